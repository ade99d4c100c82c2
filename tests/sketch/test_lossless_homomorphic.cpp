// Lossless homomorphic compression: P ranks simulated here (indexes aggregated by OR or a
// wrapping uint8 SUM, sketches summed in rank order) decode to exactly the per-element sum when
// cells/non-zeros ≥ 1.3; an independent oracle (cells from the documented formulas, peeling by a
// plain scan of the elements in synchronous rounds) predicts which elements stall, the rounds, the
// median estimates and a rounding-error bound for general data; index codings, rank limits,
// sizing, the reference layout's published hashes, dense and empty plans, odd sizes, and hostile
// indexes, plans, sketches and buffers are checked; the CPU backend equals reference_executor's
// bit for bit (indexes, plans, sketches, peeling order, estimates, errors).
#include <gradcomp/sketch/lossless_homomorphic.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "support/errors.hpp"
#include "support/executor_io.hpp"

using namespace gradcomp;
using namespace gradcomp::test;

namespace {

using byte_buffer = std::vector<std::byte>;

// ---- inputs -------------------------------------------------------------------------------------

/// P gradients of n values, each element non-zero with probability `density`. Grid values are
/// k·2^-12 with 0 < |k| < 2^10, so every float sum of up to 2^13 of them is exact; otherwise N(0, 1).
template <class T>
std::vector<std::vector<T>> make_gradients(std::size_t ranks, std::size_t n, double density, std::uint64_t seed,
                                           bool grid) {
  std::mt19937_64 engine(seed);
  std::bernoulli_distribution keep(density);
  std::uniform_int_distribution<int> level(1, 1023);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<std::vector<T>> x(ranks, std::vector<T>(n, T{0}));
  for (std::vector<T>& g : x)
    for (T& v : g) {
      if (!keep(engine)) continue;
      if (grid) v = static_cast<T>(std::ldexp(static_cast<double>(level(engine) * (engine() % 2 == 0 ? 1 : -1)), -12));
      else
        v = static_cast<T>(normal(engine));
    }
  return x;
}

/// The per-element sum in rank order, in T (exact on grid data).
template <class T>
std::vector<T> rank_order_sum(const std::vector<std::vector<T>>& x) {
  std::vector<T> sum(x.front().size(), T{0});
  for (std::size_t i = 0; i < sum.size(); ++i) {
    T s = x[0][i];
    for (std::size_t r = 1; r < x.size(); ++r) s += x[r][i];
    sum[i] = s;
  }
  return sum;
}

// ---- the transport, simulated -------------------------------------------------------------------

/// Aggregates rank indexes as the documented collective does: bitwise OR or a wrapping uint8 SUM.
byte_buffer aggregate_indexes(const std::vector<byte_buffer>& indexes, lhc_index_coding coding) {
  byte_buffer total(indexes.front().size(), std::byte{0});
  for (const byte_buffer& mine : indexes)
    for (std::size_t q = 0; q < total.size(); ++q) {
      const auto a = std::to_integer<unsigned>(total[q]), b = std::to_integer<unsigned>(mine[q]);
      total[q] = static_cast<std::byte>(coding == lhc_index_coding::bitmap ? (a | b) : ((a + b) & 0xffu));
    }
  return total;
}

/// One run of the whole protocol over the ranks' gradients.
template <class T>
struct protocol_run {
  byte_buffer index;
  lhc_plan plan;
  std::vector<T> summed;
  std::vector<T> out;
  lhc_decode_result result;
};

template <class T, class E = cpu_executor>
protocol_run<T> run_protocol(const lossless_homomorphic<T>& lhc, const std::vector<std::vector<T>>& x,
                             const E& cpu = {}) {
  const std::size_t n = x.front().size();
  std::vector<byte_buffer> indexes;
  for (const std::vector<T>& g : x) {
    indexes.emplace_back(lhc.index_bytes(n));
    lhc.encode_index(cpu, std::span<const T>(g), std::span<std::byte>(indexes.back()));
  }
  protocol_run<T> run;
  run.index = aggregate_indexes(indexes, lhc.params().index);
  run.plan = lhc.plan(cpu, std::span<const std::byte>(run.index), n, x.size());
  run.summed.assign(run.plan.sketch_values(), T{0});
  std::vector<T> sketch(run.plan.sketch_values());
  for (std::size_t r = 0; r < x.size(); ++r) {
    lhc.encode_sketch(cpu, std::span<const T>(x[r]), std::span<const std::byte>(run.index), run.plan,
                      std::span<T>(sketch));
    for (std::size_t c = 0; c < sketch.size(); ++c) run.summed[c] = r == 0 ? sketch[c] : run.summed[c] + sketch[c];
  }
  byte_buffer ws(lhc.workspace_bytes(cpu, run.plan));
  run.out.assign(n, T{0});
  run.result = lhc.decode(cpu, std::span<const std::byte>(run.index), run.plan, std::span<const T>(run.summed),
                          std::span<T>(run.out), std::span<std::byte>(ws));
  return run;
}

// ---- the oracle ---------------------------------------------------------------------------------

/// Cells and signs of one element, from the formulas of the documentation, written plainly.
struct oracle_cells {
  std::uint64_t cell[3];
  int sign[3];
};

class oracle_layout {
 public:
  oracle_layout(const lhc_params& p, std::uint64_t rows) : p_(p), rows_(rows) {}

  oracle_cells of(std::uint64_t i) {
    const std::uint64_t b = i / p_.block, t = i % p_.block;
    auto found = blocks_.find(b);
    if (found == blocks_.end()) found = blocks_.emplace(b, rows_and_rotations(b)).first;
    oracle_cells c{};
    for (std::size_t j = 0; j < 3; ++j) {
      const std::uint32_t h = murmur3_32(static_cast<std::uint32_t>(b), p_.seed + static_cast<std::uint32_t>(j));
      c.sign[j] = h >= 0x80000000u ? -1 : 1;
      c.cell[j] = found->second[j] * p_.block + (t + found->second[3 + j]) % p_.block;
    }
    return c;
  }

 private:
  // rows 0..2, then rotations 0..2
  std::vector<std::uint64_t> rows_and_rotations(std::uint64_t b) const {
    const auto key = static_cast<std::uint32_t>(b);
    std::uint64_t h[3];
    for (std::uint32_t j = 0; j < 3; ++j) h[j] = murmur3_32(key, p_.seed + j);
    if (p_.reference_layout) return {h[0] % rows_, h[1] % rows_, h[2] % rows_, 0, 0, 0};
    const std::uint64_t row0 = h[0] % rows_;
    const std::uint64_t row1 = (row0 + 1 + h[1] % (rows_ - 1)) % rows_;
    std::vector<std::uint64_t> others;  // the rows other than row0 and row1, ascending
    for (std::uint64_t r = 0; r < rows_; ++r)
      if (r != row0 && r != row1) others.push_back(r);
    const std::uint64_t row2 = others[h[2] % (rows_ - 2)];
    std::vector<std::uint64_t> v{row0, row1, row2};
    for (std::uint32_t j = 0; j < 3; ++j) v.push_back(murmur3_32(key, p_.seed + 3 + j) % p_.block);
    return v;
  }

  lhc_params p_;
  std::uint64_t rows_;
  std::map<std::uint64_t, std::vector<std::uint64_t>> blocks_;
};

/// What the oracle expects of a decode: elements recovered (with the value and a bound on its
/// error), elements stalled (with the median of their residual estimates), rounds.
struct oracle_peeling {
  std::map<std::uint64_t, long double> recovered;
  std::map<std::uint64_t, long double> error_bound;
  std::map<std::uint64_t, long double> median;
  std::uint64_t rounds = 0;
  std::uint64_t cells_with_several = 0;  ///< Cells holding ≥ 2 elements of the union.
  std::uint64_t elements_in_one_cell_twice = 0;
};

/// Peels the summed sketch in synchronous rounds: each round scans the remaining elements in
/// ascending order and recovers each through its lowest j whose cell holds exactly one remaining
/// element; then subtracts them all. `x` gives the contributions for the error bound.
template <class T>
oracle_peeling oracle_peel(const lhc_params& p, const lhc_plan& plan, const std::vector<std::vector<T>>& x,
                           const std::vector<T>& summed) {
  const std::size_t n = x.front().size();
  oracle_layout layout(p, plan.rows);
  std::vector<std::uint64_t> members;
  for (std::size_t i = 0; i < n; ++i)
    if (std::any_of(x.begin(), x.end(), [&](const std::vector<T>& g) { return g[i] != T{0}; })) members.push_back(i);
  std::map<std::uint64_t, oracle_cells> cells;
  std::vector<long double> value(summed.begin(), summed.end());
  std::vector<std::uint64_t> count(plan.cells, 0);
  std::vector<long double> magnitude(plan.cells, 0.0L);
  oracle_peeling o;
  for (const std::uint64_t i : members) {
    cells[i] = layout.of(i);
    const oracle_cells& c = cells[i];
    if (c.cell[0] == c.cell[1] || c.cell[0] == c.cell[2] || c.cell[1] == c.cell[2]) ++o.elements_in_one_cell_twice;
    for (int j = 0; j < 3; ++j) {
      ++count[c.cell[j]];
      for (const std::vector<T>& g : x) magnitude[c.cell[j]] += std::fabs(static_cast<long double>(g[i]));
    }
  }
  o.cells_with_several =
      static_cast<std::uint64_t>(std::count_if(count.begin(), count.end(), [](std::uint64_t k) { return k >= 2; }));
  const long double u = std::numeric_limits<T>::epsilon() / 2;
  std::vector<long double> cell_error(plan.cells);
  for (std::uint64_t c = 0; c < plan.cells; ++c) {
    const long double m = static_cast<long double>(2 * count[c] + x.size()) * u;
    cell_error[c] = m / (1 - m) * magnitude[c];
  }
  std::vector<std::uint64_t> left = members;
  for (;;) {
    std::vector<std::pair<std::uint64_t, int>> found;
    for (const std::uint64_t i : left)
      for (int j = 0; j < 3; ++j)
        if (count[cells[i].cell[j]] == 1) {
          found.emplace_back(i, j);
          break;
        }
    if (found.empty()) break;
    ++o.rounds;
    std::vector<std::pair<std::uint64_t, long double>> values;
    for (const auto& [i, j] : found) {
      const std::uint64_t c = cells[i].cell[j];
      values.emplace_back(i, cells[i].sign[j] * value[c]);
      o.error_bound[i] = cell_error[c];
    }
    for (const auto& [i, v] : values) {
      o.recovered[i] = v;
      for (int j = 0; j < 3; ++j) {
        const std::uint64_t c = cells[i].cell[j];
        value[c] -= cells[i].sign[j] * v;
        cell_error[c] += o.error_bound[i];
        --count[c];
      }
    }
    std::erase_if(left, [&](std::uint64_t i) { return o.recovered.count(i) != 0; });
  }
  for (const std::uint64_t i : left) {
    long double e[3];
    for (int j = 0; j < 3; ++j) e[j] = cells[i].sign[j] * value[cells[i].cell[j]];
    std::sort(e, e + 3);
    o.median[i] = e[1];
  }
  return o;
}

template <class T>
lossless_homomorphic<T> make_lhc(lhc_params p) {
  return lossless_homomorphic<T>(p);
}

/// Every element equals `expected` (±0 alike) and decoded zeros are +0.
template <class T>
void check_equal_values(const std::vector<T>& out, const std::vector<T>& expected) {
  REQUIRE(out.size() == expected.size());
  std::size_t wrong = 0, negative_zeros = 0;
  for (std::size_t i = 0; i < out.size(); ++i) {
    if (!(out[i] == expected[i])) {
      if (wrong == 0) FAIL_CHECK("element " << i << ": decoded " << out[i] << ", expected " << expected[i]);
      ++wrong;
    }
    if (out[i] == T{0} && std::signbit(out[i])) ++negative_zeros;
  }
  CHECK(wrong == 0);
  CHECK(negative_zeros == 0);
}

// ---- the reference backend ------------------------------------------------------------------------

/// The protocol on the reference and on the CPU: the same aggregated index, plan, summed sketch,
/// decoded bits and result, or the same named error.
template <class T>
void check_reference_protocol(const lossless_homomorphic<T>& lhc, const std::vector<std::vector<T>>& x) {
  protocol_run<T> ref, cpu;
  const std::string ref_status = thrown_by([&] { ref = run_protocol(lhc, x, reference_executor{}); });
  const std::string cpu_status = thrown_by([&] { cpu = run_protocol(lhc, x, cpu_executor{}); });
  CHECK(ref_status == cpu_status);
  if (ref_status != "no exception" || cpu_status != "no exception") return;
  CHECK(ref.index == cpu.index);
  CHECK(ref.plan == cpu.plan);
  CHECK(bit_patterns(ref.summed) == bit_patterns(cpu.summed));
  CHECK(bit_patterns(ref.out) == bit_patterns(cpu.out));
  CHECK(ref.result == cpu.result);
}

}  // namespace

TEST_CASE_TEMPLATE("lhc on the CPU equals the reference: indexes, plans, sketches, peeling order and stalls", T, float,
                   double) {
  for (const lhc_index_coding coding : {lhc_index_coding::bitmap, lhc_index_coding::sum4, lhc_index_coding::sum8})
    for (const std::uint32_t block : {1024u, 100u, 7u})
      for (const double cells_per_nonzero : {1.0, 1.3})
        for (const std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{999}, std::size_t{40'000}})
          for (const bool grid : {true, false}) {
            CAPTURE(static_cast<int>(coding));
            CAPTURE(block);
            CAPTURE(cells_per_nonzero);
            CAPTURE(n);
            CAPTURE(grid);
            // General data rounds in the peeling: only the documented order of subtractions
            // gives the same bits. 1.0 cells per non-zero stalls: the estimates must agree too.
            const auto x = make_gradients<T>(3, n, 0.05, n + block, grid);
            check_reference_protocol(lossless_homomorphic<T>({.block = block,
                                                              .cells_per_nonzero = cells_per_nonzero,
                                                              .index = coding,
                                                              .on_stall = lhc_stall_policy::median_estimate,
                                                              .seed = block}),
                                     x);
            check_reference_protocol(lossless_homomorphic<T>(
                                         {.block = block, .cells_per_nonzero = cells_per_nonzero, .index = coding}),
                                     x);
          }
  // The reference's layout, whose rows may coincide, and TAGC's fixed ratio.
  for (const std::size_t n : {std::size_t{5000}, std::size_t{70'001}})
    check_reference_protocol(lossless_homomorphic<T>({.on_stall = lhc_stall_policy::median_estimate,
                                                      .reference_layout = true,
                                                      .fixed_compress_ratio = 2.0}),
                             make_gradients<T>(4, n, 0.02, n, false));
}

TEST_CASE("lhc on the CPU rejects what the reference rejects: hostile sketches, indexes, plans and gradients") {
  const lossless_homomorphic<float> lhc({.block = 64, .index = lhc_index_coding::sum4});
  const std::size_t n = 3001;
  const auto x = make_gradients<float>(2, n, 0.05, 3, true);
  const protocol_run<float> run = run_protocol(lhc, x);
  REQUIRE_FALSE(run.plan.dense);
  const auto decode_status = [&](const auto& exec, byte_buffer index, lhc_plan plan, std::vector<float> summed) {
    std::vector<float> out(n, -3.0f);
    byte_buffer ws(lhc.workspace_bytes(exec, plan));
    const std::string status = thrown_by([&] {
      (void)lhc.decode(exec, std::span<const std::byte>(index), plan, std::span<const float>(summed),
                       std::span<float>(out), std::span<std::byte>(ws));
    });
    if (status != "no exception") CHECK(std::all_of(out.begin(), out.end(), [](float v) { return v == -3.0f; }));
    return status;
  };
  const auto same = [&](const byte_buffer& index, const lhc_plan& plan, const std::vector<float>& summed) {
    const std::string ref = decode_status(reference_executor{}, index, plan, summed);
    CHECK(decode_status(cpu_executor{}, index, plan, summed) == ref);
    return ref;
  };
  CHECK(same(run.index, run.plan, run.summed) == "no exception");
  std::vector<float> nan = run.summed;
  nan[nan.size() / 2] = std::numeric_limits<float>::quiet_NaN();
  CHECK(same(run.index, run.plan, nan) == named(errc::non_finite_input));
  std::vector<float> huge = run.summed;
  for (float& v : huge) v = std::numeric_limits<float>::max();
  (void)same(run.index, run.plan, huge);  // sums beyond float's range, or a stall: alike
  byte_buffer padded = run.index;
  padded.back() |= std::byte{0x10};  // n odd: the high nibble of the last byte is padding
  CHECK(same(padded, run.plan, run.summed) == named(errc::malformed_payload));
  byte_buffer over = run.index;
  over[7] = std::byte{0xf0};  // a field of 15, the coding's limit: the union, and so the plan, may change
  (void)same(over, run.plan, run.summed);
  lhc_plan other = run.plan;
  ++other.union_nonzeros;
  CHECK(same(run.index, other, run.summed) == named(errc::invalid_argument));
  std::mt19937_64 engine(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> random(run.summed.size());
  for (float& v : random) v = normal(engine);
  std::vector<float> ref_out(n), cpu_out(n);
  byte_buffer ws(
      std::max(lhc.workspace_bytes(reference_executor{}, run.plan), lhc.workspace_bytes(cpu_executor{}, run.plan)));
  const lhc_decode_result a = lhc.decode(reference_executor{}, std::span<const std::byte>(run.index), run.plan,
                                         std::span<const float>(random), std::span<float>(ref_out), ws);
  const lhc_decode_result b = lhc.decode(cpu_executor{}, std::span<const std::byte>(run.index), run.plan,
                                         std::span<const float>(random), std::span<float>(cpu_out), ws);
  CHECK(a == b);
  CHECK(bit_patterns(ref_out) == bit_patterns(cpu_out));
  // Encoders: NaN in a gradient, an element outside the index, a plan of another count.
  std::vector<float> bad = x[0];
  bad[10] = std::numeric_limits<float>::infinity();
  const auto encode_statuses = [&](const auto& exec) {
    byte_buffer index(lhc.index_bytes(n));
    std::vector<std::string> statuses;
    statuses.push_back(
        thrown_by([&] { lhc.encode_index(exec, std::span<const float>(bad), std::span<std::byte>(index)); }));
    const byte_buffer marked_all = index;
    std::vector<float> sketch(run.plan.sketch_values());
    std::vector<float> outside = x[0];  // with a plan of another count
    statuses.push_back(thrown_by([&] {
      lhc.encode_sketch(exec, std::span<const float>(outside), std::span<const std::byte>(run.index), other,
                        std::span<float>(sketch));
    }));
    statuses.push_back(thrown_by([&] {
      lhc.encode_sketch(exec, std::span<const float>(bad), std::span<const std::byte>(run.index), run.plan,
                        std::span<float>(sketch));
    }));
    statuses.push_back(std::to_string(std::isnan(sketch[0])));
    for (const std::byte byte : marked_all) statuses.push_back(std::to_string(std::to_integer<int>(byte)));
    return statuses;
  };
  CHECK(encode_statuses(reference_executor{}) == encode_statuses(cpu_executor{}));
}

// ---- exact recovery -------------------------------------------------------------------------------

TEST_CASE_TEMPLATE("lhc sums of 2 to 16 ranks decode exactly at 1.3 cells per non-zero", T, float, double) {
  const std::size_t n = (std::size_t{1} << 18) + 123;  // not a multiple of B
  for (const std::size_t ranks : {2u, 4u, 8u, 16u})
    for (const double density : {0.002, 0.02, 0.08}) {
      CAPTURE(ranks);
      CAPTURE(density);
      const lhc_params p{.seed = static_cast<std::uint32_t>(ranks * 31)};
      const auto x = make_gradients<T>(ranks, n, density, 1000 + ranks, true);
      const protocol_run<T> run = run_protocol(make_lhc<T>(p), x);
      REQUIRE_FALSE(run.plan.dense);
      CHECK(static_cast<double>(run.plan.cells) >= 1.3 * static_cast<double>(run.plan.union_nonzeros));
      const oracle_peeling o = oracle_peel(p, run.plan, x, run.summed);
      CHECK(o.cells_with_several > run.plan.cells / 10);  // collisions are the rule, not the exception
      CHECK(o.elements_in_one_cell_twice == 0);
      CHECK(o.median.empty());
      CHECK(run.result == lhc_decode_result{.recovered = run.plan.union_nonzeros, .rounds = o.rounds});
      check_equal_values(run.out, rank_order_sum(x));
    }
}

TEST_CASE("lhc general data agrees with the real sum within the propagated rounding bound") {
  const std::size_t n = std::size_t{1} << 17;
  for (const std::size_t ranks : {1u, 4u, 16u}) {
    CAPTURE(ranks);
    const lhc_params p{.cells_per_nonzero = 1.4, .seed = 5};
    const auto x = make_gradients<float>(ranks, n, 0.05, 77 + ranks, false);
    const protocol_run<float> run = run_protocol(make_lhc<float>(p), x);
    REQUIRE_FALSE(run.plan.dense);
    const oracle_peeling o = oracle_peel(p, run.plan, x, run.summed);
    REQUIRE(o.median.empty());
    REQUIRE(run.result.unrecovered == 0);
    const long double u = std::numeric_limits<float>::epsilon() / 2;
    std::size_t outside = 0;
    long double worst = 0;
    for (const auto& [i, bound] : o.error_bound) {
      long double exact = 0;
      for (const auto& g : x) exact += g[i];
      const long double error = std::fabs(static_cast<long double>(run.out[i]) - exact);
      const long double limit = bound + u * (std::fabs(exact) + bound);
      worst = std::max(worst, error / limit);
      if (error > limit) ++outside;
    }
    CHECK(outside == 0);
    CHECK(worst > 0);  // the data does round: the bound is being tested, not vacuous
    MESSAGE("ranks " << ranks << ": largest error / bound = " << static_cast<double>(worst));
  }
}

// ---- stalls ---------------------------------------------------------------------------------------

TEST_CASE_TEMPLATE("lhc below the threshold reports the stall and never writes a silent wrong value", T, float,
                   double) {
  const std::size_t n = std::size_t{1} << 16;
  const auto x = make_gradients<T>(4, n, 0.03, 9, true);
  const lhc_params stalls{.cells_per_nonzero = 1.0, .seed = 3};

  SUBCASE("report throws peeling_stalled and leaves out untouched") {
    const lossless_homomorphic<T> lhc(stalls);
    const cpu_executor cpu;
    std::vector<byte_buffer> indexes;
    for (const auto& g : x) {
      indexes.emplace_back(lhc.index_bytes(n));
      lhc.encode_index(cpu, std::span<const T>(g), std::span<std::byte>(indexes.back()));
    }
    const byte_buffer index = aggregate_indexes(indexes, lhc_index_coding::bitmap);
    const lhc_plan plan = lhc.plan(cpu, std::span<const std::byte>(index), n, 4);
    std::vector<T> summed(plan.sketch_values(), T{0}), sketch(plan.sketch_values());
    for (const auto& g : x) {
      lhc.encode_sketch(cpu, std::span<const T>(g), std::span<const std::byte>(index), plan, std::span<T>(sketch));
      for (std::size_t c = 0; c < sketch.size(); ++c) summed[c] += sketch[c];
    }
    byte_buffer ws(lhc.workspace_bytes(cpu, plan));
    std::vector<T> out(n, T{-7});
    CHECK(thrown_by([&] {
            (void)lhc.decode(cpu, std::span<const std::byte>(index), plan, std::span<const T>(summed),
                             std::span<T>(out), std::span<std::byte>(ws));
          }) == named(errc::peeling_stalled));
    CHECK(std::all_of(out.begin(), out.end(), [](T v) { return v == T{-7}; }));
  }
  SUBCASE("median_estimate counts the stalled elements and estimates them as the oracle does") {
    lhc_params p = stalls;
    p.on_stall = lhc_stall_policy::median_estimate;
    const protocol_run<T> run = run_protocol(make_lhc<T>(p), x);
    const oracle_peeling o = oracle_peel(p, run.plan, x, run.summed);
    REQUIRE(!o.median.empty());
    CHECK(run.result == lhc_decode_result{.recovered = o.recovered.size(),
                                          .unrecovered = o.median.size(),
                                          .estimated = o.median.size(),
                                          .rounds = o.rounds});
    const std::vector<T> exact = rank_order_sum(x);
    std::size_t wrong = 0, estimate_wrong = 0, inexact_estimates = 0;
    for (const auto& [i, v] : o.recovered) wrong += run.out[i] == exact[i] ? 0u : 1u;
    for (const auto& [i, m] : o.median) {
      estimate_wrong += run.out[i] == static_cast<T>(m) ? 0u : 1u;
      inexact_estimates += run.out[i] == exact[i] ? 0u : 1u;
    }
    CHECK(wrong == 0);
    CHECK(estimate_wrong == 0);
    CHECK(inexact_estimates > 0);  // estimates are estimates: the policy is what makes them visible
  }
}

// ---- index codings ----------------------------------------------------------------------------------

TEST_CASE("lhc encode_index writes the documented bitmap, sum4 and sum8 layouts") {
  const std::size_t n = 77;  // a partial last byte, an odd element count
  const auto x = make_gradients<float>(1, n, 0.4, 21, true).front();
  const cpu_executor cpu;
  for (const lhc_index_coding coding : {lhc_index_coding::bitmap, lhc_index_coding::sum4, lhc_index_coding::sum8}) {
    CAPTURE(static_cast<int>(coding));
    const lossless_homomorphic<float> lhc({.index = coding});
    byte_buffer expected;
    if (coding == lhc_index_coding::bitmap) {
      expected.assign(10, std::byte{0});
      for (std::size_t i = 0; i < n; ++i)
        if (x[i] != 0) expected[i / 8] |= static_cast<std::byte>(1u << (i % 8));
    } else if (coding == lhc_index_coding::sum4) {
      expected.assign(39, std::byte{0});
      for (std::size_t i = 0; i < n; ++i)
        if (x[i] != 0) expected[i / 2] |= static_cast<std::byte>(i % 2 == 0 ? 0x01u : 0x10u);
    } else {
      for (std::size_t i = 0; i < n; ++i) expected.push_back(static_cast<std::byte>(x[i] != 0 ? 1 : 0));
    }
    REQUIRE(lhc.index_bytes(n) == expected.size());
    byte_buffer index(expected.size(), std::byte{0xAB});
    lhc.encode_index(cpu, std::span<const float>(x), std::span<std::byte>(index));
    CHECK(index == expected);
  }
  std::vector<float> signed_zero(9, 0.0f);
  signed_zero[3] = -0.0f;
  byte_buffer index(2);
  lossless_homomorphic<float>().encode_index(cpu, std::span<const float>(signed_zero), std::span<std::byte>(index));
  CHECK(index == byte_buffer(2, std::byte{0}));  // −0 is zero
}

TEST_CASE("lhc index codings aggregate as OR up to their rank limit and refuse more") {
  const cpu_executor cpu;
  struct coding_case {
    lhc_index_coding coding;
    std::uint64_t limit;
    std::size_t ranks;
  };
  for (const coding_case k :
       {coding_case{lhc_index_coding::bitmap, std::numeric_limits<std::uint64_t>::max(), 300},
        coding_case{lhc_index_coding::sum4, 15, 15}, coding_case{lhc_index_coding::sum8, 255, 255}}) {
    CAPTURE(static_cast<int>(k.coding));
    const lhc_params p{.block = 64, .cells_per_nonzero = 1.6, .index = k.coding, .seed = 11};
    const lossless_homomorphic<float> lhc(p);
    CHECK(lhc.max_contributors() == k.limit);
    const std::size_t n = 20000;
    auto x = make_gradients<float>(k.ranks, n, 0.1 / static_cast<double>(k.ranks), 400 + k.ranks, true);
    for (auto& g : x) {
      g[4] = 0;
      g[5] = 0.25f;  // on every rank: the field of element 5 reaches the rank count
    }
    const protocol_run<float> run = run_protocol(lhc, x);
    std::uint64_t in_union = 0;
    for (std::size_t i = 0; i < n; ++i)
      in_union += std::any_of(x.begin(), x.end(), [&](const std::vector<float>& g) { return g[i] != 0; }) ? 1u : 0u;
    CHECK(run.plan.union_nonzeros == in_union);
    REQUIRE_FALSE(run.plan.dense);
    CHECK(run.result.unrecovered == 0);
    check_equal_values(run.out, rank_order_sum(x));
    if (k.coding == lhc_index_coding::bitmap) continue;
    CHECK(thrown_by([&] { (void)lhc.plan(cpu, std::span<const std::byte>(run.index), n, k.limit + 1); }) ==
          named(errc::invalid_argument));
    // one rank more wraps (sum8) or carries into the neighbour (sum4): exactly why P is capped
    byte_buffer one_more(lhc.index_bytes(n));
    lhc.encode_index(cpu, std::span<const float>(x.front()), std::span<std::byte>(one_more));
    const byte_buffer wrapped = aggregate_indexes({run.index, one_more}, k.coding);
    CHECK(std::to_integer<unsigned>(wrapped[k.coding == lhc_index_coding::sum4 ? 2 : 5]) == 0);  // element 5 vanished
    // a field above the declared contributors is refused
    CHECK(thrown_by([&] { (void)lhc.plan(cpu, std::span<const std::byte>(run.index), n, k.ranks - 1); }) ==
          named(errc::malformed_payload));
  }
  const lossless_homomorphic<float> any;
  CHECK(thrown_by([&] { (void)any.plan(cpu, std::span<const std::byte>(byte_buffer(2)), 16, 0); }) ==
        named(errc::invalid_argument));
}

// ---- layouts and sizing --------------------------------------------------------------------------------

TEST_CASE("lhc reference layout hashes equal the published MurmurHash3 vectors") {
  // docs/sketches.md §2.4: murmur3_32 of the block index with seeds 0, 1, 2.
  const std::uint32_t published[4][3] = {{0x2362f9deu, 0x78ed212du, 0x06dfadfcu},
                                         {0xfbf1402au, 0x5e11e574u, 0x13d35112u},
                                         {0x40b23b7fu, 0xdb9a7e8cu, 0x2cdefd20u},
                                         {0x32850971u, 0xcf6cc8a9u, 0xde0eb68bu}};
  for (std::uint64_t b = 0; b < 4; ++b) {
    // rows = 2^32 and B = 1: the row offset is the hash itself
    const lhc_block_layout whole = lhc_layout_of_block(b, std::uint64_t{1} << 32, 1, 0, true);
    const lhc_block_layout reduced = lhc_layout_of_block(b, 1000, 1024, 0, true);
    for (int j = 0; j < 3; ++j) {
      CHECK(whole.row_offset[j] == published[b][j]);
      CHECK(whole.negative[j] == (published[b][j] >> 31 != 0));
      CHECK(reduced.row_offset[j] == published[b][j] % 1000 * 1024);
      CHECK(reduced.rotation[j] == 0);
    }
  }
}

TEST_CASE("lhc reference layout lets rows coincide and peels as the oracle predicts") {
  const std::size_t n = std::size_t{1} << 18;
  const lhc_params p{.on_stall = lhc_stall_policy::median_estimate,
                     .reference_layout = true,
                     .fixed_compress_ratio = 2};
  const auto x = make_gradients<float>(2, n, 0.1, 31, true);
  const protocol_run<float> run = run_protocol(make_lhc<float>(p), x);
  CHECK(run.plan.rows == 128);  // ⌈G / c⌉ = ⌈256 / 2⌉
  const oracle_peeling o = oracle_peel(p, run.plan, x, run.summed);
  CHECK(o.elements_in_one_cell_twice > 0);  // the reference's row collisions occur
  CHECK(run.result == lhc_decode_result{.recovered = o.recovered.size(),
                                        .unrecovered = o.median.size(),
                                        .estimated = o.median.size(),
                                        .rounds = o.rounds});
  const std::vector<float> exact = rank_order_sum(x);
  std::size_t wrong = 0;
  for (const auto& [i, v] : o.recovered) wrong += run.out[i] == exact[i] ? 0u : 1u;
  for (const auto& [i, m] : o.median) wrong += run.out[i] == static_cast<float>(m) ? 0u : 1u;
  CHECK(wrong == 0);
}

TEST_CASE("lhc default layout puts an element in three distinct rows and a block's elements in distinct cells") {
  for (const std::uint64_t rows : {3u, 4u, 5u, 17u, 1000u})
    for (std::uint64_t b = 0; b < 2000; ++b) {
      const lhc_block_layout l = lhc_layout_of_block(b, rows, 16, 9, false);
      const std::uint64_t r[3] = {l.row_offset[0] / 16, l.row_offset[1] / 16, l.row_offset[2] / 16};
      REQUIRE((r[0] != r[1] && r[0] != r[2] && r[1] != r[2]));
      REQUIRE((r[0] < rows && r[1] < rows && r[2] < rows));
      REQUIRE((l.rotation[0] < 16 && l.rotation[1] < 16 && l.rotation[2] < 16));
    }
}

TEST_CASE("lhc plans follow the sizing rule, the fixed ratio and the dense fallback") {
  const lossless_homomorphic<float> adaptive;
  CHECK(adaptive.plan_for(1 << 20, 0) == lhc_plan{.n = 1 << 20});
  CHECK(adaptive.plan_for(1 << 20, 100000) ==
        lhc_plan{.n = 1 << 20, .union_nonzeros = 100000, .rows = 127, .cells = 127 * 1024});
  CHECK(adaptive.plan_for(1 << 20, 10) == lhc_plan{.n = 1 << 20, .union_nonzeros = 10, .rows = 3, .cells = 3 * 1024});
  CHECK(adaptive.plan_for(1 << 20, 805500) ==
        lhc_plan{.n = 1 << 20, .union_nonzeros = 805500, .rows = 1023, .cells = 1023 * 1024});
  CHECK(adaptive.plan_for(1 << 20, 806600).dense);
  CHECK(adaptive.plan_for(1 << 20, 806600).sketch_values() == 1 << 20);
  CHECK(adaptive.plan_for(3000, 1).dense);  // 3 rows of 1024 ≥ 3000
  CHECK(thrown_by([&] { (void)adaptive.plan_for(10, 11); }) == named(errc::invalid_argument));
  const lossless_homomorphic<float> fixed({.fixed_compress_ratio = 2});
  CHECK(fixed.plan_for(1 << 20, 5).rows == 512);
  CHECK(fixed.plan_for(10 * 1024, 5).rows == 5);
  CHECK(fixed.plan_for(4 * 1024, 5).rows == 3);  // ⌈4/2⌉ = 2, raised to 3
  const lossless_homomorphic<float> reference({.reference_layout = true, .fixed_compress_ratio = 2});
  CHECK(reference.plan_for(4 * 1024, 5).rows == 2);
  CHECK(thrown_by([] { lossless_homomorphic<float>({.cells_per_nonzero = 0.9}); }) == named(errc::invalid_argument));
  CHECK(thrown_by([] { lossless_homomorphic<float>({.block = 0}); }) == named(errc::invalid_argument));
  CHECK(thrown_by([] { lossless_homomorphic<float>({.fixed_compress_ratio = -1}); }) == named(errc::invalid_argument));
  CHECK(thrown_by([] { lossless_homomorphic<float>({.cells_per_nonzero = std::nan("")}); }) ==
        named(errc::invalid_argument));
}

TEST_CASE_TEMPLATE(
    "lhc sketches computed cell by cell from row-sorted pairs (the GPU's order) equal encode_sketch bit for bit", T,
    float, double) {
  // lhc_cell_from_row adds a cell's contributions in the order of its row's (block, hash) pairs,
  // sorted stably by row: the CUDA backend computes one cell per thread this way, without atomics.
  for (const bool reference : {false, true})
    for (const std::uint32_t block : {1024u, 100u, 7u})
      for (const std::size_t n : {std::size_t{1}, std::size_t{999}, std::size_t{50'000}})
        for (const double density : {0.01, 0.3, 1.0}) {
          CAPTURE(reference);
          CAPTURE(block);
          CAPTURE(n);
          CAPTURE(density);
          const lossless_homomorphic<T> lhc({.block = block,
                                             .reference_layout = reference,
                                             .fixed_compress_ratio = reference ? 2.0 : 0.0,
                                             .seed = reference ? 0u : 5u});
          const std::vector<T> x = make_gradients<T>(1, n, density, n + block, false).front();
          const cpu_executor cpu;
          byte_buffer index(lhc.index_bytes(n));
          lhc.encode_index(cpu, std::span<const T>(x), std::span<std::byte>(index));
          const lhc_plan plan = lhc.plan(cpu, std::span<const std::byte>(index), n, 1);
          if (plan.dense || plan.cells == 0) continue;
          std::vector<T> expected(plan.sketch_values());
          lhc.encode_sketch(cpu, std::span<const T>(x), std::span<const std::byte>(index), plan,
                            std::span<T>(expected));
          const std::uint64_t blocks = lhc.block_count(n);
          std::vector<lhc_block_layout> layouts;
          std::vector<std::pair<std::uint64_t, std::uint64_t>> keyed;  // (row, 3·b + j), in (b, j) order
          for (std::uint64_t b = 0; b < blocks; ++b) {
            layouts.push_back(lhc_layout_of_block(b, plan.rows, block, lhc.params().seed, reference));
            for (std::uint64_t j = 0; j < 3; ++j) keyed.emplace_back(layouts.back().row_offset[j] / block, 3 * b + j);
          }
          std::stable_sort(keyed.begin(), keyed.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
          std::vector<std::uint64_t> pairs, row_begin(plan.rows + 1, 0);
          for (const auto& [row, pair] : keyed) {
            pairs.push_back(pair);
            ++row_begin[row + 1];
          }
          for (std::uint64_t r = 0; r < plan.rows; ++r) row_begin[r + 1] += row_begin[r];
          std::vector<T> cells(plan.cells);
          for (std::uint64_t c = 0; c < plan.cells; ++c)
            cells[c] = lhc_cell_from_row<T>(x.data(), n, pairs.data(), row_begin[c / block], row_begin[c / block + 1],
                                            c % block, layouts.data(), block);
          std::size_t differing = 0;
          for (std::uint64_t c = 0; c < plan.cells; ++c)
            differing += to_bits(cells[c]) != to_bits(expected[c]) ? 1u : 0u;
          CHECK(differing == 0);
        }
}

TEST_CASE("lhc many small blocks need 32-bit counters and still decode exactly") {
  const std::size_t n = 300000;
  const lhc_params p{.block = 2, .seed = 1};  // 150000 blocks: a cell may hold more than 65535
  const auto x = make_gradients<float>(3, n, 0.1, 8, true);
  const lossless_homomorphic<float> lhc(p);
  const protocol_run<float> run = run_protocol(lhc, x);
  REQUIRE_FALSE(run.plan.dense);
  REQUIRE(run.plan.union_nonzeros > 65535);
  CHECK(run.result.unrecovered == 0);
  check_equal_values(run.out, rank_order_sum(x));
}

// ---- dense, empty, odd sizes ------------------------------------------------------------------------------

TEST_CASE_TEMPLATE("lhc dense plans transport the values and decode to the rank-order sum", T, float, double) {
  for (const std::size_t n : {std::size_t{1000}, std::size_t{5000}, std::size_t{100000}}) {
    CAPTURE(n);
    const auto x = make_gradients<T>(3, n, 0.6, n, false);  // general data: the sum is the transport's own
    const protocol_run<T> run = run_protocol(make_lhc<T>({}), x);
    CHECK(run.plan.dense);
    CHECK(run.plan.sketch_values() == n);
    CHECK(run.result == lhc_decode_result{.recovered = run.plan.union_nonzeros});
    check_equal_values(run.out, rank_order_sum(x));
  }
}

TEST_CASE("lhc empty tensors and all-zero gradients give empty sketches and zeros") {
  const cpu_executor cpu;
  const lossless_homomorphic<float> lhc;
  const lhc_plan empty = lhc.plan(cpu, std::span<const std::byte>(), 0, 4);
  CHECK(empty == lhc_plan{});
  CHECK(lhc.workspace_bytes(cpu, empty) == 0);
  lhc.encode_sketch(cpu, std::span<const float>(), std::span<const std::byte>(), empty, std::span<float>());
  CHECK(lhc.decode(cpu, std::span<const std::byte>(), empty, std::span<const float>(), std::span<float>(),
                   std::span<std::byte>()) == lhc_decode_result{});
  const std::size_t n = 5000;
  const std::vector<std::vector<float>> zeros(2, std::vector<float>(n, 0.0f));
  std::vector<std::vector<float>> with_negative_zero = zeros;
  with_negative_zero[1][17] = -0.0f;
  const protocol_run<float> run = run_protocol(lhc, with_negative_zero);
  CHECK(run.plan == lhc_plan{.n = n});
  CHECK(run.summed.empty());
  check_equal_values(run.out, zeros.front());
}

TEST_CASE("lhc tensors shorter than a block or ending in a partial block decode exactly") {
  for (const std::size_t n : {std::size_t{1}, std::size_t{7}, std::size_t{1000}, std::size_t{70 * 64 + 13}}) {
    CAPTURE(n);
    const lhc_params p{.block = 64, .cells_per_nonzero = 2, .seed = 2};
    const auto x = make_gradients<float>(4, n, 0.02, n + 1, true);
    const protocol_run<float> run = run_protocol(make_lhc<float>(p), x);
    CHECK(run.result.unrecovered == 0);
    check_equal_values(run.out, rank_order_sum(x));
  }
}

TEST_CASE_TEMPLATE("lhc decode writes every element, streamed or not, into a dirty and misaligned buffer", T, float,
                   double) {
  // The decoder assembles the output span by span (2^14 elements) and writes it front to back:
  // here through several spans and a partial last one, with and without non-temporal stores, at
  // an address that is not 64-byte aligned, over a buffer full of NaN with guard elements on both
  // sides of the output.
  const std::size_t n = 3 * (std::size_t{1} << 14) + 4321;
  const auto x = make_gradients<T>(3, n, 0.03, 42, true);
  const protocol_run<T> run = run_protocol(make_lhc<T>({.seed = 9}), x);
  REQUIRE(run.result.unrecovered == 0);
  const std::vector<T> expected = rank_order_sum(x);
  const lossless_homomorphic<T> lhc = make_lhc<T>({.seed = 9});
  byte_buffer ws(lhc.workspace_bytes(cpu_executor{}, run.plan));
  for (const std::size_t streaming_bytes : {std::size_t{0}, std::numeric_limits<std::size_t>::max()})
    for (const std::size_t offset : {std::size_t{0}, std::size_t{1}, std::size_t{5}}) {
      CAPTURE(streaming_bytes);
      CAPTURE(offset);
      const cpu_executor cpu{.streaming_store_bytes = streaming_bytes};
      constexpr std::size_t guard = 19;  // past the output, reaching into the next cache line
      std::vector<T> buffer(offset + n + guard, std::numeric_limits<T>::quiet_NaN());
      const lhc_decode_result result =
          lhc.decode(cpu, std::span<const std::byte>(run.index), run.plan, std::span<const T>(run.summed),
                     std::span<T>(buffer).subspan(offset, n), std::span<std::byte>(ws));
      CHECK(result == run.result);
      const auto first = buffer.begin() + static_cast<std::ptrdiff_t>(offset);
      check_equal_values(std::vector<T>(first, first + static_cast<std::ptrdiff_t>(n)), expected);
      std::size_t written_outside = 0;
      for (std::size_t k = 0; k < buffer.size(); ++k)
        if ((k < offset || k >= offset + n) && !std::isnan(buffer[k])) ++written_outside;
      CHECK(written_outside == 0);
    }
}

TEST_CASE("lhc blocks that are not a power of two, nor a multiple of 64 bits, decode as the oracle peels") {
  // The decoder's row-by-row counting reads each block's index bits by word and masks the words
  // shared with the neighbouring blocks; its cell arithmetic divides instead of shifting.
  const std::size_t n = 40 * 1000 + 77;
  for (const std::uint32_t block : {100u, 1000u, 37u})
    for (const lhc_index_coding coding : {lhc_index_coding::bitmap, lhc_index_coding::sum4}) {
      CAPTURE(block);
      CAPTURE(static_cast<int>(coding));
      const lhc_params p{.block = block, .index = coding, .seed = block};
      const auto x = make_gradients<float>(3, n, 0.04, block, true);
      const protocol_run<float> run = run_protocol(make_lhc<float>(p), x);
      REQUIRE_FALSE(run.plan.dense);
      const oracle_peeling o = oracle_peel(p, run.plan, x, run.summed);
      REQUIRE(o.median.empty());
      CHECK(run.result == lhc_decode_result{.recovered = run.plan.union_nonzeros, .rounds = o.rounds});
      check_equal_values(run.out, rank_order_sum(x));
    }
}

TEST_CASE("lhc tiny sketches in which every cell holds an element decode exactly") {
  // When every cell is occupied and peeling succeeds, every cell enters the worklist once, so the
  // worklist fills up completely: its queueing must stay within the workspace (16 cells, whose
  // worklist ends where the recovered elements' log begins).
  const std::size_t n = 64;
  std::size_t full = 0, decoded = 0;
  for (std::uint32_t seed = 0; seed < 400; ++seed) {
    const lhc_params p{.block = 2, .seed = seed};
    const auto x = make_gradients<float>(1, n, 0.19, seed, true);
    const lossless_homomorphic<float> lhc(p);
    const cpu_executor cpu;
    byte_buffer index(lhc.index_bytes(n));
    lhc.encode_index(cpu, std::span<const float>(x[0]), std::span<std::byte>(index));
    const lhc_plan plan = lhc.plan(cpu, std::span<const std::byte>(index), n, 1);
    if (plan.dense || plan.cells != 16) continue;
    oracle_layout layout(p, plan.rows);
    std::vector<bool> occupied(plan.cells, false);
    for (std::size_t i = 0; i < n; ++i)
      if (x[0][i] != 0.0f)
        for (const std::uint64_t c : layout.of(i).cell) occupied[c] = true;
    if (std::find(occupied.begin(), occupied.end(), false) != occupied.end()) continue;
    ++full;
    std::vector<float> sketch(plan.sketch_values());
    lhc.encode_sketch(cpu, std::span<const float>(x[0]), std::span<const std::byte>(index), plan,
                      std::span<float>(sketch));
    byte_buffer ws(lhc.workspace_bytes(cpu, plan));
    std::vector<float> out(n, -1.0f);
    try {
      (void)lhc.decode(cpu, std::span<const std::byte>(index), plan, std::span<const float>(sketch),
                       std::span<float>(out), std::span<std::byte>(ws));
    } catch (const error& e) {
      CHECK(e.code() == errc::peeling_stalled);
      continue;
    }
    ++decoded;
    check_equal_values(out, x[0]);
  }
  MESSAGE(full << " tensors filled every cell, " << decoded << " of them peeled");
  CHECK(decoded >= 5);
}

// ---- hostile input ------------------------------------------------------------------------------------

TEST_CASE("lhc rejects hostile indexes, plans, sketches and buffers with named errors") {
  const cpu_executor cpu;
  const std::size_t n = 20000;
  const lossless_homomorphic<float> lhc({.block = 128});
  const auto x = make_gradients<float>(2, n, 0.02, 99, true);
  const protocol_run<float> run = run_protocol(lhc, x);
  REQUIRE_FALSE(run.plan.dense);
  byte_buffer ws(lhc.workspace_bytes(cpu, run.plan));
  std::vector<float> out(n, 3.0f);
  const std::vector<float> untouched = out;
  const auto decode = [&](std::span<const std::byte> index, const lhc_plan& plan, std::span<const float> sketch,
                          std::span<float> into, std::span<std::byte> workspace) {
    return thrown_by([&] { (void)lhc.decode(cpu, index, plan, sketch, into, workspace); });
  };
  const std::span<const std::byte> index(run.index);
  const std::span<const float> summed(run.summed);
  std::vector<float> sketch(run.plan.sketch_values());

  SUBCASE("sizes") {
    byte_buffer short_index(lhc.index_bytes(n) - 1);
    CHECK(thrown_by([&] { lhc.encode_index(cpu, std::span<const float>(x[0]), std::span<std::byte>(short_index)); }) ==
          named(errc::size_mismatch));
    CHECK(thrown_by([&] { (void)lhc.plan(cpu, index.first(index.size() - 1), n, 2); }) == named(errc::size_mismatch));
    CHECK(thrown_by([&] {
            lhc.encode_sketch(cpu, std::span<const float>(x[0]), index, run.plan,
                              std::span<float>(sketch).first(sketch.size() - 1));
          }) == named(errc::size_mismatch));
    CHECK(decode(index, run.plan, summed.first(summed.size() - 1), out, ws) == named(errc::size_mismatch));
    CHECK(decode(index, run.plan, summed, std::span<float>(out).first(n - 1), ws) == named(errc::size_mismatch));
    CHECK(decode(index, run.plan, summed, out, std::span<std::byte>(ws).first(ws.size() - 100)) ==
          named(errc::workspace_too_small));
  }
  SUBCASE("an index or plan that does not match") {
    const std::size_t odd = n - 3;
    std::vector<float> shorter(x[0].begin(), x[0].begin() + static_cast<std::ptrdiff_t>(odd));
    byte_buffer odd_index(lhc.index_bytes(odd));
    lhc.encode_index(cpu, std::span<const float>(shorter), std::span<std::byte>(odd_index));
    odd_index.back() |= std::byte{0x80};
    CHECK(thrown_by([&] { (void)lhc.plan(cpu, std::span<const std::byte>(odd_index), odd, 1); }) ==
          named(errc::malformed_payload));
    lhc_plan forged = run.plan;
    forged.rows += 1;
    forged.cells += 128;
    std::vector<float> big(forged.cells, 0.0f);
    CHECK(decode(index, forged, std::span<const float>(big), out, ws) == named(errc::invalid_argument));
    CHECK(thrown_by([&] {
            lhc.encode_sketch(cpu, std::span<const float>(x[0]), index, forged, std::span<float>(big));
          }) == named(errc::invalid_argument));
    byte_buffer fewer = run.index;
    std::size_t dropped = 0;
    while (fewer[dropped / 8] == std::byte{0}) dropped += 8;
    while ((std::to_integer<unsigned>(fewer[dropped / 8]) >> (dropped % 8) & 1u) == 0) ++dropped;
    fewer[dropped / 8] &= static_cast<std::byte>(~(1u << (dropped % 8)));  // drop one member
    CHECK(decode(std::span<const std::byte>(fewer), run.plan, summed, out, ws) == named(errc::invalid_argument));
    // a rank whose non-zero element is missing from the aggregated index
    const lhc_plan plan_of_fewer = lhc.plan(cpu, std::span<const std::byte>(fewer), n, 2);
    std::vector<float> s(plan_of_fewer.sketch_values(), 5.0f);
    const std::vector<float>& holder = x[0][dropped] != 0 ? x[0] : x[1];
    CHECK(thrown_by([&] {
            lhc.encode_sketch(cpu, std::span<const float>(holder), std::span<const std::byte>(fewer), plan_of_fewer,
                              std::span<float>(s));
          }) == named(errc::invalid_argument));
    // poisoned: a rank that joins the SUM anyway makes every decoder fail
    CHECK(std::all_of(s.begin(), s.end(), [](float v) { return std::isnan(v); }));
  }
  SUBCASE("NaN and Inf") {
    std::vector<float> bad = x[0];
    bad[123] = std::numeric_limits<float>::quiet_NaN();
    byte_buffer bad_index(lhc.index_bytes(n), std::byte{0x5A});
    CHECK(thrown_by([&] { lhc.encode_index(cpu, std::span<const float>(bad), std::span<std::byte>(bad_index)); }) ==
          named(errc::non_finite_input));
    CHECK(bad_index == byte_buffer(lhc.index_bytes(n), std::byte{0xFF}));  // poisoned: every element a member
    byte_buffer all(lhc.index_bytes(n), std::byte{0xFF});
    const lhc_plan plan_all = lhc.plan(cpu, std::span<const std::byte>(all), n, 1);
    std::vector<float> s(plan_all.sketch_values());
    bad[123] = std::numeric_limits<float>::infinity();
    CHECK(thrown_by([&] {
            lhc.encode_sketch(cpu, std::span<const float>(bad), std::span<const std::byte>(all), plan_all,
                              std::span<float>(s));
          }) == named(errc::non_finite_input));
    for (const float poison : {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::infinity()}) {
      std::vector<float> poisoned = run.summed;
      poisoned[poisoned.size() / 2] = poison;
      CHECK(decode(index, run.plan, std::span<const float>(poisoned), out, ws) == named(errc::non_finite_input));
    }
  }
  CHECK(out == untouched);
}

TEST_CASE("lhc a summed sketch that overflowed is refused and out is left untouched") {
  const cpu_executor cpu;
  const std::size_t n = 4096;
  const lossless_homomorphic<float> lhc({.block = 64});
  std::vector<std::vector<float>> x(2, std::vector<float>(n, 0.0f));
  x[0][100] = x[1][100] = std::numeric_limits<float>::max();
  x[0][2000] = 1.0f;
  std::vector<byte_buffer> indexes(2, byte_buffer(lhc.index_bytes(n)));
  for (std::size_t r = 0; r < 2; ++r)
    lhc.encode_index(cpu, std::span<const float>(x[r]), std::span<std::byte>(indexes[r]));
  const byte_buffer index = aggregate_indexes(indexes, lhc_index_coding::bitmap);
  const lhc_plan plan = lhc.plan(cpu, std::span<const std::byte>(index), n, 2);
  REQUIRE_FALSE(plan.dense);
  // the transport's float SUM overflows to Inf in the cells of element 100
  std::vector<float> a(plan.cells), b(plan.cells);
  lhc.encode_sketch(cpu, std::span<const float>(x[0]), std::span<const std::byte>(index), plan, std::span<float>(a));
  lhc.encode_sketch(cpu, std::span<const float>(x[1]), std::span<const std::byte>(index), plan, std::span<float>(b));
  std::vector<float> overflowed(plan.cells);
  for (std::size_t c = 0; c < a.size(); ++c) overflowed[c] = a[c] + b[c];
  byte_buffer ws(lhc.workspace_bytes(cpu, plan));
  std::vector<float> out(n, 1.0f);
  CHECK(thrown_by([&] {
          (void)lhc.decode(cpu, std::span<const std::byte>(index), plan, std::span<const float>(overflowed),
                           std::span<float>(out), std::span<std::byte>(ws));
        }) == named(errc::non_finite_input));
  CHECK(std::all_of(out.begin(), out.end(), [](float v) { return v == 1.0f; }));
}
