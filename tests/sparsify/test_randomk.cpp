// Random-k: k distinct indices shared by every rank with the same key, values summable across
// ranks without decoding, unbiased when scaled.
#include <gradcomp/core/reference_executor.hpp>
#include <gradcomp/sparsify/randomk.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <set>
#include <span>
#include <vector>

#include "support/codec_io.hpp"
#include "support/data.hpp"
#include "support/reference_check.hpp"

using namespace gradcomp;
using namespace gradcomp::test;

namespace {

// x_i = i + 1 identifies every position by its value (exact in float below 2^24).
template <class T>
std::vector<T> position_values(std::size_t n) {
  std::vector<T> x(n);
  for (std::size_t i = 0; i < n; ++i) x[i] = static_cast<T>(i + 1);
  return x;
}

// The positions a decoded, unscaled message holds, checked to carry their own values.
template <class T>
std::set<std::size_t> kept_positions(const std::vector<T>& decoded) {
  std::set<std::size_t> kept;
  bool own_values = true;
  for (std::size_t i = 0; i < decoded.size(); ++i) {
    if (decoded[i] != T{0}) {
      own_values = own_values && decoded[i] == static_cast<T>(i + 1);
      kept.insert(i);
    }
  }
  CHECK(own_values);
  return kept;
}

}  // namespace

TEST_CASE_TEMPLATE("random-k keeps exactly k distinct elements with their values", T, float, double) {
  for (const std::size_t n :
       {std::size_t{1}, std::size_t{7}, std::size_t{1000}, std::size_t{(1u << 16) + 1}, std::size_t{(1u << 20) + 3}}) {
    for (const double density : {1e-6, 0.01, 0.5, 1.0}) {
      CAPTURE(n);
      CAPTURE(density);
      const randomk_sparsifier<T> randomk({.amount = {.density = density}, .seed = 11, .scaled = false});
      const std::vector<T> x = position_values<T>(n);
      const std::vector<std::byte> message = encode_bytes(randomk, x, {.step = 5, .tensor_id = 2});
      CHECK(message.size() == 56 + randomk.k(n) * sizeof(T));
      CHECK(kept_positions(decode_values(randomk, message, n)).size() == randomk.k(n));
    }
  }
}

TEST_CASE("random-k of an empty tensor is an empty message") {
  const randomk_sparsifier<float> randomk;
  const std::vector<float> empty;
  const std::vector<std::byte> message = encode_bytes(randomk, empty);
  CHECK(message.size() == 56);
  CHECK(decode_values(randomk, message, 0).empty());
}

TEST_CASE("random-k picks the same indices for the same (seed, step, tensor) on separate executors") {
  const std::size_t n = 10007;
  const std::vector<float> x = position_values<float>(n);
  const randomk_params params{.amount = {.density = 0.01}, .seed = 99, .scaled = false};
  const randomk_sparsifier<float> rank0(params), rank1(params);
  const cpu_executor exec0, exec1;
  std::vector<std::byte> m0(rank0.max_encoded_bytes(n)), m1(rank1.max_encoded_bytes(n));
  rank0.encode(exec0, std::span<const float>(x), m0, {}, {.step = 4, .tensor_id = 7});
  rank1.encode(exec1, std::span<const float>(x), m1, {}, {.step = 4, .tensor_id = 7});
  CHECK(m0 == m1);
  const std::set<std::size_t> base = kept_positions(decode_values(rank0, m0, n));
  const auto positions_for = [&](std::uint64_t seed, message_key key) {
    const randomk_sparsifier<float> other({.amount = {.density = 0.01}, .seed = seed, .scaled = false});
    return kept_positions(decode_values(other, encode_bytes(other, x, key), n));
  };
  CHECK(positions_for(99, {.step = 4, .tensor_id = 7}) == base);
  CHECK(positions_for(99, {.step = 5, .tensor_id = 7}) != base);
  CHECK(positions_for(99, {.step = 4, .tensor_id = 8}) != base);
  CHECK(positions_for(98, {.step = 4, .tensor_id = 7}) != base);
}

TEST_CASE("random-k encodings summed without decoding decode to the sum of the ranks' selections") {
  const std::size_t n = 5000;
  const int ranks = 4;
  const randomk_sparsifier<float> randomk({.amount = {.density = 0.05}, .seed = 3, .scaled = false});
  const cpu_executor cpu;
  std::vector<std::vector<float>> grads;
  std::vector<std::vector<std::byte>> messages;
  for (int r = 0; r < ranks; ++r) {
    grads.push_back(make_input<float>(input_kind::normal, n, 40u + static_cast<unsigned>(r)));
    messages.push_back(encode_bytes(randomk, grads.back(), {.step = 9, .tensor_id = 0}));
  }
  std::vector<std::byte> summed = messages[0];
  for (int r = 1; r < ranks; ++r) randomk.accumulate_encoded(cpu, summed, messages[static_cast<std::size_t>(r)]);

  // Oracle: the shared positions come from rank 0's own decode; the sum is a plain loop over ranks.
  const std::vector<float> first = decode_values(randomk, messages[0], n);
  std::vector<float> expected(n, 0.0f);
  for (std::size_t i = 0; i < n; ++i) {
    if (first[i] == 0.0f) continue;
    float s = 0.0f;
    for (int r = 0; r < ranks; ++r) s += grads[static_cast<std::size_t>(r)][i];
    expected[i] = s;
  }
  CHECK(bitwise_equal(decode_values(randomk, summed, n), expected));
}

TEST_CASE("random-k refuses to sum messages of different steps, parameters or that overflow") {
  const std::size_t n = 100;
  const randomk_sparsifier<float> randomk({.amount = {.density = 0.1}, .seed = 3});
  const cpu_executor cpu;
  const std::vector<float> x = make_input<float>(input_kind::normal, n, 1);
  std::vector<std::byte> acc = encode_bytes(randomk, x, {.step = 1});
  const std::vector<std::byte> saved = acc;
  const auto expect_error = [&](std::span<const std::byte> other, errc code) {
    try {
      randomk.accumulate_encoded(cpu, acc, other);
      FAIL("summed incompatible messages");
    } catch (const error& e) {
      CHECK(e.code() == code);
    }
    CHECK(acc == saved);
  };
  expect_error(encode_bytes(randomk, x, {.step = 2}), errc::step_mismatch);
  const randomk_sparsifier<float> other_seed({.amount = {.density = 0.1}, .seed = 4});
  expect_error(encode_bytes(other_seed, x, {.step = 1}), errc::parameter_mismatch);
  std::vector<float> huge(n, std::numeric_limits<float>::max());
  std::vector<std::byte> big = encode_bytes(randomk, huge, {.step = 1});
  acc = big;
  const std::vector<std::byte> saved_big = big;
  try {
    randomk.accumulate_encoded(cpu, acc, big);
    FAIL("an overflowing sum was accepted");
  } catch (const error& e) {
    CHECK(e.code() == errc::non_finite_input);
  }
  CHECK(acc == saved_big);
}

TEST_CASE("scaled random-k is an unbiased estimate of the gradient") {
  const std::size_t n = 64;
  const int trials = 20000;
  const randomk_sparsifier<double> randomk({.amount = {.k = 8}, .seed = 17, .scaled = true});
  std::vector<double> x(n);
  for (std::size_t i = 0; i < n; ++i) x[i] = std::sin(static_cast<double>(i)) + 0.1;
  std::vector<double> mean(n, 0.0);
  const cpu_executor cpu;
  std::vector<std::byte> message(randomk.max_encoded_bytes(n));
  for (int t = 0; t < trials; ++t) {
    randomk.encode(cpu, std::span<const double>(x), message, {}, {.step = static_cast<std::uint64_t>(t)});
    randomk.decode_accumulate(cpu, message, std::span<double>(mean), {});
  }
  // Each estimate is x_i·n/k with probability k/n: the standard error of the mean is
  // |x_i|·sqrt((n/k − 1)/trials) ≤ 1.1·0.0187; allow five of them.
  for (std::size_t i = 0; i < n; ++i) {
    CAPTURE(i);
    CHECK(std::fabs(mean[i] / trials - x[i]) < 5 * std::fabs(x[i]) * std::sqrt((8.0 - 1.0) / trials) + 1e-12);
  }
}

TEST_CASE("random-k rejects a selected NaN or Inf and ignores unselected ones") {
  const std::size_t n = 200;
  const randomk_sparsifier<float> randomk({.amount = {.k = 20}, .seed = 1, .scaled = false});
  std::vector<float> x = position_values<float>(n);
  const std::set<std::size_t> kept = kept_positions(decode_values(randomk, encode_bytes(randomk, x), n));
  std::size_t unselected = 0;
  while (kept.count(unselected) != 0) ++unselected;
  x[unselected] = std::numeric_limits<float>::quiet_NaN();
  CHECK(decode_values(randomk, encode_bytes(randomk, x), n)[unselected] == 0.0f);
  x[*kept.begin()] = std::numeric_limits<float>::infinity();
  try {
    encode_bytes(randomk, x);
    FAIL("a selected Inf was encoded");
  } catch (const error& e) {
    CHECK(e.code() == errc::non_finite_input);
  }
}

TEST_CASE_TEMPLATE("every cpu_executor setting writes the reference's random-k bytes and decodes them alike", T, float,
                   double) {
  for (const double density : {0.01, 0.5, 1.0}) {
    for (const bool scaled : {true, false}) {
      CAPTURE(density);
      CAPTURE(scaled);
      check_inputs_same_as_reference(
          randomk_sparsifier<T>({.amount = {.density = density}, .seed = 5, .scaled = scaled}));
    }
  }
}

TEST_CASE_TEMPLATE("random-k rejects a selected NaN or Inf on every executor alike", T, float, double) {
  // Density 1 selects every element, so each position of check_non_finite is selected.
  check_non_finite_same_as_reference(randomk_sparsifier<T>({.amount = {.density = 1.0}, .seed = 5}));
}
