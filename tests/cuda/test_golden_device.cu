// The golden wire files on every executor, and hostile bytes decoded alike by the CPU and the GPU:
// every codec whose GPU encoder writes the CPU's bytes reproduces its golden file byte for byte on
// cpu_executor and cuda_executor (the count sketch's GPU bytes are checked in
// test_sketch_device.cu), and the GPU's decoder gives the CPU's outcome (the same named error with
// the output untouched, or the same values bit for bit) for the message, an appended byte, and
// every truncation and single-bit flip of it, or, with GRADCOMP_GOLDEN_FLIP_STRIDE=N, the sample
// of support/golden_sampling.hpp (whose own test runs on the CPU here).
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdlib>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

#include "cuda/device_io.cuh"
#include "support/golden_cases.hpp"
#include "support/golden_sampling.hpp"

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

GRADCOMP_TEST_ON_EXECUTORS("encoders with a CUDA backend reproduce their golden files byte for byte",
                           reproduces_golden_files)

TEST_CASE("golden sampling: every file and region gets flips and truncations at any stride, and stride 1 takes all") {
  CHECK(golden_flip_stride(nullptr) == 1);
  CHECK(golden_flip_stride("") == 1);
  CHECK(golden_flip_stride("17") == 17);
  CHECK(golden_flip_stride("0") == 0);
  CHECK(golden_flip_stride("-3") == 0);
  CHECK(golden_flip_stride("12x") == 0);
  for (const std::size_t size : {0u, 1u, 55u, 56u, 57u, 71u, 72u, 73u, 88u, 89u, 1056u})
    for (const std::size_t unit : {1u, 8u})
      for (const std::size_t stride :
           {std::size_t{1}, std::size_t{2}, std::size_t{17}, std::size_t{64}, std::size_t{1} << 62}) {
        CAPTURE(size);
        CAPTURE(unit);
        CAPTURE(stride);
        const golden_sample sample = sample_golden_positions("uniform_f32.bin", size, unit, stride);
        const std::vector<std::size_t> all = sample.all();
        // Ascending, distinct and inside the message.
        CHECK(std::set<std::size_t>(all.begin(), all.end()).size() == all.size());
        CHECK(std::is_sorted(all.begin(), all.end()));
        CHECK((all.empty() || all.back() < size * unit));
        // Every region that exists has its first and last position, and at least every stride-th.
        std::size_t begin = 0;
        for (std::size_t r = 0; r < 4; ++r) {
          const std::size_t end = golden_region_ends(size)[r];
          const std::vector<std::size_t>& taken = sample.regions[r];
          if (end == begin) {
            CHECK(taken.empty());
            continue;
          }
          REQUIRE(!taken.empty());
          CHECK(taken.front() == begin * unit);
          CHECK(taken.back() == end * unit - 1);
          CHECK(taken.size() >= (end - begin) * unit / stride);
          CHECK(taken.size() <= (end - begin) * unit / stride + 3);
          begin = end;
        }
        if (stride == 1) CHECK(all.size() == size * unit);
      }
  // The regions of a golden-sized message: the envelope, 16 bytes, the middle, 16 bytes.
  CHECK(golden_region_ends(1056) == std::array<std::size_t, 4>{56, 72, 1040, 1056});
  // Different files start their stride at different positions.
  CHECK(sample_golden_positions("a.bin", 1056, 8, 17).all() != sample_golden_positions("b.bin", 1056, 8, 17).all());
}

GRADCOMP_CUDA_TEST_CASE("every truncation and single-bit flip of a golden message decodes on the GPU as on the CPU") {
  const std::size_t stride = golden_flip_stride(std::getenv(golden_flip_stride_variable));
  REQUIRE_MESSAGE(stride >= 1, std::string(golden_flip_stride_variable), " must be a positive number");
  if (stride > 1)
    MESSAGE(std::string(golden_flip_stride_variable), "=", stride,
            ": a sample of the truncations and bit flips (not all)");
  std::size_t files = 0;
  for_each_golden_codec([&](const std::string& file, const auto& codec, const auto& x, message_key) {
    if constexpr (has_cuda_backend<std::decay_t<decltype(codec)>>) {
      using T = typename std::decay_t<decltype(codec)>::value_type;
      CAPTURE(file);
      ++files;
      const std::vector<std::byte> message = read_golden(file);
      const std::vector<T> into(x.size(), T{7});
      std::size_t compared = 0, differing = 0;
      const auto compare = [&](const std::vector<std::byte>& m, bool accumulate) {
        const outcome<T> cpu = decode_outcome_on(cpu_executor{}, codec, m, into, accumulate);
        const outcome<T> gpu = decode_outcome_on(test_gpu(), codec, m, into, accumulate);
        ++compared;
        if (cpu.status != gpu.status || bit_patterns(cpu.output) != bit_patterns(gpu.output)) {
          ++differing;
          MESSAGE("differs: ", m.size(), " bytes, CPU ", cpu.status, ", GPU ", gpu.status);
        }
      };
      compare(message, false);
      compare(message, true);
      const golden_sample lengths = sample_golden_positions(file, message.size(), 1, stride);
      for (const std::size_t length : lengths.all())
        compare(std::vector<std::byte>(message.begin(), message.begin() + static_cast<std::ptrdiff_t>(length)), false);
      std::vector<std::byte> longer = message;
      longer.push_back(std::byte{0});
      compare(longer, false);
      const golden_sample bits = sample_golden_positions(file, message.size(), 8, stride);
      std::size_t flips = 0;
      for (const std::size_t bit : bits.all()) {
        std::vector<std::byte> flipped = message;
        flipped[bit / 8] ^= static_cast<std::byte>(1u << (bit % 8));
        compare(flipped, flips++ % 5 == 0);  // every fifth flip decoded onto values
      }
      CHECK(differing == 0);
      MESSAGE(file, ": ", compared, " decodes compared; truncations: ", describe(lengths, message.size(), 1),
              "; bit flips: ", describe(bits, message.size(), 8));
    }
  });
  CHECK(files >= 10);
}
