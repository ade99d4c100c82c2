// Lossless homomorphic compression of bf16 and fp16 gradients (docs/half-precision.md): the index
// is the one of the widened values, the sketch is byte for byte the float32 codec's sketch of the
// widened values, every cpu_executor setting matches the reference bit for bit (peeling order and
// stalls included), the decoded float32 values are the exact sums on grid data, and a 16-bit output
// is that value rounded once, refused with `narrowing_overflow` (the output untouched) when it would
// overflow; NaN and ±Inf poison the index and the sketch as for float. compressed_all_reduce sums
// the float32 sketches and rounds the sum (or mean) once into the 16-bit data, after a stall too.
#include <gradcomp/collective/compressed_all_reduce.hpp>
#include <gradcomp/core/reference_executor.hpp>
#include <gradcomp/sketch/lossless_homomorphic.hpp>
#include <gradcomp/transport/in_process.hpp>

#include <doctest/doctest.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "support/data.hpp"
#include "support/errors.hpp"
#include "support/executor_io.hpp"
#include "support/reference_check.hpp"

using namespace gradcomp;
using namespace gradcomp::test;

static_assert(std::is_same_v<lossless_homomorphic<fp16>::cell_type, float>);
static_assert(std::is_same_v<lossless_homomorphic<double>::cell_type, double>);

namespace {

/// P ranks' 16-bit gradients of n values, each non-zero with probability `density`: m/16 for an
/// integer 0 < |m| < 128 (exact in bf16 and fp16, and every float32 sum of them is exact), or
/// N(0, 1) rounded to H.
template <class H>
std::vector<std::vector<H>> sparse_half_ranks(std::size_t ranks, std::size_t n, double density, std::uint64_t seed,
                                              bool grid) {
  std::mt19937_64 engine(seed);
  std::bernoulli_distribution keep(density);
  std::uniform_int_distribution<int> level(-127, 127);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<std::vector<H>> x(ranks, std::vector<H>(n, H{0}));
  for (std::vector<H>& g : x)
    for (H& v : g) {
      if (!keep(engine)) continue;
      const int m = level(engine);
      v = narrow<H>(grid ? static_cast<float>(m == 0 ? 1 : m) / 16.0f : normal(engine));
    }
  return x;
}

/// One run of the protocol over the ranks' gradients on `exec`: the aggregated (ORed) index, the
/// plan, the float32 sum of the sketches in rank order, and the decoded values in O (H or float).
template <class O>
struct half_run {
  std::vector<std::byte> index;
  lhc_plan plan;
  std::vector<float> summed;
  std::vector<O> out;
  lhc_decode_result result;
};

template <class O, class V, class E>
half_run<O> run_on(const E& exec, const lossless_homomorphic<V>& lhc, const std::vector<std::vector<V>>& x,
                   const std::vector<O>& before) {
  const std::size_t n = x.front().size();
  half_run<O> run;
  run.index.assign(lhc.index_bytes(n), std::byte{0});
  for (const std::vector<V>& g : x) {
    std::vector<std::byte> mine(lhc.index_bytes(n));
    lhc.encode_index(exec, std::span<const V>(g), std::span<std::byte>(mine));
    for (std::size_t q = 0; q < mine.size(); ++q) run.index[q] |= mine[q];
  }
  run.plan = lhc.plan(exec, std::span<const std::byte>(run.index), n, x.size());
  std::vector<float> sketch(run.plan.sketch_values());
  run.summed.assign(sketch.size(), 0.0f);
  for (std::size_t r = 0; r < x.size(); ++r) {
    lhc.encode_sketch(exec, std::span<const V>(x[r]), std::span<const std::byte>(run.index), run.plan,
                      std::span<float>(sketch));
    for (std::size_t c = 0; c < sketch.size(); ++c) run.summed[c] = r == 0 ? sketch[c] : run.summed[c] + sketch[c];
  }
  std::vector<std::byte> ws(lhc.workspace_bytes(exec, run.plan));
  run.out = before;
  run.result = lhc.decode(exec, std::span<const std::byte>(run.index), run.plan, std::span<const float>(run.summed),
                          std::span<O>(run.out), std::span<std::byte>(ws));
  return run;
}

/// The protocol of the 16-bit codec against the float32 codec of the widened gradients on the
/// reference and on every cpu setting: the same index, plan and summed sketch bits; decoded into
/// float32, the float32 codec's values; into H, those rounded once; the same result counts.
template <class H>
void check_against_float(const lhc_params& p, const std::vector<std::vector<H>>& x) {
  const lossless_homomorphic<H> lhc(p);
  const lossless_homomorphic<float> f(p);
  const std::size_t n = x.front().size();
  const auto expected = run_on(reference_executor{}, f, widened_ranks(x), std::vector<float>(n, 7.0f));
  const auto check_on = [&](const auto& exec) {
    const auto wide = run_on(exec, lhc, x, std::vector<float>(n, 7.0f));
    const auto half = run_on(exec, lhc, x, poisoned_values<H>(n));
    CHECK(wide.index == expected.index);
    CHECK(wide.plan == expected.plan);
    CHECK(bit_patterns(wide.summed) == bit_patterns(expected.summed));
    CHECK(bit_patterns(wide.out) == bit_patterns(expected.out));
    CHECK(wide.result == expected.result);
    CHECK(half.result == expected.result);
    bool rounded = true;
    for (std::size_t i = 0; i < n; ++i) rounded = rounded && half.out[i].bits == narrow<H>(expected.out[i]).bits;
    CHECK(rounded);
  };
  check_on(reference_executor{});
  for (const cpu_executor& cpu : cpu_settings()) check_on(cpu);
}

}  // namespace

TEST_CASE_TEMPLATE("16-bit lhc: the float32 codec's index, sketch and peeling of the widened values, everywhere", H,
                   bf16, fp16) {
  for (const std::uint32_t block : {1024u, 100u, 7u})
    for (const double cells_per_nonzero : {1.0, 1.3})
      for (const std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{999}, std::size_t{30'000}})
        for (const bool grid : {true, false}) {
          CAPTURE(block);
          CAPTURE(cells_per_nonzero);
          CAPTURE(n);
          CAPTURE(grid);
          // 1.0 cells per non-zero stalls: the median estimates must agree too.
          const auto x = sparse_half_ranks<H>(3, n, 0.05, n + block, grid);
          check_against_float<H>({.block = block,
                                  .cells_per_nonzero = cells_per_nonzero,
                                  .on_stall = lhc_stall_policy::median_estimate,
                                  .seed = block},
                                 x);
        }
  // A dense plan (every element non-zero somewhere) and TAGC's reference layout with its fixed ratio.
  check_against_float<H>({.block = 64}, sparse_half_ranks<H>(4, 3000, 0.9, 5, false));
  check_against_float<H>({.on_stall = lhc_stall_policy::median_estimate,
                          .reference_layout = true,
                          .fixed_compress_ratio = 2.0},
                         sparse_half_ranks<H>(4, 20'000, 0.02, 6, false));
}

TEST_CASE_TEMPLATE("16-bit lhc decodes grid data to the exact sums, in float32 and rounded once into H", H, bf16,
                   fp16) {
  for (const std::size_t ranks : {std::size_t{2}, std::size_t{8}}) {
    CAPTURE(ranks);
    const auto x = sparse_half_ranks<H>(ranks, 50'000, 0.02, 40 + ranks, true);
    const lossless_homomorphic<H> lhc({.block = 256});
    std::vector<float> sum(x.front().size(), 0.0f);
    for (const std::vector<H>& g : x)
      for (std::size_t i = 0; i < sum.size(); ++i) sum[i] += widen(g[i]);  // exact: multiples of 1/16 below 2^11
    const auto wide = run_on(cpu_executor{}, lhc, x, std::vector<float>(sum.size(), 3.0f));
    const auto half = run_on(cpu_executor{}, lhc, x, std::vector<H>(sum.size(), H{0}));
    CHECK(wide.result.unrecovered == 0);
    bool exact = true, rounded = true;
    for (std::size_t i = 0; i < sum.size(); ++i) {
      exact = exact && wide.out[i] == sum[i];
      rounded = rounded && half.out[i].bits == narrow<H>(sum[i] + 0.0f).bits;
    }
    CHECK(exact);
    CHECK(rounded);
  }
}

TEST_CASE("16-bit lhc: an fp16 sum beyond 65504 is narrowing_overflow with out untouched, and float32 gets it") {
  // Two ranks hold 60000 at element 9: the sum 120000 is beyond fp16. A sparse plan and a dense one.
  for (const double density : {0.01, 0.95}) {
    CAPTURE(density);
    auto x = sparse_half_ranks<fp16>(2, 4000, density, 8, true);
    x[0][9] = x[1][9] = narrow<fp16>(60000.0f);
    const lossless_homomorphic<fp16> lhc({.block = 128});
    const std::vector<fp16> before = poisoned_values<fp16>(4000);
    const auto check_on = [&](const auto& exec) {
      half_run<fp16> half;
      CHECK(thrown_by([&] { half = run_on(exec, lhc, x, before); }) == named(errc::narrowing_overflow));
      const auto wide = run_on(exec, lhc, x, std::vector<float>(4000, 0.0f));
      CHECK(wide.out[9] == 120000.0f);
      // The decode itself leaves the output as it was.
      std::vector<fp16> out = before;
      std::vector<std::byte> ws(lhc.workspace_bytes(exec, wide.plan));
      CHECK(thrown_by([&] {
              (void)lhc.decode(exec, std::span<const std::byte>(wide.index), wide.plan,
                               std::span<const float>(wide.summed), std::span<fp16>(out), std::span<std::byte>(ws));
            }) == named(errc::narrowing_overflow));
      CHECK(bit_patterns(out) == bit_patterns(before));
    };
    check_on(reference_executor{});
    for (const cpu_executor& cpu : cpu_settings()) check_on(cpu);
  }
}

TEST_CASE_TEMPLATE("16-bit lhc: NaN and Inf mark every element and poison the sketch, as for float", H, bf16, fp16) {
  auto x = sparse_half_ranks<H>(1, 1000, 0.05, 3, true);
  x[0][500] = H{static_cast<std::uint16_t>(float_traits<H>::infinity_key + 1)};  // a NaN
  const lossless_homomorphic<H> lhc({.block = 64});
  const auto check_on = [&](const auto& exec) {
    std::vector<std::byte> index(lhc.index_bytes(1000));
    CHECK(thrown_by([&] { lhc.encode_index(exec, std::span<const H>(x[0]), std::span<std::byte>(index)); }) ==
          named(errc::non_finite_input));
    bool all = true;
    for (const std::byte b : index) all = all && b == std::byte{0xff};
    CHECK(all);
    const lhc_plan plan = lhc.plan(exec, std::span<const std::byte>(index), 1000, 1);
    CHECK(plan.dense);
    std::vector<float> sketch(plan.sketch_values());
    CHECK(thrown_by([&] {
            lhc.encode_sketch(exec, std::span<const H>(x[0]), std::span<const std::byte>(index), plan,
                              std::span<float>(sketch));
          }) == named(errc::non_finite_input));
    bool poisoned = true;
    for (const float v : sketch) poisoned = poisoned && std::isnan(v);
    CHECK(poisoned);
  };
  check_on(reference_executor{});
  check_on(cpu_executor{});
}

TEST_CASE_TEMPLATE("compressed_all_reduce with 16-bit lhc: float32 sketches summed, the sum or mean rounded once", H,
                   bf16, fp16) {
  for (const int P : {2, 3, 5}) {
    // 2%: sketched and peeled; 60%: a dense plan; 1 cell per non-zero: a stall, summed again densely.
    for (const double density : {0.02, 0.6}) {
      for (const double cells_per_nonzero : {1.3, 1.0}) {
        for (const bool average : {false, true}) {
          CAPTURE(P);
          CAPTURE(density);
          CAPTURE(cells_per_nonzero);
          CAPTURE(average);
          constexpr std::size_t n = 20'000;
          const auto x = sparse_half_ranks<H>(static_cast<std::size_t>(P), n, density, 90, true);
          std::vector<float> sum(n, 0.0f);
          for (const std::vector<H>& g : x)
            for (std::size_t i = 0; i < n; ++i) sum[i] += widen(g[i]);  // exact on the grid
          std::vector<std::uint16_t> expected(n);
          for (std::size_t i = 0; i < n; ++i)
            expected[i] = narrow<H>(average ? sum[i] / static_cast<float>(P) : sum[i] + 0.0f).bits;
          // Blocks of 32 keep the rows' rounding from adding enough cells to peel at 1 per non-zero.
          const lossless_homomorphic<H> lhc(
              {.block = cells_per_nonzero > 1.0 ? 256u : 32u, .cells_per_nonzero = cells_per_nonzero});
          std::atomic<int> matched{0}, smaller{0};
          in_process_group(P).run([&](in_process_transport& t) {
            std::vector<H> data = x[static_cast<std::size_t>(t.rank())];
            const compressed_report report =
                compressed_all_reduce(cpu_executor{}, t, lhc, std::span<H>(data), {.average = average});
            if (bit_patterns(data) == expected) ++matched;
            if (report.sent_bytes < report.dense_bytes) ++smaller;
          });
          CHECK(matched.load() == P);
          // Sketched (sparse, peeled) the index and float32 cells send less than the 16-bit ring;
          // the dense plan sends the widened values, a stall both stages and the float32 sum.
          CHECK(smaller.load() == (density == 0.02 && cells_per_nonzero > 1.0 ? P : 0));
        }
      }
    }
  }
}

TEST_CASE("compressed_all_reduce with fp16 lhc: a sum beyond 65504 throws narrowing_overflow on every rank") {
  // 60000 on both ranks at element 9: the sum is beyond fp16, its mean is not.
  constexpr int P = 2;
  const auto x = [] {
    auto g = sparse_half_ranks<fp16>(P, 5000, 0.02, 7, true);
    g[0][9] = g[1][9] = narrow<fp16>(60000.0f);
    return g;
  }();
  const lossless_homomorphic<fp16> lhc({.block = 256});
  std::atomic<int> overflowed{0}, kept{0}, averaged{0};
  in_process_group(P).run([&](in_process_transport& t) {
    std::vector<fp16> data = x[static_cast<std::size_t>(t.rank())];
    if (thrown_by([&] { compressed_all_reduce(cpu_executor{}, t, lhc, std::span<fp16>(data)); }) ==
        named(errc::narrowing_overflow))
      ++overflowed;
    if (bit_patterns(data) == bit_patterns(x[static_cast<std::size_t>(t.rank())])) ++kept;
    compressed_all_reduce(cpu_executor{}, t, lhc, std::span<fp16>(data), {.average = true});
    if (widen(data[9]) == 60000.0f) ++averaged;
  });
  CHECK(overflowed.load() == P);
  CHECK(kept.load() == P);
  CHECK(averaged.load() == P);
}
