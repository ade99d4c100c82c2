#pragma once
// The count sketch's hashing in plain loops, written from the rule documented in
// sketch/count_sketch.hpp and Appleby's reference MurmurHash3_x86_32 of a 4-byte key (body block,
// tail-free, finaliser): the oracle of the count-sketch tests on the CPU and on the GPU, with the
// cells and estimates it gives in plain loops; and the cells of a count-sketch message, as the
// tests read them.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include <gradcomp/core/wire_envelope.hpp>
#include <gradcomp/sketch/count_sketch.hpp>

namespace gradcomp::test {

inline std::uint32_t rotl(std::uint32_t x, int r) { return (x << r) | (x >> (32 - r)); }

inline std::uint32_t oracle_fmix(std::uint32_t h) {
  h ^= h >> 16;
  h *= 0x85ebca6bu;
  h ^= h >> 13;
  h *= 0xc2b2ae35u;
  h ^= h >> 16;
  return h;
}

inline std::uint32_t oracle_murmur(std::uint32_t key, std::uint32_t seed) {
  std::uint32_t k1 = key * 0xcc9e2d51u;
  k1 = rotl(k1, 15) * 0x1b873593u;
  std::uint32_t h1 = rotl(seed ^ k1, 13) * 5u + 0xe6546b64u;
  return oracle_fmix(h1 ^ 4u);
}

/// H_j(i) of row `row` of a sketch keyed by `seed`.
inline std::uint32_t oracle_hash(std::uint64_t seed, std::uint32_t row, std::uint64_t i) {
  const std::uint32_t row_seed =
      oracle_murmur(static_cast<std::uint32_t>(seed >> 32) ^ row, static_cast<std::uint32_t>(seed));
  return oracle_murmur(static_cast<std::uint32_t>(i), row_seed ^ oracle_fmix(static_cast<std::uint32_t>(i >> 32)));
}

/// h_j(i) in [0, c) from H_j(i).
inline std::uint64_t oracle_bucket(std::uint32_t h, std::uint64_t c) {
  return (static_cast<std::uint64_t>(h & 0x7fffffffu) * c) >> 31;
}

/// The r·c cells of the sketch of x, summed in T in ascending index order.
template <class T>
std::vector<T> oracle_table(const count_sketch_params& p, const std::vector<T>& x) {
  std::vector<T> table(p.rows * p.columns, T{0});
  for (std::size_t i = 0; i < x.size(); ++i)
    for (std::uint32_t j = 0; j < p.rows; ++j) {
      const std::uint32_t h = oracle_hash(p.seed, j, i);
      table[j * p.columns + oracle_bucket(h, p.columns)] += (h >> 31) != 0 ? -x[i] : x[i];
    }
  return table;
}

/// Every element's estimate from `table`: the median of its signed cells over the rows (sorted),
/// the mean of the middle two as a/2 + b/2 for even r.
template <class T>
std::vector<T> oracle_estimates(const count_sketch_params& p, const std::vector<T>& table, std::size_t n) {
  std::vector<T> est(n);
  for (std::size_t i = 0; i < n; ++i) {
    std::vector<T> v;
    for (std::uint32_t j = 0; j < p.rows; ++j) {
      const std::uint32_t h = oracle_hash(p.seed, j, i);
      const T cell = table[j * p.columns + oracle_bucket(h, p.columns)];
      v.push_back((h >> 31) != 0 ? -cell : cell);
    }
    std::sort(v.begin(), v.end());
    est[i] = p.rows % 2 == 1 ? v[p.rows / 2] : v[p.rows / 2 - 1] / T{2} + v[p.rows / 2] / T{2};
  }
  return est;
}

/// The r·c cells of a count-sketch message (after its envelope).
template <class T>
std::vector<T> cells_of(const std::vector<std::byte>& message) {
  std::vector<T> cells((message.size() - envelope::size) / sizeof(T));
  std::memcpy(cells.data(), message.data() + envelope::size, cells.size() * sizeof(T));
  return cells;
}

}  // namespace gradcomp::test
