// Exact top-k and threshold sparsification on bf16 and fp16 gradients (docs/half-precision.md): every cpu_executor setting
// writes the reference's bytes and decodes them alike; the kept indices are those of an
// independent oracle (a full sort of the widened magnitudes, ties to the lower index), the values
// travel as their own 16 bits (2 bytes each, the message size the layout documents); decoding
// into float32 widens them exactly, accumulation sums in float32 and a 16-bit accumulator rounds
// once or refuses an overflow with its output untouched; NaN/±Inf and a wrong dtype get named errors.
// The pipeline of 16-bit top-k and the 16-bit uniform quantizer decodes as its two stages do, and
// threshold sparsification of a 16-bit gradient keeps what the float32 one keeps of the widened values.
#include <gradcomp/core/reference_executor.hpp>
#include <gradcomp/pipeline.hpp>
#include <gradcomp/quantize/uniform.hpp>
#include <gradcomp/sparsify/threshold.hpp>
#include <gradcomp/sparsify/topk.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "support/codec_io.hpp"
#include "support/data.hpp"
#include "support/errors.hpp"
#include "support/executor_io.hpp"
#include "support/oracles.hpp"
#include "support/reference_check.hpp"

using namespace gradcomp;
using namespace gradcomp::test;

TEST_CASE_TEMPLATE("16-bit top-k: every cpu setting writes the reference's bytes and decodes them alike", H, bf16,
                   fp16) {
  for (const double density : {0.01, 0.1, 0.5, 1.0}) {
    CAPTURE(density);
    const topk_sparsifier<H> q(sparsity{.density = density});
    for (const input_kind kind : all_input_kinds) {
      for (const std::size_t n : edge_sizes) {
        CAPTURE(name(kind));
        CAPTURE(n);
        (void)check_same_as_reference(q, make_half_input<H>(kind, n, 300 + n), {.step = 2, .tensor_id = 5});
      }
    }
  }
}

TEST_CASE_TEMPLATE("16-bit top-k keeps the oracle's indices and sends each value's own 16 bits", H, bf16, fp16) {
  for (const std::size_t n : {std::size_t{1000}, std::size_t{70000}}) {
    for (const input_kind kind : {input_kind::normal, input_kind::ties}) {
      CAPTURE(n);
      CAPTURE(name(kind));
      const std::vector<H> x = make_half_input<H>(kind, n, 17, 100.0f);
      const std::size_t k = n / 50;
      const topk_sparsifier<H> q(sparsity{.k = k});
      const std::vector<std::byte> m = encode_bytes(q, x, {.step = 1});
      CHECK(m.size() == sparse_message_size_oracle(n, k, 2));
      CHECK(parse_envelope(m).dtype == dtype_of<H>);
      const std::vector<float> w = widened(x);
      const std::vector<std::size_t> kept = topk_indices_oracle<float>(w, k);
      const std::vector<float> expected = dense_at<float>(w, kept);
      // Into float32: the kept values widened, zeros elsewhere.
      std::vector<float> as_float(n, 3.0f);
      q.decode(cpu_executor{}, m, std::span<float>(as_float), {});
      CHECK(bitwise_equal(as_float, expected));
      // Into the 16-bit type: the same bits as the input at the kept indices, +0 elsewhere.
      const std::vector<H> as_half = decode_values(q, m, n);
      bool same = true;
      std::size_t at = 0;
      for (std::size_t i = 0; i < n; ++i) {
        const bool is_kept = at < kept.size() && kept[at] == i;
        same = same && as_half[i].bits == (is_kept ? x[i].bits : 0u);
        at += is_kept ? 1 : 0;
      }
      CHECK(same);
    }
  }
}

TEST_CASE_TEMPLATE("16-bit top-k accumulates in float32, and a 16-bit accumulator rounds once or refuses", H, bf16,
                   fp16) {
  const std::size_t n = 4000;
  const topk_sparsifier<H> q(sparsity{.density = 0.05});
  const std::vector<H> x = make_half_input<H>(input_kind::normal, n, 5, 1000.0f);
  const std::vector<std::byte> m = encode_bytes(q, x, {.step = 3});
  std::vector<float> values(n);
  q.decode(cpu_executor{}, m, std::span<float>(values), {});
  const std::vector<float> acc_float = widened(make_half_input<H>(input_kind::normal, n, 6, 1000.0f));
  const std::vector<H> acc_half = make_half_input<H>(input_kind::normal, n, 7, 1000.0f);
  for (const cpu_executor& cpu : cpu_settings()) {
    const std::vector<float> f = decode_on(cpu, q, m, acc_float, true);
    const std::vector<H> h = decode_on(cpu, q, m, acc_half, true);
    bool sums = true;
    for (std::size_t i = 0; i < n; ++i) {
      sums = sums && f[i] == acc_float[i] + values[i];
      sums = sums && h[i].bits == narrow<H>(widen(acc_half[i]) + values[i]).bits;
    }
    CHECK(sums);
  }
  CHECK(bit_patterns(decode_on(reference_executor{}, q, m, acc_half, true)) ==
        bit_patterns(decode_on(cpu_executor{}, q, m, acc_half, true)));
  // A 16-bit sum beyond the type's range: narrowing_overflow, nothing written, on both backends.
  const float largest = widen(H{static_cast<std::uint16_t>(float_traits<H>::infinity_key - 1)});
  const std::vector<H> big(n, narrow<H>(largest));
  const std::vector<std::byte> big_message = encode_bytes(q, big, {.step = 4});
  check_decode_refused_untouched(q, big_message, big, errc::narrowing_overflow, true);
}

TEST_CASE_TEMPLATE("16-bit top-k rejects NaN and infinities and messages of another dtype", H, bf16, fp16) {
  const topk_sparsifier<H> q(sparsity{.density = 0.1});
  for (const std::uint16_t bad :
       {std::uint16_t(float_traits<H>::infinity_key), std::uint16_t(0x8000u | float_traits<H>::infinity_key),
        std::uint16_t(float_traits<H>::infinity_key + 3)}) {
    std::vector<H> x = make_half_input<H>(input_kind::normal, 500, 9);
    x[250] = H{bad};
    CHECK(encode_outcome_on(reference_executor{}, q, x).status == named(errc::non_finite_input));
    (void)check_same_as_reference(q, x, {.step = 1});
  }
  const std::vector<H> x = make_half_input<H>(input_kind::normal, 500, 10);
  CHECK(decode_status_everywhere(topk_sparsifier<float>(sparsity{.density = 0.1}), encode_bytes(q, x), 500) ==
        named(errc::dtype_mismatch));
  CHECK(decode_status_everywhere(q, encode_bytes(topk_sparsifier<float>(sparsity{.density = 0.1}), widened(x)), 500) ==
        named(errc::dtype_mismatch));
}

TEST_CASE_TEMPLATE("a 16-bit pipeline (top-k, then 8-bit uniform codes of the kept values) decodes as its stages do", H,
                   bf16, fp16) {
  const pipeline<topk_sparsifier<H>, uniform_quantizer<H>> p(topk_sparsifier<H>(sparsity{.density = 0.05}),
                                                             uniform_quantizer<H>({.bits = 8, .block = 16}));
  for (const input_kind kind : all_input_kinds) {
    for (const std::size_t n : edge_sizes) {
      CAPTURE(name(kind));
      CAPTURE(n);
      (void)check_same_as_reference(p, make_half_input<H>(kind, n, 500 + n), {.step = 6, .tensor_id = 2});
    }
  }
  // The oracle: the uniform quantizer's float32 decoding of the kept values (the oracle's top-k
  // indices, in order) at those indices, zeros elsewhere; a 16-bit output is its rounding.
  const std::size_t n = 3000;
  const std::vector<H> x = make_half_input<H>(input_kind::normal, n, 77, 50.0f);
  const std::vector<std::size_t> kept = topk_indices_oracle<float>(widened(x), p.k(n));
  std::vector<H> kept_values;
  for (const std::size_t i : kept) kept_values.push_back(x[i]);
  const message_key key{.step = 9, .tensor_id = 1};
  std::vector<float> quantized(kept.size());
  p.quantize_stage().decode(cpu_executor{}, encode_bytes(p.quantize_stage(), kept_values, key),
                            std::span<float>(quantized), {});
  std::vector<float> expected(n, 0.0f);
  for (std::size_t j = 0; j < kept.size(); ++j) expected[kept[j]] = quantized[j];
  const std::vector<std::byte> m = encode_bytes(p, x, key);
  std::vector<std::byte> ws(p.workspace_bytes(cpu_executor{}, n));
  std::vector<float> as_float(n, 1.0f);
  p.decode(cpu_executor{}, m, std::span<float>(as_float), ws);
  CHECK(bitwise_equal(as_float, expected));
  const std::vector<H> as_half = decode_on(cpu_executor{}, p, m, poisoned_values<H>(n));
  bool rounded = true;
  for (std::size_t i = 0; i < n; ++i) rounded = rounded && as_half[i].bits == narrow<H>(as_float[i]).bits;
  CHECK(rounded);
}

TEST_CASE_TEMPLATE(
    "16-bit threshold sparsification: the reference's bytes, the float32 selection of the widened values", H, bf16,
    fp16) {
  for (const bool refine : {false, true}) {
    CAPTURE(refine);
    const threshold_params params{.target = {.density = 0.02}, .refine = refine, .seed = 4};
    const threshold_sparsifier<H> q(params);
    for (const input_kind kind : all_input_kinds) {
      for (const std::size_t n : edge_sizes) {
        CAPTURE(name(kind));
        CAPTURE(n);
        (void)check_same_as_reference(q, make_half_input<H>(kind, n, 900 + n), {.step = 3, .tensor_id = 1});
      }
    }
    // The same sample positions and the same order of magnitudes as the float32 sparsifier's on the
    // widened values, so the same kept elements; the oracle for the unrefined selection: every
    // element whose widened magnitude reaches the reported τ.
    const std::size_t n = 20000;
    const std::vector<H> x = make_half_input<H>(input_kind::normal, n, 41, 30.0f);
    std::vector<std::byte> m(q.max_encoded_bytes(n)), ws(q.workspace_bytes(cpu_executor{}, n));
    const threshold_report<H> report = q.encode_with_report(cpu_executor{}, std::span<const H>(x), m, ws, {.step = 2});
    m.resize(report.bytes);
    const threshold_sparsifier<float> f(params);
    const std::vector<float> w = widened(x);
    std::vector<float> from_half(n), from_float(n);
    q.decode(cpu_executor{}, m, std::span<float>(from_half), {});
    f.decode(cpu_executor{}, encode_bytes(f, w, {.step = 2}), std::span<float>(from_float), {});
    CHECK(bitwise_equal(from_half, from_float));
    if (!refine) {
      bool kept_as_documented = true;
      for (std::size_t i = 0; i < n; ++i)
        kept_as_documented = kept_as_documented && (std::fabs(w[i]) >= report.threshold) == (from_half[i] != 0.0f);
      CHECK(kept_as_documented);
    }
  }
}
