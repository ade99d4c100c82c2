#pragma once
/// @file
/// How many elements a sparsifier keeps: a density or an exact count, chosen at run time.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include <gradcomp/core/error.hpp>

namespace gradcomp {

/// Runtime amount of sparsification. `k > 0` asks for exactly min(k, n) elements; otherwise
/// `density` (in (0, 1]) asks for ⌈density·n⌉ elements, at least one of a non-empty tensor.
struct sparsity {
  double density = 0.01;  ///< Fraction of elements kept when `k == 0`.
  std::uint64_t k = 0;    ///< Exact count; overrides `density` when non-zero.

  /// Elements kept of an n-element tensor.
  [[nodiscard]] std::uint64_t count(std::uint64_t n) const noexcept {
    if (n == 0) return 0;
    if (k > 0) return std::min(k, n);
    const double wanted = std::ceil(density * static_cast<double>(n));
    if (!(wanted >= 1.0)) return 1;
    if (wanted >= static_cast<double>(n)) return n;
    return static_cast<std::uint64_t>(wanted);
  }

  /// Throws `invalid_argument` unless `k > 0` or `density` lies in (0, 1].
  void validate() const {
    detail::require(k > 0 || (density > 0.0 && density <= 1.0), errc::invalid_argument,
                    [&] { return "density must lie in (0, 1] when k is 0, got " + std::to_string(density); });
  }

  /// Adds the amount to a parameter hash: k when it is set, else the density, so that ranks
  /// asking for the same count agree however they spelled it.
  template <class Hasher>
  constexpr void hash_into(Hasher& hasher) const noexcept {
    if (k > 0) hasher.add(std::uint8_t{1}).add(k);
    else
      hasher.add(std::uint8_t{0}).add(density);
  }

  friend constexpr bool operator==(const sparsity&, const sparsity&) = default;
};

}  // namespace gradcomp
