// MPC and ZFP fixed rate of bf16 and fp16 gradients (docs/half-precision.md §2, docs/lossless.md
// §1.8 and §2.8): the payload is the float32 codec's of the exactly widened values (for MPC, the
// literal transcription of support/mpc_oracle.hpp on them), every cpu_executor setting writes
// and decodes the reference's bits; MPC gives back every 16-bit pattern bit for bit (NaN payloads
// included) and refuses words that are not widened 16-bit values; ZFP decodes into float32 as the
// float32 codec and rounds once into a 16-bit output; a result beyond the 16-bit range is
// refused with the output untouched; a wrong dtype is refused; the golden files pin the bytes.
#include <gradcomp/lossless/mpc.hpp>
#include <gradcomp/lossless/zfp_fixed_rate.hpp>
#include <gradcomp/reference/comparison.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "support/codec_io.hpp"
#include "support/data.hpp"
#include "support/errors.hpp"
#include "support/executor_io.hpp"
#include "support/golden_cases.hpp"
#include "support/golden_io.hpp"
#include "support/mpc_oracle.hpp"
#include "support/reference_check.hpp"

using namespace gradcomp;
using namespace gradcomp::test;

static_assert(takes_half_precision_values<mpc_codec<bf16>> && takes_half_precision_values<zfp_fixed_rate_codec<fp16>>);
static_assert(std::is_same_v<mpc_codec<>::value_type, float> &&
              std::is_same_v<zfp_fixed_rate_codec<>::value_type, float>);
static_assert(codec_for<mpc_codec<fp16>, reference_executor> && codec_for<zfp_fixed_rate_codec<bf16>, cpu_executor>);

namespace {

// Every 16-bit pattern once (NaNs with every payload, ±Inf, ±0, subnormals), shuffled, then n − 65536
// more random patterns.
template <class H>
std::vector<H> every_half_pattern_shuffled(std::size_t n, std::uint64_t seed) {
  std::vector<H> x(n);
  for (std::size_t i = 0; i < n; ++i) x[i] = H{static_cast<std::uint16_t>(i < 0x10000 ? i : seed * i >> 7)};
  std::shuffle(x.begin(), x.end(), std::mt19937_64(seed));
  return x;
}

// The payload bytes of a message (after its envelope).
std::vector<std::byte> float_codec_payload(const std::vector<std::byte>& m) {
  return {m.begin() + static_cast<std::ptrdiff_t>(envelope_bytes), m.end()};
}

// A 16-bit codec's message and the float32 codec's of the widened values: the same payload, the
// dtype and the parameter hash of each; each decoder refuses the other's message.
template <class Codec, class FloatCodec, class H>
void check_widened_payload(const Codec& codec, const FloatCodec& f, const std::vector<H>& x) {
  const std::vector<std::byte> m = encode_bytes(codec, x, {.step = 4}), w = encode_bytes(f, widened(x), {.step = 4});
  CHECK(float_codec_payload(m) == float_codec_payload(w));
  CHECK(parse_envelope(m).dtype == dtype_of<H>);
  CHECK(codec.params_hash() != f.params_hash());
  CHECK(decode_status_everywhere(f, m, x.size()) == named(errc::dtype_mismatch));
  CHECK(decode_status_everywhere(codec, w, x.size()) == named(errc::dtype_mismatch));
}

// Decodes `message` of codec `codec` (of H values) on `exec` into float32 (plain, and onto `acc`
// widened), into H (plain, and onto `acc`): what each gives, for comparison with the float32
// codec's values d: d itself, acc + d, and their roundings (`exact`: d's 16-bit patterns). Where
// d holds NaN or ±Inf, the accumulation into H is refused instead (a non-finite 16-bit sum).
template <class Codec, class H, class E>
void check_float_codec_outputs(const Codec& codec, const E& exec, const std::vector<std::byte>& message,
                               const std::vector<float>& d, const std::vector<H>& acc, bool exact) {
  const bool finite = std::all_of(d.begin(), d.end(), [](float v) { return is_finite(v); });
  const std::size_t n = d.size();
  std::vector<std::byte> ws(codec.workspace_bytes(exec, n));
  std::vector<float> as_float = poisoned_values<float>(n), onto_float = widened(acc);
  codec.decode(exec, message, std::span<float>(as_float), ws);
  codec.decode_accumulate(exec, message, std::span<float>(onto_float), ws);
  const std::vector<H> as_half = decode_on(exec, codec, message, poisoned_values<H>(n));
  const outcome<H> onto_half = decode_outcome_on(exec, codec, message, acc, true);
  CHECK(onto_half.status == (finite ? "no exception" : named(errc::narrowing_overflow)));
  CHECK(bit_patterns(as_float) == bit_patterns(d));
  bool same = true;
  for (std::size_t i = 0; i < n; ++i) {
    const float sum = widen(acc[i]) + d[i];
    same = same && std::bit_cast<std::uint32_t>(onto_float[i]) == std::bit_cast<std::uint32_t>(sum);
    same = same && as_half[i].bits == (exact ? exact_narrow<H>(d[i]) : narrow<H>(d[i])).bits;
    same = same && onto_half.output[i].bits == (finite ? narrow<H>(sum) : acc[i]).bits;
  }
  CHECK(same);
}

}  // namespace

TEST_CASE_TEMPLATE("16-bit MPC: every cpu setting writes the reference's bytes and decodes them to its bits", H, bf16,
                   fp16) {
  for (const std::uint32_t dim : {1u, 3u, 32u}) {
    CAPTURE(dim);
    check_inputs_same_as_reference(mpc_codec<H>({.dim = dim}));
  }
  // NaN and ±Inf are values like any other for a lossless codec (their decodes: the next case).
  const std::vector<H> all = every_half_pattern_shuffled<H>(70001, 3);
  const std::vector<std::byte> expected = encode_outcome_on(reference_executor{}, mpc_codec<H>(), all).output;
  for (const cpu_executor& cpu : cpu_settings()) CHECK(encode_outcome_on(cpu, mpc_codec<H>(), all).output == expected);
}

TEST_CASE_TEMPLATE("16-bit MPC: the oracle's payload of the widened values; every pattern comes back bit for bit", H,
                   bf16, fp16) {
  for (const std::uint32_t dim : {1u, 5u}) {
    CAPTURE(dim);
    const mpc_codec<H> codec({.dim = dim});
    for (const std::vector<H>& x : {make_half_input<H>(input_kind::normal, 5000, 21, 3.0f),
                                    every_half_pattern_shuffled<H>(65536 + 1000 + dim, 8)}) {
      CAPTURE(x.size());
      check_widened_payload(codec, mpc_codec<float>({.dim = dim}), x);
      const std::vector<std::byte> m = encode_bytes(codec, x, {.step = 1});
      CHECK(float_codec_payload(m) == mpc_oracle_payload(widened(x), dim));
      const std::vector<H> acc = make_half_input<H>(input_kind::normal, x.size(), 22, 3.0f);
      check_float_codec_outputs(codec, reference_executor{}, m, widened(x), acc, true);
      for (const cpu_executor& cpu : cpu_settings()) check_float_codec_outputs(codec, cpu, m, widened(x), acc, true);
      // Into H: the input's patterns themselves, NaN payloads and signalling bits included.
      CHECK(bit_patterns(decode_on(cpu_executor{}, codec, m, poisoned_values<H>(x.size()))) == bit_patterns(x));
    }
  }
}

TEST_CASE_TEMPLATE("16-bit MPC: the low bit planes that widening zeroes cost nothing", H, bf16, fp16) {
  // Every widened word has zero low bits (bf16: 16, fp16: 13), and so has every difference of
  // step 1; their transposed words are zero, and after step 3 only a group's first plane can be
  // carried among them. A group then carries at most 32 − zeroed + 1 words and its bitmap.
  const std::uint64_t zeroed = std::is_same_v<H, bf16> ? 16 : 13;
  const mpc_codec<H> codec;
  for (const std::vector<H>& x :
       {make_half_input<H>(input_kind::normal, 32 * 1000, 4), every_half_pattern_shuffled<H>(32 * 3000, 5)}) {
    const std::uint64_t groups = x.size() / 32;
    const std::size_t bytes = encode_bytes(codec, x).size() - envelope_bytes;
    CAPTURE(bytes);
    CHECK(bytes <= 4 * groups * (1 + 32 - zeroed + 1));
  }
}

TEST_CASE_TEMPLATE("16-bit MPC: words that are not widened 16-bit values are refused with the output untouched", H,
                   bf16, fp16) {
  // The float32 codec's message of values no H holds (an odd low mantissa bit), labelled as an H
  // message: every decoder refuses it, into H and into float32, plain and accumulated.
  const std::size_t n = 3000;
  std::vector<float> odd = widened(make_half_input<H>(input_kind::normal, n, 6));
  odd[n / 2] = std::bit_cast<float>(std::bit_cast<std::uint32_t>(odd[n / 2]) | 1u);
  const mpc_codec<H> codec;
  const auto labelled = [&](std::vector<std::byte> m) {
    envelope e = parse_envelope(m);
    e.dtype = dtype_of<H>;
    e.params_hash = codec.params_hash();
    write_envelope(e, m);
    return m;
  };
  const std::vector<std::byte> m = labelled(encode_bytes(mpc_codec<float>(), odd));
  const std::vector<H> before = make_half_input<H>(input_kind::normal, n, 7);
  check_decode_refused_untouched(codec, m, before, errc::malformed_payload);
  check_decode_refused_untouched(codec, m, before, errc::malformed_payload, true);
  check_decode_refused_untouched(codec, m, widened(before), errc::malformed_payload);
  check_decode_refused_untouched(codec, m, widened(before), errc::malformed_payload, true);
  // A sum beyond the type in the first chunk and a word that is no widened value in the second:
  // the first failing element names the error, on every backend.
  std::vector<float> late = odd;
  const H largest{static_cast<std::uint16_t>(float_traits<H>::infinity_key - 1)};
  late[0] = widen(largest);
  const std::vector<std::byte> both = labelled(encode_bytes(mpc_codec<float>(), late));
  check_decode_refused_untouched(codec, both, std::vector<H>(n, largest), errc::narrowing_overflow, true);
  // The same labelling of the widened values themselves decodes.
  const std::vector<std::byte> good = labelled(encode_bytes(mpc_codec<float>(), widened(before)));
  CHECK(bit_patterns(decode_values(codec, good, n)) == bit_patterns(before));
}

TEST_CASE_TEMPLATE("16-bit ZFP: every cpu setting writes the reference's bytes and decodes them to its bits", H, bf16,
                   fp16) {
  for (const std::uint32_t rate : {3u, 8u, 13u, 16u, 17u, 32u}) {
    CAPTURE(rate);
    check_inputs_same_as_reference(zfp_fixed_rate_codec<H>({.rate_bits = rate}));
  }
  check_non_finite_same_as_reference(zfp_fixed_rate_codec<H>({.rate_bits = 11}), 1301);
}

TEST_CASE_TEMPLATE("16-bit ZFP: the float32 codec's stream of the widened values, decoded as float32's", H, bf16,
                   fp16) {
  for (const std::uint32_t rate : {5u, 12u, 24u}) {
    CAPTURE(rate);
    const zfp_fixed_rate_codec<H> codec({.rate_bits = rate});
    const zfp_fixed_rate_codec<float> f({.rate_bits = rate});
    // 1537 values: three stages of 512 and a partial block.
    for (const std::vector<H>& x : {make_half_input<H>(input_kind::normal, 1537, 31, 40.0f),
                                    make_half_input<H>(input_kind::subnormals, 4099, 32)}) {
      CAPTURE(x.size());
      check_widened_payload(codec, f, x);
      const std::vector<std::byte> m = encode_bytes(codec, x, {.step = 1});
      const std::vector<float> d = decode_values(f, encode_bytes(f, widened(x), {.step = 1}), x.size());
      const std::vector<H> acc = make_half_input<H>(input_kind::normal, x.size(), 33, 40.0f);
      check_float_codec_outputs(codec, reference_executor{}, m, d, acc, false);
      for (const cpu_executor& cpu : cpu_settings()) check_float_codec_outputs(codec, cpu, m, d, acc, false);
    }
  }
}

TEST_CASE_TEMPLATE("16-bit ZFP and MPC: a result beyond the 16-bit range is refused with the output untouched", H, bf16,
                   fp16) {
  // Accumulated onto the largest value, the decoded largest values of four elements past the CPU
  // decoders' first stage and chunk take the float32 sum beyond the type (bf16: to +Inf in float32
  // itself); every other sum fits. The same accumulation into float32 succeeds.
  const H largest{static_cast<std::uint16_t>(float_traits<H>::infinity_key - 1)};
  std::vector<H> x(1500, H{0});
  std::fill(x.begin() + 1400, x.begin() + 1404, largest);
  const std::vector<H> before(x.size(), largest);
  for (const auto& message :
       {encode_bytes(zfp_fixed_rate_codec<H>({.rate_bits = 16}), x), encode_bytes(mpc_codec<H>(), x)}) {
    const auto check_with = [&](const auto& codec) {
      check_decode_refused_untouched(codec, message, before, errc::narrowing_overflow, true);
      std::vector<float> onto(x.size(), 1.0f);
      std::vector<std::byte> ws(codec.workspace_bytes(cpu_executor{}, x.size()));
      codec.decode_accumulate(cpu_executor{}, message, std::span<float>(onto), ws);
      CHECK(onto[1400] > 0.9f * widen(largest));
      CHECK(onto[0] == 1.0f);
    };
    if (parse_envelope(message).codec == codec_id::mpc) check_with(mpc_codec<H>());
    else
      check_with(zfp_fixed_rate_codec<H>({.rate_bits = 16}));
  }
  if constexpr (std::is_same_v<H, fp16>) {
    // A ZFP block whose exponent field says 2^128: its values decode far beyond fp16's range,
    // which a plain decode into fp16 refuses and one into float32 gives.
    const zfp_fixed_rate_codec<fp16> codec({.rate_bits = 8});
    std::vector<std::byte> m = encode_bytes(codec, make_half_input<fp16>(input_kind::normal, 16, 9));
    m[envelope_bytes] = std::byte{0xff};
    m[envelope_bytes + 1] |= std::byte{0x01};  // the first block's header 511: e_b = 255, emax = 128
    m = reseal(m);
    std::vector<float> as_float(16);
    codec.decode(cpu_executor{}, m, std::span<float>(as_float), {});
    CHECK(std::any_of(as_float.begin(), as_float.begin() + 4, [](float v) { return !narrows_finite<fp16>(v); }));
    check_decode_refused_untouched(codec, m, std::vector<fp16>(16, fp16{0}), errc::narrowing_overflow);
  }
}

TEST_CASE("the golden bf16 MPC and fp16 ZFP files hold the float32 codecs' payloads of the widened values") {
  const std::vector<bf16> xb = golden_input<bf16>(1000);
  const std::vector<std::byte> mpc = read_golden("mpc_bf16.bin");
  CHECK(parse_envelope(mpc).dtype == value_dtype::bfloat16);
  CHECK(float_codec_payload(mpc) == mpc_oracle_payload(widened(xb), 1));
  CHECK(bit_patterns(decode_values(mpc_codec<bf16>(), mpc, xb.size())) == bit_patterns(xb));

  const std::vector<fp16> xh = golden_input<fp16>(1000);
  const std::vector<std::byte> zfp = read_golden("zfp_fixed_rate_r12_fp16.bin");
  CHECK(parse_envelope(zfp).dtype == value_dtype::float16);
  const zfp_fixed_rate_codec<float> f({.rate_bits = 12});
  CHECK(float_codec_payload(zfp) == float_codec_payload(encode_bytes(f, widened(xh), {.step = 9, .tensor_id = 6})));
}

TEST_CASE_TEMPLATE("16-bit MPC and ZFP messages compare with the reference's field by field", H, bf16, fp16) {
  static_assert(comparable_with_reference<mpc_codec<H>> && comparable_with_reference<zfp_fixed_rate_codec<H>>);
  const std::vector<H> x = make_half_input<H>(input_kind::normal, 700, 41);
  const auto check_codec = [&](const auto& codec) {
    std::vector<std::byte> m = encode_bytes(codec, x, {.step = 2});
    CHECK(compare_encoding(codec, std::span<const H>(x), {.step = 2}, m).same);
    m[envelope_bytes + 200] ^= std::byte{0x10};
    const encoding_comparison c = compare_encoding(codec, std::span<const H>(x), {.step = 2}, m);
    CHECK_FALSE(c.same);
    CHECK(c.first_difference == envelope_bytes + 200);
    CHECK(c.field.elements > 0);
  };
  check_codec(mpc_codec<H>());
  check_codec(zfp_fixed_rate_codec<H>({.rate_bits = 9}));
}
