// compressed_all_reduce over the in-process transport. Oracles written here: the uncompressed sum
// in rank order (which the lossless codec must reproduce bit for bit), a naive top-k (sort by
// magnitude, keep k) summed in rank order, a single-threaded replay of P error-feedback states,
// the exact sum in double against the shared-scale quantizer's error bound; plus the agreement
// round: every mismatch and every non-finite gradient is reported by every rank with the same
// named error, data and state untouched.
#include <gradcomp/collective/compressed_all_reduce.hpp>
#include <gradcomp/core/reference_executor.hpp>
#include <gradcomp/feedback/error_feedback.hpp>
#include <gradcomp/lossless/mpc.hpp>
#include <gradcomp/quantize/shared_scale.hpp>
#include <gradcomp/quantize/uniform.hpp>
#include <gradcomp/sketch/count_sketch.hpp>
#include <gradcomp/sketch/lossless_homomorphic.hpp>
#include <gradcomp/sparsify/randomk.hpp>
#include <gradcomp/sparsify/threshold.hpp>
#include <gradcomp/sparsify/topk.hpp>
#include <gradcomp/transport/in_process.hpp>

#include <doctest/doctest.h>

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
#include <type_traits>
#include <string>
#include <vector>

#include "collective_checks.hpp"
#include "support/errors.hpp"

namespace gradcomp::test {
namespace {

// Runs `body(t)` on P ranks and returns each rank's result vector.
template <class Body>
std::vector<std::vector<float>> on_ranks(int P, Body body) {
  std::vector<std::vector<float>> results(static_cast<std::size_t>(P));
  in_process_group(P).run([&](in_process_transport& t) { results[static_cast<std::size_t>(t.rank())] = body(t); });
  return results;
}

}  // namespace

TEST_CASE("compressed_all_reduce with a lossless codec gives the rank-order sum bit for bit on every rank") {
  const mpc_codec<float> mpc;
  for (int P : {1, 2, 3, 4, 8}) {
    for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{1000}, std::size_t{4097}}) {
      CAPTURE(P);
      CAPTURE(n);
      std::vector<float> expected(n, 0.0f);
      for (int r = 0; r < P; ++r) {
        const auto g = gradient_of(r, n);
        for (std::size_t i = 0; i < n; ++i) expected[i] += g[i];
      }
      const auto results = on_ranks(P, [&](in_process_transport& t) {
        auto data = gradient_of(t.rank(), n);
        const auto report = compressed_all_reduce(cpu_executor{}, t, mpc, std::span<float>(data));
        CHECK(report.error_bound == 0.0);
        CHECK(report.dense_bytes ==
              2 * static_cast<std::uint64_t>(P - 1) * n * sizeof(float) / static_cast<std::uint64_t>(P));
        return data;
      });
      for (const auto& r : results) CHECK(same_bits<float>(r, expected));
    }
  }
}

TEST_CASE("compressed_all_reduce with top-k equals the naive top-k of every rank summed in rank order") {
  const topk_sparsifier<float> topk(sparsity{.density = 0.05});
  constexpr std::size_t n = 2000;
  for (int P : {2, 4, 5}) {
    CAPTURE(P);
    std::vector<float> expected(n, 0.0f);
    for (int r = 0; r < P; ++r) {
      const auto kept = naive_topk(gradient_of(r, n), topk.k(n));
      for (std::size_t i = 0; i < n; ++i) expected[i] += kept[i];
    }
    const auto results = on_ranks(P, [&](in_process_transport& t) {
      auto data = gradient_of(t.rank(), n);
      const auto report = compressed_all_reduce(cpu_executor{}, t, topk, std::span<float>(data), {.key = {.step = 3}});
      CHECK(report.sent_bytes > 0);
      CHECK(report.sent_bytes < report.dense_bytes);
      return data;
    });
    for (const auto& r : results) CHECK(same_bits<float>(r, expected));
  }
}

TEST_CASE("compressed_all_reduce with error feedback: a replay of P independent states, and nothing is lost") {
  const error_feedback ef(topk_sparsifier<float>(sparsity{.density = 0.02}));
  constexpr int P = 4;
  constexpr std::size_t n = 1500;
  constexpr std::uint64_t steps = 6;
  // The replay: P states on one thread, each rank's message decoded and summed in rank order.
  std::vector<std::vector<float>> expected_sums;
  {
    const cpu_executor cpu;
    std::vector<error_feedback_state<float>> states;
    for (int r = 0; r < P; ++r) states.push_back(ef.make_state(cpu, n));
    std::vector<std::byte> message(ef.max_encoded_bytes(n)), ws(ef.workspace_bytes(cpu, n));
    for (std::uint64_t s = 0; s < steps; ++s) {
      std::vector<float> sum(n, 0.0f);
      for (int r = 0; r < P; ++r) {
        const auto g = gradient_of(r, n, s);
        const std::size_t bytes =
            ef.encode(cpu, std::span<const float>(g), states[static_cast<std::size_t>(r)], message, ws, {.step = s});
        ef.decode_accumulate(cpu, std::span<const std::byte>(message).first(bytes), std::span<float>(sum), ws);
      }
      expected_sums.push_back(sum);
    }
  }
  std::vector<std::vector<std::vector<float>>> sums(P);
  std::vector<std::vector<float>> residuals(P);
  in_process_group(P).run([&](in_process_transport& t) {
    const cpu_executor cpu;
    auto state = ef.make_state(cpu, n);
    for (std::uint64_t s = 0; s < steps; ++s) {
      auto data = gradient_of(t.rank(), n, s);
      compressed_all_reduce(cpu_executor{}, t, ef, state, std::span<float>(data), {.key = {.step = s}});
      sums[static_cast<std::size_t>(t.rank())].push_back(data);
    }
    residuals[static_cast<std::size_t>(t.rank())] = state.residual;
  });
  // Nothing is lost: what every step delivered plus what every rank still holds is every gradient
  // of every rank (in double, up to the float roundings of the sums).
  std::vector<double> given(n, 0.0), magnitude(n, 0.0);
  for (int r = 0; r < P; ++r)
    for (std::uint64_t s = 0; s < steps; ++s) {
      const auto g = gradient_of(r, n, s);
      for (std::size_t i = 0; i < n; ++i) {
        given[i] += g[i];
        magnitude[i] += std::fabs(static_cast<double>(g[i]));
      }
    }
  std::size_t lost = 0;
  for (std::size_t i = 0; i < n; ++i) {
    double delivered = 0.0;
    for (std::uint64_t s = 0; s < steps; ++s) delivered += sums[0][s][i];
    for (int r = 0; r < P; ++r) delivered += residuals[static_cast<std::size_t>(r)][i];
    if (!(std::fabs(delivered - given[i]) <= 1e-5 * magnitude[i])) ++lost;
  }
  CHECK(lost == 0);
  for (int r = 0; r < P; ++r)
    for (std::uint64_t s = 0; s < steps; ++s)
      CHECK(same_bits<float>(sums[static_cast<std::size_t>(r)][s], expected_sums[s]));
}

TEST_CASE(
    "compressed_all_reduce sums shared-scale encodings: within P half-steps of the exact sum, the same bits everywhere") {
  const shared_scale_quantizer<float> q(shared_scale_params{.bits = 8, .block = 64, .headroom_bits = 3});
  constexpr std::size_t n = 1000;
  for (int P : {1, 2, 4, 8}) {
    CAPTURE(P);
    const auto results = on_ranks(P, [&](in_process_transport& t) {
      auto data = gradient_of(t.rank(), n);
      const auto report = compressed_all_reduce(cpu_executor{}, t, q, std::span<float>(data));
      CHECK(report.sent_bytes < report.dense_bytes + (P == 1 ? 1u : 0u));
      return data;
    });
    // The exact sum in double, and the agreed step of each block: M/127 for 8 bits.
    std::vector<double> exact(n, 0.0), block_max((n + 63) / 64, 0.0);
    for (int r = 0; r < P; ++r) {
      const auto g = gradient_of(r, n);
      for (std::size_t i = 0; i < n; ++i) {
        exact[i] += g[i];
        block_max[i / 64] = std::max(block_max[i / 64], std::fabs(static_cast<double>(g[i])));
      }
    }
    for (const auto& r : results) CHECK(same_bits<float>(r, results[0]));
    std::size_t outside = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const double half_step = block_max[i / 64] / 127.0 / 2.0;
      const double error = std::fabs(static_cast<double>(results[0][i]) - exact[i]);
      if (!(error <= P * half_step * (1.0 + 1e-5) + 1e-6 * std::fabs(exact[i]))) ++outside;
    }
    CHECK(outside == 0);
  }
  // Nine ranks overflow three headroom bits: every rank reports it.
  expect_everywhere(9, errc::malformed_payload, [&](in_process_transport& t) {
    auto data = gradient_of(t.rank(), n);
    compressed_all_reduce(cpu_executor{}, t, q, std::span<float>(data));
  });
}

TEST_CASE("compressed_all_reduce sums count sketches: the decode of the sketches accumulated on one thread") {
  const count_sketch<float> cs(
      count_sketch_params{.rows = 3, .columns = 512, .seed = 5, .heavy_hitters = {.density = 0.02}});
  constexpr int P = 4;
  constexpr std::size_t n = 3000;
  std::vector<float> expected(n);
  {
    const cpu_executor cpu;
    std::vector<std::byte> acc(cs.max_encoded_bytes(n)), other(cs.max_encoded_bytes(n)), ws(cs.workspace_bytes(cpu, n));
    for (int r = 0; r < P; ++r) {
      const auto g = gradient_of(r, n);
      cs.encode(cpu, std::span<const float>(g), r == 0 ? std::span<std::byte>(acc) : std::span<std::byte>(other), ws,
                {});
      if (r > 0) cs.accumulate_encoded(cpu, acc, other);
    }
    cs.decode(cpu, acc, std::span<float>(expected), ws);
  }
  const auto results = on_ranks(P, [&](in_process_transport& t) {
    auto data = gradient_of(t.rank(), n);
    compressed_all_reduce(cpu_executor{}, t, cs, std::span<float>(data));
    return data;
  });
  // The SUM collective adds the cells in rank order, as accumulate_encoded did.
  for (const auto& r : results) CHECK(same_bits<float>(r, expected));
}

TEST_CASE(
    "compressed_all_reduce with lossless homomorphic compression gives the exact sum of sparse gradients everywhere") {
  const lossless_homomorphic<float> lhc({.block = 128});
  for (int P : {1, 2, 3, 4, 8}) {
    for (const std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{1000}, std::size_t{5000}}) {
      for (const double density :
           {0.01, 0.1, 0.6}) {  // 0.6: with P ≥ 2 the plan is dense, the values travel as they are
        CAPTURE(P);
        CAPTURE(n);
        CAPTURE(density);
        std::vector<float> expected(n, 0.0f);
        for (int r = 0; r < P; ++r) {
          const auto g = dyadic_sparse_gradient(r, n, density);
          for (std::size_t i = 0; i < n; ++i) expected[i] += g[i];
        }
        std::vector<std::uint64_t> sent(static_cast<std::size_t>(P));
        const auto results = on_ranks(P, [&](in_process_transport& t) {
          auto data = dyadic_sparse_gradient(t.rank(), n, density);
          const auto report = compressed_all_reduce(cpu_executor{}, t, lhc, std::span<float>(data));
          sent[static_cast<std::size_t>(t.rank())] = report.sent_bytes;
          CHECK(report.dense_bytes ==
                2 * static_cast<std::uint64_t>(P - 1) * n * sizeof(float) / static_cast<std::uint64_t>(P));
          // Sparse enough to sketch: both stages together send less than the gradient, so the sum
          // came from peeling, not from a stall's uncompressed resend.
          if (P > 1 && n >= 1000 && density <= 0.1) CHECK(report.sent_bytes < report.dense_bytes);
          return data;
        });
        for (const auto& r : results) CHECK(same_bits<float>(r, expected));
        // Over a transport without bitwise OR the index travels as summed 4-bit fields: same sums.
        const auto summed_index = on_ranks(P, [&](in_process_transport& t) {
          collectives_only<in_process_transport> no_or(t);
          auto data = dyadic_sparse_gradient(t.rank(), n, density);
          compressed_all_reduce(cpu_executor{}, no_or, lhc, std::span<float>(data));
          return data;
        });
        for (const auto& r : summed_index) CHECK(same_bits<float>(r, expected));
        // At 1% per rank the index and the sketch are far smaller than the gradient.
        if (n == 5000 && density == 0.01 && P > 1)
          CHECK(sent[0] < 2 * static_cast<std::uint64_t>(P - 1) * n * sizeof(float) / 5);
      }
    }
  }
}

TEST_CASE(
    "compressed_all_reduce with lossless homomorphic compression: a stall sums again uncompressed on every rank") {
  // One cell per non-zero: peeling stalls (it needs about 1.23), on every rank alike.
  const lossless_homomorphic<float> tight({.block = 256, .cells_per_nonzero = 1.0});
  constexpr int P = 3;
  constexpr std::size_t n = 40000;
  std::vector<std::vector<float>> gradients;
  std::vector<float> expected(n, 0.0f);
  for (int r = 0; r < P; ++r) {
    auto g = gradient_of(r, n);  // any floats: the resent sum is the rank-order sum
    for (std::size_t i = 0; i < n; ++i)
      if ((i * 7 + static_cast<std::size_t>(r)) % 5 != 0) g[i] = 0.0f;
    for (std::size_t i = 0; i < n; ++i) expected[i] += g[i];
    gradients.push_back(std::move(g));
  }
  std::vector<std::uint64_t> sent(P), dense(P);
  const auto results = on_ranks(P, [&](in_process_transport& t) {
    auto data = gradients[static_cast<std::size_t>(t.rank())];
    const auto report = compressed_all_reduce(cpu_executor{}, t, tight, std::span<float>(data));
    sent[static_cast<std::size_t>(t.rank())] = report.sent_bytes;
    dense[static_cast<std::size_t>(t.rank())] = report.dense_bytes;
    return data;
  });
  for (const auto& r : results) CHECK(same_bits<float>(r, expected));
  for (int r = 0; r < P; ++r) CHECK(sent[static_cast<std::size_t>(r)] > dense[static_cast<std::size_t>(r)]);  // resent
}

TEST_CASE("compressed_all_reduce with lossless homomorphic compression: disagreements and NaN stop every rank alike") {
  const lossless_homomorphic<float> lhc({.block = 128});
  constexpr std::size_t n = 3000;
  for (int P : {2, 3}) {
    CAPTURE(P);
    // Runs `call(t, data)` on every rank; every rank must throw `code` with its data untouched.
    const auto everywhere = [&](errc code, auto call) {
      std::atomic<int> matching{0};
      in_process_group(P).run([&](in_process_transport& t) {
        auto data = dyadic_sparse_gradient(t.rank(), n, 0.05);
        if (t.rank() == 0 && code == errc::non_finite_input) data[17] = std::numeric_limits<float>::infinity();
        const auto before = data;
        if (thrown_by([&] { call(t, std::span<float>(data)); }) == named(code) && same_bits<float>(data, before))
          ++matching;
      });
      CHECK(matching.load() == P);
    };
    everywhere(errc::parameter_mismatch, [&](in_process_transport& t, std::span<float> data) {
      const lossless_homomorphic<float> other({.block = 128, .seed = 1});
      compressed_all_reduce(cpu_executor{}, t, t.rank() == P - 1 ? other : lhc, data);
    });
    everywhere(errc::invalid_argument, [&](in_process_transport& t, std::span<float> data) {
      compressed_all_reduce(cpu_executor{}, t, lhc, data, {.plan = all_reduce_plan::gather_decode});
    });
    everywhere(errc::parameter_mismatch, [&](in_process_transport& t, std::span<float> data) {  // plans differ
      compressed_all_reduce(cpu_executor{}, t, lhc, data,
                            {.plan = t.rank() == 0 ? all_reduce_plan::gather_decode : all_reduce_plan::two_stage});
    });
    everywhere(errc::non_finite_input, [&](in_process_transport& t, std::span<float> data) {
      compressed_all_reduce(cpu_executor{}, t, lhc, data);
    });
  }
  // A stall policy of median estimates still gives the exact sum: the all-reduce resends instead.
  const lossless_homomorphic<float> estimating(
      {.block = 256, .cells_per_nonzero = 1.0, .on_stall = lhc_stall_policy::median_estimate});
  std::vector<float> expected(20000, 0.0f);
  for (int r = 0; r < 3; ++r) {
    const auto g = dyadic_sparse_gradient(r, expected.size(), 0.4);
    for (std::size_t i = 0; i < expected.size(); ++i) expected[i] += g[i];
  }
  const auto results = on_ranks(3, [&](in_process_transport& t) {
    auto data = dyadic_sparse_gradient(t.rank(), expected.size(), 0.4);
    compressed_all_reduce(cpu_executor{}, t, estimating, std::span<float>(data));
    return data;
  });
  for (const auto& r : results) CHECK(same_bits<float>(r, expected));
  // 16 ranks are more than 4-bit fields can sum.
  expect_everywhere(16, errc::invalid_argument, [&](in_process_transport& t) {
    auto data = dyadic_sparse_gradient(t.rank(), 500, 0.05);
    const lossless_homomorphic<float> sum4({.block = 128, .index = lhc_index_coding::sum4});
    compressed_all_reduce(cpu_executor{}, t, sum4, std::span<float>(data));
  });
}

TEST_CASE("compressed_all_reduce: every disagreement is the same named error on every rank, data untouched") {
  for (int P : {2, 3, 4}) {
    CAPTURE(P);
    std::vector<std::vector<scenario_outcome>> outcomes(static_cast<std::size_t>(P));
    in_process_group(P).run(
        [&](in_process_transport& t) { outcomes[static_cast<std::size_t>(t.rank())] = run_agreement_scenarios(t); });
    REQUIRE(outcomes[0].size() >= 10);
    for (const auto& rank : outcomes) {
      REQUIRE(rank.size() == outcomes[0].size());
      for (const scenario_outcome& o : rank) {
        INFO(o.name, ": expected ", o.expected, ", got ", o.thrown, o.untouched ? "" : ", data changed");
        CHECK(o.ok());
      }
    }
  }
}

TEST_CASE(
    "compressed_all_reduce: a NaN or Inf on one rank makes every rank skip the step, error-feedback state untouched") {
  constexpr std::size_t n = 600;
  const error_feedback ef(topk_sparsifier<float>(sparsity{.density = 0.05}));
  for (int P : {1, 2, 4}) {
    for (const float bad : {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::infinity()}) {
      CAPTURE(P);
      std::atomic<int> matching{0}, unchanged{0}, recovered{0};
      in_process_group(P).run([&](in_process_transport& t) {
        const cpu_executor cpu;
        auto state = ef.make_state(cpu, n);
        auto warm = gradient_of(t.rank(), n, 1);
        compressed_all_reduce(cpu_executor{}, t, ef, state, std::span<float>(warm), {.key = {.step = 1}});
        const auto saved = state.residual;
        auto data = gradient_of(t.rank(), n, 2);
        if (t.rank() == P - 1) data[n / 3] = bad;
        const auto before = data;
        if (thrown_by([&] {
              compressed_all_reduce(cpu_executor{}, t, ef, state, std::span<float>(data), {.key = {.step = 2}});
            }) == named(errc::non_finite_input))
          ++matching;
        if (same_bits<float>(data, before) && same_bits<float>(state.residual, saved) && state.steps == 1) ++unchanged;
        // The next step goes on normally on every rank.
        auto next = gradient_of(t.rank(), n, 3);
        compressed_all_reduce(cpu_executor{}, t, ef, state, std::span<float>(next), {.key = {.step = 3}});
        if (state.steps == 2) ++recovered;
      });
      CHECK(matching.load() == P);
      CHECK(unchanged.load() == P);
      CHECK(recovered.load() == P);
    }
  }
}

TEST_CASE(
    "compressed_all_reduce: an encoding that fails after the agreement restores every rank's error-feedback state") {
  constexpr std::size_t n = 400;
  constexpr int P = 3;
  const error_feedback ef(topk_sparsifier<float>(sparsity{.density = 0.05}));
  std::atomic<int> matching{0}, restored{0};
  in_process_group(P).run([&](in_process_transport& t) {
    const cpu_executor cpu;
    auto state = ef.make_state(cpu, n);
    auto warm = gradient_of(t.rank(), n, 1);
    compressed_all_reduce(cpu_executor{}, t, ef, state, std::span<float>(warm), {.key = {.step = 1}});
    auto data = gradient_of(t.rank(), n, 2);
    if (t.rank() == 1) {
      // Finite gradient and residual whose sum overflows: only the encoding finds out.
      state.residual[7] = 3e38f;
      data[7] = 3e38f;
    }
    const auto saved = state.residual;
    const auto steps = state.steps;
    if (thrown_by([&] {
          compressed_all_reduce(cpu_executor{}, t, ef, state, std::span<float>(data), {.key = {.step = 2}});
        }) == named(errc::non_finite_input))
      ++matching;
    if (same_bits<float>(state.residual, saved) && state.steps == steps) ++restored;
  });
  CHECK(matching.load() == P);
  CHECK(restored.load() == P);
}

}  // namespace gradcomp::test

namespace gradcomp::test {
namespace {

/// The oracle of a 16-bit gather_decode all-reduce: each rank's message made and decoded into
/// float32 by the reference executor, summed in rank order in float32, divided by P with
/// `average`, rounded once to H.
template <class Codec>
std::vector<typename Codec::value_type> half_gather_decode_oracle(const Codec& codec, int ranks, std::size_t n,
                                                                  bool average) {
  using H = typename Codec::value_type;
  std::vector<float> sum(n, 0.0f);
  for (int r = 0; r < ranks; ++r) {
    const std::vector<H> x = half_gradient_of<H>(r, n);
    std::vector<std::byte> message(codec.max_encoded_bytes(n));
    std::vector<std::byte> ws(codec.workspace_bytes(reference_executor{}, n));
    message.resize(codec.encode(reference_executor{}, std::span<const H>(x), message, ws, {}));
    std::vector<float> decoded(n);
    codec.decode(reference_executor{}, message, std::span<float>(decoded), ws);
    for (std::size_t i = 0; i < n; ++i) sum[i] += decoded[i];
  }
  std::vector<H> out(n);
  for (std::size_t i = 0; i < n; ++i) out[i] = narrow<H>(average ? sum[i] / static_cast<float>(ranks) : sum[i]);
  return out;
}

}  // namespace

TEST_CASE_TEMPLATE("compressed_all_reduce of bf16 and fp16 data sums the ranks' decodings in float32 and rounds once",
                   H, bf16, fp16) {
  constexpr std::size_t n = 1500;
  const uniform_quantizer<H> q({.bits = 8, .block = 64});
  const topk_sparsifier<H> topk(sparsity{.density = 0.05});
  const randomk_sparsifier<H> randomk({.amount = {.density = 0.2}, .seed = 4});
  const auto check_codec = [&](const auto& codec, int P, bool average) {
    const auto results = on_half_ranks<H>(P, n, [&](in_process_transport& t, std::vector<H>& data) {
      const auto report = compressed_all_reduce(cpu_executor{}, t, codec, std::span<H>(data), {.average = average});
      CHECK(report.dense_bytes == ring_all_reduce_dense_bytes(n * 2, static_cast<std::uint64_t>(P)));
    });
    const auto expected = patterns_of(half_gather_decode_oracle(codec, P, n, average));
    for (const auto& r : results) CHECK(patterns_of(r) == expected);
  };
  for (const int P : {2, 3, 5})
    for (const bool average : {false, true}) {
      CAPTURE(P);
      CAPTURE(average);
      check_codec(q, P, average);
      check_codec(topk, P, average);  // automatic: gather_decode
      check_codec(randomk, P, average);  // summable, but 16-bit: gather_decode
      // The dense plan: the float32 rank-order sum of the widened values, rounded once; float32 on
      // the wire, twice the 16-bit dense bytes.
      const auto dense = on_half_ranks<H>(P, n, [&](in_process_transport& t, std::vector<H>& data) {
        const auto report = compressed_all_reduce(cpu_executor{}, t, q, std::span<H>(data),
                                                  {.plan = all_reduce_plan::dense, .average = average});
        CHECK(report.sent_bytes == 2 * report.dense_bytes);
      });
      std::vector<float> sum(n, 0.0f);
      for (int r = 0; r < P; ++r) {
        const std::vector<H> x = half_gradient_of<H>(r, n);
        for (std::size_t i = 0; i < n; ++i) sum[i] += widen(x[i]);
      }
      std::vector<H> expected(n);
      for (std::size_t i = 0; i < n; ++i) expected[i] = narrow<H>(average ? sum[i] / static_cast<float>(P) : sum[i]);
      for (const auto& r : dense) CHECK(patterns_of(r) == patterns_of(expected));
    }
  // Error feedback from a fresh state: its first messages are the inner codec's, so the sum is too.
  const auto ef = error_feedback(topk_sparsifier<H>(sparsity{.density = 0.05}));
  const auto with_feedback = on_half_ranks<H>(3, n, [&](in_process_transport& t, std::vector<H>& data) {
    auto state = ef.make_state(cpu_executor{}, n);
    compressed_all_reduce(cpu_executor{}, t, ef, state, std::span<H>(data));
  });
  for (const auto& r : with_feedback)
    CHECK(patterns_of(r) == patterns_of(half_gather_decode_oracle(topk, 3, n, false)));
}

}  // namespace gradcomp::test
