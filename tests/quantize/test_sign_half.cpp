// The sign quantizer on bf16 and fp16 gradients (docs/half-precision.md): every cpu_executor
// setting writes the reference's bytes and decodes them alike; the payload is the float32 sign
// quantizer's of the exactly widened values (sign bits and float32 mean magnitudes); a 16-bit
// output is the float32 value rounded, an accumulation sums in float32; NaN/±Inf and a wrong dtype
// get named errors.
#include <gradcomp/core/reference_executor.hpp>
#include <gradcomp/quantize/sign.hpp>

#include <doctest/doctest.h>

#include <cstdint>
#include <span>
#include <vector>

#include "support/codec_io.hpp"
#include "support/data.hpp"
#include "support/errors.hpp"
#include "support/executor_io.hpp"
#include "support/reference_check.hpp"

using namespace gradcomp;
using namespace gradcomp::test;

TEST_CASE_TEMPLATE("16-bit sign messages: every cpu setting writes the reference's bytes and decodes them alike", H,
                   bf16, fp16) {
  for (const std::uint32_t block : {std::uint32_t{7}, std::uint32_t{256}}) {
    CAPTURE(block);
    const sign_quantizer<H> q({.block = block});
    for (const input_kind kind : all_input_kinds) {
      for (const std::size_t n : edge_sizes) {
        CAPTURE(name(kind));
        CAPTURE(n);
        (void)check_same_as_reference(q, make_half_input<H>(kind, n, 700 + n), {.step = 1, .tensor_id = 3});
      }
    }
  }
}

TEST_CASE_TEMPLATE("a 16-bit sign message is the float32 one of the widened values, and decodes like it", H, bf16,
                   fp16) {
  const sign_params p{.block = 64};
  const std::size_t n = 5000;
  const std::vector<H> x = make_half_input<H>(input_kind::normal, n, 31, 20.0f);
  const std::vector<std::byte> m = encode_bytes(sign_quantizer<H>(p), x, {.step = 2});
  const std::vector<std::byte> f = encode_bytes(sign_quantizer<float>(p), widened(x), {.step = 2});
  CHECK(std::vector<std::byte>(m.begin() + 56, m.end()) == std::vector<std::byte>(f.begin() + 56, f.end()));
  CHECK(parse_envelope(m).dtype == dtype_of<H>);
  const std::vector<float> expected = decode_values(sign_quantizer<float>(p), f, n);
  std::vector<float> as_float(n);
  sign_quantizer<H>(p).decode(cpu_executor{}, m, std::span<float>(as_float), {});
  CHECK(bit_patterns(as_float) == bit_patterns(expected));
  const std::vector<H> acc = make_half_input<H>(input_kind::normal, n, 32, 20.0f);
  for (const cpu_executor& cpu : cpu_settings()) {
    const std::vector<H> as_half = decode_on(cpu, sign_quantizer<H>(p), m, poisoned_values<H>(n));
    const std::vector<H> summed = decode_on(cpu, sign_quantizer<H>(p), m, acc, true);
    bool rounded = true;
    for (std::size_t i = 0; i < n; ++i) {
      rounded = rounded && as_half[i].bits == narrow<H>(expected[i]).bits;
      rounded = rounded && summed[i].bits == narrow<H>(widen(acc[i]) + expected[i]).bits;
    }
    CHECK(rounded);
  }
}

TEST_CASE_TEMPLATE("16-bit sign rejects NaN and infinities, messages of another dtype, and overflowing sums", H, bf16,
                   fp16) {
  const sign_quantizer<H> q({.block = 32});
  std::vector<H> x = make_half_input<H>(input_kind::normal, 300, 3);
  x[100] = H{static_cast<std::uint16_t>(float_traits<H>::infinity_key + 1)};
  CHECK(encode_outcome_on(reference_executor{}, q, x).status == named(errc::non_finite_input));
  (void)check_same_as_reference(q, x, {.step = 1});
  const std::vector<H> y = make_half_input<H>(input_kind::normal, 300, 4);
  CHECK(decode_status_everywhere(sign_quantizer<float>({.block = 32}), encode_bytes(q, y), 300) ==
        named(errc::dtype_mismatch));
  const std::vector<H> big(64, H{static_cast<std::uint16_t>(float_traits<H>::infinity_key - 1)});
  const std::vector<std::byte> m = encode_bytes(q, big);
  for (const auto& result :
       {decode_outcome_on(reference_executor{}, q, m, big, true), decode_outcome_on(cpu_executor{}, q, m, big, true)}) {
    CHECK(result.status == named(errc::narrowing_overflow));
    CHECK(bit_patterns(result.output) == bit_patterns(big));
  }
}
