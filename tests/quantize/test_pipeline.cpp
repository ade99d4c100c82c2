// pipeline<Sparsifier, Quantizer>: the kept positions are the sparsifier's, the kept values are
// what the quantizer makes of them, and the composition works under error feedback.
#include <gradcomp/gradcomp.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "support/codec_io.hpp"
#include "support/data.hpp"
#include "support/errors.hpp"
#include "support/oracles.hpp"
#include "support/reference_check.hpp"

using namespace gradcomp;
using namespace gradcomp::test;

TEST_CASE_TEMPLATE("pipeline of top-k and a quantizer keeps top-k's positions with quantized values", T, float,
                   double) {
  for (const std::size_t n : {std::size_t{1}, std::size_t{7}, std::size_t{1000}, std::size_t{(1u << 16) + 1}}) {
    for (const int bits : {1, 4, 8}) {
      const std::vector<T> x = make_input<T>(input_kind::normal, n, 50 + n);
      const topk_sparsifier<T> topk(sparsity{.density = 0.05});
      const uniform_quantizer<T> q({.bits = bits, .block = 32, .round = rounding::stochastic, .seed = 4});
      const pipeline both(topk, q);
      const message_key key{.step = 6, .tensor_id = 1};
      const std::vector<std::byte> message = encode_bytes(both, x, key);
      CHECK(message.size() <= both.max_encoded_bytes(n));

      // Oracle: the full-sort top-k indices; their values through the quantizer alone, same key.
      const std::vector<std::size_t> kept = topk_indices_oracle<T>(x, static_cast<std::size_t>(topk.k(n)));
      std::vector<T> kept_values;
      for (const std::size_t i : kept) kept_values.push_back(x[i]);
      const std::vector<T> quantized = decode_values(q, encode_bytes(q, kept_values, key), kept_values.size());
      std::vector<T> expected(n, T{0});
      for (std::size_t j = 0; j < kept.size(); ++j) expected[kept[j]] = quantized[j];
      CAPTURE(n);
      CAPTURE(bits);
      CHECK(bitwise_equal(decode_values(both, message, n), expected));
    }
  }
}

TEST_CASE("pipeline of threshold and sign decodes to ± block means at the threshold's positions") {
  const std::vector<float> x = make_input<float>(input_kind::normal, 20000, 3);
  const pipeline both(threshold_sparsifier<float>({.target = {.density = 0.01}}), sign_quantizer<float>({.block = 64}));
  const std::vector<float> decoded = decode_values(both, encode_bytes(both, x), x.size());
  std::size_t nonzero = 0;
  bool signs_agree = true;
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (decoded[i] == 0.0f) continue;
    ++nonzero;
    signs_agree = signs_agree && std::signbit(decoded[i]) == std::signbit(x[i]);
  }
  CHECK(signs_agree);
  CHECK(nonzero >= 160);  // about 1% of 20000, within the threshold's density bounds
  CHECK(nonzero <= 250);
}

TEST_CASE("error feedback over top-k with 8-bit values keeps the sum of decoded messages plus residual") {
  const std::size_t n = 4000;
  const error_feedback ef(
      pipeline(topk_sparsifier<float>(sparsity{.density = 0.02}), uniform_quantizer<float>({.bits = 8})));
  const cpu_executor cpu;
  auto state = ef.make_state(cpu, n);
  std::vector<std::byte> message(ef.max_encoded_bytes(n)), ws(ef.workspace_bytes(cpu, n));
  std::vector<double> sent(n, 0.0), given(n, 0.0);
  std::vector<float> decoded(n);
  for (std::uint64_t step = 0; step < 20; ++step) {
    const std::vector<float> g = make_input<float>(input_kind::normal, n, 900 + step);
    const std::size_t bytes = ef.encode(cpu, std::span<const float>(g), state, message, ws, {.step = step});
    ef.decode(cpu, std::span<const std::byte>(message.data(), bytes), std::span<float>(decoded), ws);
    for (std::size_t i = 0; i < n; ++i) {
      sent[i] += decoded[i];
      given[i] += g[i];
    }
  }
  // Per step the residual update a − D(C(a)) is exact up to one float rounding of |a| ≤ ~2e-2
  // (20 steps of N(0, 1e-3) plus carried residual): 20 · 2^-24 · 2e-2 bounds the drift.
  double worst = 0.0;
  for (std::size_t i = 0; i < n; ++i) worst = std::max(worst, std::fabs(sent[i] + state.residual[i] - given[i]));
  CHECK(worst <= 20 * std::ldexp(1.0, -24) * 2e-2);
}

TEST_CASE("pipeline rejects NaN, other stages' messages and tampered nested messages") {
  const pipeline both(topk_sparsifier<float>(sparsity{.k = 10}), uniform_quantizer<float>({.bits = 8}));
  std::vector<float> x = make_input<float>(input_kind::normal, 500, 8);
  x[17] = std::numeric_limits<float>::quiet_NaN();
  CHECK(thrown_by([&] { encode_bytes(both, x); }) == named(errc::non_finite_input));
  x[17] = 0.5f;
  CHECK(thrown_by([&] { decode_values(both, encode_bytes(topk_sparsifier<float>(sparsity{.k = 10}), x), x.size()); }) ==
        named(errc::codec_mismatch));
  const pipeline other(topk_sparsifier<float>(sparsity{.k = 10}), uniform_quantizer<float>({.bits = 4}));
  CHECK(thrown_by([&] { decode_values(other, encode_bytes(both, x), x.size()); }) == named(errc::parameter_mismatch));
}

TEST_CASE("pipeline: every cpu setting writes the reference's bytes, rejects alike and decodes alike") {
  check_inputs_same_as_reference(
      pipeline(topk_sparsifier<float>(sparsity{.density = 0.1}), uniform_quantizer<float>({.bits = 8})));
  check_inputs_same_as_reference(pipeline(threshold_sparsifier<double>(), sign_quantizer<double>()));
  check_inputs_same_as_reference(
      pipeline(topk_sparsifier<float>(sparsity{.k = 50}), qsgd_quantizer<float>({.levels = 7, .seed = 2})));
  check_non_finite_same_as_reference(
      pipeline(topk_sparsifier<float>(sparsity{.k = 10}), uniform_quantizer<float>({.bits = 4})));
}

TEST_CASE("pipeline: a nested message of another step or tensor is rejected with step_mismatch, everywhere alike") {
  const pipeline both(topk_sparsifier<float>(sparsity{.k = 10}), uniform_quantizer<float>({.bits = 8}));
  const std::vector<float> x = make_input<float>(input_kind::normal, 500, 8);
  const std::vector<std::byte> message = encode_on(reference_executor{}, both, x, {.step = 5, .tensor_id = 2});
  // docs/wire-format.md §12.1: the nested message follows the count and the u32 list of 10 indices (40 bytes).
  const std::size_t nested_at = envelope::size + 8 + 40;
  REQUIRE(decode_status_everywhere(both, message, x.size()) == "no exception");
  for (const message_key other : {message_key{.step = 6, .tensor_id = 2}, message_key{.step = 5, .tensor_id = 3}}) {
    std::vector<std::byte> tampered = message;
    envelope nested = parse_envelope(std::span<const std::byte>(tampered).subspan(nested_at));
    nested.key = other;
    write_envelope(nested, std::span<std::byte>(tampered).subspan(nested_at));  // a valid header CRC
    CHECK(decode_status_everywhere(both, tampered, x.size()) == named(errc::step_mismatch));
  }
}
