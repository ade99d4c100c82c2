#pragma once
/// @file
/// Selection by magnitude key (docs/sparsifiers.md §2.1), shared by top-k and threshold: the
/// k-th largest key, and the walk that keeps every element above it and the first ties at it.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>

#include <gradcomp/core/float_bits.hpp>

namespace gradcomp::detail::reference {

/// The `rank`-th largest (1 ≤ rank ≤ keys.size()) of `keys`, which it reorders.
template <class Key>
[[nodiscard]] Key kth_largest(std::span<Key> keys, std::uint64_t rank) {
  std::nth_element(keys.begin(), keys.begin() + static_cast<std::ptrdiff_t>(rank - 1), keys.end(), std::greater<>{});
  return keys[rank - 1];
}

/// Calls `visit(i)`, in ascending index order, for every element of `x` whose magnitude key is
/// above `kth` and for the first `ties` (lowest index first) whose key equals it.
template <gradient_value T, class Visit>
void for_each_kept(std::span<const T> x, typename float_traits<T>::bits_type kth, std::uint64_t ties, Visit&& visit) {
  for (std::uint64_t i = 0; i < x.size(); ++i) {
    const auto key = magnitude_key(x[i]);
    if (key > kth) {
      visit(i);
    } else if (key == kth && ties > 0) {
      --ties;
      visit(i);
    }
  }
}

/// How many elements of `x` have a magnitude key above `kth`.
template <gradient_value T>
[[nodiscard]] std::uint64_t count_above(std::span<const T> x, typename float_traits<T>::bits_type kth) {
  std::uint64_t above = 0;
  for (const T v : x)
    if (magnitude_key(v) > kth) ++above;
  return above;
}

}  // namespace gradcomp::detail::reference
