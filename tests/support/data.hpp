#pragma once
// Seeded test inputs (std::mt19937_64, independent of the library's Philox), including the
// special values every codec must handle: ties, all-equal, ±0, subnormals.
#include <gradcomp/core/half_float.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <vector>

namespace gradcomp::test {

/// Whether a and b hold the same values bit for bit (NaN payloads and the sign of zero included).
template <class T>
bool same_bits(std::span<const T> a, std::span<const T> b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size_bytes()) == 0);
}

/// `same_bits` of two vectors.
template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return same_bits(std::span<const T>(a), std::span<const T>(b));
}

/// Kinds of input the codec tests run over.
enum class input_kind { normal, ties, all_equal, signed_zeros, subnormals };

inline const char* name(input_kind kind) {
  switch (kind) {
    case input_kind::normal: return "normal";
    case input_kind::ties: return "ties";
    case input_kind::all_equal: return "all_equal";
    case input_kind::signed_zeros: return "signed_zeros";
    case input_kind::subnormals: return "subnormals";
  }
  return "?";
}

inline constexpr input_kind all_input_kinds[] = {input_kind::normal, input_kind::ties, input_kind::all_equal,
                                                 input_kind::signed_zeros, input_kind::subnormals};

/// n values of the given kind, reproducible from `seed`.
template <class T>
std::vector<T> make_input(input_kind kind, std::size_t n, std::uint64_t seed) {
  std::mt19937_64 engine(seed);
  std::normal_distribution<T> normal(T{0}, static_cast<T>(1e-3));
  std::uniform_int_distribution<int> small(-3, 3);
  std::vector<T> x(n);
  for (std::size_t i = 0; i < n; ++i) {
    switch (kind) {
      case input_kind::normal: x[i] = normal(engine); break;
      case input_kind::ties: x[i] = static_cast<T>(small(engine)) * T{0.5}; break;  // many equal magnitudes
      case input_kind::all_equal: x[i] = T{-0.25}; break;
      case input_kind::signed_zeros: {
        const int r = small(engine);
        x[i] = r == 0 ? T{0} : (r == 1 ? -T{0} : (r > 0 ? static_cast<T>(1e-6) : -static_cast<T>(2e-6)));
        break;
      }
      case input_kind::subnormals: {
        const T tiny = std::numeric_limits<T>::denorm_min();
        const int r = small(engine);
        x[i] = r == 0 ? T{0} : tiny * static_cast<T>(r * 1000 + static_cast<int>(i % 7)) * (i % 2 == 0 ? T{1} : T{-1});
        break;
      }
    }
  }
  return x;
}

/// n values of a kind for a 16-bit type H: made in float32 (times `scale`), then rounded to H.
template <class H>
std::vector<H> make_half_input(input_kind kind, std::size_t n, std::uint64_t seed, float scale = 1.0f) {
  const std::vector<float> wide = make_input<float>(kind, n, seed);
  std::vector<H> x(n);
  for (std::size_t i = 0; i < n; ++i) x[i] = narrow<H>(wide[i] * scale);
  return x;
}

/// The float32 values of 16-bit values, widened exactly.
template <class H>
std::vector<float> widened(const std::vector<H>& x) {
  std::vector<float> w(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) w[i] = widen(x[i]);
  return w;
}

/// The widened copies of every rank's 16-bit gradient.
template <class H>
std::vector<std::vector<float>> widened_ranks(const std::vector<std::vector<H>>& x) {
  std::vector<std::vector<float>> w;
  for (const std::vector<H>& g : x) w.push_back(widened(g));
  return w;
}

/// Bit-exact equality of two vectors (distinguishes -0 from +0).
template <class T>
bool bitwise_equal(const std::vector<T>& a, const std::vector<T>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::signbit(a[i]) != std::signbit(b[i]) || !(a[i] == b[i])) return false;
  }
  return true;
}

}  // namespace gradcomp::test
