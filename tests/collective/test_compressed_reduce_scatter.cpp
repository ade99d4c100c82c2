// compressed_reduce_scatter over the in-process transport. Oracles written here: the uncompressed
// chunk sums in rank order (which the lossless codec must reproduce bit for bit under the
// all-to-all and gather plans), a naive top-k of every rank's chunk summed in rank order, and a
// single-threaded replay of P error-feedback states per rank (one per chunk).
#include <gradcomp/collective/compressed_reduce_scatter.hpp>
#include <gradcomp/feedback/error_feedback.hpp>
#include <gradcomp/lossless/mpc.hpp>
#include <gradcomp/sparsify/topk.hpp>
#include <gradcomp/transport/in_process.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "collective_checks.hpp"
#include "support/errors.hpp"

namespace gradcomp::test {
namespace {

std::vector<float> slice(const std::vector<float>& v, std::pair<std::size_t, std::size_t> range) {
  return {v.begin() + static_cast<std::ptrdiff_t>(range.first),
          v.begin() + static_cast<std::ptrdiff_t>(range.first + range.second)};
}

// The transport's collectives and point-to-point messages, without its all_to_all_bytes: the
// all_to_all plan's P − 1 shifted sendrecv_bytes.
template <transport X>
class point_to_point_only : public collectives_only<X> {
 public:
  explicit point_to_point_only(X& inner) : collectives_only<X>(inner), inner_(inner) {}
  void send_bytes(std::span<const std::byte> d, int dest) { inner_.send_bytes(d, dest); }
  std::vector<std::byte> recv_bytes(int source) { return inner_.recv_bytes(source); }
  std::vector<std::byte> sendrecv_bytes(std::span<const std::byte> d, int dest, int source) {
    return inner_.sendrecv_bytes(d, dest, source);
  }

 private:
  X& inner_;
};

static_assert(!transport_with_point_to_point<collectives_only<in_process_transport>>);
static_assert(!transport_with_all_to_all<collectives_only<in_process_transport>>);
static_assert(transport_with_all_to_all<in_process_transport>);
static_assert(transport_with_point_to_point<point_to_point_only<in_process_transport>>);
static_assert(!transport_with_all_to_all<point_to_point_only<in_process_transport>>);
static_assert(detail::resolved_plan<point_to_point_only<in_process_transport>>(reduce_scatter_plan::automatic) ==
              reduce_scatter_plan::all_to_all);
static_assert(detail::resolved_plan<collectives_only<in_process_transport>>(reduce_scatter_plan::automatic) ==
              reduce_scatter_plan::gather_decode);

}  // namespace

TEST_CASE("compressed_reduce_scatter with a lossless codec: each rank's chunk of the rank-order sum, bit for bit") {
  const mpc_codec<float> mpc;
  for (int P : {1, 2, 3, 5}) {
    for (std::size_t n : {std::size_t{0}, std::size_t{2}, std::size_t{1001}}) {
      CAPTURE(P);
      CAPTURE(n);
      const std::vector<float> sum = rank_order_sum(P, n);
      std::atomic<int> exact{0};
      in_process_group(P).run([&](in_process_transport& t) {
        const auto g = gradient_of(t.rank(), n);
        const auto mine = rank_chunk(n, P, t.rank());
        const auto expected = slice(sum, mine);
        std::vector<float> a(mine.second, -1.0f), b(mine.second, -1.0f);
        compressed_reduce_scatter(cpu_executor{}, t, mpc, std::span<const float>(g),
                                  std::span<float>(a));  // all_to_all
        collectives_only<in_process_transport> plain(t);
        compressed_reduce_scatter(cpu_executor{}, plain, mpc, std::span<const float>(g),
                                  std::span<float>(b));  // gather_decode
        if (same_bits<float>(a, expected) && same_bits<float>(b, expected)) ++exact;
      });
      CHECK(exact.load() == P);
    }
  }
}

TEST_CASE(
    "compressed_reduce_scatter all_to_all with top-k: the naive top-k of every rank's chunk, summed in rank order") {
  const topk_sparsifier<float> topk(sparsity{.density = 0.05});
  constexpr std::size_t n = 3001;
  for (int P : {2, 4}) {
    CAPTURE(P);
    std::atomic<int> exact{0}, cheaper{0};
    in_process_group(P).run([&](in_process_transport& t) {
      const auto mine = rank_chunk(n, P, t.rank());
      std::vector<float> expected(mine.second, 0.0f);
      for (int r = 0; r < P; ++r) {
        const auto part = slice(gradient_of(r, n), mine);
        const auto kept = naive_topk(part, topk.k(part.size()));
        for (std::size_t i = 0; i < kept.size(); ++i) expected[i] += kept[i];
      }
      const auto g = gradient_of(t.rank(), n);
      std::vector<float> out(mine.second);
      const auto report =
          compressed_reduce_scatter(cpu_executor{}, t, topk, std::span<const float>(g), std::span<float>(out),
                                    {.key = {.step = 2}, .plan = reduce_scatter_plan::all_to_all});
      if (same_bits<float>(out, expected)) ++exact;
      if (report.sent_bytes < report.dense_bytes) ++cheaper;
    });
    CHECK(exact.load() == P);
    CHECK(cheaper.load() == P);
  }
}

TEST_CASE(
    "compressed_reduce_scatter all_to_all gives the same bits and report over all_to_all_bytes and over sendrecv_bytes") {
  const topk_sparsifier<float> topk(sparsity{.density = 0.05});
  const error_feedback ef(topk);
  const cpu_executor cpu;
  for (int P : {1, 2, 3, 5}) {
    for (std::size_t n : {std::size_t{0}, std::size_t{4}, std::size_t{3001}}) {
      CAPTURE(P);
      CAPTURE(n);
      std::atomic<int> same{0};
      in_process_group(P).run([&](in_process_transport& t) {
        const auto g = gradient_of(t.rank(), n);
        const std::size_t mine = rank_chunk(n, P, t.rank()).second;
        std::vector<float> a(mine), b(mine), c(mine), d(mine);
        point_to_point_only<in_process_transport> p2p(t);
        const reduce_scatter_options options{.key = {.step = 3}};
        const auto ra =
            compressed_reduce_scatter(cpu_executor{}, t, topk, std::span<const float>(g), std::span<float>(a), options);
        const auto rb = compressed_reduce_scatter(cpu_executor{}, p2p, topk, std::span<const float>(g),
                                                  std::span<float>(b), options);
        std::vector<error_feedback_state<float>> sa, sb;
        for (int j = 0; j < P; ++j) {
          sa.push_back(ef.make_state(cpu, rank_chunk(n, P, j).second));
          sb.push_back(ef.make_state(cpu, rank_chunk(n, P, j).second));
        }
        const auto rc = compressed_reduce_scatter(cpu_executor{}, t, ef, std::span<error_feedback_state<float>>(sa),
                                                  std::span<const float>(g), std::span<float>(c), options);
        const auto rd = compressed_reduce_scatter(cpu_executor{}, p2p, ef, std::span<error_feedback_state<float>>(sb),
                                                  std::span<const float>(g), std::span<float>(d), options);
        const bool reports = ra.sent_bytes == rb.sent_bytes && ra.dense_bytes == rb.dense_bytes &&
                             rc.sent_bytes == rd.sent_bytes && rc.dense_bytes == rd.dense_bytes;
        if (reports && same_bits<float>(a, b) && same_bits<float>(c, d)) ++same;
      });
      CHECK(same.load() == P);
    }
  }
}

TEST_CASE("compressed_reduce_scatter with error feedback keeps one state per chunk: a single-threaded replay") {
  const error_feedback ef(topk_sparsifier<float>(sparsity{.density = 0.03}));
  constexpr int P = 3;
  constexpr std::size_t n = 1200;
  constexpr std::uint64_t steps = 4;
  const cpu_executor cpu;
  // Replay: rank r's state for chunk j encodes rank r's chunk j; owner j decodes in rank order.
  std::vector<std::vector<std::vector<float>>> expected(P);  // [owner][step]
  {
    std::vector<std::vector<error_feedback_state<float>>> states(P);
    for (int r = 0; r < P; ++r)
      for (int j = 0; j < P; ++j)
        states[static_cast<std::size_t>(r)].push_back(ef.make_state(cpu, rank_chunk(n, P, j).second));
    std::vector<std::byte> message(ef.max_encoded_bytes(n)), ws(ef.workspace_bytes(cpu, n));
    for (std::uint64_t s = 0; s < steps; ++s)
      for (int j = 0; j < P; ++j) {
        std::vector<float> sum(rank_chunk(n, P, j).second, 0.0f);
        for (int r = 0; r < P; ++r) {
          const auto part = slice(gradient_of(r, n, s), rank_chunk(n, P, j));
          const std::size_t bytes =
              ef.encode(cpu, std::span<const float>(part),
                        states[static_cast<std::size_t>(r)][static_cast<std::size_t>(j)], message, ws, {.step = s});
          ef.decode_accumulate(cpu, std::span<const std::byte>(message).first(bytes), std::span<float>(sum), ws);
        }
        expected[static_cast<std::size_t>(j)].push_back(sum);
      }
  }
  std::atomic<int> exact{0};
  in_process_group(P).run([&](in_process_transport& t) {
    std::vector<error_feedback_state<float>> states;
    for (int j = 0; j < P; ++j) states.push_back(ef.make_state(cpu, rank_chunk(n, P, j).second));
    bool same = true;
    for (std::uint64_t s = 0; s < steps; ++s) {
      const auto g = gradient_of(t.rank(), n, s);
      std::vector<float> out(rank_chunk(n, P, t.rank()).second);
      compressed_reduce_scatter(cpu_executor{}, t, ef, std::span(states), std::span<const float>(g),
                                std::span<float>(out), {.key = {.step = s}});
      same = same && same_bits<float>(out, expected[static_cast<std::size_t>(t.rank())][s]);
    }
    if (same) ++exact;
  });
  CHECK(exact.load() == P);
}

TEST_CASE("compressed_reduce_scatter failures: the same named error on every rank, outputs and states untouched") {
  constexpr std::size_t n = 900;
  const topk_sparsifier<float> topk(sparsity{.density = 0.05});
  const error_feedback ef(topk);
  constexpr int P = 3;
  const auto everywhere = [](errc code, auto body) { expect_everywhere(P, code, body); };
  // A NaN on one rank: nothing encoded anywhere, the states untouched.
  everywhere(errc::non_finite_input, [&](in_process_transport& t) {
    const cpu_executor cpu;
    std::vector<error_feedback_state<float>> states;
    for (int j = 0; j < P; ++j) states.push_back(ef.make_state(cpu, rank_chunk(n, P, j).second));
    auto g = gradient_of(t.rank(), n);
    if (t.rank() == 1) g[5] = std::numeric_limits<float>::quiet_NaN();
    std::vector<float> out(rank_chunk(n, P, t.rank()).second, 7.0f);
    try {
      compressed_reduce_scatter(cpu_executor{}, t, ef, std::span(states), std::span<const float>(g),
                                std::span<float>(out));
    } catch (...) {
      CHECK(std::all_of(out.begin(), out.end(), [](float v) { return v == 7.0f; }));
      for (const auto& s : states) CHECK(s.steps == 0);
      throw;
    }
  });
  // An encoding that fails on one rank after the agreement (g + residual overflows): every
  // rank's states are restored.
  everywhere(errc::non_finite_input, [&](in_process_transport& t) {
    const cpu_executor cpu;
    std::vector<error_feedback_state<float>> states;
    for (int j = 0; j < P; ++j) states.push_back(ef.make_state(cpu, rank_chunk(n, P, j).second));
    auto g = gradient_of(t.rank(), n);
    if (t.rank() == 2) {
      g[0] = 3e38f;
      states[0].residual[0] = 3e38f;
    }
    const auto saved = states;
    std::vector<float> out(rank_chunk(n, P, t.rank()).second);
    try {
      compressed_reduce_scatter(cpu_executor{}, t, ef, std::span(states), std::span<const float>(g),
                                std::span<float>(out));
    } catch (...) {
      for (std::size_t j = 0; j < states.size(); ++j) {
        CHECK(states[j].steps == saved[j].steps);
        CHECK(same_bits<float>(states[j].residual, saved[j].residual));
      }
      throw;
    }
  });
  // Disagreement on n, and a reduce-scatter meeting an all-reduce.
  everywhere(errc::size_mismatch, [&](in_process_transport& t) {
    const auto g = gradient_of(t.rank(), t.rank() == 0 ? n + 3 : n);
    std::vector<float> out(rank_chunk(g.size(), P, t.rank()).second);
    compressed_reduce_scatter(cpu_executor{}, t, topk, std::span<const float>(g), std::span<float>(out));
  });
  everywhere(errc::parameter_mismatch, [&](in_process_transport& t) {
    auto g = gradient_of(t.rank(), n);
    std::vector<float> out(rank_chunk(n, P, t.rank()).second);
    if (t.rank() == 0) compressed_all_reduce(cpu_executor{}, t, topk, std::span<float>(g));
    else
      compressed_reduce_scatter(cpu_executor{}, t, topk, std::span<const float>(g), std::span<float>(out));
  });
  // Invalid arguments on one rank only (an output of another size, too few states): the agreement
  // carries that rank's verdict, so every rank throws and none waits in the exchange. Then a plan
  // value that is no reduce_scatter_plan.
  everywhere(errc::invalid_argument, [&](in_process_transport& t) {
    const auto g = gradient_of(t.rank(), n);
    std::vector<float> out(rank_chunk(n, P, t.rank()).second + (t.rank() == 1 ? 1 : 0), 7.0f);
    try {
      compressed_reduce_scatter(cpu_executor{}, t, topk, std::span<const float>(g), std::span<float>(out));
    } catch (...) {
      CHECK(std::all_of(out.begin(), out.end(), [](float v) { return v == 7.0f; }));
      throw;
    }
  });
  everywhere(errc::invalid_argument, [&](in_process_transport& t) {
    const cpu_executor cpu;
    std::vector<error_feedback_state<float>> states;
    for (int j = 0; j < (t.rank() == 2 ? P - 1 : P); ++j)
      states.push_back(ef.make_state(cpu, rank_chunk(n, P, j).second));
    const auto g = gradient_of(t.rank(), n);
    std::vector<float> out(rank_chunk(n, P, t.rank()).second);
    compressed_reduce_scatter(cpu_executor{}, t, ef, std::span(states), std::span<const float>(g),
                              std::span<float>(out));
  });
  everywhere(errc::invalid_argument, [&](in_process_transport& t) {
    const auto g = gradient_of(t.rank(), n);
    std::vector<float> out(rank_chunk(n, P, t.rank()).second);
    compressed_reduce_scatter(cpu_executor{}, t, topk, std::span<const float>(g), std::span<float>(out),
                              {.plan = static_cast<reduce_scatter_plan>(7)});
  });
  // The ring plan without point-to-point messages: every rank alike.
  everywhere(errc::invalid_argument, [&](in_process_transport& t) {
    collectives_only<in_process_transport> plain(t);
    const auto g = gradient_of(t.rank(), n);
    std::vector<float> out(rank_chunk(n, P, t.rank()).second);
    compressed_reduce_scatter(cpu_executor{}, plain, topk, std::span<const float>(g), std::span<float>(out),
                              {.plan = reduce_scatter_plan::ring});
  });
}

}  // namespace gradcomp::test
