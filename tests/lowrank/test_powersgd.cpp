// PowerSGD (lowrank/powersgd.hpp) through its compressed all-reduce on in-process ranks: the step
// against a float64 oracle written here (classical Gram–Schmidt, plain sums: no code of the
// library's), P̂ orthonormal, the full-rank case exact up to rounding, both error-feedback
// invariants, the reference and CPU backends bit for bit with every rank holding the same bits,
// the dense fallbacks, the agreement's errors with nothing changed, and the saved state.
#include <gradcomp/collective/compressed_reduce_scatter.hpp>
#include <gradcomp/collective/low_rank_collectives.hpp>
#include <gradcomp/lowrank/powersgd.hpp>
#include <gradcomp/lowrank/powersgd_math.hpp>
#include <gradcomp/transport/in_process.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "collective/collective_checks.hpp"
#include "support/errors.hpp"
#include "support/executor_io.hpp"

namespace gradcomp::test {
namespace {

using matrix = std::vector<double>;  // row-major

/// The oracle's PowerSGD step for all ranks at once, in float64: P = Σ M_r·Q, P̂ by classical
/// Gram–Schmidt, Q = Σ M_rᵀ·P̂, result = P̂·Qᵀ.
matrix oracle_step(const std::vector<matrix>& ms, const std::vector<double>& q0, std::uint64_t a, std::uint64_t b,
                   std::uint64_t r, matrix* p_hat_out = nullptr) {
  matrix p(a * r, 0.0);
  for (const matrix& m : ms)
    for (std::uint64_t i = 0; i < a; ++i)
      for (std::uint64_t k = 0; k < r; ++k)
        for (std::uint64_t j = 0; j < b; ++j) p[i * r + k] += m[i * b + j] * q0[j * r + k];
  matrix ph(a * r, 0.0);
  for (std::uint64_t k = 0; k < r; ++k) {
    std::vector<double> v(a);
    for (std::uint64_t i = 0; i < a; ++i) v[i] = p[i * r + k];
    for (std::uint64_t l = 0; l < k; ++l) {  // classical: projections on the finished columns of the input
      double dot = 0.0;
      for (std::uint64_t i = 0; i < a; ++i) dot += ph[i * r + l] * p[i * r + k];
      for (std::uint64_t i = 0; i < a; ++i) v[i] -= dot * ph[i * r + l];
    }
    double norm = 0.0;
    for (const double x : v) norm += x * x;
    norm = std::sqrt(norm);
    for (std::uint64_t i = 0; i < a; ++i) ph[i * r + k] = v[i] / norm;
  }
  matrix q(b * r, 0.0);
  for (const matrix& m : ms)
    for (std::uint64_t j = 0; j < b; ++j)
      for (std::uint64_t k = 0; k < r; ++k)
        for (std::uint64_t i = 0; i < a; ++i) q[j * r + k] += m[i * b + j] * ph[i * r + k];
  matrix out(a * b, 0.0);
  for (std::uint64_t i = 0; i < a; ++i)
    for (std::uint64_t j = 0; j < b; ++j)
      for (std::uint64_t k = 0; k < r; ++k) out[i * b + j] += ph[i * r + k] * q[j * r + k];
  if (p_hat_out != nullptr) *p_hat_out = ph;
  return out;
}

template <class T>
matrix widened_matrix(const std::vector<T>& v) {
  return matrix(v.begin(), v.end());
}

double max_abs(const matrix& v) {
  double m = 0.0;
  for (const double x : v) m = std::max(m, std::abs(x));
  return m;
}

/// What one rank ends a run of PowerSGD calls with.
template <class T>
struct rank_run {
  std::vector<T> data;            // the last call's result
  std::vector<T> first_gradient;  // the last call's input
  powersgd_state<T> state;
  std::vector<T> error_before;    // the state's error before the last call
  compressed_report report;
};

/// `steps` calls on P in-process ranks with gradients gradient_of(rank, a·b, step), steps 0, 1, …
template <class T, class E = cpu_executor>
std::vector<rank_run<T>> run_powersgd(int P, matrix_shape shape, const powersgd<T>& scheme, int steps,
                                      all_reduce_options options = {}) {
  std::vector<rank_run<T>> runs(static_cast<std::size_t>(P));
  in_process_group(P).run([&](in_process_transport& t) {
    rank_run<T>& run = runs[static_cast<std::size_t>(t.rank())];
    for (int s = 0; s < steps; ++s) {
      options.key.step = static_cast<std::uint64_t>(s);
      run.data = gradient_of<T>(t.rank(), static_cast<std::size_t>(shape.count()), static_cast<std::uint64_t>(s));
      run.first_gradient = run.data;
      run.error_before = run.state.error;
      run.report = compressed_all_reduce(E{}, t, scheme, run.state, std::span<T>(run.data), shape, options);
    }
  });
  return runs;
}

}  // namespace

TEST_CASE("powersgd_orthonormalise: orthonormal columns in float and double sums, a zero column stays zero") {
  const std::uint64_t a = 57, r = 5;
  for (const bool in_double : {false, true}) {
    CAPTURE(in_double);
    std::vector<float> m = gradient_of<float>(2, a * r);
    for (std::uint64_t i = 0; i < a; ++i) m[i * r + 2] = 0.0f;  // column 2 is zero
    powersgd_orthonormalise(std::span<float>(m), a, r, in_double);
    for (std::uint64_t k = 0; k < r; ++k)
      for (std::uint64_t l = 0; l < r; ++l) {
        double dot = 0.0;
        for (std::uint64_t i = 0; i < a; ++i) dot += double{m[i * r + k]} * double{m[i * r + l]};
        const double expected = k == l && k != 2 ? 1.0 : 0.0;
        CAPTURE(k);
        CAPTURE(l);
        CHECK(std::abs(dot - expected) < 1e-5);
      }
  }
}

TEST_CASE("powersgd_draw_q: uniform from -1 to 1 before orthonormalising, keyed by step and tensor, orthonormal") {
  const std::uint64_t b = 40, r = 4;
  std::vector<float> q(b * r), again(b * r), other(b * r);
  powersgd_draw_q(std::span<float>(q), b, r, 7, 3, 1, false);
  powersgd_draw_q(std::span<float>(again), b, r, 7, 3, 1, false);
  powersgd_draw_q(std::span<float>(other), b, r, 7, 4, 1, false);
  CHECK(bit_patterns(q) == bit_patterns(again));
  CHECK(bit_patterns(q) != bit_patterns(other));
  for (std::uint64_t k = 0; k < r; ++k) {
    double norm = 0.0;
    for (std::uint64_t j = 0; j < b; ++j) norm += double{q[j * r + k]} * double{q[j * r + k]};
    CHECK(std::abs(norm - 1.0) < 1e-5);
  }
}

TEST_CASE("PowerSGD all-reduce: one step against the float64 oracle, P = 1 and 3, several shapes and ranks") {
  struct shape_case {
    std::uint64_t a, b;
    std::uint32_t r;
  };
  for (const shape_case c :
       {shape_case{37, 29, 4}, shape_case{64, 48, 8}, shape_case{30, 41, 3}, shape_case{9, 70, 1}}) {
    for (int P : {1, 3}) {
      CAPTURE(c.a);
      CAPTURE(c.b);
      CAPTURE(c.r);
      CAPTURE(P);
      const matrix_shape shape{c.a, c.b};
      const powersgd<float> scheme({.rank = c.r, .seed = 11});
      REQUIRE(scheme.compresses(shape));
      const auto runs = run_powersgd<float>(P, shape, scheme, 1, {.key = {.step = 0, .tensor_id = 2}});
      std::vector<float> q0(c.b * c.r);
      powersgd_draw_q(std::span<float>(q0), c.b, c.r, 11, 0, 2, false);
      std::vector<matrix> ms;
      for (int rank = 0; rank < P; ++rank) ms.push_back(widened_matrix(gradient_of<float>(rank, c.a * c.b, 0)));
      const matrix expected = oracle_step(ms, widened_matrix(q0), c.a, c.b, c.r);
      const double tolerance = 1e-4 * max_abs(expected) + 1e-6;
      for (const auto& run : runs) {
        double worst = 0.0;
        for (std::size_t i = 0; i < expected.size(); ++i) worst = std::max(worst, std::abs(run.data[i] - expected[i]));
        CHECK(worst <= tolerance);
        CHECK(bit_patterns(run.data) == bit_patterns(runs[0].data));
        CHECK(run.report.sent_bytes == ring_all_reduce_dense_bytes(c.a * c.r * 4, static_cast<std::uint64_t>(P)) +
                                           ring_all_reduce_dense_bytes(c.b * c.r * 4, static_cast<std::uint64_t>(P)));
        CHECK(run.report.dense_bytes == ring_all_reduce_dense_bytes(c.a * c.b * 4, static_cast<std::uint64_t>(P)));
      }
    }
  }
}

TEST_CASE("PowerSGD all-reduce: at r = min(a, b) on one rank, without error, the result is M up to rounding") {
  const matrix_shape shape{12, 7};
  const powersgd<double> scheme({.rank = 7});
  const auto runs = run_powersgd<double>(1, shape, scheme, 1, {.plan = all_reduce_plan::low_rank});
  const auto& run = runs[0];
  for (std::size_t i = 0; i < run.data.size(); ++i) CHECK(std::abs(run.data[i] - run.first_gradient[i]) < 1e-9);
}

TEST_CASE("PowerSGD error feedback: the shared and local invariants hold over steps") {
  const matrix_shape shape{33, 26};
  const std::uint64_t n = shape.count();
  const int P = 3;
  for (const powersgd_feedback form : {powersgd_feedback::shared, powersgd_feedback::local}) {
    CAPTURE(static_cast<int>(form));
    const powersgd<float> scheme({.rank = 2, .feedback = form});
    for (const bool average : {false, true}) {
      CAPTURE(average);
      const auto runs = run_powersgd<float>(P, shape, scheme, 3, {.average = average});
      // Σ_r (M_r − E_r): P̂·Σ_r Q_rᵀ (local) or P·P̂·(Q/P)ᵀ (shared), each the sum over ranks.
      std::vector<double> applied(n, 0.0);
      double scale = 0.0;
      for (const auto& run : runs)
        for (std::uint64_t i = 0; i < n; ++i) {
          const double m = double{run.first_gradient[i]} + double{run.error_before[i]};
          applied[i] += m - double{run.state.error[i]};
          scale = std::max(scale, std::abs(m));
        }
      const double sum_factor = average ? P : 1.0;  // data is the mean with average
      double worst = 0.0;
      for (std::uint64_t i = 0; i < n; ++i)
        worst = std::max(worst, std::abs(applied[i] - sum_factor * double{runs[0].data[i]}));
      CHECK(worst <= 1e-5 * scale * P);
      for (const auto& run : runs) CHECK(run.state.steps == 3);
      if (form == powersgd_feedback::shared)  // every rank subtracts the same mean: M_r − E_r equal
        for (std::uint64_t i = 0; i < n; ++i) {
          const double first = double{runs[0].first_gradient[i]} + runs[0].error_before[i] - runs[0].state.error[i];
          const double last = double{runs[2].first_gradient[i]} + runs[2].error_before[i] - runs[2].state.error[i];
          CHECK(std::abs(first - last) <= 1e-5 * scale);
        }
    }
  }
}

TEST_CASE("PowerSGD all-reduce: reference_executor and cpu_executor give the same bits on every rank") {
  struct shape_case {
    std::uint64_t a, b;
    std::uint32_t r;
  };
  for (const shape_case c : {shape_case{37, 29, 4}, shape_case{21, 64, 8}, shape_case{30, 41, 3},
                             shape_case{13, 300, 12}, shape_case{50, 52, 36}}) {
    for (const powersgd_feedback form : {powersgd_feedback::shared, powersgd_feedback::local}) {
      CAPTURE(c.a);
      CAPTURE(c.b);
      CAPTURE(c.r);
      const matrix_shape shape{c.a, c.b};
      const powersgd<float> scheme({.rank = c.r, .min_compression_rate = 1.0f, .feedback = form});
      const auto ref = run_powersgd<float, reference_executor>(3, shape, scheme, 3);
      const auto cpu = run_powersgd<float, cpu_executor>(3, shape, scheme, 3);
      for (std::size_t rank = 0; rank < 3; ++rank) {
        CAPTURE(rank);
        CHECK(bit_patterns(ref[rank].data) == bit_patterns(cpu[rank].data));
        CHECK(bit_patterns(ref[rank].data) == bit_patterns(ref[0].data));
        CHECK(bit_patterns(ref[rank].state.error) == bit_patterns(cpu[rank].state.error));
        CHECK(bit_patterns(ref[rank].state.q) == bit_patterns(cpu[rank].state.q));
      }
    }
  }
  const powersgd<double> in_double({.rank = 4, .orthonormalise_in_double = true});
  const auto ref = run_powersgd<double, reference_executor>(2, {40, 30}, in_double, 2);
  const auto cpu = run_powersgd<double, cpu_executor>(2, {40, 30}, in_double, 2);
  CHECK(bit_patterns(ref[1].data) == bit_patterns(cpu[1].data));
}

TEST_CASE("PowerSGD all-reduce: dense when the matrix does not compress or before start_iter, state untouched") {
  const int P = 3;
  {
    const matrix_shape small{6, 5};  // (6 + 5)·4 = 44 ≥ 30 / 2
    const powersgd<float> scheme({.rank = 4});
    REQUIRE_FALSE(scheme.compresses(small));
    const auto runs = run_powersgd<float>(P, small, scheme, 1);
    CHECK(bit_patterns(runs[1].data) == bit_patterns(rank_order_sum(P, small.count())));
    CHECK(runs[1].state.error.empty());
    CHECK(runs[1].state.steps == 0);
  }
  {
    const matrix_shape shape{40, 40};
    const powersgd<float> scheme({.rank = 2, .start_iter = 1});
    const auto runs = run_powersgd<float>(P, shape, scheme, 1);
    CHECK(bit_patterns(runs[0].data) == bit_patterns(rank_order_sum(P, shape.count())));
    CHECK(runs[0].state.steps == 0);
    CHECK(runs[0].report.sent_bytes == runs[0].report.dense_bytes);
  }
  CHECK_FALSE(powersgd<float>({.rank = 1}).compresses({1, 1000}));
}

TEST_CASE("PowerSGD all-reduce: a rank's other shape, NaN or bad state, or a plan it lacks: all throw, unchanged") {
  const int P = 3;
  const powersgd<float> scheme({.rank = 2});
  struct fault_case {
    const char* what;
    errc expected;
  };
  for (const fault_case f : {fault_case{"shape", errc::parameter_mismatch}, fault_case{"nan", errc::non_finite_input},
                             fault_case{"plan", errc::invalid_argument}, fault_case{"state", errc::size_mismatch}}) {
    const std::string what = f.what;
    CAPTURE(what);
    std::vector<std::string> thrown(P);
    std::vector<char> unchanged(P, 0);  // not vector<bool>: each rank's thread writes its own element
    in_process_group(P).run([&](in_process_transport& t) {
      matrix_shape shape{20, 30};
      powersgd_state<float> state;
      {  // one compressed step first, so that there is a state to keep
        std::vector<float> g = gradient_of<float>(t.rank(), 600);
        compressed_all_reduce(cpu_executor{}, t, scheme, state, std::span<float>(g), shape);
      }
      std::vector<float> g = gradient_of<float>(t.rank(), 600, 1);
      all_reduce_options options{.key = {.step = 1}};
      if (what == "plan") options.plan = all_reduce_plan::gather_decode;  // on every rank: a plan PowerSGD lacks
      if (t.rank() == 1) {
        if (what == "shape") shape = {30, 20};
        if (what == "nan") g[17] = std::nanf("");
        if (what == "state") state.error.pop_back();
      }
      const std::vector<float> g_before = g;
      const powersgd_state<float> state_before = state;
      thrown[static_cast<std::size_t>(t.rank())] = thrown_by(
          [&] { compressed_all_reduce(cpu_executor{}, t, scheme, state, std::span<float>(g), shape, options); });
      unchanged[static_cast<std::size_t>(t.rank())] =
          bit_patterns(g) == bit_patterns(g_before) && bit_patterns(state.error) == bit_patterns(state_before.error) &&
          bit_patterns(state.q) == bit_patterns(state_before.q) && state.steps == state_before.steps;
    });
    for (int r = 0; r < P; ++r) {
      CAPTURE(r);
      CHECK(thrown[static_cast<std::size_t>(r)] == named(f.expected));
      CHECK(unchanged[static_cast<std::size_t>(r)]);
    }
  }
}

TEST_CASE("PowerSGD saved state: a run resumed from it continues bit for bit, damaged or mismatched bytes refused") {
  const matrix_shape shape{24, 36};
  const powersgd<float> scheme({.rank = 3, .seed = 5});
  const int P = 2;
  std::vector<std::vector<float>> straight(P), resumed(P);
  std::vector<std::vector<std::byte>> saved(P);
  in_process_group(P).run([&](in_process_transport& t) {
    const auto rank = static_cast<std::size_t>(t.rank());
    powersgd_state<float> state;
    for (std::uint64_t s = 0; s < 2; ++s) {
      std::vector<float> g = gradient_of<float>(t.rank(), shape.count(), s);
      compressed_all_reduce(cpu_executor{}, t, scheme, state, std::span<float>(g), shape, {.key = {.step = s}});
    }
    saved[rank].resize(scheme.saved_state_bytes(shape));
    CHECK(scheme.save_state(state, shape, saved[rank]) == saved[rank].size());
    powersgd_state<float> loaded;
    scheme.load_state(saved[rank], shape, loaded);
    CHECK(loaded.steps == 2);
    std::vector<float> a = gradient_of<float>(t.rank(), shape.count(), 2), b = a;
    compressed_all_reduce(cpu_executor{}, t, scheme, state, std::span<float>(a), shape, {.key = {.step = 2}});
    compressed_all_reduce(cpu_executor{}, t, scheme, loaded, std::span<float>(b), shape, {.key = {.step = 2}});
    straight[rank] = a;
    resumed[rank] = b;
  });
  CHECK(bit_patterns(straight[0]) == bit_patterns(resumed[0]));
  CHECK(bit_patterns(straight[1]) == bit_patterns(resumed[1]));

  powersgd_state<float> target;
  const auto refuses = [&](std::vector<std::byte> bytes, matrix_shape s, const powersgd<float>& with) {
    return thrown_by([&] { with.load_state(bytes, s, target); });
  };
  std::vector<std::byte> bytes = saved[0];
  CHECK(refuses(bytes, {36, 24}, scheme) == named(errc::size_mismatch));
  CHECK(refuses(bytes, shape, powersgd<float>({.rank = 3, .seed = 6})) == named(errc::parameter_mismatch));
  bytes[bytes.size() - 9] ^= std::byte{1};
  CHECK(refuses(bytes, shape, scheme) == named(errc::payload_checksum));
  bytes = saved[0];
  bytes.pop_back();
  CHECK(refuses(bytes, shape, scheme) == named(errc::truncated));
  bytes = saved[0];
  bytes[3] ^= std::byte{1};
  CHECK(refuses(bytes, shape, scheme) == named(errc::bad_magic));
  CHECK(target.steps == 0);
  CHECK(target.q.empty());
}

TEST_CASE("PowerSGD reduce-scatter: each rank's chunk of the all-reduce's result, the same state and bytes") {
  const matrix_shape shape{37, 29};
  const powersgd<float> scheme({.rank = 3});
  for (int P : {1, 3, 4}) {
    CAPTURE(P);
    const auto whole = run_powersgd<float>(P, shape, scheme, 3, {.average = true});
    std::vector<std::vector<float>> chunks(static_cast<std::size_t>(P));
    std::vector<powersgd_state<float>> states(static_cast<std::size_t>(P));
    std::vector<compressed_report> reports(static_cast<std::size_t>(P));
    in_process_group(P).run([&](in_process_transport& t) {
      const auto rank = static_cast<std::size_t>(t.rank());
      for (std::uint64_t s = 0; s < 3; ++s) {
        const std::vector<float> g = gradient_of<float>(t.rank(), shape.count(), s);
        chunks[rank].assign(ring_chunk_of(shape.count(), P, t.rank()).count, 0.0f);
        reports[rank] =
            compressed_reduce_scatter(cpu_executor{}, t, scheme, states[rank], std::span<const float>(g), shape,
                                      std::span<float>(chunks[rank]), {.key = {.step = s}, .average = true});
      }
    });
    for (int r = 0; r < P; ++r) {
      CAPTURE(r);
      const auto rank = static_cast<std::size_t>(r);
      const ring_chunk c = ring_chunk_of(shape.count(), P, r);
      const std::vector<float> expected(whole[rank].data.begin() + static_cast<std::ptrdiff_t>(c.offset),
                                        whole[rank].data.begin() + static_cast<std::ptrdiff_t>(c.offset + c.count));
      CHECK(bit_patterns(chunks[rank]) == bit_patterns(expected));
      CHECK(bit_patterns(states[rank].error) == bit_patterns(whole[rank].state.error));
      CHECK(reports[rank].sent_bytes == whole[rank].report.sent_bytes);
      CHECK(reports[rank].dense_bytes == (shape.count() - c.count) * sizeof(float));
    }
  }
  // The dense plan (a matrix that does not compress) is the codecs' dense reduce-scatter, state
  // untouched; an `out` of another size fails on every rank.
  const int P = 3;
  std::vector<std::string> thrown(P);
  in_process_group(P).run([&](in_process_transport& t) {
    const matrix_shape small{6, 5};
    const std::vector<float> g = gradient_of<float>(t.rank(), small.count());
    powersgd_state<float> state;
    std::vector<float> out(ring_chunk_of(small.count(), P, t.rank()).count);
    compressed_reduce_scatter(cpu_executor{}, t, scheme, state, std::span<const float>(g), small,
                              std::span<float>(out));
    const std::vector<float> sum = rank_order_sum(P, small.count());
    const ring_chunk c = ring_chunk_of(small.count(), P, t.rank());
    CHECK(bit_patterns(out) ==
          bit_patterns(std::vector<float>(sum.begin() + static_cast<std::ptrdiff_t>(c.offset),
                                          sum.begin() + static_cast<std::ptrdiff_t>(c.offset + c.count))));
    CHECK(state.steps == 0);
    std::vector<float> wrong(out.size() + (t.rank() == 2 ? 1 : 0));
    thrown[static_cast<std::size_t>(t.rank())] = thrown_by([&] {
      compressed_reduce_scatter(cpu_executor{}, t, scheme, state, std::span<const float>(g), small,
                                std::span<float>(wrong));
    });
  });
  for (const std::string& s : thrown) CHECK(s == named(errc::invalid_argument));
}

TEST_CASE("PowerSGD batched view: a vector padded to a square matrix, as the shape overload on the padded copy") {
  CHECK(powersgd_square_side(0) == 0);
  CHECK(powersgd_square_side(1) == 1);
  CHECK(powersgd_square_side(2) == 2);
  CHECK(powersgd_square_side(4) == 2);
  CHECK(powersgd_square_side(5) == 3);
  CHECK(powersgd_square_side(std::uint64_t{1} << 24) == 4096);
  CHECK(powersgd_square_side((std::uint64_t{1} << 40) + 1) == (std::uint64_t{1} << 20) + 1);
  CHECK(powersgd_square_side(UINT64_MAX) == std::uint64_t{1} << 32);
  const std::size_t n = 1000;  // 32 x 32 = 1024 after padding
  const powersgd<float> scheme({.rank = 2});
  const int P = 3;
  std::vector<std::vector<float>> batched(P), padded(P);
  in_process_group(P).run([&](in_process_transport& t) {
    const auto rank = static_cast<std::size_t>(t.rank());
    powersgd_state<float> a, b;
    for (std::uint64_t s = 0; s < 2; ++s) {
      batched[rank] = gradient_of<float>(t.rank(), n, s);
      padded[rank] = batched[rank];
      padded[rank].resize(1024, 0.0f);
      const compressed_report r =
          compressed_all_reduce(cpu_executor{}, t, scheme, a, std::span<float>(batched[rank]), {.key = {.step = s}});
      compressed_all_reduce(cpu_executor{}, t, scheme, b, std::span<float>(padded[rank]), {32, 32},
                            {.key = {.step = s}});
      CHECK(r.sent_bytes == 2 * ring_all_reduce_dense_bytes(32 * 2 * sizeof(float), P));
      CHECK(r.dense_bytes == ring_all_reduce_dense_bytes(n * sizeof(float), P));
    }
    CHECK(bit_patterns(a.error) == bit_patterns(b.error));
  });
  for (std::size_t r = 0; r < P; ++r) {
    padded[r].resize(n);
    CHECK(bit_patterns(batched[r]) == bit_patterns(padded[r]));
    CHECK(bit_patterns(batched[r]) == bit_patterns(batched[0]));
  }
}

TEST_CASE("powersgd parameters: invalid ones are refused with a named error") {
  CHECK(thrown_by([] { powersgd<float>({.rank = 0}); }) == named(errc::invalid_argument));
  CHECK(thrown_by([] { powersgd<float>({.min_compression_rate = 0.5f}); }) == named(errc::invalid_argument));
}

}  // namespace gradcomp::test
