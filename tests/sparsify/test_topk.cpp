// Exact top-k: the reference against a full-sort oracle, and every cpu_executor setting against the
// reference, over sizes, densities, value types and special inputs.
#include <gradcomp/core/reference_executor.hpp>
#include <gradcomp/sparsify/topk.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "support/codec_io.hpp"
#include "support/data.hpp"
#include "support/executor_io.hpp"
#include "support/oracles.hpp"
#include "support/reference_check.hpp"

using namespace gradcomp;
using namespace gradcomp::test;

namespace {

// Encodes x on the reference, checks the message size and the decoded tensor against the full-sort
// oracle, and that decode_accumulate adds exactly the decoded values; then checks that every
// cpu_executor setting writes the same bytes (its radix selection, candidate list and fallback
// passes against the reference's nth_element).
template <class T>
void check_against_oracle(const std::vector<T>& x, std::uint64_t k) {
  const topk_sparsifier<T> topk(sparsity{.density = 1.0, .k = k});
  const std::uint64_t kept = topk.k(x.size());
  const message_key key{.step = 3, .tensor_id = 1};
  const std::vector<std::byte> message = encode_on(reference_executor{}, topk, x, key);
  CHECK(message.size() == sparse_message_size_oracle(x.size(), kept, sizeof(T)));
  CHECK(message.size() <= topk.max_encoded_bytes(x.size()));

  const std::vector<T> expected = dense_at<T>(x, topk_indices_oracle<T>(x, kept));
  CHECK(bitwise_equal(decode_on(reference_executor{}, topk, message, poisoned_values<T>(x.size())), expected));
  const std::vector<T> acc = decode_on(reference_executor{}, topk, message, std::vector<T>(x.size(), T{1}), true);
  bool sums = true;
  for (std::size_t i = 0; i < x.size(); ++i) sums = sums && acc[i] == T{1} + expected[i];
  CHECK(sums);

  CHECK(check_same_as_reference(topk, x, key) == message);
}

template <class T>
void sweep() {
  const std::size_t sizes[] = {0, 1, 7, 1000, (1u << 16) + 1, (1u << 20) + 3};
  for (const std::size_t n : sizes) {
    const bool large = n > 1000;
    for (const input_kind kind : all_input_kinds) {
      if (large && kind != input_kind::normal && kind != input_kind::ties) continue;
      const std::vector<T> x = make_input<T>(kind, n, 1000 + n);
      std::vector<std::uint64_t> ks = {1, n, (n + 99) / 100};
      if (!large) ks.insert(ks.end(), {n / 2, n / 10 + 1, n > 1 ? n - 1 : 1});
      for (const std::uint64_t k : ks) {
        CAPTURE(n);
        CAPTURE(name(kind));
        CAPTURE(k);
        check_against_oracle(x, k);
      }
    }
  }
}

}  // namespace

TEST_CASE_TEMPLATE("top-k keeps exactly the k largest magnitudes, ties to the lower index", T, float, double) {
  sweep<T>();
}

TEST_CASE("top-k resolves a bucket larger than its candidate buffer with extra passes") {
  // 300000 values that share their top 11 key bits but differ below: the first histogram bucket
  // holds everything, more than the n/16 candidate buffer, so selection descends over the data.
  std::vector<float> x(300000);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = 1.0f + static_cast<float>((i * 7919) % 65536) * 1e-6f;
  for (const std::uint64_t k : {std::uint64_t{1}, std::uint64_t{3000}, std::uint64_t{150001}}) {
    CAPTURE(k);
    check_against_oracle(x, k);
  }
}

TEST_CASE("top-k keeps the sign of -0 and orders subnormals by magnitude") {
  const float tiny = std::numeric_limits<float>::denorm_min();
  const std::vector<float> x = {-0.0f, 3 * tiny, -5 * tiny, 0.0f, tiny, -0.0f};
  const topk_sparsifier<float> topk(sparsity{.k = 4});
  const std::vector<float> decoded = decode_values(topk, encode_bytes(topk, x), x.size());
  // Magnitudes: 5t (index 2), 3t (index 1), t (index 4), then the first zero (index 0, which is -0).
  CHECK(decoded[2] == -5 * tiny);
  CHECK(decoded[1] == 3 * tiny);
  CHECK(decoded[4] == tiny);
  CHECK(std::signbit(decoded[0]));
  CHECK(decoded[3] == 0.0f);
}

TEST_CASE_TEMPLATE("top-k rejects NaN and Inf before writing anything", T, float, double) {
  const T specials[] = {std::numeric_limits<T>::quiet_NaN(), std::numeric_limits<T>::infinity(),
                        -std::numeric_limits<T>::infinity(), -std::numeric_limits<T>::quiet_NaN()};
  for (const T special : specials) {
    std::vector<T> x = make_input<T>(input_kind::normal, 5000, 5);
    x[1234] = special;
    const topk_sparsifier<T> topk(sparsity{.density = 0.01});
    const cpu_executor cpu;
    std::vector<std::byte> out(topk.max_encoded_bytes(x.size()), std::byte{0xAB});
    std::vector<std::byte> ws(topk.workspace_bytes(cpu, x.size()));
    try {
      topk.encode(cpu, std::span<const T>(x), out, ws);
      FAIL("a non-finite gradient was encoded");
    } catch (const error& e) {
      CHECK(e.code() == errc::non_finite_input);
    }
    bool untouched = true;
    for (const std::byte b : out) untouched = untouched && b == std::byte{0xAB};
    CHECK(untouched);
  }
}

TEST_CASE_TEMPLATE("top-k rejects NaN and Inf on every executor alike", T, float, double) {
  check_non_finite_same_as_reference(topk_sparsifier<T>(sparsity{.density = 0.01}));
}

TEST_CASE("top-k reports small buffers and bad parameters with named errors") {
  const std::vector<float> x = make_input<float>(input_kind::normal, 1000, 1);
  const topk_sparsifier<float> topk(sparsity{.density = 0.1});
  const cpu_executor cpu;
  std::vector<std::byte> ws(topk.workspace_bytes(cpu, x.size()));
  std::vector<std::byte> small(100);
  try {
    topk.encode(cpu, std::span<const float>(x), small, ws);
    FAIL("encoded into a too-small buffer");
  } catch (const error& e) {
    CHECK(e.code() == errc::buffer_too_small);
  }
  std::vector<std::byte> out(topk.max_encoded_bytes(x.size()));
  std::vector<std::byte> tiny_ws(16);
  try {
    topk.encode(cpu, std::span<const float>(x), out, tiny_ws);
    FAIL("encoded with a too-small workspace");
  } catch (const error& e) {
    CHECK(e.code() == errc::workspace_too_small);
  }
  for (const double density : {0.0, -0.5, 1.5, std::numeric_limits<double>::quiet_NaN()}) {
    try {
      topk_sparsifier<float> bad(sparsity{.density = density});
      FAIL("accepted density ", density);
    } catch (const error& e) {
      CHECK(e.code() == errc::invalid_argument);
    }
  }
}

TEST_CASE("top-k's k follows the runtime density and an explicit k overrides it") {
  topk_sparsifier<float> topk(sparsity{.density = 0.01});
  CHECK(topk.k(0) == 0);
  CHECK(topk.k(1) == 1);
  CHECK(topk.k(1000) == 10);
  CHECK(topk.k(1001) == 11);  // ceil(10.01)
  topk.set_amount(sparsity{.density = 0.5});
  CHECK(topk.k(7) == 4);
  topk.set_amount(sparsity{.k = 12});
  CHECK(topk.k(10) == 10);
  CHECK(topk.k(100) == 12);
}

TEST_CASE("top-k messages of differently configured ranks are rejected") {
  const std::vector<float> x = make_input<float>(input_kind::normal, 1000, 2);
  const topk_sparsifier<float> sender(sparsity{.density = 0.05});
  const topk_sparsifier<float> receiver(sparsity{.density = 0.01});
  const std::vector<std::byte> message = encode_bytes(sender, x);
  try {
    decode_values(receiver, message, x.size());
    FAIL("decoded a message of another configuration");
  } catch (const error& e) {
    CHECK(e.code() == errc::parameter_mismatch);
  }
  const topk_sparsifier<double> other_type(sparsity{.density = 0.05});
  try {
    decode_values(other_type, message, x.size());
    FAIL("decoded float values as double");
  } catch (const error& e) {
    CHECK(e.code() == errc::dtype_mismatch);
  }
}
