// The shared-scale quantizer on bf16 and fp16 gradients (docs/half-precision.md): every
// cpu_executor setting writes the reference's bytes and decodes them to the same bits; the
// payload of every rank's message, and of their sum, is the float32 quantizer's on the exactly
// widened values (the documented equivalence), so the sum decodes to exactly what the float32
// quantizer's sum does; decoded sums are within P half steps of the sum of the widened inputs (an
// oracle reading the message's own scales); a 16-bit output is the float32 result rounded once,
// and an fp16 sum beyond 65504 is `narrowing_overflow` with the output untouched; NaN/±Inf inputs
// are refused. compressed_all_reduce runs `summed_encodings` for them (its automatic plan): every
// rank ends with the float32 decoding of the summed message, divided by P in float32 and rounded
// once.
#include <gradcomp/collective/compressed_all_reduce.hpp>
#include <gradcomp/core/reference_executor.hpp>
#include <gradcomp/quantize/shared_scale.hpp>
#include <gradcomp/transport/in_process.hpp>

#include <doctest/doctest.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "support/codec_io.hpp"
#include "support/data.hpp"
#include "support/errors.hpp"
#include "support/executor_io.hpp"
#include "support/reference_check.hpp"

using namespace gradcomp;
using namespace gradcomp::test;

static_assert(homomorphic<shared_scale_quantizer<bf16>, cpu_executor>);
static_assert(summed_in_messages<shared_scale_quantizer<fp16>>);

namespace {

// The payload (the bytes after the 56-byte envelope).
std::vector<std::byte> payload_after_envelope(const std::vector<std::byte>& m) {
  return {m.begin() + static_cast<std::ptrdiff_t>(envelope::size), m.end()};
}

const shared_scale_params shared_layouts[] = {
    {.bits = 8, .block = 256},
    {.bits = 4, .block = 32, .headroom_bits = 2},
    {.bits = 2, .block = 100},
    {.bits = 1, .block = 7},
    {.bits = 4, .block = 64, .round = rounding::stochastic, .seed = 5},
};

// P ranks' 16-bit gradients, rank r scaled by (1 + r) so that their block maxima differ.
template <class H>
std::vector<std::vector<H>> half_ranks(std::size_t ranks, std::size_t n, std::uint64_t seed) {
  std::vector<std::vector<H>> x;
  for (std::size_t r = 0; r < ranks; ++r)
    x.push_back(make_half_input<H>(input_kind::normal, n, seed + 31 * r, static_cast<float>(1 + r)));
  return x;
}

// The messages' sum as a SUM collective forms it.
template <class T>
std::vector<std::byte> summed(const shared_scale_quantizer<T>& q, std::vector<std::vector<std::byte>> messages) {
  for (std::size_t r = 1; r < messages.size(); ++r) q.accumulate_encoded(cpu_executor{}, messages[0], messages[r]);
  return messages[0];
}

}  // namespace

TEST_CASE_TEMPLATE(
    "16-bit shared-scale messages: every cpu setting writes the reference's bytes and decodes them alike", H, bf16,
    fp16) {
  for (const shared_scale_params& p : shared_layouts) {
    CAPTURE(p.bits);
    CAPTURE(p.block);
    const shared_scale_quantizer<H> q(p);
    // The single-stage encode (this rank's maxima, rank 0) on every input kind and edge size.
    check_inputs_same_as_reference(q);
    // encode_shared with float32 maxima above this rank's own, as rank 2.
    check_encode_shared_same_as_reference(q, make_half_input<H>(input_kind::normal, 1001, 14, 8.0f));
  }
}

TEST_CASE_TEMPLATE("16-bit shared-scale messages and their sums are the float32 quantizer's of the widened values", H,
                   bf16, fp16) {
  for (const shared_scale_params& p : shared_layouts) {
    CAPTURE(p.bits);
    CAPTURE(p.block);
    const shared_scale_quantizer<H> half_q(p);
    const shared_scale_quantizer<float> float_q(p);
    const std::size_t n = 3000, P = 4;
    const std::vector<std::vector<H>> x = half_ranks<H>(P, n, 3);
    const message_key key{.step = 2, .tensor_id = 1};
    const auto half_messages = encode_shared_ranks(half_q, x, key);
    const auto float_messages = encode_shared_ranks(float_q, widened_ranks(x), key);
    for (std::size_t r = 0; r < P; ++r) {
      CHECK(payload_after_envelope(half_messages[r]) == payload_after_envelope(float_messages[r]));
      const envelope e = parse_envelope(half_messages[r]);
      CHECK(e.dtype == dtype_of<H>);
      CHECK(e.params_hash == half_q.params_hash());
      CHECK(half_messages[r].size() == half_q.max_encoded_bytes(n));
    }
    CHECK(half_q.params_hash() != float_q.params_hash());
    const std::vector<std::byte> half_sum = summed(half_q, half_messages);
    const std::vector<std::byte> float_sum = summed(float_q, float_messages);
    CHECK(payload_after_envelope(half_sum) == payload_after_envelope(float_sum));
    // The sum decodes into float32 to the float32 quantizer's decoding, bit for bit, and into the
    // 16-bit type to that rounded once, on every executor.
    const std::vector<float> expected = decode_values(float_q, float_sum, n);
    for (const cpu_executor& cpu : cpu_settings()) {
      CHECK(bit_patterns(decode_on(cpu, half_q, half_sum, std::vector<float>(n, 7.0f))) == bit_patterns(expected));
      const std::vector<H> narrowed = decode_on(cpu, half_q, half_sum, poisoned_values<H>(n));
      bool rounded_once = true;
      for (std::size_t i = 0; i < n; ++i)
        rounded_once = rounded_once && narrowed[i].bits == narrow<H>(expected[i]).bits;
      CHECK(rounded_once);
    }
    CHECK(bit_patterns(decode_on(reference_executor{}, half_q, half_sum, poisoned_values<H>(n))) ==
          bit_patterns(decode_on(cpu_executor{}, half_q, half_sum, poisoned_values<H>(n))));
  }
}

TEST_CASE_TEMPLATE("a 16-bit shared-scale sum is within P half steps of the sum of the widened inputs", H, bf16, fp16) {
  const shared_scale_params p{.bits = 4, .block = 32};
  const shared_scale_quantizer<H> q(p);
  const std::size_t n = 1000, P = 5;
  const std::vector<std::vector<H>> x = half_ranks<H>(P, n, 9);
  const std::vector<std::byte> sum = summed(q, encode_shared_ranks(q, x, {.step = 1}));
  // The oracle reads the scales straight from the documented layout: float32, one per block.
  std::vector<float> scales(q.block_count(n));
  std::memcpy(scales.data(), sum.data() + envelope::size, scales.size() * sizeof(float));
  const std::vector<float> decoded = decode_on(cpu_executor{}, q, sum, std::vector<float>(n));
  bool within = true;
  for (std::size_t i = 0; i < n; ++i) {
    double exact = 0.0;
    for (std::size_t r = 0; r < P; ++r) exact += static_cast<double>(widen(x[r][i]));
    // Half a step per contribution, and the float32 roundings of L/m and of t = x·L/m.
    within = within && std::fabs(static_cast<double>(decoded[i]) - exact) <=
                           static_cast<double>(P) * scales[i / p.block] / 2 * (1 + 1e-5);
  }
  CHECK(within);
  // Accumulating sums in float32 and rounds once into a 16-bit output.
  const std::vector<H> acc = make_half_input<H>(input_kind::normal, n, 12, 2.0f);
  const std::vector<H> added = decode_on(cpu_executor{}, q, sum, acc, true);
  const std::vector<float> added_wide = decode_on(cpu_executor{}, q, sum, widened(acc), true);
  bool once = true;
  for (std::size_t i = 0; i < n; ++i) {
    once = once && added_wide[i] == widen(acc[i]) + decoded[i] && added[i].bits == narrow<H>(added_wide[i]).bits;
  }
  CHECK(once);
  CHECK(bit_patterns(decode_on(reference_executor{}, q, sum, acc, true)) == bit_patterns(added));
}

TEST_CASE("an fp16 shared-scale sum beyond 65504 is narrowing_overflow, the output untouched") {
  const shared_scale_quantizer<fp16> q({.bits = 8, .block = 16});
  const std::size_t n = 64;
  std::vector<std::vector<fp16>> x(2, std::vector<fp16>(n, narrow<fp16>(1.0f)));
  x[0][20] = x[1][20] = narrow<fp16>(60000.0f);
  const std::vector<std::byte> sum = summed(q, encode_shared_ranks(q, x));
  const std::vector<fp16> before = make_half_input<fp16>(input_kind::normal, n, 2);
  check_decode_refused_untouched(q, sum, before, errc::narrowing_overflow);
  // Into float32 the sum decodes: 120000 within a step of the 8-bit code.
  const std::vector<float> wide = decode_on(cpu_executor{}, q, sum, std::vector<float>(n));
  CHECK(std::fabs(wide[20] - 120000.0f) <= 60000.0f / 127);
}

TEST_CASE_TEMPLATE("16-bit shared-scale encoders refuse NaN and infinities and mark the maxima", H, bf16, fp16) {
  const shared_scale_quantizer<H> q({.bits = 4, .block = 16});
  for (const std::uint16_t bad :
       {std::uint16_t(float_traits<H>::infinity_key), std::uint16_t(0x8000u | float_traits<H>::infinity_key),
        std::uint16_t(float_traits<H>::infinity_key | 1u)}) {
    CAPTURE(bad);
    std::vector<H> x = make_half_input<H>(input_kind::normal, 40, 5);
    x[17] = H{bad};
    CHECK(encode_outcome_on(reference_executor{}, q, x).status == named(errc::non_finite_input));
    CHECK(encode_outcome_on(cpu_executor{}, q, x).status == named(errc::non_finite_input));
    std::vector<float> maxima(q.block_count(x.size()), 0.0f);
    CHECK(thrown_by([&] { q.block_maxima(cpu_executor{}, std::span<const H>(x), std::span<float>(maxima)); }) ==
          named(errc::non_finite_input));
    for (const float m : maxima) CHECK(std::isinf(m));
  }
}

TEST_CASE_TEMPLATE("compressed_all_reduce sums 16-bit shared-scale messages in place and rounds the mean once", H, bf16,
                   fp16) {
  constexpr int P = 3;
  constexpr std::size_t n = 777;
  const shared_scale_quantizer<H> q({.bits = 4, .block = 64});
  const std::vector<std::vector<H>> x = half_ranks<H>(P, n, 21);
  const message_key key{.step = 4, .tensor_id = 2};
  // The oracle: the float32 quantizer's summed message of the widened gradients, decoded, divided by
  // P in float32, rounded once.
  const shared_scale_quantizer<float> float_q({.bits = 4, .block = 64});
  const std::vector<float> sum =
      decode_values(float_q, summed(float_q, encode_shared_ranks(float_q, widened_ranks(x), key)), n);
  CHECK(automatic_plan(q, n, P, true) == all_reduce_plan::summed_encodings);
  for (const bool average : {false, true}) {
    std::vector<std::vector<H>> results(P);
    std::atomic<int> reported{0};
    in_process_group(P).run([&](in_process_transport& t) {
      std::vector<H> data = x[static_cast<std::size_t>(t.rank())];
      const compressed_report report =
          compressed_all_reduce(cpu_executor{}, t, q, std::span<H>(data), {.key = key, .average = average});
      // The float32 maxima's all-reduce and the summable region's: fewer bytes than the 16-bit ring.
      if (report.sent_bytes > 0 && report.sent_bytes < report.dense_bytes) ++reported;
      results[static_cast<std::size_t>(t.rank())] = data;
    });
    CHECK(reported.load() == P);
    std::vector<std::uint16_t> expected(n);
    for (std::size_t i = 0; i < n; ++i) expected[i] = narrow<H>(average ? sum[i] / static_cast<float>(P) : sum[i]).bits;
    for (const std::vector<H>& r : results) CHECK(bit_patterns(r) == expected);
  }
}

TEST_CASE("compressed_all_reduce of fp16 shared-scale sums beyond 65504 throws narrowing_overflow everywhere") {
  // 60000 on both ranks at one element: the float32 sum (about 120000) is beyond fp16, its mean is
  // not. Without `average` every rank throws and keeps its data; with it every rank succeeds.
  constexpr int P = 2;
  constexpr std::size_t n = 100;
  const shared_scale_quantizer<fp16> q({.bits = 8, .block = 16});
  std::atomic<int> overflowed{0}, kept{0}, averaged{0};
  in_process_group(P).run([&](in_process_transport& t) {
    std::vector<fp16> data = make_half_input<fp16>(input_kind::normal, n, 40 + static_cast<std::uint64_t>(t.rank()));
    data[9] = narrow<fp16>(60000.0f);
    const std::vector<fp16> before = data;
    if (thrown_by([&] { compressed_all_reduce(cpu_executor{}, t, q, std::span<fp16>(data)); }) ==
        named(errc::narrowing_overflow))
      ++overflowed;
    if (bit_patterns(data) == bit_patterns(before)) ++kept;
    compressed_all_reduce(cpu_executor{}, t, q, std::span<fp16>(data), {.average = true});
    if (std::fabs(widen(data[9]) - 60000.0f) <= 60000.0f / 127) ++averaged;
  });
  CHECK(overflowed.load() == P);
  CHECK(kept.load() == P);
  CHECK(averaged.load() == P);
}
