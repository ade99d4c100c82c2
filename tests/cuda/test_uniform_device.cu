// The uniform quantizer on the GPU: its messages and decodings equal reference_executor's bit for
// bit over widths, block sizes (whole-word blocks and blocks sharing code words), rounding modes,
// value types, sizes and special inputs; and on both executors NaN/Inf, checksums, short buffers
// and deferred errors behave as documented.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "cuda/device_io.cuh"
#include "support/data.hpp"
#include "support/errors.hpp"

using namespace gradcomp;
using namespace gradcomp::test;

namespace {

template <class T>
void check_uniform(const uniform_params& p, wire_options wire = {}) {
  for (const std::size_t n : {0u, 1u, 31u, 1000u, 4099u})
    for (const input_kind kind : all_input_kinds)
      check_matches_reference(uniform_quantizer<T>(p, wire), n, kind, 1234 + n);
}

const auto non_finite_leaves_no_message = [](const auto& exec) {
  const uniform_quantizer<float> q({.bits = 8, .block = 32});
  const uniform_quantizer<float> shared_words({.bits = 2, .block = 7});
  for (const float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity()}) {
    std::vector<float> x = make_input<float>(input_kind::normal, 1000, 5);
    x[777] = bad;
    for (const auto& codec : {q, shared_words}) {
      const outcome<std::byte> result = encode_outcome_on(exec, codec, x);
      CHECK(result.status == named(errc::non_finite_input));
      CHECK(std::vector<std::byte>(result.output.begin(), result.output.begin() + 56) == std::vector<std::byte>(56));
    }
  }
};

const auto checksummed_messages_round_trip = [](const auto& exec) {
  const uniform_quantizer<float> q({.bits = 4, .block = 64}, {.payload_checksum = true});
  const std::vector<float> x = make_input<float>(input_kind::normal, 5000, 8);
  std::vector<std::byte> m = encode_on(exec, q, x, {.step = 2});
  CHECK(m == encode_on(cpu_executor{}, q, x, {.step = 2}));
  const std::vector<float> zeros(x.size());
  CHECK(decode_outcome_on(exec, q, m, zeros, false, {.require_checksum = true}).status == "no exception");
  m[m.size() - 3] ^= std::byte{0x10};
  const outcome<float> corrupted = decode_outcome_on(exec, q, m, zeros);
  CHECK(corrupted.status == named(errc::payload_checksum));
  CHECK(corrupted.output == zeros);
};

const auto short_buffers_are_named = [](const auto& exec) {
  using E = std::decay_t<decltype(exec)>;
  using memory = executor_memory<E>;
  const uniform_quantizer<float> q({.bits = 8, .block = 99});  // 99·8 bits: the two-kernel path, with scratch
  const std::vector<float> x = make_input<float>(input_kind::normal, 10000, 3);
  const std::size_t size = q.max_encoded_bytes(x.size());
  auto g = memory::copy_in(exec, x);
  auto out = memory::copy_in(exec, std::vector<std::byte>(size + 8, std::byte{0xAB}));
  auto ws = memory::template poisoned<std::byte>(exec, q.workspace_bytes(exec, x.size()));
  const std::span<const float> grad(memory::span(g));
  const std::span<std::byte> buffer = memory::span(out);
  CHECK(thrown_by([&] { (void)q.encode(exec, grad, buffer.first(size - 1), memory::span(ws)); }) ==
        named(errc::buffer_too_small));
  if constexpr (on_gpu<E>) {
    CHECK(thrown_by([&] { (void)q.encode(exec, grad, buffer.first(size), memory::span(ws).first(0)); }) ==
          named(errc::workspace_too_small));
    CHECK(thrown_by([&] { (void)q.encode(exec, grad, buffer.subspan(4, size), memory::span(ws)); }) ==
          named(errc::invalid_argument));  // a device message must start on 8 bytes
  }
  // Nothing of the buffer was written by the refused calls.
  CHECK(memory::copy_out(exec, out, size + 8) == std::vector<std::byte>(size + 8, std::byte{0xAB}));
};

}  // namespace

GRADCOMP_CUDA_TEST_CASE("uniform messages and decodings equal the reference's bit for bit") {
  for (const int bits : {1, 2, 4, 8}) {
    for (const std::uint32_t block : {1u, 7u, 32u, 100u, 256u}) {
      for (const rounding mode : {rounding::nearest_even, rounding::stochastic}) {
        CAPTURE(bits);
        CAPTURE(block);
        CAPTURE(static_cast<int>(mode));
        check_uniform<float>({.bits = bits, .block = block, .round = mode, .seed = 77});
        check_uniform<double>({.bits = bits, .block = block, .round = mode, .seed = 78});
      }
    }
  }
  check_uniform<float>({.bits = 8, .block = 256}, {.payload_checksum = true});
}

GRADCOMP_TEST_ON_EXECUTORS("uniform: NaN or Inf in the gradient is non_finite_input and leaves no message",
                           non_finite_leaves_no_message)
GRADCOMP_TEST_ON_EXECUTORS("uniform: checksummed messages decode, and a corrupted one is payload_checksum",
                           checksummed_messages_round_trip)
GRADCOMP_TEST_ON_EXECUTORS("uniform: short outputs and workspaces are named errors", short_buffers_are_named)

GRADCOMP_CUDA_TEST_CASE("deferred errors leave the message unsealed and are reported by check_deferred_errors") {
  device_array<std::uint32_t> word = to_device(test_gpu(), std::vector<std::uint32_t>{0});  // zeroed, as documented
  cuda_executor deferred = test_gpu();
  deferred.deferred_errors = word.data();
  const uniform_quantizer<float> q({.bits = 8});
  std::vector<float> x = make_input<float>(input_kind::normal, 3000, 4);
  x[2500] = std::numeric_limits<float>::quiet_NaN();
  const outcome<std::byte> failed = encode_outcome_on(deferred, q, x);
  CHECK(failed.status == "no exception");  // nothing thrown: the failure waits in the word
  CHECK(std::vector<std::byte>(failed.output.begin(), failed.output.begin() + 56) == std::vector<std::byte>(56));
  CHECK(thrown_by([&] { check_deferred_errors(deferred); }) == named(errc::non_finite_input));
  CHECK(to_host(deferred, word) == std::vector<std::uint32_t>{0});  // cleared

  x[2500] = 0.5f;
  CHECK(encode_on(deferred, q, x) == encode_on(cpu_executor{}, q, x));
  CHECK(thrown_by([&] { check_deferred_errors(deferred); }) == "no exception");
}
