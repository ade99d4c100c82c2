// random_permutation: a bijection of [0, n) for awkward n (cycle walking included), determined by
// its key alone, different under different keys, and statistically uniform in where it sends 0.

#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <set>
#include <vector>

#include <gradcomp/core/philox.hpp>
#include <gradcomp/core/random_permutation.hpp>

namespace {

using gradcomp::random_permutation;
using gradcomp::random_purpose;
using gradcomp::random_stream;

std::vector<std::uint64_t> images(std::uint64_t n, const random_stream& key) {
  const random_permutation perm(n, key);
  std::vector<std::uint64_t> out(static_cast<std::size_t>(n));
  for (std::uint64_t j = 0; j < n; ++j) out[static_cast<std::size_t>(j)] = perm(j);
  return out;
}

// True when `image` hits every value of [0, n) exactly once.
bool is_bijection_of_range(const std::vector<std::uint64_t>& image, std::uint64_t n) {
  std::vector<bool> seen(static_cast<std::size_t>(n), false);
  for (const std::uint64_t x : image) {
    if (x >= n || seen[static_cast<std::size_t>(x)]) return false;
    seen[static_cast<std::size_t>(x)] = true;
  }
  return image.size() == n;
}

}  // namespace

TEST_CASE("random_permutation maps 0..n-1 onto itself one to one") {
  const std::uint64_t sizes[] = {1, 2, 3, 4, 5, 7, 16, 17, 63, 64, 65, 1000, 1023, 1024, 4097, 65537};
  for (const std::uint64_t n : sizes) {
    for (std::uint64_t seed = 0; seed < 3; ++seed) {
      CAPTURE(n);
      CAPTURE(seed);
      const random_stream key{seed, 17, 4, random_purpose::random_k};
      CHECK(is_bijection_of_range(images(n, key), n));
    }
  }
}

TEST_CASE("random_permutation of one element maps 0 to 0") {
  CHECK(random_permutation(1, random_stream{5, 6, 7, random_purpose::random_k})(0) == 0);
  CHECK(random_permutation(1, random_stream{})(0) == 0);
}

TEST_CASE("random_permutation stays in range for n near 2^32 and 2^64") {
  const std::uint64_t sizes[] = {(std::uint64_t{1} << 32) + 1, (std::uint64_t{1} << 40) - 3,
                                 (std::uint64_t{1} << 63) + 1, 0xFFFFFFFFFFFFFFFFull};
  for (const std::uint64_t n : sizes) {
    CAPTURE(n);
    const random_permutation perm(n, random_stream{11, 12, 13, random_purpose::random_k});
    std::set<std::uint64_t> distinct;
    bool in_range = true;
    for (std::uint64_t j = 0; j < 200; ++j) {
      const std::uint64_t x = perm(n - 1 - j * 977);
      in_range = in_range && x < n;
      distinct.insert(x);
    }
    CHECK(in_range);
    CHECK(distinct.size() == 200);  // a bijection never maps distinct inputs together
  }
}

TEST_CASE("random_permutation is determined by its key: separate objects with equal keys agree") {
  const random_stream key{0xabcdef, 99, 2, random_purpose::random_k};
  random_stream copy;
  copy.seed = 0xabcdef;
  copy.step = 99;
  copy.tensor_id = 2;
  copy.purpose = random_purpose::random_k;
  CHECK(images(1000, key) == images(1000, copy));
  CHECK(images(17, key) == images(17, copy));
}

TEST_CASE("random_permutation differs between seeds, steps, tensors and purposes") {
  const random_stream base{1, 2, 3, random_purpose::random_k};
  random_stream seed = base, step = base, tensor = base, purpose = base;
  seed.seed = 2;
  step.step = 3;
  tensor.tensor_id = 4;
  purpose.purpose = random_purpose::sketch_hash;
  const std::vector<std::uint64_t> reference = images(1000, base);
  std::vector<std::uint64_t> identity(1000);
  for (std::size_t j = 0; j < identity.size(); ++j) identity[j] = j;
  CHECK(reference != identity);
  for (const random_stream& other : {seed, step, tensor, purpose}) {
    const std::vector<std::uint64_t> changed = images(1000, other);
    std::size_t same = 0;
    for (std::size_t j = 0; j < changed.size(); ++j) same += changed[j] == reference[j] ? 1u : 0u;
    CHECK(same < 20);  // independent permutations of 1000 share ~1 fixed position on average
  }
}

TEST_CASE("random_permutation of three elements reaches all six orders over many keys") {
  std::set<std::vector<std::uint64_t>> orders;
  for (std::uint64_t step = 0; step < 600; ++step)
    orders.insert(images(3, random_stream{77, step, 0, random_purpose::random_k}));
  CHECK(orders.size() == 6);
}

TEST_CASE("random_permutation sends 0 to each of 10 positions about equally often over 20000 keys") {
  constexpr std::uint64_t n = 10;
  constexpr int keys = 20000;
  std::array<int, n> count{};
  for (std::uint64_t step = 0; step < static_cast<std::uint64_t>(keys); ++step) {
    const random_permutation perm(n, random_stream{2718281828, step, 9, random_purpose::random_k});
    ++count[static_cast<std::size_t>(perm(0))];
  }
  const double expected = keys / static_cast<double>(n);
  double chi_square = 0.0;
  for (const int c : count) chi_square += (c - expected) * (c - expected) / expected;
  CAPTURE(chi_square);
  // 9 degrees of freedom: P(chi^2 > 40) is about 7e-6.
  CHECK(chi_square < 40.0);
}

// Regression: with 1-2 bit Feistel halves (n = 3..15 before the 4-bit minimum) the six-round
// network was measurably non-uniform: for n = 5, perm(4) == 4 held 8% more often than 1/5.
TEST_CASE("random_permutation sends every position of small tensors to each image about equally often") {
  constexpr int keys = 40000;
  for (const std::uint64_t n : {std::uint64_t{3}, std::uint64_t{5}, std::uint64_t{6}, std::uint64_t{10}}) {
    std::vector<int> count(n * n, 0);
    for (std::uint64_t step = 0; step < static_cast<std::uint64_t>(keys); ++step) {
      const random_permutation perm(n, random_stream{31415, step, 1, random_purpose::random_k});
      for (std::uint64_t j = 0; j < n; ++j) ++count[static_cast<std::size_t>(j * n + perm(j))];
    }
    const double expected = keys / static_cast<double>(n);
    for (std::uint64_t j = 0; j < n; ++j) {
      double chi_square = 0.0;
      for (std::uint64_t i = 0; i < n; ++i) {
        const double c = count[static_cast<std::size_t>(j * n + i)];
        chi_square += (c - expected) * (c - expected) / expected;
      }
      CAPTURE(n);
      CAPTURE(j);
      CAPTURE(chi_square);
      // At most 9 degrees of freedom: P(chi^2 > 40) is about 7e-6 for a uniform permutation.
      CHECK(chi_square < 40.0);
    }
  }
}
