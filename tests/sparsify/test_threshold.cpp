// Sampled-threshold sparsification: τ is the documented sample quantile, the kept set is exactly
// {|x| ≥ τ, x ≠ 0} (or its exact top-k after refinement), and the achieved density is near target.
#include <gradcomp/core/philox.hpp>
#include <gradcomp/core/reference_executor.hpp>
#include <gradcomp/sparsify/threshold.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <span>
#include <vector>

#include "support/codec_io.hpp"
#include "support/data.hpp"
#include "support/oracles.hpp"
#include "support/reference_check.hpp"

using namespace gradcomp;
using namespace gradcomp::test;

namespace {

template <class T>
struct encoded {
  std::vector<std::byte> message;
  threshold_report<T> report;
};

// Encodes on `exec`: the reference unless a test names another (the oracles below check the
// reference; every cpu_executor setting is checked against it).
template <class T, class E = reference_executor>
encoded<T> encode_with_report(const threshold_sparsifier<T>& codec, const std::vector<T>& x, message_key key,
                              const E& exec = {}) {
  encoded<T> result;
  result.message.resize(codec.max_encoded_bytes(x.size()));
  std::vector<std::byte> ws(codec.workspace_bytes(exec, x.size()));
  result.report = codec.encode_with_report(exec, std::span<const T>(x), result.message, ws, key);
  result.message.resize(result.report.bytes);
  return result;
}

// τ as documented: the m-th largest |sample| with m = ⌈k·s/n⌉ (integer) clamped to [1, s], where sample
// j is x[floor(r_j · n / 2^64)] for the 64-bit word r_j = words (2j, 2j+1) of the threshold_sample
// stream, or all of x when s = n. Then clamped to at least the smallest positive value.
template <class T>
T documented_threshold(const std::vector<T>& x, std::uint64_t k, std::uint64_t s, std::uint64_t seed, message_key key) {
  const std::uint64_t n = x.size();
  std::vector<T> sample;
  const random_stream stream{seed, key.step, key.tensor_id, random_purpose::threshold_sample};
  for (std::uint64_t j = 0; j < s; ++j) {
    if (s == n) {
      sample.push_back(std::fabs(x[j]));
      continue;
    }
    const std::uint64_t r = stream.word(2 * j) | std::uint64_t{stream.word(2 * j + 1)} << 32;
    __extension__ using wide128 = unsigned __int128;
    sample.push_back(std::fabs(x[static_cast<std::uint64_t>((wide128{r} * n) >> 64)]));
  }
  std::sort(sample.begin(), sample.end(), std::greater<T>{});
  __extension__ using wide = unsigned __int128;
  const auto m = std::clamp<std::uint64_t>(static_cast<std::uint64_t>((wide{k} * s + n - 1) / n), 1, s);
  return std::max(sample[m - 1], std::numeric_limits<T>::denorm_min());
}

}  // namespace

TEST_CASE_TEMPLATE("threshold keeps every nonzero |x| >= the documented sample quantile", T, float, double) {
  for (const std::size_t n :
       {std::size_t{1}, std::size_t{7}, std::size_t{1000}, std::size_t{(1u << 16) + 1}, std::size_t{(1u << 20) + 3}}) {
    for (const input_kind kind : all_input_kinds) {
      if (n > 1000 && kind != input_kind::normal && kind != input_kind::signed_zeros) continue;
      for (const double density : {1e-5, 0.01, 0.3, 1.0}) {
        CAPTURE(n);
        CAPTURE(name(kind));
        CAPTURE(density);
        // Without refinement the kept set is the whole threshold set.
        const threshold_sparsifier<T> codec({.target = {.density = density}, .refine = false, .seed = 5});
        const std::vector<T> x = make_input<T>(kind, n, 77 + n);
        const message_key key{.step = 12, .tensor_id = 3};
        const encoded<T> e = encode_with_report(codec, x, key);
        const T tau = documented_threshold(x, codec.k(n), codec.sample_count(n), 5, key);
        CHECK(e.report.threshold == tau);
        std::vector<T> expected(n, T{0});
        std::uint64_t count = 0;
        for (std::size_t i = 0; i < n; ++i) {
          if (std::fabs(x[i]) >= tau && x[i] != T{0}) {
            expected[i] = x[i];
            ++count;
          }
        }
        CHECK(e.report.kept == count);
        CHECK(e.report.target == codec.k(n));
        CHECK(e.message.size() == sparse_message_size_oracle(n, count, sizeof(T)));
        CHECK(bitwise_equal(decode_values(codec, e.message, n), expected));
      }
    }
  }
}

TEST_CASE("threshold achieves a density within 0.8x..1.25x of a 1% target on Gaussian gradients") {
  const std::size_t n = (1u << 20) + 3;
  const threshold_sparsifier<float> codec({.target = {.density = 0.01}, .refine = false, .seed = 21});
  for (std::uint64_t step = 0; step < 5; ++step) {
    const std::vector<float> x = make_input<float>(input_kind::normal, n, 500 + step);
    const encoded<float> e = encode_with_report(codec, x, {.step = step});
    CAPTURE(step);
    CHECK(e.report.density >= 0.8 * 0.01);
    CHECK(e.report.density <= 1.25 * 0.01);
    CHECK(e.report.density == static_cast<double>(e.report.kept) / static_cast<double>(n));
  }
}

TEST_CASE("threshold refinement keeps the exact top-k when more than 1.3k survive the threshold") {
  // Three distinct magnitudes: the sample quantile lands on a value shared by far more than k
  // elements, so refinement must cut the survivors to exactly k, ties to the lower index.
  const std::vector<float> x = make_input<float>(input_kind::ties, 20000, 8);
  const threshold_sparsifier<float> codec({.target = {.density = 0.01}, .seed = 2});
  const encoded<float> e = encode_with_report(codec, x, {.step = 1});
  std::uint64_t survivors = 0;
  for (const float v : x) survivors += (std::fabs(v) >= e.report.threshold && v != 0.0f) ? 1u : 0u;
  REQUIRE(static_cast<double>(survivors) > 1.3 * static_cast<double>(codec.k(x.size())));
  CHECK(e.report.kept == codec.k(x.size()));
  const std::vector<float> expected = dense_at<float>(x, topk_indices_oracle<float>(x, codec.k(x.size())));
  CHECK(bitwise_equal(decode_values(codec, e.message, x.size()), expected));
}

TEST_CASE("threshold keeps exactly k of a small fully-sampled tensor with distinct magnitudes") {
  // With every element sampled, τ is the exact k-th largest magnitude: no rounding may add one.
  for (std::size_t n = 1; n <= 300; ++n) {
    std::vector<float> x(n);
    for (std::size_t i = 0; i < n; ++i) x[i] = static_cast<float>((i * 331) % n + 1) * ((i % 2) != 0 ? -1.0f : 1.0f);
    for (std::uint64_t k = 1; k <= n; k += 1 + n / 7) {
      const threshold_sparsifier<float> codec({.target = {.k = k}, .refine = false});
      CAPTURE(n);
      CAPTURE(k);
      CHECK(encode_with_report(codec, x, {}).report.kept == k);
    }
  }
}

TEST_CASE("threshold never keeps exact zeros") {
  std::vector<float> x(10000, 0.0f);
  x[17] = -1.0f;
  x[9000] = 2.0f;
  const threshold_sparsifier<float> codec({.target = {.density = 0.1}});
  const encoded<float> e = encode_with_report(codec, x, {});
  CHECK(e.report.kept == 2);
  const std::vector<float> decoded = decode_values(codec, e.message, x.size());
  CHECK(decoded[17] == -1.0f);
  CHECK(decoded[9000] == 2.0f);
}

TEST_CASE_TEMPLATE("threshold rejects NaN and Inf wherever they are", T, float, double) {
  for (const T special :
       {std::numeric_limits<T>::quiet_NaN(), std::numeric_limits<T>::infinity(), -std::numeric_limits<T>::infinity()}) {
    for (const std::size_t where : {std::size_t{0}, std::size_t{4999}}) {
      std::vector<T> x = make_input<T>(input_kind::normal, 5000, 3);
      x[where] = special;
      // Many NaNs, too: enough that the sample's quantile itself may be non-finite.
      std::vector<T> mostly_nan(5000, std::numeric_limits<T>::quiet_NaN());
      mostly_nan[where] = T{1};
      for (const auto* input : {&x, &mostly_nan}) {
        try {
          encode_with_report(threshold_sparsifier<T>({.target = {.density = 0.01}}), *input, {});
          FAIL("a non-finite gradient was encoded");
        } catch (const error& e) {
          CHECK(e.code() == errc::non_finite_input);
        }
      }
    }
  }
}

TEST_CASE_TEMPLATE("every cpu_executor setting writes the reference's threshold bytes and reports", T, float, double) {
  for (const double density : {0.001, 0.01, 0.3, 1.0}) {
    for (const bool refine : {true, false}) {
      for (const double fraction : {0.01, 1.0}) {
        const threshold_sparsifier<T> codec({.target = {.density = density},
                                             .sample_fraction = fraction,
                                             .min_samples = 64,
                                             .refine = refine,
                                             .seed = 6});
        CAPTURE(density);
        CAPTURE(refine);
        CAPTURE(fraction);
        check_inputs_same_as_reference(codec);
        const std::vector<T> x = make_input<T>(input_kind::normal, 5000, 8);
        const encoded<T> expected = encode_with_report(codec, x, {.step = 2});
        for (const cpu_executor& cpu : cpu_settings()) {
          const encoded<T> got = encode_with_report(codec, x, {.step = 2}, cpu);
          CHECK(got.message == expected.message);
          CHECK(got.report.kept == expected.report.kept);
          CHECK(to_bits(got.report.threshold) == to_bits(expected.report.threshold));
        }
      }
    }
  }
}

TEST_CASE_TEMPLATE("threshold rejects NaN and Inf on every executor alike", T, float, double) {
  check_non_finite_same_as_reference(threshold_sparsifier<T>({.target = {.density = 0.01}, .min_samples = 64}));
}

TEST_CASE("threshold parameters are validated") {
  for (const threshold_params bad : {threshold_params{.target = {.density = 0}}, threshold_params{.sample_fraction = 0},
                                     threshold_params{.sample_fraction = 2}, threshold_params{.min_samples = 0}}) {
    try {
      threshold_sparsifier<float> codec(bad);
      FAIL("accepted invalid parameters");
    } catch (const error& e) {
      CHECK(e.code() == errc::invalid_argument);
    }
  }
  const threshold_sparsifier<float> codec({.sample_fraction = 0.01, .min_samples = 4096});
  CHECK(codec.sample_count(100) == 100);
  CHECK(codec.sample_count(10000) == 4096);
  CHECK(codec.sample_count(1000000) == 10000);
}
