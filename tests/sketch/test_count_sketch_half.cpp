// The count sketch of bf16 and fp16 gradients (docs/half-precision.md): its float32 cells are the
// plain-loop oracle's sketch of the exactly widened values, byte for byte the float32 codec's;
// every cpu_executor setting writes and decodes the reference's bits; estimates and heavy hitters
// are the float32 codec's; a 16-bit output is the float32 result rounded once, refused with its
// output untouched when it would overflow; NaN/±Inf and a wrong dtype get named errors; the ranks'
// sketches are summed in the messages (`summed_encodings`) as float32 cells.
#include <gradcomp/collective/compressed_all_reduce.hpp>
#include <gradcomp/core/reference_executor.hpp>
#include <gradcomp/sketch/count_sketch.hpp>
#include <gradcomp/transport/in_process.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <span>
#include <vector>

#include "support/codec_io.hpp"
#include "support/data.hpp"
#include "support/errors.hpp"
#include "support/executor_io.hpp"
#include "support/golden_cases.hpp"
#include "support/oracles.hpp"
#include "support/reference_check.hpp"
#include "support/sketch_oracle.hpp"

using namespace gradcomp;
using namespace gradcomp::test;

static_assert(std::is_same_v<count_sketch<bf16>::cell_type, float>);
static_assert(std::is_same_v<count_sketch<double>::cell_type, double>);
static_assert(summed_in_messages<count_sketch<fp16>>);
static_assert(std::is_same_v<summed_word_t<count_sketch<bf16>>, float>);

TEST_CASE_TEMPLATE("16-bit count sketch: every cpu setting writes the reference's cells and decodes them to its bits",
                   H, bf16, fp16) {
  for (const std::uint32_t rows : {1u, 3u, 4u}) {
    CAPTURE(rows);
    check_inputs_same_as_reference(
        count_sketch<H>({.rows = rows, .columns = 61, .seed = 0x5eedull + rows, .heavy_hitters = {.density = 0.05}}));
  }
  check_non_finite_same_as_reference(count_sketch<H>({.rows = 3, .columns = 100}));
}

TEST_CASE_TEMPLATE("16-bit count sketch: the oracle's float32 cells of the widened values, decoded as float32's", H,
                   bf16, fp16) {
  const count_sketch_params p{.rows = 3, .columns = 211, .seed = 77, .heavy_hitters = {.k = 40}};
  const count_sketch<H> cs(p);
  const count_sketch<float> f(p);
  constexpr std::size_t n = 4001;
  const std::vector<H> x = make_half_input<H>(input_kind::normal, n, 12, 30.0f);
  const std::vector<H> y = make_half_input<H>(input_kind::normal, n, 13, 30.0f);
  const message_key key{.step = 5, .tensor_id = 1};
  const std::vector<std::byte> m = encode_bytes(cs, x, key), w = encode_bytes(f, widened(x), key);
  // The oracle's cells, and the float32 codec's payload; only the dtype and the parameter hash differ.
  CHECK(m.size() == envelope_bytes + 4 * p.rows * p.columns);
  CHECK(bitwise_equal(cells_of<float>(m), oracle_table(p, widened(x))));
  CHECK(std::vector<std::byte>(m.begin() + 56, m.end()) == std::vector<std::byte>(w.begin() + 56, w.end()));
  CHECK(parse_envelope(m).dtype == dtype_of<H>);
  CHECK(cs.params_hash() != f.params_hash());
  CHECK(decode_status_everywhere(f, m, n) == named(errc::dtype_mismatch));
  CHECK(decode_status_everywhere(cs, w, n) == named(errc::dtype_mismatch));

  const std::vector<float> expected = decode_values(f, w, n);
  const std::vector<float> estimates = oracle_estimates(p, oracle_table(p, widened(x)), n);
  const std::vector<H> acc = make_half_input<H>(input_kind::normal, n, 14, 30.0f);
  std::vector<std::byte> my = encode_bytes(cs, y, key), summed_float = w;
  f.accumulate_encoded(cpu_executor{}, summed_float, std::span<const std::byte>(encode_bytes(f, widened(y), key)));
  const auto check_on = [&](const auto& exec) {
    std::vector<float> got(n);
    cs.estimate(exec, m, std::span<float>(got), {});
    CHECK(bit_patterns(got) == bit_patterns(estimates));
    std::vector<std::byte> ws(cs.workspace_bytes(exec, n));
    std::vector<std::uint64_t> hitters(40), float_hitters(40);
    REQUIRE(cs.heavy_hitters(exec, m, n, std::span<std::uint64_t>(hitters), ws) == 40);
    REQUIRE(f.heavy_hitters(exec, w, n, std::span<std::uint64_t>(float_hitters), ws) == 40);
    CHECK(hitters == float_hitters);
    // Into float32: the float32 codec's values; into H: those rounded once; onto H: the float32 sum rounded.
    std::vector<float> as_float(n, 3.0f);
    cs.decode(exec, m, std::span<float>(as_float), ws);
    CHECK(bit_patterns(as_float) == bit_patterns(expected));
    std::vector<float> float_acc = widened(acc);
    cs.decode_accumulate(exec, m, std::span<float>(float_acc), ws);
    const std::vector<H> as_half = decode_on(exec, cs, m, poisoned_values<H>(n));
    const std::vector<H> onto = decode_on(exec, cs, m, acc, true);
    bool rounded = true;
    for (std::size_t i = 0; i < n; ++i) {
      rounded = rounded && float_acc[i] == widen(acc[i]) + expected[i];
      rounded = rounded && as_half[i].bits == narrow<H>(expected[i]).bits;
      rounded = rounded && onto[i].bits == narrow<H>(widen(acc[i]) + expected[i]).bits;
    }
    CHECK(rounded);
    // The summed cells are the float32 codec's sum.
    std::vector<std::byte> sum = m;
    cs.accumulate_encoded(exec, sum, std::span<const std::byte>(my));
    CHECK(std::vector<std::byte>(sum.begin() + 56, sum.end()) ==
          std::vector<std::byte>(summed_float.begin() + 56, summed_float.end()));
  };
  check_on(reference_executor{});
  for (const cpu_executor& cpu : cpu_settings()) check_on(cpu);
}

TEST_CASE_TEMPLATE("16-bit count sketch: a result beyond the 16-bit range is refused with the output untouched", H,
                   bf16, fp16) {
  // One value at the type's largest magnitude, the only heavy hitter; accumulated onto the largest
  // value everywhere, the float32 sum is beyond the type (bf16: beyond float32 itself).
  const H largest{static_cast<std::uint16_t>(float_traits<H>::infinity_key - 1)};
  const count_sketch<H> cs({.rows = 3, .columns = 64, .seed = 2, .heavy_hitters = {.k = 1}});
  std::vector<H> one_big(64, H{0});
  one_big[5] = largest;
  const std::vector<std::byte> message = encode_bytes(cs, one_big);
  check_decode_refused_untouched(cs, message, std::vector<H>(64, largest), errc::narrowing_overflow, true);
  std::vector<float> into_float(64, widen(largest));
  std::vector<std::byte> ws(cs.workspace_bytes(cpu_executor{}, 64));
  cs.decode_accumulate(cpu_executor{}, message, std::span<float>(into_float), ws);
  CHECK(into_float[5] == 2.0f * widen(largest));
  if constexpr (std::is_same_v<H, fp16>) {
    // Two values of 60000 sharing the one cell with the same sign: an estimate of 120000, which a
    // plain decode into fp16 refuses and one into float32 gives.
    const count_sketch<fp16> one({.rows = 1, .columns = 1, .heavy_hitters = {.k = 1}});
    const std::uint32_t row_seed = count_sketch_row_seed(0, 0);
    const std::vector<fp16> two{count_sketch_signed(count_sketch_hash(row_seed, 0), narrow<fp16>(60000.0f)),
                                count_sketch_signed(count_sketch_hash(row_seed, 1), narrow<fp16>(60000.0f))};
    const std::vector<std::byte> m = encode_bytes(one, two);
    check_decode_refused_untouched(one, m, std::vector<fp16>(2, fp16{0}), errc::narrowing_overflow, false);
    std::vector<float> f(2);
    one.decode(cpu_executor{}, m, std::span<float>(f), ws);
    CHECK(std::fabs(f[0]) == 120000.0f);
  }
}

TEST_CASE_TEMPLATE("16-bit count sketch: accumulating touches only the heavy hitters; the second round widens", H, bf16,
                   fp16) {
  // An accumulator holding Inf and NaN away from the heavy hitters: they stay as they were, on the
  // reference as on the CPU, and the heavy hitters get the float32 sums rounded once.
  const count_sketch<H> cs({.rows = 3, .columns = 128, .seed = 3, .heavy_hitters = {.k = 5}});
  constexpr std::size_t n = 600;
  const std::vector<H> x = make_half_input<H>(input_kind::normal, n, 21);
  const std::vector<std::byte> m = encode_bytes(cs, x);
  std::vector<std::uint64_t> hitters(5);
  std::vector<std::byte> ws(cs.workspace_bytes(cpu_executor{}, n));
  REQUIRE(cs.heavy_hitters(cpu_executor{}, m, n, std::span<std::uint64_t>(hitters), ws) == 5);
  std::vector<H> acc = make_half_input<H>(input_kind::normal, n, 22);
  const auto not_hit = [&](std::uint64_t i) { return std::find(hitters.begin(), hitters.end(), i) == hitters.end(); };
  std::uint64_t inf_at = 0, nan_at = 1;
  while (!not_hit(inf_at)) ++inf_at;
  while (nan_at == inf_at || !not_hit(nan_at)) ++nan_at;
  acc[inf_at] = H{float_traits<H>::infinity_key};
  acc[nan_at] = H{static_cast<std::uint16_t>(float_traits<H>::infinity_key + 1)};
  std::vector<float> estimates(n);
  cs.estimate(cpu_executor{}, m, std::span<float>(estimates), {});
  const auto check_on = [&](const auto& exec) {
    const std::vector<H> got = decode_on(exec, cs, m, acc, true);
    bool as_documented = true;
    for (std::size_t i = 0; i < n; ++i)
      as_documented =
          as_documented && got[i].bits == (not_hit(i) ? acc[i].bits : narrow<H>(widen(acc[i]) + estimates[i]).bits);
    CHECK(as_documented);
  };
  check_on(reference_executor{});
  for (const cpu_executor& cpu : cpu_settings()) check_on(cpu);
  // The second round's values: as they are, or widened into float32.
  std::vector<H> same(5);
  std::vector<float> wide(5);
  gather_values(std::span<const H>(x), std::span<const std::uint64_t>(hitters), std::span<H>(same));
  gather_values(std::span<const H>(x), std::span<const std::uint64_t>(hitters), std::span<float>(wide));
  for (std::size_t q = 0; q < 5; ++q) {
    CHECK(same[q].bits == x[hitters[q]].bits);
    CHECK(wide[q] == widen(x[hitters[q]]));
  }
}

TEST_CASE_TEMPLATE("compressed_all_reduce sums 16-bit count sketches in the messages as float32 cells", H, bf16, fp16) {
  // Every rank runs the float32 codec on its widened gradient through the same transport too: the
  // 16-bit result is that float32 result rounded once, with and without `average`.
  constexpr int P = 3;
  constexpr std::size_t n = 2000;
  const count_sketch_params p{.rows = 3, .columns = 300, .seed = 9, .heavy_hitters = {.density = 0.05}};
  const count_sketch<H> cs(p);
  const count_sketch<float> f(p);
  CHECK(automatic_plan(cs, n, P, true) == all_reduce_plan::summed_encodings);
  for (const bool average : {false, true}) {
    std::atomic<int> matched{0}, smaller{0};
    in_process_group(P).run([&](in_process_transport& t) {
      std::vector<H> data = make_half_input<H>(input_kind::normal, n, 60 + static_cast<std::uint64_t>(t.rank()), 5.0f);
      std::vector<float> wide = widened(data);
      const all_reduce_options options{.key = {.step = 1}, .average = average};
      const compressed_report report = compressed_all_reduce(cpu_executor{}, t, cs, std::span<H>(data), options);
      (void)compressed_all_reduce(cpu_executor{}, t, f, std::span<float>(wide), options);
      bool same = true;
      for (std::size_t i = 0; i < n; ++i) same = same && data[i].bits == narrow<H>(wide[i]).bits;
      if (same) ++matched;
      // r·c float32 cells against the 16-bit ring of n values.
      if (report.sent_bytes > 0 && report.sent_bytes < report.dense_bytes) ++smaller;
    });
    CHECK(matched.load() == P);
    CHECK(smaller.load() == P);
  }
}

TEST_CASE("the golden bf16 count-sketch file holds the oracle's cells and decodes to its heavy hitters") {
  const count_sketch_params p{.rows = 3, .columns = 64, .seed = 7, .heavy_hitters = {.k = 10}};
  const std::vector<float> x = widened(golden_input<bf16>(1000));
  const std::vector<std::byte> golden = read_golden("count_sketch_bf16.bin");
  REQUIRE(golden.size() == 56 + 3 * 64 * 4);
  CHECK(parse_envelope(golden).dtype == value_dtype::bfloat16);
  CHECK(bitwise_equal(cells_of<float>(golden), oracle_table(p, x)));
  const std::vector<float> est = oracle_estimates(p, oracle_table(p, x), x.size());
  std::vector<float> got(x.size());
  std::vector<std::byte> ws(count_sketch<bf16>(p).workspace_bytes(cpu_executor{}, x.size()));
  count_sketch<bf16>(p).decode(cpu_executor{}, golden, std::span<float>(got), ws);
  CHECK(bitwise_equal(got, dense_at<float>(est, topk_indices_oracle<float>(est, 10))));
}
