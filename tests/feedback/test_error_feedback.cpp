// Error feedback around the sparsifiers: the EF invariant against sums accumulated by the test,
// the top-k residual against a full-sort oracle, failed steps leaving the state bit-identical, and
// the saved state (its documented layout, bit-identical continuation, every load error); the
// decayed residual against a plain loop of the test's, around the sparsifiers and quantizers.
#include <gradcomp/feedback/error_feedback.hpp>
#include <gradcomp/quantize/sign.hpp>
#include <gradcomp/quantize/uniform.hpp>
#include <gradcomp/sparsify/randomk.hpp>
#include <gradcomp/sparsify/threshold.hpp>
#include <gradcomp/sparsify/topk.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "support/codec_io.hpp"
#include "support/data.hpp"
#include "support/ef_invariant.hpp"
#include "support/errors.hpp"
#include "support/oracles.hpp"
#include "support/reference_check.hpp"

using namespace gradcomp;
using namespace gradcomp::test;

static_assert(stateful<error_feedback<topk_sparsifier<float>>, cpu_executor>);
static_assert(stateful<error_feedback<randomk_sparsifier<double>>, cpu_executor>);
static_assert(stateful<error_feedback<threshold_sparsifier<float>>, cpu_executor>);
static_assert(codec<error_feedback<topk_sparsifier<float>>>);
static_assert(error_feedback<threshold_sparsifier<double>>::id == codec_id::threshold);
// The fused step exists where it is written (cpu/uniform_feedback.hpp) and nowhere else.
static_assert(fuses_error_feedback<uniform_quantizer<float>, cpu_executor>);
static_assert(!fuses_error_feedback<uniform_quantizer<float>, reference_executor>);
static_assert(!fuses_error_feedback<uniform_quantizer<double>, cpu_executor>);
static_assert(!fuses_error_feedback<topk_sparsifier<float>, cpu_executor>);
static_assert(stateful<error_feedback<topk_sparsifier<float>>, reference_executor>);

namespace {

/// One EF step with buffers sized as the wrapper asks; returns exactly the bytes written.
template <class Codec, class T>
std::vector<std::byte> ef_step(const error_feedback<Codec>& ef, const std::vector<T>& grad,
                               error_feedback_state<T>& state, message_key key = {}) {
  const cpu_executor cpu;
  std::vector<std::byte> out(ef.max_encoded_bytes(grad.size()));
  std::vector<std::byte> ws(ef.workspace_bytes(cpu, grad.size()));
  out.resize(ef.encode(cpu, std::span<const T>(grad), state, out, ws, key));
  return out;
}

/// The object representation of a state: residual bytes, then the step counter.
template <class T>
std::vector<std::byte> bits_of(const error_feedback_state<T>& state) {
  const auto residual = std::as_bytes(std::span<const T>(state.residual));
  const auto steps = std::as_bytes(std::span<const std::uint64_t>(&state.steps, 1));
  std::vector<std::byte> bits(residual.begin(), residual.end());
  bits.insert(bits.end(), steps.begin(), steps.end());
  return bits;
}

/// The saved bytes of a state.
template <class Codec, class T>
std::vector<std::byte> saved(const error_feedback<Codec>& ef, const error_feedback_state<T>& state) {
  std::vector<std::byte> bytes(ef.saved_state_bytes(state.residual.size()));
  CHECK(ef.save_state(cpu_executor{}, state, bytes) == bytes.size());
  return bytes;
}

/// The gradient of step t: N(0, 1e-3) values, a fresh draw each step.
template <class T>
std::vector<T> gradient(std::size_t n, std::uint64_t t) {
  return make_input<T>(input_kind::normal, n, 9000 + t);
}

message_key key_of(std::uint64_t t) { return {.step = t, .tensor_id = 3}; }

template <class T>
void check_invariant_for_all_codecs(std::size_t n) {
  constexpr std::uint64_t steps = 50;
  SUBCASE("top-k 1%") { check_ef_invariant(topk_sparsifier<T>(sparsity{.density = 0.01}), n, steps, 9000, 3); }
  SUBCASE("random-k 5%, unscaled") {
    check_ef_invariant(randomk_sparsifier<T>({.amount = {.density = 0.05}, .seed = 11, .scaled = false}), n, steps,
                       9000, 3);
  }
  // Decoding as value·n/k makes a_t − d_t round. The residual of a sent element becomes −19·a_t, so
  // it grows over the steps (EF with an unbiased scaled codec does); the invariant still holds.
  SUBCASE("random-k 5%, scaled by n/k") {
    check_ef_invariant(randomk_sparsifier<T>({.amount = {.density = 0.05}, .seed = 11}), n, steps, 9000, 3);
  }
  SUBCASE("threshold 1%") {
    check_ef_invariant(threshold_sparsifier<T>({.target = {.density = 0.01}, .seed = 5}), n, steps, 9000, 3);
  }
}

// Runs 10 steps straight, and again with the state saved after 5 and restored into a fresh state;
// both runs must write the same bytes and end in the same state.
template <class Codec>
void check_continuation(const Codec& inner, std::size_t n, error_feedback_params params = {}) {
  using T = typename Codec::value_type;
  const error_feedback<Codec> ef(inner, params);
  const cpu_executor cpu;
  std::vector<std::vector<std::byte>> straight_messages;
  auto straight = ef.make_state(cpu, n);
  for (std::uint64_t t = 0; t < 10; ++t)
    straight_messages.push_back(ef_step(ef, gradient<T>(n, t), straight, key_of(t)));

  auto first_half = ef.make_state(cpu, n);
  for (std::uint64_t t = 0; t < 5; ++t) ef_step(ef, gradient<T>(n, t), first_half, key_of(t));
  const std::vector<std::byte> checkpoint = saved(ef, first_half);
  auto resumed = ef.make_state(cpu, n);
  ef.load_state(cpu, checkpoint, resumed);
  CHECK(bits_of(resumed) == bits_of(first_half));
  for (std::uint64_t t = 5; t < 10; ++t) {
    CAPTURE(t);
    CHECK(ef_step(ef, gradient<T>(n, t), resumed, key_of(t)) == straight_messages[t]);
  }
  CHECK(resumed.steps == 10);
  CHECK(bits_of(resumed) == bits_of(straight));
}

// Runs `steps` steps of error feedback with decay `decay` on `exec` and, beside it, the definition
// as a plain loop of the test's: a = g + e, the inner codec's own message of a, and
// e = fl(β·(a − its decoding)), the product rounded through a volatile store (so no contraction
// into a multiply-add can change it). Every message and every residual must match bit for bit.
template <class Codec>
void check_decay_against_loop(const Codec& inner, double decay, std::size_t n, std::uint64_t steps,
                              const cpu_executor& exec = {}) {
  using T = typename Codec::value_type;
  const error_feedback<Codec> ef(inner, {.decay = decay});
  const T beta = static_cast<T>(decay);
  auto state = ef.make_state(exec, n);
  std::vector<T> residual(n, T{0}), a(n);
  std::uint64_t wrong_messages = 0, wrong_residuals = 0;
  for (std::uint64_t t = 0; t < steps; ++t) {
    const std::vector<T> g = make_input<T>(t % 4 == 3 ? input_kind::ties : input_kind::normal, n, 300 + t);
    for (std::size_t i = 0; i < n; ++i) a[i] = g[i] + residual[i];
    const std::vector<std::byte> expected = encode_bytes(inner, a, key_of(t));
    const std::vector<T> decoded = decode_values(inner, expected, n);
    for (std::size_t i = 0; i < n; ++i) {
      volatile T product = beta * (a[i] - decoded[i]);
      residual[i] = product;
    }
    std::vector<std::byte> out(ef.max_encoded_bytes(n));
    std::vector<std::byte> ws(ef.workspace_bytes(exec, n));
    out.resize(ef.encode(exec, std::span<const T>(g), state, out, ws, key_of(t)));
    wrong_messages += static_cast<std::uint64_t>(out != expected);
    wrong_residuals += static_cast<std::uint64_t>(!bitwise_equal(state.residual, residual));
  }
  CHECK(wrong_messages == 0);
  CHECK(wrong_residuals == 0);
  CHECK(state.steps == steps);
  // The comparison has teeth: the codec leaves some residual.
  CHECK(std::any_of(residual.begin(), residual.end(), [](T v) { return v != T{0}; }));
}

// Steps a few times, then checks that NaN and ±Inf at `index` of the gradient are rejected with the
// state bit-identical and the output untouched, so the inner codec never ran.
template <class Codec>
void check_non_finite_gradient(const error_feedback<Codec>& ef, std::size_t n, std::size_t index) {
  using T = typename Codec::value_type;
  const cpu_executor cpu;
  auto state = ef.make_state(cpu, n);
  for (std::uint64_t t = 0; t < 3; ++t) ef_step(ef, gradient<T>(n, t), state, key_of(t));
  const std::vector<std::byte> before = bits_of(state);
  std::vector<std::byte> ws(ef.workspace_bytes(cpu, n));
  const T specials[] = {std::numeric_limits<T>::quiet_NaN(), -std::numeric_limits<T>::quiet_NaN(),
                        std::numeric_limits<T>::infinity(), -std::numeric_limits<T>::infinity()};
  for (const T special : specials) {
    CAPTURE(special);
    std::vector<T> g = gradient<T>(n, 3);
    g[index] = special;
    std::vector<std::byte> out(ef.max_encoded_bytes(n), std::byte{0xAB});
    CHECK(thrown_by([&] { ef.encode(cpu, std::span<const T>(g), state, out, ws, key_of(3)); }) ==
          named(errc::non_finite_input));
    CHECK(bits_of(state) == before);
    CHECK(std::all_of(out.begin(), out.end(), [](std::byte b) { return b == std::byte{0xAB}; }));
  }
}

// A small saved state whose residual is not zero: n = 5 floats, top-k keeping 2, after 2 steps.
const error_feedback<topk_sparsifier<float>> small_ef(topk_sparsifier<float>(sparsity{.k = 2}));
constexpr std::size_t small_n = 5;

error_feedback_state<float> small_state() {
  auto state = small_ef.make_state(cpu_executor{}, small_n);
  ef_step(small_ef, std::vector<float>{0.5f, -2.0f, 0.25f, 3.0f, -0.125f}, state);
  ef_step(small_ef, std::vector<float>{1.0f, 0.75f, -1.5f, 0.5f, 2.0f}, state);
  return state;
}

/// A state with recognisable contents, the target of loads that must fail.
template <class T>
error_feedback_state<T> sentinel_state(std::size_t n) {
  return {std::vector<T>(n, T{7}), std::vector<T>(n, T{9}), 42};
}

template <class U>
U read_at(const std::vector<std::byte>& bytes, std::size_t offset) {
  U value;
  std::memcpy(&value, bytes.data() + offset, sizeof value);
  return value;
}

}  // namespace

TEST_CASE_TEMPLATE("error feedback keeps sum of decoded messages plus residual equal to sum of gradients", T, float,
                   double) {
  check_invariant_for_all_codecs<T>(std::is_same_v<T, float> ? 10007 : 1000);
}

TEST_CASE_TEMPLATE("error feedback with top-k leaves exactly the unsent values after one step", T, float, double) {
  const std::size_t n = std::is_same_v<T, float> ? 10007 : 1000;
  const error_feedback<topk_sparsifier<T>> ef(topk_sparsifier<T>(sparsity{.density = 0.01}));
  for (const input_kind kind : {input_kind::normal, input_kind::ties}) {
    CAPTURE(name(kind));
    const std::vector<T> g = make_input<T>(kind, n, 77);
    auto state = ef.make_state(cpu_executor{}, n);
    const std::vector<std::byte> message = ef_step(ef, g, state);

    const std::vector<std::size_t> kept = topk_indices_oracle<T>(g, ef.inner().k(n));
    std::vector<T> unsent = g;
    for (const std::size_t i : kept) unsent[i] = T{0};
    CHECK(bitwise_equal(state.residual, unsent));
    CHECK(bitwise_equal(decode_values(ef.inner(), message, n), dense_at<T>(g, kept)));
    CHECK(state.steps == 1);
  }
}

TEST_CASE("error feedback messages are the inner codec's") {
  const topk_sparsifier<float> inner(sparsity{.density = 0.05});
  const error_feedback<topk_sparsifier<float>> ef(inner);
  const cpu_executor cpu;
  const std::size_t n = 1000;
  CHECK(ef.max_encoded_bytes(n) == inner.max_encoded_bytes(n));
  CHECK(ef.params_hash() == inner.params_hash());
  CHECK(ef.workspace_bytes(cpu, n) >= inner.workspace_bytes(cpu, n) + n * sizeof(float));

  const std::vector<float> g = gradient<float>(n, 1);
  auto state = ef.make_state(cpu, n);
  const std::vector<std::byte> message = ef_step(ef, g, state);
  CHECK(message == encode_bytes(inner, g));

  std::vector<std::byte> ws(ef.workspace_bytes(cpu, n));
  std::vector<float> decoded(n, 1.0f), accumulated(n, 1.0f);
  ef.decode(cpu, message, std::span<float>(decoded), ws);
  ef.decode_accumulate(cpu, message, std::span<float>(accumulated), ws);
  const std::vector<float> expected = decode_values(inner, message, n);
  CHECK(bitwise_equal(decoded, expected));
  bool sums = true;
  for (std::size_t i = 0; i < n; ++i) sums = sums && accumulated[i] == 1.0f + expected[i];
  CHECK(sums);
}

TEST_CASE_TEMPLATE("error feedback rejects NaN and Inf before the codec runs and keeps the state", T, float, double) {
  const std::size_t n = 1000;
  const error_feedback<topk_sparsifier<T>> ef(topk_sparsifier<T>(sparsity{.k = 10}));
  const cpu_executor cpu;

  SUBCASE("in the gradient") {
    check_non_finite_gradient(ef, n, 123);
    // Random-k does not inspect the values it does not send, so only the wrapper's check can reject
    // one at an unsent index: π(k) is the first index not sent.
    const randomk_sparsifier<T> randomk({.amount = {.k = 10}, .seed = 11});
    const auto unsent = static_cast<std::size_t>(randomk.permutation(n, key_of(3))(10));
    check_non_finite_gradient(error_feedback<randomk_sparsifier<T>>(randomk), n, unsent);
  }

  SUBCASE("in gradient + residual, which overflows") {
    const T big = std::numeric_limits<T>::max();
    std::vector<T> g = gradient<T>(n, 0);
    for (std::size_t i = 0; i < 10; ++i) g[i] = big * static_cast<T>(0.9);  // the 10 kept values
    g[500] = big * T{0.75};  // unsent, so carried in the residual
    auto state = ef.make_state(cpu, n);
    ef_step(ef, g, state);
    REQUIRE(state.residual[500] == big * T{0.75});
    const std::vector<std::byte> before = bits_of(state);
    std::vector<T> next = gradient<T>(n, 1);
    next[500] = big * T{0.75};  // finite, but 1.5·max once the residual is added
    CHECK(thrown_by([&] { ef_step(ef, next, state); }) == named(errc::non_finite_input));
    CHECK(bits_of(state) == before);
  }
}

TEST_CASE("error feedback keeps the state when a buffer is too small or the sizes differ") {
  const std::size_t n = 1000;
  const error_feedback<topk_sparsifier<float>> ef(topk_sparsifier<float>(sparsity{.density = 0.01}));
  const cpu_executor cpu;
  auto state = ef.make_state(cpu, n);
  for (std::uint64_t t = 0; t < 3; ++t) ef_step(ef, gradient<float>(n, t), state);
  const std::vector<std::byte> before = bits_of(state);
  const std::vector<float> g = gradient<float>(n, 3);
  std::vector<std::byte> out(ef.max_encoded_bytes(n));
  std::vector<std::byte> ws(ef.workspace_bytes(cpu, n));

  std::vector<std::byte> small_out(100);
  CHECK(thrown_by([&] { ef.encode(cpu, std::span<const float>(g), state, small_out, ws); }) ==
        named(errc::buffer_too_small));
  CHECK(bits_of(state) == before);

  std::vector<std::byte> small_ws(100);
  CHECK(thrown_by([&] { ef.encode(cpu, std::span<const float>(g), state, out, small_ws); }) ==
        named(errc::workspace_too_small));
  CHECK(bits_of(state) == before);

  const std::vector<float> longer = gradient<float>(n + 1, 3);
  CHECK(thrown_by([&] { ef.encode(cpu, std::span<const float>(longer), state, out, ws); }) ==
        named(errc::size_mismatch));
  CHECK(thrown_by([&] { ef.encode(cpu, std::span<const float>(g).first(n - 1), state, out, ws); }) ==
        named(errc::size_mismatch));
  CHECK(bits_of(state) == before);
}

TEST_CASE("error feedback resumes bit-identically from a saved state") {
  SUBCASE("top-k float") { check_continuation(topk_sparsifier<float>(sparsity{.density = 0.01}), 10007); }
  SUBCASE("random-k double") {
    check_continuation(randomk_sparsifier<double>({.amount = {.density = 0.05}, .seed = 11}), 1000);
  }
  SUBCASE("threshold float") {
    check_continuation(threshold_sparsifier<float>({.target = {.density = 0.01}, .seed = 5}), 10007);
  }
}

TEST_CASE("error feedback saves its state in the documented layout") {
  const auto state = small_state();
  const std::vector<std::byte> bytes = saved(small_ef, state);
  REQUIRE(bytes.size() == 37 + small_n * sizeof(float) + 4);
  CHECK(std::memcmp(bytes.data(), "GCEF", 4) == 0);
  CHECK(read_at<std::uint16_t>(bytes, 4) == 1);
  CHECK(read_at<std::uint16_t>(bytes, 6) == static_cast<std::uint16_t>(codec_id::topk));
  CHECK(read_at<std::uint8_t>(bytes, 8) == static_cast<std::uint8_t>(value_dtype::float32));
  CHECK(read_at<std::uint64_t>(bytes, 9) == small_n);
  CHECK(read_at<std::uint64_t>(bytes, 17) == 2);
  CHECK(read_at<std::uint64_t>(bytes, 25) == small_ef.params_hash());
  CHECK(read_at<std::uint32_t>(bytes, 33) == crc32c(std::span(bytes).first(33)));
  std::vector<float> values(small_n);
  for (std::size_t i = 0; i < small_n; ++i) values[i] = read_at<float>(bytes, 37 + 4 * i);
  CHECK(bitwise_equal(values, state.residual));
  CHECK(read_at<std::uint32_t>(bytes, 57) == crc32c(std::span(bytes).subspan(37, 20)));

  std::vector<std::byte> short_buffer(bytes.size() - 1);
  CHECK(thrown_by([&] { small_ef.save_state(cpu_executor{}, state, short_buffer); }) == named(errc::buffer_too_small));
}

TEST_CASE("error feedback rejects damaged or mismatched saved states and keeps the target state") {
  const cpu_executor cpu;
  const std::vector<std::byte> good = saved(small_ef, small_state());
  auto target = sentinel_state<float>(small_n);
  const std::vector<std::byte> untouched = bits_of(target);
  const auto load = [&](const auto& ef, const std::vector<std::byte>& bytes, auto& state) {
    return thrown_by([&] { ef.load_state(cpu, bytes, state); });
  };

  SUBCASE("every truncation, and one byte too many") {
    for (std::size_t length = 0; length < good.size(); ++length) {
      CAPTURE(length);
      const std::vector<std::byte> prefix(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(length));
      CHECK(load(small_ef, prefix, target) == named(errc::truncated));
    }
    std::vector<std::byte> longer = good;
    longer.push_back(std::byte{0});
    CHECK(load(small_ef, longer, target) == named(errc::trailing_bytes));
  }

  SUBCASE("every single-bit flip") {
    for (std::size_t bit = 0; bit < good.size() * 8; ++bit) {
      const std::size_t byte = bit / 8;
      const errc expected = byte < 4    ? errc::bad_magic
                            : byte < 6  ? errc::unsupported_version
                            : byte < 37 ? errc::header_checksum
                                        : errc::payload_checksum;
      std::vector<std::byte> flipped = good;
      flipped[byte] ^= std::byte{static_cast<unsigned char>(1u << (bit % 8))};
      const std::string outcome = load(small_ef, flipped, target);
      if (outcome != named(expected)) {
        CAPTURE(bit);
        CHECK(outcome == named(expected));
      }
    }
  }

  SUBCASE("another element count, codec, value type or parameters") {
    auto shorter = sentinel_state<float>(small_n - 1);
    auto longer = sentinel_state<float>(small_n + 1);
    CHECK(load(small_ef, good, shorter) == named(errc::size_mismatch));
    CHECK(load(small_ef, good, longer) == named(errc::size_mismatch));
    CHECK(bits_of(shorter) == bits_of(sentinel_state<float>(small_n - 1)));
    CHECK(bits_of(longer) == bits_of(sentinel_state<float>(small_n + 1)));

    const error_feedback<randomk_sparsifier<float>> other_codec(randomk_sparsifier<float>({.amount = {.k = 2}}));
    CHECK(load(other_codec, good, target) == named(errc::codec_mismatch));

    const error_feedback<topk_sparsifier<double>> other_dtype(topk_sparsifier<double>(sparsity{.k = 2}));
    auto double_target = sentinel_state<double>(small_n);
    CHECK(load(other_dtype, good, double_target) == named(errc::dtype_mismatch));
    CHECK(bits_of(double_target) == bits_of(sentinel_state<double>(small_n)));

    const error_feedback<topk_sparsifier<float>> other_params(topk_sparsifier<float>(sparsity{.k = 3}));
    CHECK(load(other_params, good, target) == named(errc::parameter_mismatch));
  }

  SUBCASE("a huge element count behind a valid header CRC") {
    std::vector<std::byte> huge = good;
    const std::uint64_t n = std::numeric_limits<std::uint64_t>::max();
    std::memcpy(huge.data() + 9, &n, sizeof n);
    const std::uint32_t crc = crc32c(std::span(huge).first(33));
    std::memcpy(huge.data() + 33, &crc, sizeof crc);
    CHECK(load(small_ef, huge, target) == named(errc::size_mismatch));
  }

  SUBCASE("a NaN or infinite residual behind a valid payload CRC") {
    const float specials[] = {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN(),
                              std::numeric_limits<float>::signaling_NaN(), std::numeric_limits<float>::infinity(),
                              -std::numeric_limits<float>::infinity()};
    for (std::size_t i = 0; i < small_n; ++i)
      for (const float special : specials) {
        CAPTURE(i);
        std::vector<std::byte> bytes = good;
        std::memcpy(bytes.data() + 37 + 4 * i, &special, sizeof special);
        const std::uint32_t crc = crc32c(std::span(bytes).subspan(37, 4 * small_n));
        std::memcpy(bytes.data() + 37 + 4 * small_n, &crc, sizeof crc);
        CHECK(load(small_ef, bytes, target) == named(errc::malformed_payload));
      }
    // The largest finite magnitudes still load.
    std::vector<std::byte> bytes = good;
    const float largest[] = {std::numeric_limits<float>::max(), -std::numeric_limits<float>::max()};
    std::memcpy(bytes.data() + 37, largest, sizeof largest);
    const std::uint32_t crc = crc32c(std::span(bytes).subspan(37, 4 * small_n));
    std::memcpy(bytes.data() + 37 + 4 * small_n, &crc, sizeof crc);
    auto loaded = sentinel_state<float>(small_n);
    small_ef.load_state(cpu, bytes, loaded);
    CHECK(loaded.residual[0] == std::numeric_limits<float>::max());
    CHECK(loaded.residual[1] == -std::numeric_limits<float>::max());
  }

  CHECK(bits_of(target) == untouched);
  small_ef.load_state(cpu, good, target);
  CHECK(bits_of(target) == bits_of(small_state()));
}

TEST_CASE("error feedback steps, saves and restores an empty tensor") {
  const error_feedback<topk_sparsifier<double>> ef(topk_sparsifier<double>(sparsity{.density = 0.01}));
  const cpu_executor cpu;
  auto state = ef.make_state(cpu, 0);
  const std::vector<std::byte> message = ef_step(ef, std::vector<double>{}, state);
  CHECK(decode_values(ef.inner(), message, 0).empty());
  CHECK(state.steps == 1);
  const std::vector<std::byte> bytes = saved(ef, state);
  CHECK(bytes.size() == 37 + 4);
  auto restored = sentinel_state<double>(0);
  ef.load_state(cpu, bytes, restored);
  CHECK(restored.steps == 1);
}

TEST_CASE("error feedback around the float uniform quantizer sends C(g + e) and keeps g + e minus its decoding") {
  // The one-pass path (8-bit, 4-bit round to nearest, 8-bit stochastic) against the definition,
  // computed by the test: a = g + e, the quantizer's own message of a, e = a − its decoding.
  using uq = uniform_quantizer<float>;
  const cpu_executor settings[] = {{},
                                   {.max_simd = cpu_simd::baseline, .streaming_store_bytes = 0},
                                   {.streaming_store_bytes = 0}};
  struct config {
    uniform_params params;
    std::size_t n;
  };
  const config configs[] = {{{.bits = 8}, 70001},
                            {{.bits = 8, .block = 64, .round = rounding::stochastic, .seed = 2}, 4099},
                            {{.bits = 4, .block = 32}, 1000},
                            {{.bits = 8, .block = 32}, 31}};
  for (const config& c : configs) {
    for (const cpu_executor& exec : settings) {
      const uq inner(c.params);
      const error_feedback<uq> ef{inner};
      const auto step = [&](const std::vector<float>& g, error_feedback_state<float>& state, std::uint64_t t) {
        std::vector<std::byte> out(ef.max_encoded_bytes(c.n));
        std::vector<std::byte> ws(ef.workspace_bytes(exec, c.n));
        out.resize(ef.encode(exec, std::span<const float>(g), state, out, ws, key_of(t)));
        return out;
      };
      auto state = ef.make_state(exec, c.n);
      std::vector<float> residual(c.n, 0.0f), a(c.n);
      bool messages_equal = true, residuals_equal = true;
      for (std::uint64_t t = 0; t < 6; ++t) {
        const std::vector<float> g = make_input<float>(input_kind::normal, c.n, 100 + t);
        for (std::size_t i = 0; i < c.n; ++i) a[i] = g[i] + residual[i];
        const std::vector<std::byte> expected = encode_bytes(inner, a, key_of(t));
        const std::vector<float> decoded = decode_values(inner, expected, c.n);
        for (std::size_t i = 0; i < c.n; ++i) residual[i] = a[i] - decoded[i];
        messages_equal = messages_equal && step(g, state, t) == expected;
        residuals_equal = residuals_equal && bitwise_equal(state.residual, residual);
      }
      CAPTURE(c.params.bits);
      CAPTURE(c.params.block);
      CAPTURE(c.n);
      CAPTURE(static_cast<int>(exec.max_simd));
      CHECK(messages_equal);
      CHECK(residuals_equal);
      CHECK(state.steps == 6);

      // NaN in the last element is found only after every other block has been coded: the message
      // is left without an envelope, the state as it was, and the next step continues as if the
      // failed one had not been tried.
      std::vector<float> bad = make_input<float>(input_kind::normal, c.n, 7);
      bad.back() = std::numeric_limits<float>::quiet_NaN();
      const std::vector<std::byte> before = bits_of(state);
      std::vector<std::byte> out(ef.max_encoded_bytes(c.n), std::byte{0xAB});
      std::vector<std::byte> ws(ef.workspace_bytes(exec, c.n));
      CHECK(thrown_by([&] { ef.encode(exec, std::span<const float>(bad), state, out, ws, key_of(6)); }) ==
            named(errc::non_finite_input));
      CHECK(bits_of(state) == before);
      CHECK(thrown_by([&] { (void)decode_values(inner, out, c.n); }) == named(errc::bad_magic));
      const std::vector<float> g = make_input<float>(input_kind::normal, c.n, 106);
      for (std::size_t i = 0; i < c.n; ++i) a[i] = g[i] + residual[i];
      CHECK(step(g, state, 6) == encode_bytes(inner, a, key_of(6)));
    }
  }
}

TEST_CASE("error feedback rejects a step whose new residual would overflow, keeps the state and leaves no message") {
  // 1-bit stochastic rounding decodes a value to ±s, s = max|a| of its block, with either sign: a
  // value of −m/2 decoded to +m leaves −1.5·m, which overflows for m near the largest float.
  const uniform_quantizer<float> inner({.bits = 1, .block = 64, .round = rounding::stochastic, .seed = 5});
  const error_feedback<uniform_quantizer<float>> ef(inner);
  const cpu_executor cpu;
  const std::size_t n = 256;
  auto state = ef.make_state(cpu, n);
  ef_step(ef, gradient<float>(n, 0), state, key_of(0));
  const std::vector<std::byte> before = bits_of(state);
  const float m = std::numeric_limits<float>::max() * 0.9f;
  std::vector<float> g(n, -m / 2);
  g[0] = m;
  // The test's own check that the draw does send some −m/2 as +m (so the residual overflows).
  const std::vector<float> decoded = decode_values(inner,
                                                   encode_bytes(
                                                       inner,
                                                       [&] {
                                                         std::vector<float> a(n);
                                                         for (std::size_t i = 0; i < n; ++i)
                                                           a[i] = g[i] + state.residual[i];
                                                         return a;
                                                       }(),
                                                       key_of(1)),
                                                   n);
  REQUIRE(std::count(decoded.begin(), decoded.end(), decoded[0]) > 1);
  for (const cpu_executor& exec : {cpu_executor{}, cpu_executor{.max_simd = cpu_simd::baseline}}) {
    std::vector<std::byte> out(ef.max_encoded_bytes(n), std::byte{0xAB});
    std::vector<std::byte> ws(ef.workspace_bytes(exec, n));
    CHECK(thrown_by([&] { (void)ef.encode(exec, std::span<const float>(g), state, out, ws, key_of(1)); }) ==
          named(errc::non_finite_input));
    CHECK(thrown_by([&] { (void)parse_envelope(out); }) != "no exception");  // no message passes for this step
    CHECK(bits_of(state) == before);
    CHECK(state.steps == 1);
  }
  // The reference refuses it alike.
  auto reference_state = ef.make_state(reference_executor{}, n);
  reference_state.residual = state.residual;
  std::vector<std::byte> out(ef.max_encoded_bytes(n), std::byte{0xAB});
  std::vector<std::byte> ws(ef.workspace_bytes(reference_executor{}, n));
  CHECK(thrown_by([&] {
          (void)ef.encode(reference_executor{}, std::span<const float>(g), reference_state, out, ws, key_of(1));
        }) == named(errc::non_finite_input));
  CHECK(thrown_by([&] { (void)parse_envelope(out); }) != "no exception");
}

TEST_CASE("step_rollback undoes an error-feedback step without copying the residual") {
  const error_feedback<topk_sparsifier<float>> ef(topk_sparsifier<float>(sparsity{.density = 0.01}));
  const cpu_executor cpu;
  const std::size_t n = 1000;
  auto state = ef.make_state(cpu, n);
  for (std::uint64_t t = 0; t < 3; ++t) ef_step(ef, gradient<float>(n, t), state, key_of(t));
  const std::vector<std::byte> before = bits_of(state);

  SUBCASE("after a step that succeeded") {
    step_rollback<error_feedback_state<float>> rollback(state);
    ef_step(ef, gradient<float>(n, 3), state, key_of(3));
    REQUIRE(bits_of(state) != before);
    rollback.restore(state);
    CHECK(bits_of(state) == before);
    // The state steps on as if the undone step had never run.
    auto straight = ef.make_state(cpu, n);
    for (std::uint64_t t = 0; t < 3; ++t) ef_step(ef, gradient<float>(n, t), straight, key_of(t));
    CHECK(ef_step(ef, gradient<float>(n, 4), state, key_of(4)) ==
          ef_step(ef, gradient<float>(n, 4), straight, key_of(4)));
    CHECK(bits_of(state) == bits_of(straight));
  }
  SUBCASE("after a step that failed") {
    step_rollback<error_feedback_state<float>> rollback(state);
    std::vector<float> bad = gradient<float>(n, 3);
    bad[5] = std::numeric_limits<float>::infinity();
    CHECK(thrown_by([&] { ef_step(ef, bad, state, key_of(3)); }) == named(errc::non_finite_input));
    rollback.restore(state);
    CHECK(bits_of(state) == before);
  }
}

TEST_CASE("error feedback's carried error is the residual, and setting it steers the next message") {
  const std::size_t n = 1000;
  const topk_sparsifier<float> inner(sparsity{.density = 0.01});
  const error_feedback<topk_sparsifier<float>> ef(inner);
  const cpu_executor cpu;
  auto state = ef.make_state(cpu, n);
  for (std::uint64_t t = 0; t < 3; ++t) ef_step(ef, gradient<float>(n, t), state, key_of(t));
  std::vector<float> carried(n);
  ef.carried_error(cpu, state, carried);
  CHECK(carried == state.residual);

  // A new error, as a re-laid bucket would bring: the next message is the inner codec's encoding
  // of g + error, and the residual what it left.
  const std::vector<float> error = gradient<float>(n, 40);
  ef.set_carried_error(cpu, std::span<const float>(error), state);
  ef.carried_error(cpu, state, carried);
  CHECK(carried == error);
  CHECK(state.steps == 3);
  const std::vector<float> g = gradient<float>(n, 3);
  std::vector<float> h(n);
  for (std::size_t i = 0; i < n; ++i) h[i] = g[i] + error[i];
  std::vector<std::byte> expected(inner.max_encoded_bytes(n)), ws(inner.workspace_bytes(cpu, n));
  expected.resize(inner.encode(cpu, std::span<const float>(h), expected, ws, key_of(3)));
  CHECK(ef_step(ef, g, state, key_of(3)) == expected);

  const std::vector<std::byte> before = bits_of(state);
  std::vector<float> bad = error;
  bad[7] = std::numeric_limits<float>::quiet_NaN();
  CHECK(thrown_by([&] { ef.set_carried_error(cpu, std::span<const float>(bad), state); }) ==
        named(errc::non_finite_input));
  bad[7] = -std::numeric_limits<float>::infinity();
  CHECK(thrown_by([&] { ef.set_carried_error(cpu, std::span<const float>(bad), state); }) ==
        named(errc::non_finite_input));
  bad.pop_back();
  CHECK(thrown_by([&] { ef.set_carried_error(cpu, std::span<const float>(bad), state); }) ==
        named(errc::size_mismatch));
  CHECK(thrown_by([&] { ef.carried_error(cpu, state, std::span<float>(bad)); }) == named(errc::size_mismatch));
  CHECK(bits_of(state) == before);
}

TEST_CASE_TEMPLATE("error feedback with decay equals the test's loop bit for bit, sparsifiers and quantizers", T, float,
                   double) {
  const std::size_t n = std::is_same_v<T, float> ? 10007 : 1000;
  for (const double decay : {0.9, 0.5}) {
    CAPTURE(decay);
    SUBCASE("top-k 1%") { check_decay_against_loop(topk_sparsifier<T>(sparsity{.density = 0.01}), decay, n, 30); }
    SUBCASE("random-k 5%, scaled by n/k") {
      check_decay_against_loop(randomk_sparsifier<T>({.amount = {.density = 0.05}, .seed = 11}), decay, n, 30);
    }
    SUBCASE("threshold 1%") {
      check_decay_against_loop(threshold_sparsifier<T>({.target = {.density = 0.01}, .seed = 5}), decay, n, 30);
    }
    SUBCASE("uniform 4-bit, blocks of 33 (the reference path)") {
      check_decay_against_loop(uniform_quantizer<T>({.bits = 4, .block = 33}), decay, n, 30);
    }
    SUBCASE("sign, blocks of 64") { check_decay_against_loop(sign_quantizer<T>({.block = 64}), decay, n, 30); }
  }
}

TEST_CASE("error feedback with decay around the float uniform quantizer: the one-pass path equals the loop") {
  // AVX2 where the machine has it, the SSE2 baseline, streaming stores allowed (decay writes the
  // residual with ordinary stores) or not; block and element counts that leave scalar tails.
  const cpu_executor settings[] = {{},
                                   {.max_simd = cpu_simd::baseline, .streaming_store_bytes = 0},
                                   {.streaming_store_bytes = 0}};
  for (const cpu_executor& exec : settings) {
    CAPTURE(static_cast<int>(exec.max_simd));
    for (const double decay : {0.9, 0.5}) {
      CAPTURE(decay);
      check_decay_against_loop(uniform_quantizer<float>({.bits = 8}), decay, 70001, 12, exec);
      check_decay_against_loop(uniform_quantizer<float>({.bits = 4, .block = 32}), decay, 1000, 12, exec);
      check_decay_against_loop(uniform_quantizer<float>(
                                   {.bits = 8, .block = 64, .round = rounding::stochastic, .seed = 2}),
                               decay, 4099, 12, exec);
      check_decay_against_loop(uniform_quantizer<float>({.bits = 8, .block = 32}), decay, 31, 12, exec);
    }
  }
}

TEST_CASE_TEMPLATE("error feedback with decay: each residual is fl(β·(a − d)) and the decayed sums balance", T, float,
                   double) {
  const std::size_t n = std::is_same_v<T, float> ? 10007 : 1000;
  constexpr std::uint64_t steps = 50;
  for (const double decay : {0.9, 0.5}) {
    CAPTURE(decay);
    check_ef_invariant(topk_sparsifier<T>(sparsity{.density = 0.01}), n, steps, 9000, 3, cpu_executor{}, decay);
    check_ef_invariant(randomk_sparsifier<T>({.amount = {.density = 0.05}, .seed = 11}), n, steps, 9000, 3,
                       cpu_executor{}, decay);
    check_ef_invariant(threshold_sparsifier<T>({.target = {.density = 0.01}, .seed = 5}), n, steps, 9000, 3,
                       cpu_executor{}, decay);
    check_ef_invariant(uniform_quantizer<T>({.bits = 4}), n, steps, 9000, 3, cpu_executor{}, decay);
    check_ef_invariant(sign_quantizer<T>({.block = 64}), n, steps, 9000, 3, cpu_executor{}, decay);
  }
}

TEST_CASE("error feedback with decay sends the inner codec's messages and parameter hash") {
  const topk_sparsifier<float> inner(sparsity{.density = 0.05});
  const error_feedback<topk_sparsifier<float>> ef(inner, {.decay = 0.9});
  CHECK(ef.params().decay == 0.9);
  CHECK(ef.decay() == 0.9f);
  CHECK(ef.params_hash() == inner.params_hash());
  CHECK(ef.state_hash() != inner.params_hash());
  CHECK(error_feedback<topk_sparsifier<float>>(inner).state_hash() == inner.params_hash());
  CHECK(error_feedback<topk_sparsifier<float>>(inner, {.decay = 1.0}).state_hash() == inner.params_hash());
  const std::vector<float> g = gradient<float>(1000, 1);
  auto state = ef.make_state(cpu_executor{}, 1000);
  CHECK(ef_step(ef, g, state) == encode_bytes(inner, g));
}

TEST_CASE("error feedback rejects a decay that is not in 0 < β ≤ 1") {
  const topk_sparsifier<float> inner(sparsity{.k = 2});
  for (const double decay : {0.0, -0.0, -0.5, 1.0 + 1e-12, 2.0, std::numeric_limits<double>::quiet_NaN(),
                             std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity(),
                             1e-300 /* positive, but 0 as a float */}) {
    CAPTURE(decay);
    CHECK(thrown_by([&] { (void)error_feedback<topk_sparsifier<float>>(inner, {.decay = decay}); }) ==
          named(errc::invalid_argument));
  }
  CHECK(thrown_by([&] {
          (void)error_feedback<topk_sparsifier<double>>(topk_sparsifier<double>(sparsity{.k = 2}), {.decay = 1e-300});
        }) == "no exception");
  CHECK(thrown_by([&] { (void)error_feedback<topk_sparsifier<float>>(inner, {.decay = 1.0}); }) == "no exception");
}

TEST_CASE("error feedback with decay saves β in the state hash, resumes, and refuses another β") {
  SUBCASE("resumes bit-identically") {
    check_continuation(topk_sparsifier<float>(sparsity{.density = 0.01}), 10007, {.decay = 0.9});
    check_continuation(randomk_sparsifier<double>({.amount = {.density = 0.05}, .seed = 11}), 1000, {.decay = 0.5});
    check_continuation(uniform_quantizer<float>({.bits = 4}), 4099, {.decay = 0.9});
  }
  SUBCASE("the hash at offset 25 is the inner hash and β; other β are refused both ways") {
    const topk_sparsifier<float> inner(sparsity{.k = 2});
    const error_feedback<topk_sparsifier<float>> decayed(inner, {.decay = 0.9});
    const error_feedback<topk_sparsifier<float>> other(inner, {.decay = 0.5});
    auto state = decayed.make_state(cpu_executor{}, small_n);
    ef_step(decayed, std::vector<float>{0.5f, -2.0f, 0.25f, 3.0f, -0.125f}, state);
    const std::vector<std::byte> bytes = saved(decayed, state);
    REQUIRE(bytes.size() == 37 + small_n * sizeof(float) + 4);
    const float beta = 0.9f;
    CHECK(read_at<std::uint64_t>(bytes, 25) == params_hasher{}.add(inner.params_hash()).add(beta).value());
    CHECK(read_at<std::uint64_t>(bytes, 25) == decayed.state_hash());

    auto target = sentinel_state<float>(small_n);
    const std::vector<std::byte> untouched = bits_of(target);
    CHECK(thrown_by([&] { small_ef.load_state(cpu_executor{}, bytes, target); }) == named(errc::parameter_mismatch));
    CHECK(thrown_by([&] { other.load_state(cpu_executor{}, bytes, target); }) == named(errc::parameter_mismatch));
    const std::vector<std::byte> classic = saved(small_ef, small_state());
    CHECK(thrown_by([&] { decayed.load_state(cpu_executor{}, classic, target); }) == named(errc::parameter_mismatch));
    CHECK(bits_of(target) == untouched);
    decayed.load_state(cpu_executor{}, bytes, target);
    CHECK(bits_of(target) == bits_of(state));
  }
}

TEST_CASE("error feedback on every cpu setting equals the reference step by step, fused paths included") {
  // The float32 uniform quantizer's fused step (8-bit, 4-bit round to nearest, 8-bit stochastic),
  // its layouts that take the plain step, other codecs, decay, and a NaN step.
  check_steps_same_as_reference(error_feedback(uniform_quantizer<float>({.bits = 8})), 5000, 6, 1.0, 3);
  check_steps_same_as_reference(error_feedback(uniform_quantizer<float>({.bits = 4})), 4099, 6);
  check_steps_same_as_reference(error_feedback(uniform_quantizer<float>(
                                    {.bits = 8, .block = 64, .round = rounding::stochastic, .seed = 9})),
                                1000, 6);
  check_steps_same_as_reference(error_feedback(uniform_quantizer<float>({.bits = 4, .block = 100})), 1001, 4, 1.0, 2);
  check_steps_same_as_reference(error_feedback(uniform_quantizer<double>({.bits = 2, .block = 7})), 1001, 4);
  check_steps_same_as_reference(error_feedback(uniform_quantizer<float>({.bits = 8}), {.decay = 0.9}), 5000, 6, 1.0, 4);
  check_steps_same_as_reference(error_feedback(topk_sparsifier<float>(sparsity{.density = 0.01}), {.decay = 0.9}), 3000,
                                6, 1.0, 2);
  check_steps_same_as_reference(error_feedback(sign_quantizer<double>({.block = 64})), 1000, 4);
  check_steps_same_as_reference(error_feedback(threshold_sparsifier<float>({.target = {.density = 0.05}})), 2000, 4);
  for (const std::size_t n : edge_sizes) {
    CAPTURE(n);
    check_steps_same_as_reference(error_feedback(uniform_quantizer<float>({.bits = 8})), n, 3);
  }
}
