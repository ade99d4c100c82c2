// The sign and QSGD quantizers on the GPU: messages and decodings equal the CPU reference's bit
// for bit over block sizes, levels, value types, sizes and special inputs (the per-block sums run
// in the documented order on both); on both executors NaN/Inf and an overflowing QSGD norm are
// non_finite_input with no message left.
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "cuda/device_io.cuh"
#include "support/data.hpp"
#include "support/errors.hpp"

using namespace gradcomp;
using namespace gradcomp::test;

namespace {

template <class Codec>
void check_all_inputs(const Codec& codec) {
  for (const std::size_t n : {0u, 1u, 33u, 1000u, 4099u})
    for (const input_kind kind : all_input_kinds) check_matches_cpu(codec, n, kind, 4321 + n);
}

const auto non_finite_leaves_no_message = [](const auto& exec) {
  std::vector<double> x = make_input<double>(input_kind::normal, 700, 2);
  x[650] = std::numeric_limits<double>::infinity();
  const sign_quantizer<double> sign({.block = 100});
  const qsgd_quantizer<double> qsgd({.levels = 7, .bucket = 64});
  for (const outcome<std::byte>& result : {encode_outcome_on(exec, sign, x), encode_outcome_on(exec, qsgd, x)}) {
    CHECK(result.status == named(errc::non_finite_input));
    CHECK(std::vector<std::byte>(result.output.begin(), result.output.begin() + 56) == std::vector<std::byte>(56));
  }
  // Finite values whose bucket norm overflows float.
  std::vector<float> big(64, 3e38f);
  const outcome<std::byte> overflow = encode_outcome_on(exec, qsgd_quantizer<float>({.bucket = 32}), big);
  CHECK(overflow.status == named(errc::non_finite_input));
};

}  // namespace

TEST_CASE("cuda: sign messages and decodings equal the CPU reference's bit for bit" * doctest::skip(!gpu_available())) {
  for (const std::uint32_t block : {1u, 5u, 32u, 100u, 256u}) {
    CAPTURE(block);
    check_all_inputs(sign_quantizer<float>({.block = block}));
    check_all_inputs(sign_quantizer<double>({.block = block}));
  }
  check_all_inputs(sign_quantizer<float>({.block = 64}, {.payload_checksum = true}));
}

TEST_CASE("cuda: QSGD messages and decodings equal the CPU reference's bit for bit" * doctest::skip(!gpu_available())) {
  for (const std::uint32_t levels : {1u, 3u, 7u, 15u, 127u}) {
    for (const std::uint32_t bucket : {1u, 9u, 64u, 256u}) {
      CAPTURE(levels);
      CAPTURE(bucket);
      check_all_inputs(qsgd_quantizer<float>({.levels = levels, .bucket = bucket, .seed = 5}));
      check_all_inputs(qsgd_quantizer<double>({.levels = levels, .bucket = bucket, .seed = 6}));
    }
  }
}

GRADCOMP_TEST_ON_EXECUTORS("sign and QSGD: NaN, Inf or an overflowing norm is non_finite_input and leaves no message",
                           non_finite_leaves_no_message)
