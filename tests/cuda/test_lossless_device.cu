// The float codecs of the hybrid scheme on the GPU. ZFP fixed-rate messages equal
// reference_executor's byte for byte and decode (into poisoned values and onto values) to
// reference_executor's bits, for every rate from 3 to 32, sizes with partial last blocks and odd
// block counts, the test inputs and magnitudes at both ends of the float range; payloads with every
// byte random decode alike. MPC messages equal reference_executor's for every d from 1 to 32, sizes
// around the group and chunk boundaries, smooth, random-bit and special-value inputs, and decode
// alike, damaged messages included. On both executors: ZFP's NaN or Inf leaves no message; non-zero
// padding bits (ZFP's nibble, MPC's high bits of a partial last group) and MPC bitmaps that mark
// more words than the payload carries are malformed_payload with the output untouched.
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "cuda/device_io.cuh"
#include "support/data.hpp"
#include "support/errors.hpp"
#include "support/zfp_inputs.hpp"

using namespace gradcomp;
using namespace gradcomp::test;

namespace {

/// Bit patterns with every NaN replaced by one pattern: the NaN an addition returns follows the
/// device (x86 keeps an operand's payload, a GPU returns its canonical NaN), docs/cuda.md §4.
std::vector<std::uint32_t> nan_as_class(const std::vector<float>& values) {
  std::vector<std::uint32_t> bits = bit_patterns(values);
  for (std::size_t i = 0; i < values.size(); ++i)
    if (std::isnan(values[i])) bits[i] = 0x7FC00000u;
  return bits;
}

/// The reference's and the GPU's decodings of `message` have equal bits (into poisoned values), and equal
/// bits but for NaN payloads when added onto `start`.
template <class Codec>
void check_decodes_alike(const Codec& codec, const std::vector<std::byte>& message, std::size_t n, std::uint64_t seed) {
  const std::vector<float> start = make_input<float>(input_kind::normal, n, seed);
  const outcome<float> cpu = decode_outcome_on(reference_executor{}, codec, message, poisoned_values<float>(n));
  const outcome<float> gpu = decode_outcome_on(test_gpu(), codec, message, poisoned_values<float>(n));
  CHECK(gpu.status == cpu.status);
  CHECK(bit_patterns(gpu.output) == bit_patterns(cpu.output));
  const outcome<float> cpu_sum = decode_outcome_on(reference_executor{}, codec, message, start, true);
  const outcome<float> gpu_sum = decode_outcome_on(test_gpu(), codec, message, start, true);
  CHECK(gpu_sum.status == cpu_sum.status);
  CHECK(nan_as_class(gpu_sum.output) == nan_as_class(cpu_sum.output));
}

const auto zfp_bad_input_changes_nothing = [](const auto& exec) {
  const zfp_fixed_rate_codec<float> codec({.rate_bits = 5});
  for (const float bad : {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::infinity()}) {
    std::vector<float> x = make_input<float>(input_kind::normal, 999, 3);
    x[998] = bad;
    const outcome<std::byte> result = encode_outcome_on(exec, codec, x);
    CHECK(result.status == named(errc::non_finite_input));
    CHECK(thrown_by([&] { (void)parse_envelope(result.output); }) != "no exception");
  }
  // 1001 values are 251 blocks of 20 bits: the stream ends mid-byte, with 4 padding bits.
  const std::vector<float> x = make_input<float>(input_kind::normal, 1001, 4);
  std::vector<std::byte> message = encode_on(reference_executor{}, codec, x);
  message.back() |= std::byte{0x80};
  const std::vector<float> start(1001, 2.5f);
  const outcome<float> decoded = decode_outcome_on(exec, codec, message, start);
  CHECK(decoded.status == named(errc::malformed_payload));
  CHECK(bit_patterns(decoded.output) == bit_patterns(start));
};

const auto mpc_bad_payload_changes_nothing = [](const auto& exec) {
  const mpc_codec<float> codec({.dim = 3});
  const std::vector<float> x = make_input<float>(input_kind::normal, 1000, 6);  // 1000 = 31·32 + 8
  const std::vector<std::byte> message = encode_on(reference_executor{}, codec, x);
  const std::vector<float> start(1000, -1.5f);
  // A bit at or above 2^8 in a transposed word of the last group: flip the top bit of the last
  // kept word, which belongs to that group.
  std::vector<std::byte> high = message;
  high.back() ^= std::byte{0x80};
  // One bit more in a bitmap than the payload carries words for.
  std::vector<std::byte> marked = message;
  bool added = false;
  for (std::size_t g = 0; g < mpc_codec<float>::group_count(x.size()) && !added; ++g) {
    std::uint32_t bitmap = 0;
    std::memcpy(&bitmap, marked.data() + envelope::size + 4 * g, 4);
    if (bitmap == ~std::uint32_t{0}) continue;
    bitmap |= bitmap + 1;  // the lowest clear bit
    std::memcpy(marked.data() + envelope::size + 4 * g, &bitmap, 4);
    added = true;
  }
  REQUIRE(added);
  for (const std::vector<std::byte>* bad : std::array<const std::vector<std::byte>*, 2>{&high, &marked}) {
    const outcome<float> decoded = decode_outcome_on(exec, codec, *bad, start);
    CHECK(decoded.status == named(errc::malformed_payload));
    CHECK(bit_patterns(decoded.output) == bit_patterns(start));
  }
};

/// n random bit patterns (NaNs, infinities and subnormals among them).
std::vector<float> random_bits(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 engine(seed);
  std::vector<float> x(n);
  for (float& v : x) v = from_bits<float>(static_cast<std::uint32_t>(engine()));
  return x;
}

}  // namespace

GRADCOMP_CUDA_TEST_CASE("MPC messages and decodings equal the reference's bit for bit") {
  for (std::uint32_t dim = 1; dim <= 32; ++dim) {
    const mpc_codec<float> codec({.dim = dim});
    for (const std::size_t n : {0u, 1u, 31u, 32u, 33u, 1023u, 1024u, 1025u, 5000u, 70001u}) {
      CAPTURE(dim);
      CAPTURE(n);
      for (const input_kind kind : all_input_kinds) check_matches_reference(codec, n, kind, 7 * dim + n);
      const std::vector<float> smooth = zfp_test_input(zfp_input::smooth, n, dim);
      CHECK(encode_on(test_gpu(), codec, smooth) == encode_on(reference_executor{}, codec, smooth));
      const std::vector<float> bits = random_bits(n, dim + n);
      const std::vector<std::byte> message = encode_on(reference_executor{}, codec, bits);
      CHECK(encode_on(test_gpu(), codec, bits) == message);
      check_decodes_alike(codec, message, n, dim);
      // Damaged: a flipped bit in each of a few kept words (the padding check or other values).
      std::vector<std::byte> damaged = message;
      for (std::size_t b = envelope::size + 4 * mpc_codec<float>::group_count(n); b < damaged.size(); b += 97)
        damaged[b] ^= std::byte{0x10};
      check_decodes_alike(codec, damaged, n, dim + 1);
    }
  }
  check_matches_reference(mpc_codec<float>(), std::size_t{1} << 22, input_kind::normal, 8);
  check_matches_reference(mpc_codec<float>({.dim = 5}, {.payload_checksum = true}), (std::size_t{1} << 21) + 17,
                          input_kind::ties, 9);
}

GRADCOMP_CUDA_TEST_CASE("ZFP fixed-rate messages and decodings equal the reference's bit for bit") {
  for (unsigned rate = 3; rate <= 32; ++rate) {
    const zfp_fixed_rate_codec<float> codec({.rate_bits = rate});
    for (const std::size_t n : {1u, 2u, 3u, 4u, 5u, 1003u, 4099u}) {
      CAPTURE(rate);
      for (const input_kind kind : all_input_kinds) check_matches_reference(codec, n, kind, 100 * rate + n);
      for (const zfp_input kind : all_zfp_inputs) {
        const std::vector<float> x = zfp_test_input(kind, n, rate + n);
        CHECK(encode_on(test_gpu(), codec, x) == encode_on(reference_executor{}, codec, x));
      }
      // Both ends of the range: blocks below 2^-98 (the exact cast) and from 2^126 up.
      const std::vector<float> extreme = zfp_extreme_input(n, rate);
      const std::vector<std::byte> message = encode_on(reference_executor{}, codec, extreme);
      CHECK(encode_on(test_gpu(), codec, extreme) == message);
      check_decodes_alike(codec, message, n, rate);
      // Hostile payloads: every byte random (the padding bits cleared, or the CPU refuses it too).
      std::mt19937_64 engine(rate * n);
      std::vector<std::byte> random = message;
      for (std::size_t b = envelope::size; b < random.size(); ++b) random[b] = static_cast<std::byte>(engine());
      check_decodes_alike(codec, random, n, rate + 1);
    }
  }
  // Large enough for many blocks per thread.
  check_matches_reference(zfp_fixed_rate_codec<float>({.rate_bits = 8}), std::size_t{1} << 22, input_kind::normal, 5);
  check_matches_reference(zfp_fixed_rate_codec<float>({.rate_bits = 16}, {.payload_checksum = true}),
                          (std::size_t{1} << 21) + 3, input_kind::normal, 6);
}

GRADCOMP_TEST_ON_EXECUTORS("ZFP: NaN or Inf leaves no message, and non-zero padding bits are malformed_payload",
                           zfp_bad_input_changes_nothing)
GRADCOMP_TEST_ON_EXECUTORS("MPC: stray high bits in the last group and over-marking bitmaps are malformed_payload",
                           mpc_bad_payload_changes_nothing)
