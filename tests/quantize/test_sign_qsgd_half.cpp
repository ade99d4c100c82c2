// The sign and QSGD quantizers on bf16 and fp16 gradients (docs/half-precision.md): every
// cpu_executor setting writes the reference's bytes and decodes them alike; the payload is the
// float32 quantizer's of the exactly widened values (sign bits or stochastic levels, float32 mean
// magnitudes or norms); a 16-bit output is the float32 value rounded, an accumulation sums in
// float32 and refuses an overflow with its output untouched; NaN/±Inf and a wrong dtype get named
// errors.
#include <gradcomp/core/reference_executor.hpp>
#include <gradcomp/quantize/qsgd.hpp>
#include <gradcomp/quantize/sign.hpp>

#include <doctest/doctest.h>

#include <cstdint>
#include <span>
#include <vector>

#include "support/codec_io.hpp"
#include "support/data.hpp"
#include "support/errors.hpp"
#include "support/executor_io.hpp"
#include "support/reference_check.hpp"

using namespace gradcomp;
using namespace gradcomp::test;

namespace {

// The quantizer of values V with blocks (or buckets) of `block` values.
template <class V>
struct sign_of {
  static sign_quantizer<V> make(std::uint32_t block) { return sign_quantizer<V>({.block = block}); }
};
template <class V>
struct qsgd_of {
  static qsgd_quantizer<V> make(std::uint32_t block) {
    return qsgd_quantizer<V>({.levels = 7, .bucket = block, .seed = 13});
  }
};

template <template <class> class Family, class H>
void check_family() {
  // Every cpu setting against the reference, every input kind and edge size.
  for (const std::uint32_t block : {std::uint32_t{7}, std::uint32_t{256}}) {
    CAPTURE(block);
    const auto q = Family<H>::make(block);
    for (const input_kind kind : all_input_kinds) {
      for (const std::size_t n : edge_sizes) {
        CAPTURE(name(kind));
        CAPTURE(n);
        (void)check_same_as_reference(q, make_half_input<H>(kind, n, 700 + n), {.step = 1, .tensor_id = 3});
      }
    }
  }
  // The float32 quantizer's payload of the widened values, and its decoded values (rounded into H).
  const std::size_t n = 5000;
  const std::vector<H> x = make_half_input<H>(input_kind::normal, n, 31, 20.0f);
  const auto q = Family<H>::make(64);
  const auto f = Family<float>::make(64);
  const std::vector<std::byte> m = encode_bytes(q, x, {.step = 2});
  const std::vector<std::byte> w = encode_bytes(f, widened(x), {.step = 2});
  CHECK(std::vector<std::byte>(m.begin() + 56, m.end()) == std::vector<std::byte>(w.begin() + 56, w.end()));
  CHECK(parse_envelope(m).dtype == dtype_of<H>);
  const std::vector<float> expected = decode_values(f, w, n);
  std::vector<float> as_float(n);
  q.decode(cpu_executor{}, m, std::span<float>(as_float), {});
  CHECK(bit_patterns(as_float) == bit_patterns(expected));
  const std::vector<H> acc = make_half_input<H>(input_kind::normal, n, 32, 20.0f);
  for (const cpu_executor& cpu : cpu_settings()) {
    const std::vector<H> as_half = decode_on(cpu, q, m, poisoned_values<H>(n));
    const std::vector<H> summed = decode_on(cpu, q, m, acc, true);
    bool rounded = true;
    for (std::size_t i = 0; i < n; ++i) {
      rounded = rounded && as_half[i].bits == narrow<H>(expected[i]).bits;
      rounded = rounded && summed[i].bits == narrow<H>(widen(acc[i]) + expected[i]).bits;
    }
    CHECK(rounded);
  }
  // NaN and infinities; another dtype's decoder; a 16-bit sum beyond the type's range.
  std::vector<H> bad = make_half_input<H>(input_kind::normal, 300, 3);
  bad[100] = H{static_cast<std::uint16_t>(float_traits<H>::infinity_key + 1)};
  CHECK(encode_outcome_on(reference_executor{}, q, bad).status == named(errc::non_finite_input));
  (void)check_same_as_reference(q, bad, {.step = 1});
  CHECK(decode_status_everywhere(f, m, n) == named(errc::dtype_mismatch));
  // One value at the type's largest finite magnitude (a finite norm or mean), added to an
  // accumulator that holds the largest value everywhere.
  const H largest{static_cast<std::uint16_t>(float_traits<H>::infinity_key - 1)};
  std::vector<H> one_big(64, H{0});
  one_big[0] = largest;
  const std::vector<H> big(64, largest);
  const std::vector<std::byte> big_message = encode_bytes(q, one_big);
  check_decode_refused_untouched(q, big_message, big, errc::narrowing_overflow, true);
}

}  // namespace

TEST_CASE_TEMPLATE("16-bit sign messages: the reference's bytes, the float32 payload, float32 arithmetic", H, bf16,
                   fp16) {
  check_family<sign_of, H>();
}

TEST_CASE_TEMPLATE("16-bit QSGD messages: the reference's bytes, the float32 payload, float32 arithmetic", H, bf16,
                   fp16) {
  check_family<qsgd_of, H>();
}
