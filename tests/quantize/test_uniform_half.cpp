// The uniform quantizer on bf16 and fp16 gradients (docs/half-precision.md): every cpu_executor
// setting writes the reference's bytes and decodes them to the same bits; the payload is the
// float32 quantizer's on the exactly widened values (the documented equivalence); decoded values
// are within half a step of the widened input (an oracle reading the message's own scales); a
// 16-bit output is the float32 result rounded to nearest even, and an accumulation sums in float32
// and rounds once; a result beyond the 16-bit range is `narrowing_overflow` with the output
// untouched; NaN/±Inf inputs, wrong dtypes and hostile bytes get named errors.
#include <gradcomp/core/reference_executor.hpp>
#include <gradcomp/quantize/uniform.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "support/codec_io.hpp"
#include "support/data.hpp"
#include "support/errors.hpp"
#include "support/executor_io.hpp"
#include "support/reference_check.hpp"

using namespace gradcomp;
using namespace gradcomp::test;

namespace {

// The payload (the bytes after the 56-byte envelope).
std::vector<std::byte> payload_of(const std::vector<std::byte>& m) {
  return {m.begin() + static_cast<std::ptrdiff_t>(envelope::size), m.end()};
}

const uniform_params layouts[] = {
    {.bits = 8, .block = 256},
    {.bits = 8, .block = 32},
    {.bits = 4, .block = 64},
    {.bits = 2, .block = 256},
    {.bits = 1, .block = 7},
    {.bits = 8, .block = 5000},  // longer than the CPU decoder's narrowing stage
    {.bits = 4, .block = 100},
    {.bits = 8, .block = 64, .round = rounding::stochastic, .seed = 5},
    {.bits = 2, .block = 32, .round = rounding::stochastic, .seed = 6},
};

}  // namespace

TEST_CASE_TEMPLATE("16-bit uniform messages: every cpu setting writes the reference's bytes and decodes them alike", H,
                   bf16, fp16) {
  for (const uniform_params& p : layouts) {
    CAPTURE(p.bits);
    CAPTURE(p.block);
    const uniform_quantizer<H> q(p);
    for (const input_kind kind : all_input_kinds) {
      for (const std::size_t n :
           {std::size_t{0}, std::size_t{1}, std::size_t{33}, std::size_t{257}, std::size_t{4099}, std::size_t{9000}}) {
        CAPTURE(name(kind));
        CAPTURE(n);
        (void)check_same_as_reference(q, make_half_input<H>(kind, n, 100 + n), {.step = 3, .tensor_id = 7});
      }
    }
  }
}

TEST_CASE_TEMPLATE("a 16-bit message carries the float32 quantizer's scales and codes of the widened values", H, bf16,
                   fp16) {
  for (const uniform_params& p : layouts) {
    CAPTURE(p.bits);
    CAPTURE(p.block);
    const std::vector<H> x = make_half_input<H>(input_kind::normal, 9000, 3, 40.0f);
    const message_key key{.step = 2, .tensor_id = 1};
    const std::vector<std::byte> half_message = encode_bytes(uniform_quantizer<H>(p), x, key);
    const std::vector<std::byte> float_message = encode_bytes(uniform_quantizer<float>(p), widened(x), key);
    CHECK(payload_of(half_message) == payload_of(float_message));
    const envelope e = parse_envelope(half_message);
    CHECK(e.dtype == dtype_of<H>);
    CHECK(e.elements == x.size());
    CHECK(e.params_hash == uniform_quantizer<H>(p).params_hash());
    CHECK(e.params_hash != uniform_quantizer<float>(p).params_hash());
    CHECK(half_message.size() == uniform_quantizer<H>(p).max_encoded_bytes(x.size()));
  }
}

TEST_CASE_TEMPLATE("16-bit RTN values decode within half a step of the widened input, and narrow as documented", H,
                   bf16, fp16) {
  const uniform_params p{.bits = 4, .block = 32};
  const uniform_quantizer<H> q(p);
  const std::size_t n = 1000;
  const std::vector<H> x = make_half_input<H>(input_kind::normal, n, 9, 10.0f);
  const std::vector<std::byte> m = encode_bytes(q, x, {.step = 1});
  // The oracle reads the scales straight from the documented layout: float32, one per block.
  std::vector<float> scales((n + p.block - 1) / p.block);
  std::memcpy(scales.data(), m.data() + envelope::size, scales.size() * sizeof(float));
  const cpu_executor cpu;
  const std::vector<float> as_float = decode_on(cpu, q, m, std::vector<float>(n, 7.0f));
  const std::vector<H> as_half = decode_on(cpu, q, m, poisoned_values<H>(n));
  for (std::size_t i = 0; i < n; ++i) {
    CAPTURE(i);
    const float s = scales[i / p.block];
    // Half a step, and the float32 roundings of L/m and of t = x·L/m (a few ulps of the block's top).
    CHECK(std::fabs(static_cast<double>(as_float[i]) - static_cast<double>(widen(x[i]))) <= s / 2 * (1 + 1e-5));
    CHECK(as_half[i].bits == narrow<H>(as_float[i]).bits);
  }
  // The same values as the float32 quantizer's decoder gives its own message of the widened input.
  const std::vector<std::byte> float_message = encode_bytes(uniform_quantizer<float>(p), widened(x), {.step = 1});
  CHECK(bit_patterns(decode_values(uniform_quantizer<float>(p), float_message, n)) == bit_patterns(as_float));
}

TEST_CASE_TEMPLATE("16-bit accumulation sums in float32 and rounds once", H, bf16, fp16) {
  for (const uniform_params& p : {uniform_params{.bits = 8, .block = 256}, uniform_params{.bits = 2, .block = 10}}) {
    CAPTURE(p.bits);
    const uniform_quantizer<H> q(p);
    const std::size_t n = 700;
    const std::vector<H> x = make_half_input<H>(input_kind::normal, n, 4, 3.0f);
    const std::vector<std::byte> m = encode_bytes(q, x, {.step = 1});
    const std::vector<float> values =
        decode_values(uniform_quantizer<float>(p), encode_bytes(uniform_quantizer<float>(p), widened(x), {.step = 1}),
                      n);
    const std::vector<H> acc_half = make_half_input<H>(input_kind::normal, n, 8, 2.0f);
    const std::vector<float> acc_float = widened(make_half_input<H>(input_kind::normal, n, 12, 2.0f));
    for (const cpu_executor& cpu : cpu_settings()) {
      CAPTURE(static_cast<int>(cpu.simd()));
      const std::vector<float> f = decode_on(cpu, q, m, acc_float, true);
      const std::vector<H> h = decode_on(cpu, q, m, acc_half, true);
      for (std::size_t i = 0; i < n; ++i) {
        CAPTURE(i);
        CHECK(f[i] == acc_float[i] + values[i]);
        CHECK(h[i].bits == narrow<H>(widen(acc_half[i]) + values[i]).bits);
      }
    }
    CHECK(bit_patterns(decode_on(reference_executor{}, q, m, acc_half, true)) ==
          bit_patterns(decode_on(cpu_executor{}, q, m, acc_half, true)));
    CHECK(bit_patterns(decode_on(reference_executor{}, q, m, acc_float, true)) ==
          bit_patterns(decode_on(cpu_executor{}, q, m, acc_float, true)));
  }
}

TEST_CASE_TEMPLATE("16-bit stochastic rounding is unbiased on the widened values", H, bf16, fp16) {
  const uniform_quantizer<H> q({.bits = 2, .block = 64, .round = rounding::stochastic, .seed = 17});
  const std::size_t n = 64;
  const std::vector<H> x = make_half_input<H>(input_kind::normal, n, 21);
  std::vector<double> mean(n, 0.0);
  const int trials = 4000;
  float step = 0;
  for (int t = 0; t < trials; ++t) {
    const std::vector<std::byte> m = encode_bytes(q, x, {.step = static_cast<std::uint64_t>(t)});
    std::memcpy(&step, m.data() + envelope::size, sizeof step);
    const std::vector<float> v = decode_on(cpu_executor{}, q, m, std::vector<float>(n));
    for (std::size_t i = 0; i < n; ++i) mean[i] += v[i] / trials;
  }
  // Each decoded value is one of the two levels around x (a Bernoulli draw of spread s), so the
  // mean of `trials` draws is within 5 standard deviations s/(2√trials) of x.
  for (std::size_t i = 0; i < n; ++i) {
    CAPTURE(i);
    CHECK(std::fabs(mean[i] - static_cast<double>(widen(x[i]))) <= 5 * step / (2 * std::sqrt(double{trials})));
  }
}

TEST_CASE("an fp16 output refuses a value beyond 65504 with narrowing_overflow and is left untouched") {
  const uniform_quantizer<fp16> q({.bits = 8, .block = 32});
  const std::size_t n = 64;
  // A valid fp16 message whose block holds 1e6: the float32 quantizer's payload under an fp16 envelope.
  std::vector<float> big(n, 1.0f);
  big[40] = 1.0e6f;
  const std::vector<std::byte> float_message = encode_bytes(uniform_quantizer<float>({.bits = 8, .block = 32}), big);
  envelope e = parse_envelope(float_message);
  e.dtype = value_dtype::float16;
  e.params_hash = q.params_hash();
  std::vector<std::byte> m = float_message;
  write_envelope(e, m);
  const std::vector<fp16> before = make_half_input<fp16>(input_kind::normal, n, 2);
  check_decode_refused_untouched(q, m, before, errc::narrowing_overflow);
  // Into float32 the same message decodes (1e6 within half a step).
  const std::vector<float> wide = decode_on(cpu_executor{}, q, m, std::vector<float>(n));
  CHECK(std::fabs(wide[40] - 1.0e6f) <= 1.0e6f / 127 / 2);
  // Accumulating: 60000 + 60000 overflows fp16 even though each fits.
  std::vector<fp16> x(n, narrow<fp16>(60000.0f));
  const std::vector<std::byte> fits = encode_bytes(q, x);
  check_decode_refused_untouched(q, fits, x, errc::narrowing_overflow, true);
  std::vector<float> acc(n, 60000.0f);
  CHECK(decode_on(cpu_executor{}, q, fits, acc, true)[0] == 120000.0f);  // the float32 accumulator holds it
}

TEST_CASE_TEMPLATE("16-bit NaN and infinities are rejected, fp16 subnormals and signed zeros code like floats", H, bf16,
                   fp16) {
  const uniform_quantizer<H> q({.bits = 8, .block = 32});
  for (const std::uint16_t bad :
       {std::uint16_t(float_traits<H>::infinity_key), std::uint16_t(0x8000u | float_traits<H>::infinity_key),
        std::uint16_t(float_traits<H>::infinity_key + 1)}) {
    for (const std::size_t at : {std::size_t{0}, std::size_t{500}, std::size_t{999}}) {
      std::vector<H> x = make_half_input<H>(input_kind::normal, 1000, 5);
      x[at] = H{bad};
      CAPTURE(at);
      CHECK(encode_outcome_on(reference_executor{}, q, x).status == named(errc::non_finite_input));
      (void)check_same_as_reference(q, x, {.step = 1});
    }
  }
  // Subnormal and signed-zero blocks (fp16 subnormals are below 2^-14).
  std::vector<H> tiny(200);
  for (std::size_t i = 0; i < tiny.size(); ++i)
    tiny[i] = H{static_cast<std::uint16_t>((i % 3 == 0 ? 0x8000u : 0u) | (i % 5 == 0 ? 0u : (i * 7) % 1000 + 1))};
  const std::vector<std::byte> m = check_same_as_reference(q, tiny, {.step = 2});
  const std::vector<std::byte> float_message =
      encode_bytes(uniform_quantizer<float>({.bits = 8, .block = 32}), widened(tiny), {.step = 2});
  CHECK(payload_of(m) == payload_of(float_message));
}

TEST_CASE("16-bit messages are checked for their dtype, and hostile bytes get named errors on every backend") {
  const uniform_params p{.bits = 4, .block = 32};
  const std::vector<bf16> x = make_half_input<bf16>(input_kind::normal, 100, 1);
  const std::vector<std::byte> bf = encode_bytes(uniform_quantizer<bf16>(p), x);
  // Another dtype's decoder: dtype_mismatch, before anything else is read.
  CHECK(decode_status_everywhere(uniform_quantizer<fp16>(p), bf, 100) == named(errc::dtype_mismatch));
  CHECK(decode_status_everywhere(uniform_quantizer<float>(p), bf, 100) == named(errc::dtype_mismatch));
  CHECK(decode_status_everywhere(uniform_quantizer<bf16>(p), encode_bytes(uniform_quantizer<float>(p), widened(x)),
                                 100) == named(errc::dtype_mismatch));
  // A negative scale, a code above 2L, and every truncation: rejected alike, output untouched.
  // (The payload carries no checksum here, so its bytes are changed in place.)
  std::vector<std::byte> negative = bf;
  negative[envelope::size + 3] |= std::byte{0x80};  // the sign bit of scale 0
  CHECK(decode_status_everywhere(uniform_quantizer<bf16>(p), negative, 100) == named(errc::malformed_payload));
  std::vector<std::byte> too_large = bf;
  too_large[envelope::size + 4 * 4] = std::byte{0xff};  // codes 0 and 1 (after the 4 scales) both 15
  CHECK(decode_status_everywhere(uniform_quantizer<bf16>(p), too_large, 100) == named(errc::malformed_payload));
  for (std::size_t length = 0; length < bf.size(); ++length) {
    const std::vector<std::byte> prefix(bf.begin(), bf.begin() + static_cast<std::ptrdiff_t>(length));
    CHECK(decode_status_everywhere(uniform_quantizer<bf16>(p), prefix, 100) != "no exception");
  }
}
