// The 16-bit value types against an independent oracle: every bf16 and fp16 bit pattern widened
// is the value its sign, exponent and mantissa fields denote (computed in double with std::ldexp);
// narrowing picks the nearest 16-bit value, ties to the even pattern, found by searching the
// sorted table of all finite 16-bit values, at every rounding boundary (each value, the midpoints
// between neighbours and one float ulp either side) and at random floats; NaN and ±Inf are kept;
// exact narrowing gives back every pattern widening made (NaN payloads too) and no other float;
// the CPU's bulk conversions give the scalar conversions' bits.
#include <gradcomp/core/float_bits.hpp>
#include <gradcomp/core/half_float.hpp>
#include <gradcomp/core/wire_envelope.hpp>
#include <gradcomp/cpu/detail/half_conversion.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <type_traits>
#include <unordered_set>
#include <vector>

using namespace gradcomp;

namespace {

// The layout of a 16-bit type: exponent and mantissa widths.
template <class H>
struct layout;
template <>
struct layout<bf16> {
  static constexpr int exponent_bits = 8, mantissa_bits = 7;
};
template <>
struct layout<fp16> {
  static constexpr int exponent_bits = 5, mantissa_bits = 10;
};

// The value a pattern denotes, from its fields (NaN for NaN patterns, ±Inf for infinities).
template <class H>
double field_value(std::uint16_t bits) {
  constexpr int e_bits = layout<H>::exponent_bits, m_bits = layout<H>::mantissa_bits;
  constexpr int bias = (1 << (e_bits - 1)) - 1;
  const int sign = bits >> 15;
  const int exponent = (bits >> m_bits) & ((1 << e_bits) - 1);
  const int mantissa = bits & ((1 << m_bits) - 1);
  double magnitude = 0;
  if (exponent == (1 << e_bits) - 1) magnitude = mantissa == 0 ? std::numeric_limits<double>::infinity() : std::nan("");
  else if (exponent == 0)
    magnitude = std::ldexp(static_cast<double>(mantissa), 1 - bias - m_bits);
  else
    magnitude = std::ldexp(static_cast<double>(mantissa + (1 << m_bits)), exponent - bias - m_bits);
  return sign != 0 ? -magnitude : magnitude;
}

float float_of(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
std::uint32_t bits_of(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// The nearest finite non-negative pattern to |x| (ties to the even pattern), or the infinity
// pattern when |x| is at or beyond the largest finite value plus half its spacing; by search in
// the table of the 16-bit type's non-negative finite values, ascending (patterns 0 … max).
template <class H>
std::uint16_t oracle_narrow(float x) {
  static const std::vector<double> table = [] {
    std::vector<double> t;
    for (std::uint32_t b = 0; b < 0x8000u; ++b) {
      const double v = field_value<H>(static_cast<std::uint16_t>(b));
      if (!std::isfinite(v)) break;
      t.push_back(v);
    }
    return t;
  }();
  const std::uint16_t sign = std::signbit(x) ? 0x8000u : 0u;
  const double a = std::fabs(static_cast<double>(x));
  const auto largest = static_cast<std::uint16_t>(table.size() - 1);
  const double spacing = table[largest] - table[largest - 1];
  const auto infinity = static_cast<std::uint16_t>(table.size());
  if (a >= table[largest] + spacing / 2)
    return static_cast<std::uint16_t>(sign | infinity);  // the tie goes to Inf (even)
  const auto above = static_cast<std::uint16_t>(std::lower_bound(table.begin(), table.end(), a) - table.begin());
  if (above == 0) return sign;
  if (above > largest) return static_cast<std::uint16_t>(sign | largest);
  const auto below = static_cast<std::uint16_t>(above - 1);
  const double up = table[above] - a, down = a - table[below];
  std::uint16_t pick = up < down ? above : below;
  if (up == down) pick = (above & 1u) == 0 ? above : below;
  return static_cast<std::uint16_t>(sign | pick);
}

template <class H>
std::uint16_t narrowed_bits(float x) {
  return narrow<H>(x).bits;
}

// The floats at which narrowing to H changes its answer, and their neighbours: every finite
// 16-bit value, the midpoints between consecutive ones, one float ulp either side of each, and
// the same negated (the overflow threshold has its own checks).
template <class H>
std::vector<float> boundary_floats() {
  std::vector<float> out;
  float previous = 0;
  for (std::uint32_t b = 0; b < 0x8000u; ++b) {
    const double v = field_value<H>(static_cast<std::uint16_t>(b));
    if (!std::isfinite(v)) break;
    const auto f = static_cast<float>(v);
    const float mid = static_cast<float>((static_cast<double>(previous) + v) / 2);  // exact in float for both types
    for (const float c : {f, mid}) {
      out.push_back(c);
      out.push_back(std::nextafter(c, 0.0f));
      out.push_back(std::nextafter(c, std::numeric_limits<float>::infinity()));
    }
    previous = f;
  }
  const std::vector<float> negated(out.begin(), out.end());
  for (const float c : negated) out.push_back(-c);
  return out;
}

}  // namespace

TEST_CASE_TEMPLATE("widening every 16-bit pattern gives the value its fields denote, exactly", H, bf16, fp16) {
  for (std::uint32_t b = 0; b <= 0xffffu; ++b) {
    const auto bits = static_cast<std::uint16_t>(b);
    const double expected = field_value<H>(bits);
    const float got = widen(H{bits});
    CAPTURE(b);
    if (std::isnan(expected)) {
      CHECK(std::isnan(got));
      CHECK(std::signbit(got) == ((b & 0x8000u) != 0));
    } else {
      CHECK(static_cast<double>(got) == expected);
      CHECK(std::signbit(got) == std::signbit(expected));
    }
  }
}

TEST_CASE_TEMPLATE("narrowing rounds to the nearest 16-bit value, ties to even, at every rounding boundary", H, bf16,
                   fp16) {
  std::size_t checked = 0;
  for (const float x : boundary_floats<H>()) {
    CAPTURE(x);
    CHECK(narrowed_bits<H>(x) == oracle_narrow<H>(x));
    ++checked;
  }
  // Beyond the largest finite value: its midpoint with the next power of two is the first to
  // overflow (ties go to the even pattern, the infinity), the float just below it does not.
  const float largest = widen(H{static_cast<std::uint16_t>(float_traits<H>::infinity_key - 1)});
  const float threshold =
      largest + (largest - widen(H{static_cast<std::uint16_t>(float_traits<H>::infinity_key - 2)})) / 2;
  CHECK(narrowed_bits<H>(threshold) == float_traits<H>::infinity_key);
  CHECK(narrowed_bits<H>(std::nextafter(threshold, 0.0f)) == float_traits<H>::infinity_key - 1);
  CHECK(narrowed_bits<H>(-threshold) == (0x8000u | float_traits<H>::infinity_key));
  CHECK_FALSE(narrows_finite<H>(threshold));
  CHECK(narrows_finite<H>(std::nextafter(threshold, 0.0f)));
  CHECK(narrowed_bits<H>(std::numeric_limits<float>::max()) == float_traits<H>::infinity_key);
  CHECK(checked > 100000);
}

TEST_CASE_TEMPLATE("narrowing random floats of every magnitude agrees with the oracle", H, bf16, fp16) {
  std::mt19937 engine(7);
  for (int trial = 0; trial < 300000; ++trial) {
    float x = float_of(static_cast<std::uint32_t>(engine()));
    if (!std::isfinite(x)) continue;
    if (trial % 2 == 0) x = std::ldexp(x, -std::ilogb(x) + static_cast<int>(engine() % 40) - 28);  // near H's range
    CAPTURE(x);
    CHECK(narrowed_bits<H>(x) == oracle_narrow<H>(x));
  }
}

TEST_CASE_TEMPLATE("NaN stays NaN with its sign, infinities stay, and every other pattern round-trips", H, bf16, fp16) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  CHECK(std::isnan(widen(narrow<H>(nan))));
  CHECK(std::isnan(widen(narrow<H>(-nan))));
  CHECK(std::signbit(widen(narrow<H>(-nan))));
  CHECK(std::isnan(widen(narrow<H>(float_of(0x7f800001u)))));  // a signalling NaN whose payload narrowing drops
  CHECK(narrowed_bits<H>(std::numeric_limits<float>::infinity()) == float_traits<H>::infinity_key);
  CHECK(narrowed_bits<H>(-std::numeric_limits<float>::infinity()) == (0x8000u | float_traits<H>::infinity_key));
  CHECK_FALSE(narrows_finite<H>(std::numeric_limits<float>::infinity()));
  for (std::uint32_t b = 0; b <= 0xffffu; ++b) {
    const H h{static_cast<std::uint16_t>(b)};
    if (!is_finite(h) && (b & 0x7fffu) != float_traits<H>::infinity_key) continue;  // NaN patterns
    CAPTURE(b);
    CHECK(narrow<H>(widen(h)).bits == b);
  }
}

// The float32 bit patterns that are 16-bit values, from the formats' definitions: each finite or
// infinite pattern's field value as a float32 (exact), each NaN pattern with its payload moved to
// the top of float32's mantissa.
template <class H>
std::unordered_set<std::uint32_t> widened_patterns() {
  std::unordered_set<std::uint32_t> set;
  for (std::uint32_t b = 0; b <= 0xffffu; ++b) {
    const double v = field_value<H>(static_cast<std::uint16_t>(b));
    if (!std::isnan(v)) {
      set.insert(bits_of(static_cast<float>(v)));
      continue;
    }
    constexpr int mantissa_bits = layout<H>::mantissa_bits;
    const std::uint32_t payload = b & ((1u << mantissa_bits) - 1u);
    set.insert((b & 0x8000u) << 16 | 0x7f800000u | payload << (23 - mantissa_bits));
  }
  return set;
}

TEST_CASE_TEMPLATE("exact narrowing inverts widening bit for bit, NaN payloads included, and nothing else", H, bf16,
                   fp16) {
  const std::unordered_set<std::uint32_t> patterns = widened_patterns<H>();
  REQUIRE(patterns.size() == 0x10000u);
  for (std::uint32_t b = 0; b <= 0xffffu; ++b) {
    const H h{static_cast<std::uint16_t>(b)};
    CAPTURE(b);
    CHECK(patterns.count(bits_of(widen(h))) == 1);
    CHECK(narrows_exactly<H>(widen(h)));
    CHECK(exact_narrow<H>(widen(h)).bits == b);
  }
  std::mt19937 engine(11);
  for (int trial = 0; trial < 300000; ++trial) {
    std::uint32_t u = static_cast<std::uint32_t>(engine());
    if (trial % 3 == 0)
      u = bits_of(widen(H{static_cast<std::uint16_t>(u)})) + static_cast<std::uint32_t>(trial % 7) - 3u;
    CAPTURE(u);
    CHECK(narrows_exactly<H>(float_of(u)) == (patterns.count(u) == 1));
  }
  static_assert(narrows_exactly<float>(0.1f) && exact_narrow<float>(0.1f) == 0.1f);
}

TEST_CASE("the conversions are constant expressions") {
  static_assert(widen(fp16{0x3c00}) == 1.0f);
  static_assert(widen(fp16{0x0001}) == 0x1p-24f);
  static_assert(widen(fp16{0x7bff}) == 65504.0f);
  static_assert(widen(bf16{0x3f80}) == 1.0f);
  static_assert(narrow<fp16>(65519.0f).bits == 0x7bff && narrow<fp16>(65520.0f).bits == 0x7c00);
  static_assert(narrow<bf16>(1.0f + 0x1p-8f).bits == 0x3f80);  // the tie to the even pattern
  static_assert(narrow<bf16>(1.0f + 0x1p-8f + 0x1p-20f).bits == 0x3f81);
  static_assert(dtype_of<bf16> == value_dtype::bfloat16 && dtype_of<fp16> == value_dtype::float16);
  static_assert(gradient_value<bf16> && gradient_value<fp16> && half_precision<bf16> && !half_precision<float>);
  static_assert(std::is_same_v<compute_type<bf16>, float> && std::is_same_v<compute_type<double>, double>);
  CHECK(true);
}

TEST_CASE_TEMPLATE("the CPU's bulk conversions give the scalar conversions' bits", H, bf16, fp16) {
  std::vector<H> all(0x10000);
  for (std::uint32_t b = 0; b <= 0xffffu; ++b) all[b] = H{static_cast<std::uint16_t>(b)};
  std::vector<float> wide(all.size());
  detail::cpu::widen_values(all.data(), all.size(), wide.data());
  for (std::size_t i = 0; i < all.size(); ++i) {
    CAPTURE(i);
    CHECK(bits_of(wide[i]) == bits_of(widen(all[i])));
  }
  std::vector<float> floats = boundary_floats<H>();
  std::mt19937 engine(11);
  for (int i = 0; i < 100000; ++i) floats.push_back(float_of(static_cast<std::uint32_t>(engine())));  // NaN, Inf too
  for (const std::size_t offset : {std::size_t{0}, std::size_t{3}}) {  // unaligned runs and ragged tails
    std::vector<H> narrowed(floats.size() - offset);
    detail::cpu::narrow_values(floats.data() + offset, narrowed.size(), narrowed.data());
    for (std::size_t i = 0; i < narrowed.size(); ++i) {
      CAPTURE(floats[i + offset]);
      CHECK(narrowed[i].bits == narrow<H>(floats[i + offset]).bits);
    }
  }
}
