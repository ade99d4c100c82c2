// The golden wire files on every executor, and hostile bytes decoded alike by the CPU and the GPU:
// every codec whose GPU encoder writes the CPU's bytes reproduces its golden file byte for byte on
// cpu_executor and cuda_executor (the count sketch's GPU bytes are checked in
// test_sketch_device.cu), and the GPU's decoder gives the CPU's outcome (the same named error with
// the output untouched, or the same values bit for bit) for the message, every truncation of it,
// an appended byte and every single-bit flip.
#include <cstddef>
#include <string>
#include <type_traits>
#include <vector>

#include "cuda/device_io.cuh"
#include "support/golden_cases.hpp"

using namespace gradcomp;
using namespace gradcomp::test;

namespace {

const auto reproduces_golden_files = [](const auto& exec) {
  std::size_t checked = 0;
  for_each_golden_codec([&](const std::string& file, const auto& codec, const auto& x, message_key key) {
    if constexpr (gpu_encodes_cpu_bytes<std::decay_t<decltype(codec)>>) {
      CAPTURE(file);
      CHECK(encode_on(exec, codec, x, key) == read_golden(file));
      ++checked;
    }
  });
  CHECK(checked >= 3);
};

}  // namespace

GRADCOMP_TEST_ON_EXECUTORS("encoders with a CUDA backend reproduce their golden files byte for byte", reproduces_golden_files)

TEST_CASE("cuda: every truncation and single-bit flip of a golden message decodes on the GPU as on the CPU" *
          doctest::skip(!gpu_available())) {
  for_each_golden_codec([&](const std::string& file, const auto& codec, const auto& x, message_key) {
    if constexpr (has_cuda_backend<std::decay_t<decltype(codec)>>) {
      using T = typename std::decay_t<decltype(codec)>::value_type;
      CAPTURE(file);
      const std::vector<std::byte> message = read_golden(file);
      const std::vector<T> into(x.size(), T{7});
      std::size_t compared = 0, differing = 0;
      const auto compare = [&](const std::vector<std::byte>& m, bool accumulate) {
        const outcome<T> cpu = decode_outcome_on(cpu_executor{}, codec, m, into, accumulate);
        const outcome<T> gpu = decode_outcome_on(cuda_executor{}, codec, m, into, accumulate);
        ++compared;
        if (cpu.status != gpu.status || bit_patterns(cpu.output) != bit_patterns(gpu.output)) {
          ++differing;
          MESSAGE("differs: ", m.size(), " bytes, CPU ", cpu.status, ", GPU ", gpu.status);
        }
      };
      compare(message, false);
      compare(message, true);
      for (std::size_t length = 0; length < message.size(); ++length)
        compare(std::vector<std::byte>(message.begin(), message.begin() + static_cast<std::ptrdiff_t>(length)), false);
      std::vector<std::byte> longer = message;
      longer.push_back(std::byte{0});
      compare(longer, false);
      for (std::size_t bit = 0; bit < message.size() * 8; ++bit) {
        std::vector<std::byte> flipped = message;
        flipped[bit / 8] ^= static_cast<std::byte>(1u << (bit % 8));
        compare(flipped, bit % 5 == 0);
      }
      CHECK(differing == 0);
      MESSAGE(file, ": ", compared, " decodes compared");
    }
  });
}
