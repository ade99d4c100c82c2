// Random-k on bf16 and fp16 gradients (docs/half-precision.md, docs/sparsifiers.md §3): the CPU
// writes the reference's bytes; the message holds each selected value's own 16 bits at the keyed
// permutation's positions (2 bytes a value, the wire dtype of the gradient); decoding into float32
// gives v·n/k computed in float32, into a 16-bit output that result rounded once (or added to the
// output in float32, then rounded once); a result beyond fp16's range is narrowing_overflow with
// the output untouched; summed messages round each sum to the type; NaN/±Inf and a wrong dtype get
// named errors. The oracle is written here from the permutation and float32 arithmetic.
#include <gradcomp/core/reference_executor.hpp>
#include <gradcomp/sparsify/randomk.hpp>

#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <span>
#include <type_traits>
#include <vector>

#include "support/codec_io.hpp"
#include "support/data.hpp"
#include "support/errors.hpp"
#include "support/executor_io.hpp"
#include "support/reference_check.hpp"

using namespace gradcomp;
using namespace gradcomp::test;

namespace {

/// The k values a message carries, as 16-bit patterns.
template <class H>
std::vector<std::uint16_t> carried_bits(const std::vector<std::byte>& message, std::size_t k) {
  std::vector<std::uint16_t> bits(k);
  if (k > 0) std::memcpy(bits.data(), message.data() + envelope::size, 2 * k);
  return bits;
}

}  // namespace

TEST_CASE_TEMPLATE("16-bit random-k: every cpu setting writes the reference's bytes and decodes them alike", H, bf16,
                   fp16) {
  for (const bool scaled : {true, false})
    for (const double density : {0.01, 0.3, 1.0}) {
      CAPTURE(scaled);
      CAPTURE(density);
      const randomk_sparsifier<H> q({.amount = {.density = density}, .seed = 11, .scaled = scaled});
      for (const input_kind kind : all_input_kinds)
        for (const std::size_t n : edge_sizes) {
          CAPTURE(name(kind));
          CAPTURE(n);
          (void)check_same_as_reference(q, make_half_input<H>(kind, n, 400 + n), {.step = 6, .tensor_id = 2});
        }
    }
}

TEST_CASE_TEMPLATE("16-bit random-k sends the permutation's values as their own 16 bits and decodes v*n/k in float32",
                   H, bf16, fp16) {
  const std::size_t n = 3000;
  const randomk_sparsifier<H> q({.amount = {.density = 0.07}, .seed = 5});
  const message_key key{.step = 9, .tensor_id = 4};
  const std::vector<H> x = make_half_input<H>(input_kind::normal, n, 21, 10.0f);
  const std::vector<std::byte> m = encode_bytes(q, x, key);
  const std::size_t k = q.k(n);
  CHECK(m.size() == envelope::size + 2 * k);
  CHECK(parse_envelope(m).dtype == dtype_of<H>);
  const random_permutation pick = q.permutation(n, key);
  const std::vector<std::uint16_t> bits = carried_bits<H>(m, k);
  bool carried = true;
  for (std::size_t j = 0; j < k; ++j) carried = carried && bits[j] == x[pick(j)].bits;
  CHECK(carried);
  // The oracle: v·s in float32 at π(j), zero elsewhere; s = n/k rounded to float32.
  const auto s = static_cast<float>(static_cast<double>(n) / static_cast<double>(k));
  std::vector<float> expected(n, 0.0f);
  for (std::size_t j = 0; j < k; ++j) expected[pick(j)] = widen(x[pick(j)]) * s;
  const std::vector<float> start = widened(make_half_input<H>(input_kind::normal, n, 22, 10.0f));
  const std::vector<H> start_half = make_half_input<H>(input_kind::normal, n, 23, 10.0f);
  for (const cpu_executor& cpu : cpu_settings()) {
    std::vector<float> out(n, 7.0f);
    q.decode(cpu, m, std::span<float>(out), {});
    CHECK(bit_patterns(out) == bit_patterns(expected));
    std::vector<H> out_half(n);
    q.decode(cpu, m, std::span<H>(out_half), {});
    std::vector<float> acc = start;
    q.decode_accumulate(cpu, m, std::span<float>(acc), {});
    std::vector<H> acc_half = start_half;
    q.decode_accumulate(cpu, m, std::span<H>(acc_half), {});
    bool rounded_once = true;
    for (std::size_t i = 0; i < n; ++i) {
      rounded_once = rounded_once && out_half[i].bits == narrow<H>(expected[i]).bits;
      rounded_once = rounded_once && acc[i] == start[i] + expected[i];
      rounded_once = rounded_once && acc_half[i].bits == narrow<H>(widen(start_half[i]) + expected[i]).bits;
    }
    CHECK(rounded_once);
  }
}

TEST_CASE_TEMPLATE("16-bit random-k: summed messages round each sum to the type; overflow is named", H, bf16, fp16) {
  const std::size_t n = 2000;
  const randomk_sparsifier<H> q({.amount = {.density = 0.1}, .seed = 8, .scaled = false});
  const message_key key{.step = 2};
  const std::vector<H> a = make_half_input<H>(input_kind::normal, n, 31, 3.0f);
  const std::vector<H> b = make_half_input<H>(input_kind::normal, n, 32, 3.0f);
  const std::vector<std::byte> ma = encode_bytes(q, a, key);
  const std::vector<std::byte> mb = encode_bytes(q, b, key);
  const random_permutation pick = q.permutation(n, key);
  const std::size_t k = q.k(n);
  for (const auto& run :
       {+[](const randomk_sparsifier<H>& c, std::vector<std::byte>& acc, const std::vector<std::byte>& other) {
          c.accumulate_encoded(reference_executor{}, acc, other);
        },
        +[](const randomk_sparsifier<H>& c, std::vector<std::byte>& acc, const std::vector<std::byte>& other) {
          c.accumulate_encoded(cpu_executor{}, acc, other);
        }}) {
    std::vector<std::byte> sum = ma;
    run(q, sum, mb);
    const std::vector<std::uint16_t> bits = carried_bits<H>(sum, k);
    bool rounded = true;
    for (std::size_t j = 0; j < k; ++j)
      rounded = rounded && bits[j] == narrow<H>(widen(a[pick(j)]) + widen(b[pick(j)])).bits;
    CHECK(rounded);
  }
  // Values at the type's largest finite magnitude: their sum does not fit, named, nothing changed.
  const H largest{static_cast<std::uint16_t>(float_traits<H>::infinity_key - 1)};
  const std::vector<std::byte> big = encode_bytes(q, std::vector<H>(n, largest), key);
  std::vector<std::byte> acc = big;
  CHECK(thrown_by([&] { q.accumulate_encoded(cpu_executor{}, acc, big); }) == named(errc::non_finite_input));
  CHECK(acc == big);
  // Scaled by n/k = 10, fp16's values overflow a 16-bit output but not a float32 one.
  if constexpr (std::is_same_v<H, fp16>) {
    const randomk_sparsifier<H> scaled({.amount = {.density = 0.1}, .seed = 8});
    const std::vector<H> x(n, narrow<H>(10000.0f));
    const std::vector<std::byte> m = encode_bytes(scaled, x, key);
    const std::vector<H> before = make_half_input<H>(input_kind::normal, n, 33);
    check_decode_refused_untouched(scaled, m, before, errc::narrowing_overflow);
    std::vector<float> wide(n);
    scaled.decode(cpu_executor{}, m, std::span<float>(wide), {});
    CHECK(wide[pick(0)] == 100000.0f);
  }
}

TEST_CASE_TEMPLATE("16-bit random-k rejects a selected NaN or infinity and messages of another dtype", H, bf16, fp16) {
  const std::size_t n = 500;
  const randomk_sparsifier<H> q({.amount = {.density = 0.2}, .seed = 3});
  const message_key key{.step = 1};
  const std::size_t selected = q.permutation(n, key)(0);
  for (const std::uint16_t bad :
       {std::uint16_t(float_traits<H>::infinity_key), std::uint16_t(0x8000u | float_traits<H>::infinity_key),
        std::uint16_t(float_traits<H>::infinity_key + 3)}) {
    std::vector<H> x = make_half_input<H>(input_kind::normal, n, 9);
    x[selected] = H{bad};
    CHECK(encode_outcome_on(reference_executor{}, q, x, key).status == named(errc::non_finite_input));
    (void)check_same_as_reference(q, x, key);
  }
  const std::vector<H> x = make_half_input<H>(input_kind::normal, n, 10);
  const randomk_sparsifier<float> wide({.amount = {.density = 0.2}, .seed = 3});
  CHECK(decode_status_everywhere(wide, encode_bytes(q, x), n) == named(errc::dtype_mismatch));
  CHECK(decode_status_everywhere(q, encode_bytes(wide, widened(x)), n) == named(errc::dtype_mismatch));
}
