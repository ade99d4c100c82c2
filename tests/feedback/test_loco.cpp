// LoCo around the uniform quantizer: every message byte and the final state against a literal
// transcription of the update rule (docs/feedback.md §8.1) written here, the periodic reset, failed
// steps leaving the state bit-identical, the saved state (layout, bit-identical continuation, every
// load error), the state's size per element, and the compensation measurably helping.
#include <gradcomp/feedback/loco.hpp>
#include <gradcomp/quantize/uniform.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
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
#include "support/errors.hpp"
#include "support/oracles.hpp"
#include "support/reference_check.hpp"

using namespace gradcomp;
using namespace gradcomp::test;

static_assert(stateful<loco<uniform_quantizer<float>>, cpu_executor>);
static_assert(stateful<loco<uniform_quantizer<double>>, cpu_executor>);
static_assert(codec<loco<uniform_quantizer<float>>>);
static_assert(loco<uniform_quantizer<float>>::id == codec_id::uniform);
static_assert(fuses_loco<uniform_quantizer<float>, cpu_executor>);
static_assert(!fuses_loco<uniform_quantizer<float>, reference_executor>);
static_assert(stateful<loco<uniform_quantizer<double>>, reference_executor>);

// The file's own namespace: its helpers share names with test_error_feedback.cpp's, which a unity
// batch compiles in the same translation unit.
namespace loco_tests {
namespace {

template <class T>
using uq = uniform_quantizer<T>;

/// One LoCo step with buffers sized as the wrapper asks; returns exactly the bytes written.
template <class Codec, class T>
std::vector<std::byte> loco_step(const loco<Codec>& lc, const std::vector<T>& grad, loco_state<T>& state,
                                 message_key key = {}) {
  const cpu_executor cpu;
  std::vector<std::byte> out(lc.max_encoded_bytes(grad.size()));
  std::vector<std::byte> ws(lc.workspace_bytes(cpu, grad.size()));
  out.resize(lc.encode(cpu, std::span<const T>(grad), state, out, ws, key));
  return out;
}

/// The object representation of a state: codes, scales, then both counters.
template <class T>
std::vector<std::byte> bits_of(const loco_state<T>& state) {
  const auto codes = std::as_bytes(std::span<const std::int8_t>(state.codes));
  const auto scales = std::as_bytes(std::span<const T>(state.scales));
  const std::uint64_t counters[] = {state.steps, state.total_steps};
  const auto counter_bytes = std::as_bytes(std::span<const std::uint64_t>(counters));
  std::vector<std::byte> bits(codes.begin(), codes.end());
  bits.insert(bits.end(), scales.begin(), scales.end());
  bits.insert(bits.end(), counter_bytes.begin(), counter_bytes.end());
  return bits;
}

/// The saved bytes of a state.
template <class Codec, class T>
std::vector<std::byte> saved(const loco<Codec>& lc, const loco_state<T>& state) {
  std::vector<std::byte> bytes(lc.saved_state_bytes(state.codes.size()));
  CHECK(lc.save_state(cpu_executor{}, state, bytes) == bytes.size());
  return bytes;
}

/// The gradient of step t: N(0, 1e-3) values, a fresh draw each step.
template <class T>
std::vector<T> gradient(std::size_t n, std::uint64_t t) {
  return make_input<T>(input_kind::normal, n, 4400 + t);
}

message_key key_of(std::uint64_t t) { return {.step = t, .tensor_id = 5}; }

// ---- the oracle: docs/feedback.md §8.1 transcribed line by line ------------------------------------

/// The LoCo update written out literally, with its own 8-bit error storage: per group of G values,
/// scale = max|v| / 127, code = clamp(nearbyint(v / scale), −127, 127), or scale 0 and codes 0 for
/// a group of zeros; dequant8 = code · scale.
template <class T>
struct loco_oracle {
  uq<T> inner;
  float beta;
  std::uint64_t period;
  std::size_t group;
  std::vector<int> code;
  std::vector<T> scale;
  std::uint64_t t = 0;

  loco_oracle(uq<T> q, float b, std::uint64_t reset_period, std::size_t g, std::size_t n)
      : inner(q), beta(b), period(reset_period), group(g), code(n, 0), scale((n + g - 1) / g, T{0}) {}

  T dequant8(std::size_t i) const { return rounded_product(static_cast<T>(code[i]), scale[i / group]); }

  void quant8(const std::vector<T>& v) {
    for (std::size_t j = 0; j < scale.size(); ++j) {
      const std::size_t begin = j * group, end = std::min(v.size(), begin + group);
      T m = 0;
      for (std::size_t i = begin; i < end; ++i) m = std::max(m, std::fabs(v[i]));
      scale[j] = m / T{127};
      for (std::size_t i = begin; i < end; ++i) {
        if (scale[j] == T{0}) {
          code[i] = 0;
        } else {
          const T r = std::nearbyint(v[i] / scale[j]);
          code[i] = static_cast<int>(std::clamp(r, T{-127}, T{127}));
        }
      }
    }
  }

  std::vector<std::byte> step(const std::vector<T>& g, message_key key) {
    const std::size_t n = g.size();
    if (t >= period) {  // if t ≥ T: e ← 0, t ← 0
      std::fill(code.begin(), code.end(), 0);
      std::fill(scale.begin(), scale.end(), T{0});
      t = 0;
    }
    std::vector<T> h(n);  // h = g + dequant8(e)
    for (std::size_t i = 0; i < n; ++i) h[i] = g[i] + dequant8(i);
    const std::vector<std::byte> q = encode_bytes(inner, h, key);  // q = Q_b(h)
    const std::vector<T> hhat = decode_values(inner, q, n);       // ĥ = D(q)
    const T b = static_cast<T>(beta);
    std::vector<T> v(n);  // e ← quant8(β·dequant8(e) + (1 − β)·(h − ĥ))
    for (std::size_t i = 0; i < n; ++i)
      v[i] = rounded_product(b, dequant8(i)) + rounded_product(T{1} - b, h[i] - hhat[i]);
    quant8(v);
    ++t;  // t ← t + 1
    return q;  // send q
  }
};

template <class T>
void check_against_oracle(const uq<T>& inner, loco_params params, std::size_t n, std::uint64_t steps,
                          const cpu_executor& cpu = {}) {
  const loco<uq<T>> lc(inner, params);
  auto state = lc.make_state(cpu, n);
  loco_oracle<T> oracle(inner, params.beta, params.reset_period, params.error_group, n);
  std::size_t differing_messages = 0;
  bool error_seen = false;
  for (std::uint64_t t = 0; t < steps; ++t) {
    const std::vector<T> g = gradient<T>(n, t);
    const std::vector<std::byte> expected = oracle.step(g, key_of(t));
    const std::vector<std::byte> got = loco_step(lc, g, state, key_of(t));
    if (got != expected) {
      if (differing_messages == 0) {
        CAPTURE(t);
        CHECK(got == expected);
      }
      ++differing_messages;
    }
    error_seen =
        error_seen || std::any_of(state.codes.begin(), state.codes.end(), [](std::int8_t c) { return c != 0; });
  }
  CHECK(differing_messages == 0);
  CHECK(error_seen);  // the error took part, so the messages are not the inner codec's of g alone
  std::vector<std::int8_t> oracle_codes(n);
  for (std::size_t i = 0; i < n; ++i) oracle_codes[i] = static_cast<std::int8_t>(oracle.code[i]);
  CHECK(state.codes == oracle_codes);
  CHECK(bitwise_equal(state.scales, oracle.scale));
  CHECK(state.steps == oracle.t);
  CHECK(state.total_steps == steps);
}

// A small saved state whose error is not zero: n = 5 floats, groups of 2, after 2 steps.
const loco<uq<float>> small_lc(uq<float>({.bits = 2, .block = 4}), {.beta = 0.5f, .reset_period = 7, .error_group = 2});
constexpr std::size_t small_n = 5;

loco_state<float> small_state() {
  auto state = small_lc.make_state(cpu_executor{}, small_n);
  loco_step(small_lc, std::vector<float>{0.5f, -2.0f, 0.25f, 3.0f, -0.125f}, state);
  loco_step(small_lc, std::vector<float>{1.0f, 0.75f, -1.5f, 0.5f, 2.0f}, state);
  return state;
}

/// A state with recognisable contents, the target of loads that must fail.
template <class T>
loco_state<T> sentinel_state(std::size_t n, std::size_t groups) {
  return {std::vector<std::int8_t>(n, std::int8_t{7}), std::vector<T>(groups, T{3}), 4, 42};
}

template <class U>
U read_at(const std::vector<std::byte>& bytes, std::size_t offset) {
  U value;
  std::memcpy(&value, bytes.data() + offset, sizeof value);
  return value;
}

/// Overwrites the header field at `offset` and rewrites the header CRC, so that only the later
/// checks can catch the change.
template <class U>
std::vector<std::byte> with_header_field(std::vector<std::byte> bytes, std::size_t offset, U value) {
  std::memcpy(bytes.data() + offset, &value, sizeof value);
  const std::uint32_t crc = crc32c(std::span(bytes).first(53));
  std::memcpy(bytes.data() + 53, &crc, sizeof crc);
  return bytes;
}

}  // namespace

TEST_CASE_TEMPLATE("LoCo matches a literal transcription of its update rule bit for bit", T, float, double) {
  SUBCASE("defaults: 4-bit uniform, beta 0.8, groups of 256, 30 steps of n = 5000") {
    check_against_oracle(uq<T>({.bits = 4}), {}, 5000, 30);
  }
  SUBCASE("beta 0.5, reset every 7 steps, groups of 100 and a partial group, 2-bit stochastic") {
    check_against_oracle(uq<T>({.bits = 2, .block = 64, .round = rounding::stochastic, .seed = 9}),
                         {.beta = 0.5f, .reset_period = 7, .error_group = 100}, 5050, 30);
  }
  SUBCASE("beta 0, groups of 1") { check_against_oracle(uq<T>({.bits = 4}), {.beta = 0.0f, .error_group = 1}, 777, 5); }
  // Groups equal to the quantizer's blocks take the fused one-pass path for float; a partial last
  // block whose length is not a multiple of 32 and resets exercise its scalar tails.
  const uq<T> sr8({.bits = 8, .block = 64, .round = rounding::stochastic, .seed = 4});
  const loco_params fused{.beta = 0.8f, .reset_period = 7, .error_group = 64};
  SUBCASE("fused layout: 8-bit stochastic, groups = blocks of 64, resets, n = 4099") {
    check_against_oracle(sr8, fused, 4099, 20);
  }
  SUBCASE("fused layout on the baseline kernels with streamed stores") {
    check_against_oracle(sr8, fused, 4099, 20,
                         cpu_executor{.max_simd = cpu_simd::baseline, .streaming_store_bytes = 0});
  }
  SUBCASE("fused layout: 4-bit round to nearest, groups = blocks of 256, streamed stores") {
    check_against_oracle(uq<T>({.bits = 4}), {}, 70001, 6, cpu_executor{.streaming_store_bytes = 0});
  }
}

TEST_CASE("LoCo zeroes the error at the step where t reaches reset_period") {
  const std::size_t n = 1000;
  const uq<float> inner({.bits = 4});
  const loco<uq<float>> lc(inner, {.reset_period = 5});
  const cpu_executor cpu;
  auto state = lc.make_state(cpu, n);
  for (std::uint64_t t = 0; t < 5; ++t) {
    loco_step(lc, gradient<float>(n, t), state, key_of(t));
    CHECK(state.steps == t + 1);
  }
  REQUIRE(std::any_of(state.codes.begin(), state.codes.end(), [](std::int8_t c) { return c != 0; }));

  // Step 6 starts from e = 0: it sends the inner codec's message of g itself, and leaves the state
  // a fresh wrapper would have after that one gradient.
  const std::vector<float> g = gradient<float>(n, 5);
  const std::vector<std::byte> message = loco_step(lc, g, state, key_of(5));
  CHECK(message == encode_bytes(inner, g, key_of(5)));
  auto fresh = lc.make_state(cpu, n);
  loco_step(lc, g, fresh, key_of(5));
  CHECK(state.codes == fresh.codes);
  CHECK(bitwise_equal(state.scales, fresh.scales));
  CHECK(state.steps == 1);
  CHECK(state.total_steps == 6);

  // …and the next reset comes 5 steps later, not before.
  for (std::uint64_t t = 6; t < 10; ++t) {
    const std::vector<float> next = gradient<float>(n, t);
    CHECK(loco_step(lc, next, state, key_of(t)) != encode_bytes(inner, next, key_of(t)));
  }
  CHECK(state.steps == 5);
  const std::vector<float> last = gradient<float>(n, 10);
  CHECK(loco_step(lc, last, state, key_of(10)) == encode_bytes(inner, last, key_of(10)));
  CHECK(state.steps == 1);
  CHECK(state.total_steps == 11);
}

TEST_CASE("LoCo messages are the inner codec's") {
  const uq<float> inner({.bits = 4});
  const loco<uq<float>> lc(inner);
  const cpu_executor cpu;
  const std::size_t n = 1000;
  CHECK(lc.max_encoded_bytes(n) == inner.max_encoded_bytes(n));
  CHECK(lc.params_hash() == inner.params_hash());
  CHECK(lc.workspace_bytes(cpu, n) >= inner.workspace_bytes(cpu, n) + 2 * n * sizeof(float));
  CHECK(lc.params() == loco_params{.beta = 0.8f, .reset_period = 1024, .error_group = 256});

  const std::vector<float> g = gradient<float>(n, 1);
  auto state = lc.make_state(cpu, n);
  const std::vector<std::byte> message = loco_step(lc, g, state);
  CHECK(message == encode_bytes(inner, g));  // e starts at zero

  std::vector<std::byte> ws(lc.workspace_bytes(cpu, n));
  std::vector<float> decoded(n, 1.0f), accumulated(n, 1.0f);
  lc.decode(cpu, message, std::span<float>(decoded), ws);
  lc.decode_accumulate(cpu, message, std::span<float>(accumulated), ws);
  const std::vector<float> expected = decode_values(inner, message, n);
  CHECK(bitwise_equal(decoded, expected));
  bool sums = true;
  for (std::size_t i = 0; i < n; ++i) sums = sums && accumulated[i] == 1.0f + expected[i];
  CHECK(sums);
}

TEST_CASE("LoCo rejects invalid parameters") {
  const auto make = [](loco_params p) { return thrown_by([&] { loco<uq<float>> lc(uq<float>{}, p); }); };
  CHECK(make({.beta = -0.1f}) == named(errc::invalid_argument));
  CHECK(make({.beta = 1.0f}) == named(errc::invalid_argument));
  CHECK(make({.beta = std::numeric_limits<float>::quiet_NaN()}) == named(errc::invalid_argument));
  CHECK(make({.reset_period = 0}) == named(errc::invalid_argument));
  CHECK(make({.error_group = 0}) == named(errc::invalid_argument));
  CHECK(make({.beta = 0.0f, .reset_period = 1, .error_group = 1}) == "no exception");
}

TEST_CASE_TEMPLATE("LoCo rejects NaN and Inf and keeps the state bit-identical", T, float, double) {
  const std::size_t n = 1000;
  // reset_period 3: after 3 steps a reset is due, and a failed step must not perform it.
  const loco<uq<T>> lc(uq<T>({.bits = 4}), {.reset_period = 3});
  const cpu_executor cpu;
  auto state = lc.make_state(cpu, n);
  for (std::uint64_t t = 0; t < 3; ++t) loco_step(lc, gradient<T>(n, t), state, key_of(t));
  const std::vector<std::byte> before = bits_of(state);
  std::vector<std::byte> ws(lc.workspace_bytes(cpu, n));
  const T specials[] = {std::numeric_limits<T>::quiet_NaN(), -std::numeric_limits<T>::quiet_NaN(),
                        std::numeric_limits<T>::infinity(), -std::numeric_limits<T>::infinity()};
  for (const std::size_t index : {std::size_t{0}, std::size_t{517}, n - 1}) {
    for (const T special : specials) {
      CAPTURE(index);
      CAPTURE(special);
      std::vector<T> g = gradient<T>(n, 3);
      g[index] = special;
      std::vector<std::byte> out(lc.max_encoded_bytes(n), std::byte{0xAB});
      CHECK(thrown_by([&] { lc.encode(cpu, std::span<const T>(g), state, out, ws, key_of(3)); }) ==
            named(errc::non_finite_input));
      CHECK(bits_of(state) == before);
      CHECK(std::all_of(out.begin(), out.end(), [](std::byte b) { return b == std::byte{0xAB}; }));
    }
  }

  SUBCASE("g + e overflows") {
    const T big = std::numeric_limits<T>::max();
    auto loaded = lc.make_state(cpu, n);
    loaded.codes[600] = 127;
    loaded.scales[600 / 256] = uniform_step(big, 8);  // dequant8 ≈ max
    std::vector<T> g = gradient<T>(n, 0);
    g[600] = big * T{0.75};
    const std::vector<std::byte> loaded_bits = bits_of(loaded);
    CHECK(thrown_by([&] { loco_step(lc, g, loaded); }) == named(errc::non_finite_input));
    CHECK(bits_of(loaded) == loaded_bits);
  }
}

TEST_CASE("LoCo keeps the state when a buffer is too small or the sizes differ") {
  const std::size_t n = 1000;
  const loco<uq<float>> lc(uq<float>({.bits = 4}));
  const cpu_executor cpu;
  auto state = lc.make_state(cpu, n);
  for (std::uint64_t t = 0; t < 3; ++t) loco_step(lc, gradient<float>(n, t), state);
  const std::vector<std::byte> before = bits_of(state);
  const std::vector<float> g = gradient<float>(n, 3);
  std::vector<std::byte> out(lc.max_encoded_bytes(n));
  std::vector<std::byte> ws(lc.workspace_bytes(cpu, n));

  std::vector<std::byte> small_out(100);
  CHECK(thrown_by([&] { lc.encode(cpu, std::span<const float>(g), state, small_out, ws); }) ==
        named(errc::buffer_too_small));
  std::vector<std::byte> small_ws(100);
  CHECK(thrown_by([&] { lc.encode(cpu, std::span<const float>(g), state, out, small_ws); }) ==
        named(errc::workspace_too_small));
  const std::vector<float> longer = gradient<float>(n + 1, 3);
  CHECK(thrown_by([&] { lc.encode(cpu, std::span<const float>(longer), state, out, ws); }) ==
        named(errc::size_mismatch));
  CHECK(bits_of(state) == before);

  // A state made for another error group.
  const loco<uq<float>> other_group(uq<float>({.bits = 4}), {.error_group = 100});
  CHECK(thrown_by([&] { other_group.encode(cpu, std::span<const float>(g), state, out, ws); }) ==
        named(errc::size_mismatch));
  CHECK(bits_of(state) == before);
}

TEST_CASE_TEMPLATE("LoCo resumes bit-identically from a saved state", T, float, double) {
  const std::size_t n = 3001;
  // Reset every 4 steps, so a reset falls both before and after the checkpoint.
  const loco<uq<T>> lc(uq<T>({.bits = 4, .round = rounding::stochastic, .seed = 3}),
                       {.beta = 0.8f, .reset_period = 4, .error_group = 128});
  const cpu_executor cpu;
  std::vector<std::vector<std::byte>> straight_messages;
  auto straight = lc.make_state(cpu, n);
  for (std::uint64_t t = 0; t < 12; ++t)
    straight_messages.push_back(loco_step(lc, gradient<T>(n, t), straight, key_of(t)));

  auto first_half = lc.make_state(cpu, n);
  for (std::uint64_t t = 0; t < 6; ++t) loco_step(lc, gradient<T>(n, t), first_half, key_of(t));
  const std::vector<std::byte> checkpoint = saved(lc, first_half);
  auto resumed = lc.make_state(cpu, n);
  lc.load_state(cpu, checkpoint, resumed);
  CHECK(bits_of(resumed) == bits_of(first_half));
  for (std::uint64_t t = 6; t < 12; ++t) {
    CAPTURE(t);
    CHECK(loco_step(lc, gradient<T>(n, t), resumed, key_of(t)) == straight_messages[t]);
  }
  CHECK(resumed.total_steps == 12);
  CHECK(bits_of(resumed) == bits_of(straight));
}

TEST_CASE("LoCo saves its state in the documented layout") {
  const auto state = small_state();
  REQUIRE(std::any_of(state.codes.begin(), state.codes.end(), [](std::int8_t c) { return c != 0; }));
  const std::vector<std::byte> bytes = saved(small_lc, state);
  const std::size_t groups = 3;
  REQUIRE(bytes.size() == 57 + small_n + groups * sizeof(float) + 4);
  CHECK(std::memcmp(bytes.data(), "GCLC", 4) == 0);
  CHECK(read_at<std::uint16_t>(bytes, 4) == 1);
  CHECK(read_at<std::uint16_t>(bytes, 6) == static_cast<std::uint16_t>(codec_id::uniform));
  CHECK(read_at<std::uint8_t>(bytes, 8) == static_cast<std::uint8_t>(value_dtype::float32));
  CHECK(read_at<std::uint64_t>(bytes, 9) == small_n);
  CHECK(read_at<std::uint64_t>(bytes, 17) == 2);
  CHECK(read_at<std::uint64_t>(bytes, 25) == 2);
  CHECK(read_at<std::uint64_t>(bytes, 33) == small_lc.params_hash());
  CHECK(read_at<float>(bytes, 41) == 0.5f);
  CHECK(read_at<std::uint32_t>(bytes, 45) == 7);
  CHECK(read_at<std::uint32_t>(bytes, 49) == 2);
  CHECK(read_at<std::uint32_t>(bytes, 53) == crc32c(std::span(bytes).first(53)));
  for (std::size_t i = 0; i < small_n; ++i) CHECK(read_at<std::int8_t>(bytes, 57 + i) == state.codes[i]);
  std::vector<float> scales(groups);
  for (std::size_t j = 0; j < groups; ++j) scales[j] = read_at<float>(bytes, 57 + small_n + 4 * j);
  CHECK(bitwise_equal(scales, state.scales));
  CHECK(read_at<std::uint32_t>(bytes, 74) == crc32c(std::span(bytes).subspan(57, 17)));

  std::vector<std::byte> short_buffer(bytes.size() - 1);
  CHECK(thrown_by([&] { small_lc.save_state(cpu_executor{}, state, short_buffer); }) == named(errc::buffer_too_small));
}

TEST_CASE("LoCo rejects damaged or mismatched saved states and keeps the target state") {
  const cpu_executor cpu;
  const std::vector<std::byte> good = saved(small_lc, small_state());
  auto target = sentinel_state<float>(small_n, 3);
  const std::vector<std::byte> untouched = bits_of(target);
  const auto load = [&](const auto& lc, const std::vector<std::byte>& bytes, auto& state) {
    return thrown_by([&] { lc.load_state(cpu, bytes, state); });
  };

  SUBCASE("every truncation, and one byte too many") {
    for (std::size_t length = 0; length < good.size(); ++length) {
      CAPTURE(length);
      const std::vector<std::byte> prefix(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(length));
      CHECK(load(small_lc, prefix, target) == named(errc::truncated));
    }
    std::vector<std::byte> longer = good;
    longer.push_back(std::byte{0});
    CHECK(load(small_lc, longer, target) == named(errc::trailing_bytes));
  }

  SUBCASE("every single-bit flip") {
    for (std::size_t bit = 0; bit < good.size() * 8; ++bit) {
      const std::size_t byte = bit / 8;
      const errc expected = byte < 4    ? errc::bad_magic
                            : byte < 6  ? errc::unsupported_version
                            : byte < 57 ? errc::header_checksum
                                        : errc::payload_checksum;
      std::vector<std::byte> flipped = good;
      flipped[byte] ^= std::byte{static_cast<unsigned char>(1u << (bit % 8))};
      const std::string outcome = load(small_lc, flipped, target);
      if (outcome != named(expected)) {
        CAPTURE(bit);
        CHECK(outcome == named(expected));
      }
    }
  }

  SUBCASE("another element count, codec, value type or parameters") {
    auto shorter = sentinel_state<float>(small_n - 1, 2);
    auto longer = sentinel_state<float>(small_n + 1, 3);
    CHECK(load(small_lc, good, shorter) == named(errc::size_mismatch));
    CHECK(load(small_lc, good, longer) == named(errc::size_mismatch));
    CHECK(bits_of(shorter) == bits_of(sentinel_state<float>(small_n - 1, 2)));
    CHECK(bits_of(longer) == bits_of(sentinel_state<float>(small_n + 1, 3)));
    auto wrong_scales = sentinel_state<float>(small_n, 2);  // not made by make_state for this group
    CHECK(load(small_lc, good, wrong_scales) == named(errc::size_mismatch));
    CHECK(bits_of(wrong_scales) == bits_of(sentinel_state<float>(small_n, 2)));

    // The header's codec id and dtype, changed behind a valid header CRC.
    CHECK(load(small_lc, with_header_field<std::uint16_t>(good, 6, 2), target) == named(errc::codec_mismatch));
    const loco<uq<double>> other_dtype(uq<double>({.bits = 2, .block = 4}),
                                       {.beta = 0.5f, .reset_period = 7, .error_group = 2});
    auto double_target = sentinel_state<double>(small_n, 3);
    CHECK(load(other_dtype, good, double_target) == named(errc::dtype_mismatch));
    CHECK(bits_of(double_target) == bits_of(sentinel_state<double>(small_n, 3)));

    const loco_params p = small_lc.params();
    const loco<uq<float>> other_inner(uq<float>({.bits = 4, .block = 4}), p);
    CHECK(load(other_inner, good, target) == named(errc::parameter_mismatch));
    const loco<uq<float>> other_beta(small_lc.inner(), {.beta = 0.8f, .reset_period = 7, .error_group = 2});
    CHECK(load(other_beta, good, target) == named(errc::parameter_mismatch));
    const loco<uq<float>> other_period(small_lc.inner(), {.beta = 0.5f, .reset_period = 8, .error_group = 2});
    CHECK(load(other_period, good, target) == named(errc::parameter_mismatch));
    const loco<uq<float>> other_group(small_lc.inner(), {.beta = 0.5f, .reset_period = 7, .error_group = 3});
    auto group3_target = sentinel_state<float>(small_n, 2);
    CHECK(load(other_group, good, group3_target) == named(errc::parameter_mismatch));
  }

  SUBCASE("a huge element count behind a valid header CRC") {
    const auto huge = with_header_field<std::uint64_t>(good, 9, std::numeric_limits<std::uint64_t>::max());
    CHECK(load(small_lc, huge, target) == named(errc::size_mismatch));
  }

  SUBCASE("an out-of-range code or scale behind a valid payload CRC") {
    const auto with_payload_byte = [&](std::size_t offset, std::uint8_t value) {
      std::vector<std::byte> bytes = good;
      bytes[offset] = std::byte{value};
      const std::uint32_t crc = crc32c(std::span(bytes).subspan(57, 17));
      std::memcpy(bytes.data() + 74, &crc, sizeof crc);
      return bytes;
    };
    CHECK(load(small_lc, with_payload_byte(59, 0x80), target) == named(errc::malformed_payload));  // code −128
    CHECK(load(small_lc, with_payload_byte(57 + small_n + 3, 0x80), target) ==
          named(errc::malformed_payload));  // sign bit of scale 0
    CHECK(load(small_lc, with_payload_byte(57 + small_n + 7, 0x7F), target) ==
          named(errc::malformed_payload));  // scale 1 becomes NaN or Inf
  }

  CHECK(bits_of(target) == untouched);
  small_lc.load_state(cpu, good, target);
  CHECK(bits_of(target) == bits_of(small_state()));
}

TEST_CASE("LoCo state takes at most 1.1 bytes per element") {
  const std::size_t n = std::size_t{1} << 20;
  const loco<uq<float>> lc(uq<float>({.bits = 4}));
  const auto state = lc.make_state(cpu_executor{}, n);
  const std::size_t bytes = state.codes.size() * sizeof(std::int8_t) + state.scales.size() * sizeof(float);
  const double per_element = static_cast<double>(bytes) / static_cast<double>(n);
  MESSAGE("LoCo state bytes per element, n = 2^20, groups of 256: " << per_element);
  CHECK(bytes == n + 4 * (n / 256));
  CHECK(per_element == doctest::Approx(1.015625));
  CHECK(per_element <= 1.1);
  CHECK(lc.state_bytes_per_element(n) == per_element);
  CHECK(lc.state_bytes_per_element(0) == 0.0);
}

TEST_CASE("LoCo makes decoded sums track gradient sums better than the bare quantizer") {
  // ‖Σ_t D(q_t) − Σ_t g_t‖ over 200 steps of fresh N(0, 1e-3) gradients, 2-bit inner quantizer.
  // Without compensation the per-step errors add up like a random walk (∝ √200); with LoCo the sum
  // telescopes, Σ(D(q_t) − g_t) = −(e_T − e_0)/(1 − β) + the 8-bit rounding of e, so it stays bounded.
  const std::size_t n = 4096;
  const std::uint64_t steps = 200;
  const uq<float> inner({.bits = 2});
  const loco<uq<float>> lc(inner);
  const cpu_executor cpu;
  auto state = lc.make_state(cpu, n);
  std::vector<double> sum_g(n, 0.0), sum_plain(n, 0.0), sum_loco(n, 0.0);
  for (std::uint64_t t = 0; t < steps; ++t) {
    const std::vector<float> g = gradient<float>(n, t);
    const std::vector<float> plain = decode_values(inner, encode_bytes(inner, g), n);
    const std::vector<float> compensated = decode_values(inner, loco_step(lc, g, state), n);
    for (std::size_t i = 0; i < n; ++i) {
      sum_g[i] += static_cast<double>(g[i]);
      sum_plain[i] += static_cast<double>(plain[i]);
      sum_loco[i] += static_cast<double>(compensated[i]);
    }
  }
  double plain_gap = 0.0, loco_gap = 0.0;
  for (std::size_t i = 0; i < n; ++i) {
    plain_gap += (sum_plain[i] - sum_g[i]) * (sum_plain[i] - sum_g[i]);
    loco_gap += (sum_loco[i] - sum_g[i]) * (sum_loco[i] - sum_g[i]);
  }
  plain_gap = std::sqrt(plain_gap);
  loco_gap = std::sqrt(loco_gap);
  MESSAGE("||sum d - sum g||: bare 2-bit " << plain_gap << ", LoCo " << loco_gap << ", ratio " << loco_gap / plain_gap);
  CHECK(loco_gap < 0.5 * plain_gap);
}

TEST_CASE("LoCo steps, saves and restores an empty tensor") {
  const loco<uq<double>> lc(uq<double>({.bits = 4}));
  const cpu_executor cpu;
  auto state = lc.make_state(cpu, 0);
  const std::vector<std::byte> message = loco_step(lc, std::vector<double>{}, state);
  CHECK(decode_values(lc.inner(), message, 0).empty());
  CHECK(state.steps == 1);
  const std::vector<std::byte> bytes = saved(lc, state);
  CHECK(bytes.size() == 57 + 4);
  auto restored = sentinel_state<double>(0, 0);
  lc.load_state(cpu, bytes, restored);
  CHECK(restored.steps == 1);
  CHECK(restored.total_steps == 1);
}

TEST_CASE("LoCo's carried error is the dequantized 8-bit error, and a new one is stored within half a step") {
  const std::size_t n = 1000;  // groups of 256: three full, one of 232
  const loco<uq<float>> lc(uq<float>({.bits = 4}));
  const cpu_executor cpu;
  auto state = lc.make_state(cpu, n);
  for (std::uint64_t t = 0; t < 4; ++t) loco_step(lc, gradient<float>(n, t), state, key_of(t));
  std::vector<float> carried(n);
  lc.carried_error(cpu, state, carried);
  for (std::size_t i = 0; i < n; ++i) REQUIRE(carried[i] == static_cast<float>(state.codes[i]) * state.scales[i / 256]);

  // Setting what it carries keeps every code and scale.
  const std::vector<std::byte> before = bits_of(state);
  lc.set_carried_error(cpu, std::span<const float>(carried), state);
  CHECK(bits_of(state) == before);

  // A new error: per group s = max|x| / 127, each value within s/2; the counters are kept.
  std::vector<float> error = gradient<float>(n, 50);
  std::fill(error.begin() + 256, error.begin() + 512, 0.0f);  // an all-zero group reads back as zeros
  lc.set_carried_error(cpu, std::span<const float>(error), state);
  CHECK(state.steps == 4);
  CHECK(state.total_steps == 4);
  lc.carried_error(cpu, state, carried);
  for (std::size_t begin = 0; begin < n; begin += 256) {
    const std::size_t end = std::min(n, begin + 256);
    float largest = 0.0f;
    for (std::size_t i = begin; i < end; ++i) largest = std::max(largest, std::fabs(error[i]));
    const double half_step = static_cast<double>(largest) / 127.0 / 2.0;
    for (std::size_t i = begin; i < end; ++i) {
      CAPTURE(i);
      const double gap = std::fabs(static_cast<double>(carried[i]) - static_cast<double>(error[i]));
      REQUIRE(gap <= half_step * (1.0 + 1e-6));
    }
  }
  for (std::size_t i = 256; i < 512; ++i) REQUIRE(std::bit_cast<std::uint32_t>(carried[i]) == 0u);

  const std::vector<std::byte> kept = bits_of(state);
  error[999] = std::numeric_limits<float>::infinity();
  CHECK(thrown_by([&] { lc.set_carried_error(cpu, std::span<const float>(error), state); }) ==
        named(errc::non_finite_input));
  error.pop_back();
  CHECK(thrown_by([&] { lc.set_carried_error(cpu, std::span<const float>(error), state); }) ==
        named(errc::size_mismatch));
  CHECK(thrown_by([&] { lc.carried_error(cpu, state, std::span<float>(error)); }) == named(errc::size_mismatch));
  CHECK(bits_of(state) == kept);
}

TEST_CASE("LoCo on every cpu setting equals the reference step by step, fused paths and resets included") {
  const loco_params period4{.beta = 0.8f, .reset_period = 4, .error_group = 256};
  check_steps_same_as_reference(loco(uq<float>({.bits = 4}), period4), 5000, 10, 1.0, 5);
  check_steps_same_as_reference(loco(uq<float>({.bits = 8, .block = 64, .round = rounding::stochastic, .seed = 5}),
                                     {.beta = 0.5f, .reset_period = 3, .error_group = 64}),
                                4099, 8);
  check_steps_same_as_reference(loco(uq<double>({.bits = 4})), 3000, 6, 1.0, 2);
  check_steps_same_as_reference(loco(uq<float>({.bits = 4}), {.error_group = 100}), 3000, 6);  // groups ≠ blocks
  // Gradients near FLT_MAX/16: the fused step declines and the plain step runs.
  check_steps_same_as_reference(loco(uq<float>({.bits = 4})), 2000, 4, 1e40);
  for (const std::size_t n : edge_sizes) {
    CAPTURE(n);
    check_steps_same_as_reference(loco(uq<float>({.bits = 8})), n, 3);
  }
}

}  // namespace loco_tests
