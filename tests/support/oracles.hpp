#pragma once
// Naive dense oracles, written independently of the code under test (full sorts, plain loops).
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <span>
#include <vector>

namespace gradcomp::test {

/// a·b rounded to T on its own: an oracle's a·b + c then rounds twice, as the documentation
/// defines it, whatever the compiler's flags (a volatile result cannot be fused with the sum into a
/// multiply-add; independent of the library's `mul_rn`).
template <class T>
T rounded_product(T a, T b) {
  const volatile T p = a * b;
  return p;
}

/// Indices of the k largest |x|, ties to the lower index, in ascending order: a full std::sort.
template <class T>
std::vector<std::size_t> topk_indices_oracle(std::span<const T> x, std::size_t k) {
  std::vector<std::size_t> order(x.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    const T fa = std::fabs(x[a]), fb = std::fabs(x[b]);
    return fa != fb ? fa > fb : a < b;
  });
  order.resize(std::min(k, x.size()));
  std::sort(order.begin(), order.end());
  return order;
}

/// Dense vector holding x at `indices` and +0 elsewhere.
template <class T>
std::vector<T> dense_at(std::span<const T> x, const std::vector<std::size_t>& indices) {
  std::vector<T> dense(x.size(), T{0});
  for (const std::size_t i : indices) dense[i] = x[i];
  return dense;
}

/// Expected size of an index-carrying sparse message, from the layout documentation.
inline std::size_t sparse_message_size_oracle(std::uint64_t n, std::uint64_t k, std::size_t value_size) {
  const auto pad8 = [](std::uint64_t b) { return (b + 7) / 8 * 8; };
  const std::uint64_t list = pad8(k * (n <= (std::uint64_t{1} << 32) ? 4 : 8));
  const std::uint64_t bitmap = pad8((n + 7) / 8);
  return static_cast<std::size_t>(56 + 8 + std::min(list, bitmap) + k * value_size);
}

/// L of the b-bit uniform quantizer: 2^(b−1) − 1, and 1 for b = 1.
inline int levels_of(int bits) { return bits == 1 ? 1 : (1 << (bits - 1)) - 1; }

/// The documented step of a block whose largest magnitude is m: m / L, lowered to the next smaller
/// value while L·s overflows.
template <class T>
T documented_step(T max_abs, int bits) {
  const T L = static_cast<T>(levels_of(bits));
  T s = max_abs / L;
  while (!std::isfinite(s * L)) s = std::nextafter(s, T{0});
  return s;
}

}  // namespace gradcomp::test
