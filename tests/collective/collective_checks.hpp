#pragma once
// Checks of the compressed collectives that run over any transport, shared by the in-process tests
// and the MPI and Gloo tests (each process checking its own outcomes):
// - mismatch injection for compressed_all_reduce: in each scenario the last rank differs from the
//   others (element count, dtype, codec, parameters, step, tensor id, plan, a truncated message, a
//   NaN), and every rank must throw the same named error in the same call, its gradient untouched;
// - sums: with the lossless MPC codec, compressed_all_reduce and compressed_reduce_scatter must
//   give the uncompressed rank-order sum (or this rank's chunk of it) bit for bit.
#include <gradcomp/collective/compressed_all_reduce.hpp>
#include <gradcomp/collective/compressed_reduce_scatter.hpp>
#include <gradcomp/core/half_float.hpp>
#include <gradcomp/lossless/mpc.hpp>
#include <gradcomp/sketch/lossless_homomorphic.hpp>
#include <gradcomp/sparsify/threshold.hpp>
#include <gradcomp/sparsify/topk.hpp>
#include <gradcomp/transport/in_process.hpp>
#include <gradcomp/transport/transport.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <doctest/doctest.h>

#include "support/data.hpp"
#include "support/errors.hpp"

namespace gradcomp::test {

/// Rank r's gradient at a step: N(0, 1) with a per-rank seed, times 10^(r mod 3) so that the
/// order of a float sum matters.
template <class T = float>
std::vector<T> gradient_of(int rank, std::size_t n, std::uint64_t step = 0) {
  std::mt19937_64 engine(step * 7919 + static_cast<std::uint64_t>(rank) + 1);
  std::normal_distribution<double> normal(0.0, 1.0);
  const double scale = std::pow(10.0, rank % 3);
  std::vector<T> v(n);
  for (T& x : v) x = static_cast<T>(scale * normal(engine));
  return v;
}

/// Rank r's gradient of `gradient_of` rounded to the 16-bit type H.
template <class H>
std::vector<H> half_gradient_of(int rank, std::size_t n, std::uint64_t step = 0) {
  const std::vector<double> g = gradient_of<double>(rank, n, step);
  std::vector<H> h(n);
  for (std::size_t i = 0; i < n; ++i) h[i] = narrow<H>(static_cast<float>(g[i]));
  return h;
}

/// The 16-bit patterns of x.
template <class H>
std::vector<std::uint16_t> patterns_of(const std::vector<H>& x) {
  std::vector<std::uint16_t> bits(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) bits[i] = x[i].bits;
  return bits;
}

/// Runs `body(t, data)` on P in-process ranks, each with its `half_gradient_of`, and returns each
/// rank's data.
template <class H, class Body>
std::vector<std::vector<H>> on_half_ranks(int P, std::size_t n, Body body) {
  std::vector<std::vector<H>> results(static_cast<std::size_t>(P));
  in_process_group(P).run([&](in_process_transport& t) {
    std::vector<H> data = half_gradient_of<H>(t.rank(), n);
    body(t, data);
    results[static_cast<std::size_t>(t.rank())] = data;
  });
  return results;
}

/// The oracle of a lossless all-reduce: the ranks' `gradient_of(r, n, step)` summed in rank order
/// in float, element by element.
inline std::vector<float> rank_order_sum(int ranks, std::size_t n, std::uint64_t step = 0) {
  std::vector<float> sum(n, 0.0f);
  for (int r = 0; r < ranks; ++r) {
    const auto g = gradient_of(r, n, step);
    for (std::size_t i = 0; i < n; ++i) sum[i] += g[i];
  }
  return sum;
}

/// Rank r's sparse gradient: about `density` of the n values non-zero, each a non-zero multiple of
/// 1/16 in [−0.5, 0.5], so that every sum of a lossless homomorphic sketch cell is exact.
inline std::vector<float> dyadic_sparse_gradient(int rank, std::size_t n, double density, std::uint64_t step = 0) {
  std::mt19937_64 engine(step * 104729 + static_cast<std::uint64_t>(rank) * 31 + 5);
  std::uniform_real_distribution<double> coin(0.0, 1.0);
  std::uniform_int_distribution<int> level(1, 8);
  std::vector<float> v(n, 0.0f);
  for (float& x : v)
    if (coin(engine) < density) {
      const int magnitude = level(engine);
      x = static_cast<float>(coin(engine) < 0.5 ? -magnitude : magnitude) / 16.0f;
    }
  return v;
}

/// Chunk c of n values cut into P, written out independently of ring_chunk_of: {offset, count}.
inline std::pair<std::size_t, std::size_t> rank_chunk(std::size_t n, int P, int c) {
  const std::size_t base = n / static_cast<std::size_t>(P), extra = n % static_cast<std::size_t>(P);
  const auto i = static_cast<std::size_t>(c);
  return {i * base + std::min(i, extra), base + (i < extra ? 1 : 0)};
}

/// The calls of the `transport` concept alone, forwarded to another transport: a transport
/// without point-to-point messages or OR, and the base of transports that tamper with one call.
template <transport X>
class collectives_only {
 public:
  explicit collectives_only(X& inner) : inner_(inner) {}
  [[nodiscard]] int rank() const { return inner_.rank(); }
  [[nodiscard]] int size() const { return inner_.size(); }
  template <class V>
  void all_reduce_sum(std::span<V> d) {
    inner_.all_reduce_sum(d);
  }
  template <class V>
  void all_reduce_max(std::span<V> d) {
    inner_.all_reduce_max(d);
  }
  template <class V>
  void reduce_sum(std::span<V> d, int root) {
    inner_.reduce_sum(d, root);
  }
  template <class V>
  void reduce_scatter_sum(std::span<const V> in, std::span<V> out) {
    inner_.reduce_scatter_sum(in, out);
  }
  void broadcast(std::span<std::byte> d, int root) { inner_.broadcast(d, root); }
  std::vector<std::vector<std::byte>> all_gather_bytes(std::span<const std::byte> mine) {
    return inner_.all_gather_bytes(mine);
  }

 private:
  X& inner_;
};

/// A transport that cuts the last `cut` bytes off rank `victim`'s all-gathered buffers that are
/// longer than the agreement record: a message truncated in flight.
template <transport X>
class truncating_transport : public collectives_only<X> {
 public:
  truncating_transport(X& inner, int victim, std::size_t cut)
      : collectives_only<X>(inner), victim_(victim), cut_(cut) {}
  std::vector<std::vector<std::byte>> all_gather_bytes(std::span<const std::byte> mine) {
    if (this->rank() == victim_ && mine.size() > detail::agreement_record::size) mine = mine.first(mine.size() - cut_);
    return collectives_only<X>::all_gather_bytes(mine);
  }

 private:
  int victim_;
  std::size_t cut_;
};

/// The naive top-k of `g`: the k largest magnitudes (distinct in these tests) kept, the rest zero.
inline std::vector<float> naive_topk(const std::vector<float>& g, std::size_t k) {
  std::vector<std::size_t> order(g.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::sort(order.begin(), order.end(),
            [&](std::size_t a, std::size_t b) { return std::fabs(g[a]) > std::fabs(g[b]); });
  std::vector<float> kept(g.size(), 0.0f);
  for (std::size_t j = 0; j < k && j < order.size(); ++j) kept[order[j]] = g[order[j]];
  return kept;
}

/// What one rank saw in one scenario.
struct scenario_outcome {
  std::string name;      ///< The scenario.
  std::string expected;  ///< named(errc) every rank must throw ("no exception" for a normal call).
  std::string thrown;    ///< named(errc) this rank threw, or what happened instead.
  bool untouched = true; ///< This rank's gradient is unchanged (required when a call throws).
  [[nodiscard]] bool ok() const { return thrown == expected && (untouched || expected == "no exception"); }
};

/// CHECKs that `body(t)` throws errc `code` on every rank of an in-process group of P.
template <class Body>
void expect_everywhere(int P, errc code, Body body) {
  std::atomic<int> matching{0};
  in_process_group(P).run([&](in_process_transport& t) {
    if (thrown_by([&] { body(t); }) == named(code)) ++matching;
  });
  CHECK(matching.load() == P);
}

/// Values per gradient in the scenarios.
inline constexpr std::size_t agreement_scenario_count = 800;

/// Runs every scenario on this rank (all ranks of `t` must call it; P ≥ 2) and returns its outcomes.

template <transport X>
std::vector<scenario_outcome> run_agreement_scenarios(X& t) {
  constexpr std::size_t n = agreement_scenario_count;
  const int odd = t.size() - 1;
  const bool differs = t.rank() == odd;
  const topk_sparsifier<float> topk(sparsity{.density = 0.05});
  std::vector<scenario_outcome> outcomes;
  // Runs `call(data)` on this rank's float gradient of `count` values (with a NaN on the odd rank
  // when `poisoned`).
  const auto scenario = [&](std::string name, errc expected, auto&& call, std::size_t count = agreement_scenario_count,
                            bool poisoned = false) {
    auto data = gradient_of(t.rank(), count);
    if (poisoned && differs) data[count / 2] = std::numeric_limits<float>::quiet_NaN();
    const auto before = data;
    const std::string expect = expected == errc{} ? "no exception" : named(expected);
    scenario_outcome o{std::move(name), expect, thrown_by([&] { call(std::span<float>(data)); }), true};
    o.untouched = same_bits<float>(data, before);
    outcomes.push_back(std::move(o));
  };
  scenario(
      "element count", errc::size_mismatch,
      [&](std::span<float> d) { compressed_all_reduce(cpu_executor{}, t, topk, d); }, differs ? n + 1 : n);
  scenario("codec parameters", errc::parameter_mismatch, [&](std::span<float> d) {
    compressed_all_reduce(cpu_executor{}, t, differs ? topk_sparsifier<float>(sparsity{.density = 0.06}) : topk, d);
  });
  scenario("codec id", errc::codec_mismatch, [&](std::span<float> d) {
    if (differs) compressed_all_reduce(cpu_executor{}, t, threshold_sparsifier<float>(), d);
    else
      compressed_all_reduce(cpu_executor{}, t, topk, d);
  });
  scenario("dtype", errc::dtype_mismatch, [&](std::span<float> d) {
    if (!differs) {
      compressed_all_reduce(cpu_executor{}, t, topk, d);
      return;
    }
    auto wide = gradient_of<double>(t.rank(), n);
    compressed_all_reduce(cpu_executor{}, t, topk_sparsifier<double>(sparsity{.density = 0.05}),
                          std::span<double>(wide));
  });
  scenario("step", errc::step_mismatch, [&](std::span<float> d) {
    compressed_all_reduce(cpu_executor{}, t, topk, d, {.key = {.step = differs ? 8u : 7u}});
  });
  scenario("tensor id", errc::step_mismatch, [&](std::span<float> d) {
    compressed_all_reduce(cpu_executor{}, t, topk, d, {.key = {.tensor_id = differs ? 1u : 0u}});
  });
  scenario("plan", errc::parameter_mismatch, [&](std::span<float> d) {
    const auto plan = differs ? all_reduce_plan::summed_encodings : all_reduce_plan::gather_decode;
    compressed_all_reduce(cpu_executor{}, t, mpc_codec<float>(), d, {.plan = plan});
  });
  for (const std::size_t cut : {std::size_t{1}, std::size_t{30}}) {
    scenario("truncated message (" + std::to_string(cut) + " bytes cut)", errc::truncated, [&](std::span<float> d) {
      truncating_transport<X> cutting(t, odd, cut);
      compressed_all_reduce(cpu_executor{}, cutting, topk, d);
    });
  }
  scenario(
      "NaN in one gradient", errc::non_finite_input,
      [&](std::span<float> d) { compressed_all_reduce(cpu_executor{}, t, topk, d); }, n, true);
  scenario("reduce-scatter output of another size on one rank", errc::invalid_argument, [&](std::span<float> d) {
    std::vector<float> out(ring_chunk_of(n, t.size(), t.rank()).count + (differs ? 1 : 0));
    compressed_reduce_scatter(cpu_executor{}, t, topk, std::span<const float>(d), std::span<float>(out));
  });
  scenario("plan the codec cannot run", errc::invalid_argument, [&](std::span<float> d) {
    compressed_all_reduce(cpu_executor{}, t, topk, d, {.plan = all_reduce_plan::summed_encodings});
  });
  // After all of that, the group still works.
  scenario("a normal call afterwards", errc{},
           [&](std::span<float> d) { compressed_all_reduce(cpu_executor{}, t, mpc_codec<float>(), d); });
  return outcomes;
}

/// Runs the scenarios and CHECKs this rank's outcomes (collective: every rank calls it).
template <transport X>
void check_agreement_scenarios(X& t) {
  for (const scenario_outcome& o : run_agreement_scenarios(t)) {
    INFO("rank ", t.rank(), ", ", o.name, ": expected ", o.expected, ", got ", o.thrown,
         o.untouched ? "" : ", data changed");
    CHECK(o.ok());
  }
}

/// CHECKs that the lossless codec's compressed all-reduce and reduce-scatter (every plan this
/// transport can run), and lossless homomorphic compression's two-stage all-reduce of sparse
/// gradients, give the uncompressed rank-order sum bit for bit (collective).
template <transport X>
void check_lossless_sums(X& t) {
  const mpc_codec<float> mpc;
  const int P = t.size();
  const lossless_homomorphic<float> lhc({.block = 256});
  for (const double density : {0.0, 0.02, 0.3}) {
    const std::size_t n = 20000;
    INFO("rank ", t.rank(), ", lossless homomorphic, density ", density);
    std::vector<float> sum(n, 0.0f);
    for (int r = 0; r < P; ++r) {
      const auto g = dyadic_sparse_gradient(r, n, density);
      for (std::size_t i = 0; i < n; ++i) sum[i] += g[i];
    }
    auto data = dyadic_sparse_gradient(t.rank(), n, density);
    compressed_all_reduce(cpu_executor{}, t, lhc, std::span<float>(data));
    CHECK(same_bits<float>(data, sum));
  }
  for (const std::size_t n : {std::size_t{0}, std::size_t{1}, static_cast<std::size_t>(P) + 1, std::size_t{5003}}) {
    INFO("rank ", t.rank(), ", n = ", n);
    const std::vector<float> sum = rank_order_sum(P, n);
    auto data = gradient_of(t.rank(), n);
    compressed_all_reduce(cpu_executor{}, t, mpc, std::span<float>(data), {.plan = all_reduce_plan::gather_decode});
    CHECK(same_bits<float>(data, sum));
    const ring_chunk mine = ring_chunk_of(n, P, t.rank());
    const std::span<const float> expected = std::span<const float>(sum).subspan(mine.offset, mine.count);
    std::vector<reduce_scatter_plan> plans{reduce_scatter_plan::gather_decode};
    if constexpr (transport_with_point_to_point<X>) plans.push_back(reduce_scatter_plan::all_to_all);
    for (const reduce_scatter_plan plan : plans) {
      const auto g = gradient_of(t.rank(), n);
      std::vector<float> out(mine.count, -1.0f);
      compressed_reduce_scatter(cpu_executor{}, t, mpc, std::span<const float>(g), std::span<float>(out),
                                {.plan = plan});
      CHECK(same_bits<float>(out, expected));
    }
  }
}

}  // namespace gradcomp::test
