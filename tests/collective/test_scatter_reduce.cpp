// The scatter_reduce plan of compressed_all_reduce, its cost model, `automatic` and the dense
// warm-up of the all-reduce and the reduce-scatter, over the in-process transport. Oracles written here: the chunks cut independently of
// ring_chunk_of; every rank's chunk messages encoded with the codec's public encode, decoded and
// summed in rank order, the sum re-encoded with server error feedback by its definition
// (a = s + ε, message C(a), ε ← a − D(C(a))); a single-threaded replay of the stateful wrappers'
// chunk and server states; the cost model's byte counts worked out by hand.
#include <gradcomp/collective/all_reduce_cost.hpp>
#include <gradcomp/collective/compressed_all_reduce.hpp>
#include <gradcomp/collective/compressed_reduce_scatter.hpp>
#include <gradcomp/control/density_schedule.hpp>
#include <gradcomp/feedback/error_feedback.hpp>
#include <gradcomp/feedback/loco.hpp>
#include <gradcomp/lossless/mpc.hpp>
#include <gradcomp/quantize/shared_scale.hpp>
#include <gradcomp/quantize/uniform.hpp>
#include <gradcomp/sparsify/topk.hpp>
#include <gradcomp/transport/in_process.hpp>

#include <doctest/doctest.h>

#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "collective_checks.hpp"
#include "support/errors.hpp"

namespace gradcomp::test {
namespace {

std::span<const float> part(const std::vector<float>& v, std::pair<std::size_t, std::size_t> c) {
  return std::span<const float>(v).subspan(c.first, c.second);
}

const uniform_quantizer<float> four_bit(uniform_params{.bits = 4});

// Chunk j of the sum over ranks of gradient_of(r, n, step), each rank's chunk encoded with
// `codec` and decoded onto zeros in rank order: what the owner of chunk j holds after the all-to-all.
template <class C>
std::vector<float> decoded_chunk_sum(const C& codec, int P, std::size_t n, int j, std::uint64_t step) {
  const cpu_executor cpu;
  const auto c = rank_chunk(n, P, j);
  std::vector<std::byte> message(codec.max_encoded_bytes(c.second)), ws(codec.workspace_bytes(cpu, c.second));
  std::vector<float> sum(c.second, 0.0f);
  for (int r = 0; r < P; ++r) {
    const auto g = gradient_of(r, n, step);
    const std::size_t bytes = codec.encode(cpu, part(g, c), message, ws, {.step = step});
    codec.decode_accumulate(cpu, std::span<const std::byte>(message).first(bytes), std::span<float>(sum), ws);
  }
  return sum;
}

// The result of `steps` all-reduces of every rank's gradient_of(r, n, step) by scatter_reduce with
// server error feedback around the stateless `codec`, by the definition; `residuals` receives the
// server residuals (chunk r's on rank r) after the last step.
template <class C>
std::vector<std::vector<float>> server_feedback_oracle(const C& codec, int P, std::size_t n, std::uint64_t steps,
                                                       std::vector<std::vector<float>>& residuals) {
  const cpu_executor cpu;
  residuals.assign(static_cast<std::size_t>(P), {});
  for (int j = 0; j < P; ++j) residuals[static_cast<std::size_t>(j)].assign(rank_chunk(n, P, j).second, 0.0f);
  std::vector<std::byte> message(codec.max_encoded_bytes(n)), ws(codec.workspace_bytes(cpu, n));
  std::vector<std::vector<float>> results;
  for (std::uint64_t s = 0; s < steps; ++s) {
    const message_key key{.step = s};
    std::vector<float> result(n);
    for (int j = 0; j < P; ++j) {
      const auto c = rank_chunk(n, P, j);
      const std::vector<float> sum = decoded_chunk_sum(codec, P, n, j, s);
      auto& residual = residuals[static_cast<std::size_t>(j)];
      std::vector<float> compensated(c.second), decoded(c.second);
      for (std::size_t i = 0; i < c.second; ++i) compensated[i] = sum[i] + residual[i];
      const std::size_t bytes = codec.encode(cpu, std::span<const float>(compensated), message, ws, key);
      codec.decode(cpu, std::span<const std::byte>(message).first(bytes), std::span<float>(decoded), ws);
      for (std::size_t i = 0; i < c.second; ++i) {
        residual[i] = compensated[i] - decoded[i];
        result[c.first + i] = decoded[i];
      }
    }
    results.push_back(result);
  }
  return results;
}

}  // namespace

TEST_CASE("all-reduce cost model: bytes and rounds worked out by hand") {
  // n = 10 values of one byte each (B(m) = m) over P = 4: chunks 3, 3, 2, 2; frames F(m) = 16 + m.
  const auto one_byte = [](std::uint64_t m) { return m; };
  CHECK(gather_decode_cost(10, 4, one_byte).sent_bytes == 3 * 26);
  CHECK(gather_decode_cost(10, 4, one_byte).rounds == 3);
  // Rank 0 sends F(3) + F(2) + F(2) in the all-to-all and 3 · F(3) in the all-gather.
  CHECK(scatter_reduce_cost(10, 4, 0, one_byte).sent_bytes == 19 + 18 + 18 + 3 * 19);
  // Rank 3 sends F(3) + F(3) + F(2), then 3 · F(2).
  CHECK(scatter_reduce_cost(10, 4, 3, one_byte).sent_bytes == 19 + 19 + 18 + 3 * 18);
  CHECK(scatter_reduce_cost(10, 4, 3, one_byte).rounds == 6);
  CHECK(ring_cost(10, 4, 1, one_byte).sent_bytes == scatter_reduce_cost(10, 4, 1, one_byte).sent_bytes);
  CHECK(dense_ring_cost(40, 4).sent_bytes == 60);  // 2 · 3 · 40 / 4
  CHECK(dense_ring_cost(40, 4).rounds == 6);
  CHECK(summed_encodings_cost(100, 5).sent_bytes == 160);  // 2 · 4 · 100 / 5
  // One rank sends nothing.
  CHECK(gather_decode_cost(10, 1, one_byte).sent_bytes == 0);
  CHECK(scatter_reduce_cost(10, 1, 0, one_byte).sent_bytes == 0);
  CHECK(dense_ring_cost(40, 1).rounds == 0);
  // α–β: 6 rounds of 1 ms and 60 bytes at 1000 B/s.
  CHECK(dense_ring_cost(40, 4).seconds({.latency_seconds = 1e-3, .bytes_per_second = 1000.0}) ==
        doctest::Approx(0.006 + 0.06));
  // Uniform 4 bits: B(m) = envelope + ⌈m/2⌉ + scale; the scatter_reduce bytes tend to twice one
  // message as P grows, gather_decode's grow as P − 1.
  const auto four = [](std::uint64_t m) { return four_bit.max_encoded_bytes(m); };
  const std::uint64_t one_message = four(1 << 20);
  CHECK(scatter_reduce_cost(1 << 20, 16, 0, four).sent_bytes < 2 * one_message);
  CHECK(scatter_reduce_cost(1 << 20, 16, 0, four).sent_bytes > one_message * 15 / 8);
  CHECK(gather_decode_cost(1 << 20, 16, four).sent_bytes == 15 * (16 + one_message));
}

TEST_CASE("automatic picks scatter_reduce exactly where the cost model says it sends less") {
  const topk_sparsifier<float> topk(sparsity{.density = 0.01});
  for (std::uint64_t n : {std::uint64_t{0}, std::uint64_t{7}, std::uint64_t{1000}, std::uint64_t{1} << 20}) {
    for (int P = 1; P <= 16; ++P) {
      CAPTURE(n);
      CAPTURE(P);
      const auto check = [&](const auto& codec) {
        const auto bytes = [&](std::uint64_t m) { return modelled_encoded_bytes(codec, m); };
        const bool cheaper =
            scatter_reduce_cost(n, P, 0, bytes).sent_bytes < gather_decode_cost(n, P, bytes).sent_bytes;
        CHECK(automatic_plan(codec, n, P, true) ==
              (cheaper ? all_reduce_plan::scatter_reduce : all_reduce_plan::gather_decode));
        CHECK(automatic_plan(codec, n, P, false) == all_reduce_plan::gather_decode);
      };
      check(four_bit);
      check(topk);
    }
  }
  // One or two ranks: gather_decode (two ranks: scatter_reduce would add two frame headers).
  CHECK(automatic_plan(four_bit, 1000, 1, true) == all_reduce_plan::gather_decode);
  CHECK(automatic_plan(four_bit, 1000, 2, true) == all_reduce_plan::gather_decode);
  for (int P = 3; P <= 16; ++P) CHECK(automatic_plan(four_bit, 1000, P, true) == all_reduce_plan::scatter_reduce);
  // A summable encoding keeps summing its encodings.
  CHECK(automatic_plan(shared_scale_quantizer<float>(), 1000, 8, true) == all_reduce_plan::summed_encodings);
}

TEST_CASE("scatter_reduce with a lossless codec: the rank-order sum bit for bit on every rank, any P and n") {
  const mpc_codec<float> mpc;
  for (int P : {1, 2, 3, 4, 5, 8, 16}) {
    for (std::size_t n : {std::size_t{0}, std::size_t{3}, std::size_t{1001}}) {
      CAPTURE(P);
      CAPTURE(n);
      const std::vector<float> sum = rank_order_sum(P, n);
      std::vector<std::vector<float>> results(static_cast<std::size_t>(P));
      in_process_group(P).run([&](in_process_transport& t) {
        auto data = gradient_of(t.rank(), n);
        compressed_all_reduce(cpu_executor{}, t, mpc, std::span<float>(data),
                              {.plan = all_reduce_plan::scatter_reduce});
        results[static_cast<std::size_t>(t.rank())] = data;
      });
      for (const auto& r : results) CHECK(same_bits<float>(r, sum));
    }
  }
}

TEST_CASE("scatter_reduce with server error feedback equals its definition, on every rank, any P and n") {
  constexpr std::uint64_t steps = 3;
  for (int P : {1, 2, 3, 4, 5, 8, 16}) {
    for (std::size_t n : {std::size_t{0}, std::size_t{5}, std::size_t{1001}}) {
      CAPTURE(P);
      CAPTURE(n);
      std::vector<std::vector<float>> expected_residuals;
      const auto expected = server_feedback_oracle(four_bit, P, n, steps, expected_residuals);
      std::vector<std::vector<std::vector<float>>> results(static_cast<std::size_t>(P));
      std::vector<std::vector<float>> residuals(static_cast<std::size_t>(P));
      std::vector<std::uint64_t> sent(static_cast<std::size_t>(P));
      in_process_group(P).run([&](in_process_transport& t) {
        const cpu_executor cpu;
        auto server = make_server_state(cpu, four_bit, n, t.size(), t.rank());
        for (std::uint64_t s = 0; s < steps; ++s) {
          auto data = gradient_of(t.rank(), n, s);
          const auto report = compressed_all_reduce(cpu, t, four_bit, server, std::span<float>(data),
                                                    {.key = {.step = s}, .plan = all_reduce_plan::scatter_reduce});
          results[static_cast<std::size_t>(t.rank())].push_back(data);
          sent[static_cast<std::size_t>(t.rank())] = report.sent_bytes;
        }
        residuals[static_cast<std::size_t>(t.rank())] = server.residual;
      });
      for (int r = 0; r < P; ++r) {
        const auto rank = static_cast<std::size_t>(r);
        for (std::uint64_t s = 0; s < steps; ++s) CHECK(same_bits<float>(results[rank][s], expected[s]));
        CHECK(same_bits<float>(residuals[rank], expected_residuals[rank]));
        // The bytes are the cost model's, exactly (a fixed-size codec).
        CHECK(sent[rank] ==
              scatter_reduce_cost(n, P, r, [](std::uint64_t m) { return four_bit.max_encoded_bytes(m); }).sent_bytes);
      }
    }
  }
}

TEST_CASE(
    "scatter_reduce server state: residual + delivered chunk = chunk sum + previous residual, to one rounding each") {
  // ε_new = fl(a − D), a = fl(s + ε_old): |ε_new + D − (s + ε_old)| ≤ ½ ulp(ε_new) + ½ ulp(a).
  constexpr int P = 4;
  constexpr std::size_t n = 999;
  const auto half_ulp = [](float v) {
    return 0.5 *
           static_cast<double>(std::nextafter(std::fabs(v), std::numeric_limits<float>::infinity()) - std::fabs(v));
  };
  in_process_group(P).run([&](in_process_transport& t) {
    const cpu_executor cpu;
    const auto mine = rank_chunk(n, P, t.rank());
    auto server = make_server_state(cpu, four_bit, n, P, t.rank());
    for (std::uint64_t s = 0; s < 4; ++s) {
      const std::vector<float> before = server.residual;
      const std::vector<float> sum = decoded_chunk_sum(four_bit, P, n, t.rank(), s);
      auto data = gradient_of(t.rank(), n, s);
      (void)compressed_all_reduce(cpu, t, four_bit, server, std::span<float>(data),
                                  {.key = {.step = s}, .plan = all_reduce_plan::scatter_reduce});
      std::size_t off = 0, carried = 0;
      for (std::size_t i = 0; i < mine.second; ++i) {
        const float a = sum[i] + before[i];
        const double gap = static_cast<double>(server.residual[i]) + static_cast<double>(data[mine.first + i]) -
                           (static_cast<double>(sum[i]) + static_cast<double>(before[i]));
        if (!(std::fabs(gap) <= half_ulp(server.residual[i]) + half_ulp(a))) ++off;
        if (server.residual[i] != 0.0f) ++carried;
      }
      CHECK(off == 0);
      CHECK(carried > mine.second / 2);  // 4 bits drop something almost everywhere
    }
  });
}

// The result of `steps` scatter_reduce all-reduces with stateful wrapper `w`, replayed on one
// thread: P chunk states per rank and one server state per chunk, each step's chunk messages
// decoded onto zeros in rank order and the chunk sum re-encoded with the server state.
template <class W>
std::vector<std::vector<float>> wrapper_replay(const W& w, int P, std::size_t n, std::uint64_t steps) {
  const cpu_executor cpu;
  std::vector<std::vector<state_type_of<W, cpu_executor>>> workers(static_cast<std::size_t>(P));
  std::vector<state_type_of<W, cpu_executor>> servers;
  for (int j = 0; j < P; ++j) {
    servers.push_back(w.make_state(cpu, rank_chunk(n, P, j).second));
    for (int r = 0; r < P; ++r)
      workers[static_cast<std::size_t>(r)].push_back(w.make_state(cpu, rank_chunk(n, P, j).second));
  }
  std::vector<std::byte> message(w.max_encoded_bytes(n)), ws(w.workspace_bytes(cpu, n));
  std::vector<std::vector<float>> results;
  for (std::uint64_t s = 0; s < steps; ++s) {
    std::vector<float> result(n);
    for (int j = 0; j < P; ++j) {
      const auto c = rank_chunk(n, P, j);
      std::vector<float> sum(c.second, 0.0f);
      for (int r = 0; r < P; ++r) {
        const auto g = gradient_of(r, n, s);
        const std::size_t bytes =
            w.encode(cpu, part(g, c), workers[static_cast<std::size_t>(r)][static_cast<std::size_t>(j)], message, ws,
                     {.step = s});
        w.decode_accumulate(cpu, std::span<const std::byte>(message).first(bytes), std::span<float>(sum), ws);
      }
      const std::size_t bytes =
          w.encode(cpu, std::span<const float>(sum), servers[static_cast<std::size_t>(j)], message, ws, {.step = s});
      w.decode(cpu, std::span<const std::byte>(message).first(bytes),
               std::span<float>(result).subspan(c.first, c.second), ws);
    }
    results.push_back(result);
  }
  return results;
}

// Runs `steps` scatter_reduce all-reduces with wrapper `w` on P ranks; returns each rank's results.
template <class W>
std::vector<std::vector<std::vector<float>>> wrapper_run(const W& w, int P, std::size_t n, std::uint64_t steps) {
  std::vector<std::vector<std::vector<float>>> results(static_cast<std::size_t>(P));
  in_process_group(P).run([&](in_process_transport& t) {
    const cpu_executor cpu;
    auto chunks = make_chunk_states(cpu, w, n, P);
    auto server = make_server_state(cpu, w, n, P, t.rank());
    for (std::uint64_t s = 0; s < steps; ++s) {
      auto data = gradient_of(t.rank(), n, s);
      (void)compressed_all_reduce(cpu, t, w, std::span(chunks), server, std::span<float>(data), {.key = {.step = s}});
      results[static_cast<std::size_t>(t.rank())].push_back(data);
    }
  });
  return results;
}

TEST_CASE(
    "scatter_reduce with stateful wrappers: a replay of the chunk and server states, the same bits on every rank") {
  const error_feedback ef(topk_sparsifier<float>(sparsity{.density = 0.01}));
  const loco lc(uniform_quantizer<float>(uniform_params{.bits = 4}));
  for (int P : {1, 3, 4, 8}) {
    for (std::size_t n : {std::size_t{2}, std::size_t{1500}}) {
      CAPTURE(P);
      CAPTURE(n);
      const auto expected_ef = wrapper_replay(ef, P, n, 4);
      const auto got_ef = wrapper_run(ef, P, n, 4);
      const auto expected_lc = wrapper_replay(lc, P, n, 4);
      const auto got_lc = wrapper_run(lc, P, n, 4);
      for (int r = 0; r < P; ++r)
        for (std::size_t s = 0; s < 4; ++s) {
          CHECK(same_bits<float>(got_ef[static_cast<std::size_t>(r)][s], expected_ef[s]));
          CHECK(same_bits<float>(got_lc[static_cast<std::size_t>(r)][s], expected_lc[s]));
        }
    }
  }
}

TEST_CASE("scatter_reduce states saved after two steps and loaded into fresh ones continue bit for bit") {
  const error_feedback ef(topk_sparsifier<float>(sparsity{.density = 0.02}));
  constexpr int P = 3;
  constexpr std::size_t n = 1001;
  const auto expected = wrapper_replay(ef, P, n, 4);
  std::vector<std::vector<std::vector<float>>> results(P);
  std::vector<std::vector<float>> stateless_results(P), stateless_expected(P);
  in_process_group(P).run([&](in_process_transport& t) {
    const cpu_executor cpu;
    const auto save = [&](const auto& codec, const auto& state) {
      std::vector<std::byte> bytes(codec.saved_state_bytes(state.residual.size()));
      CHECK(codec.save_state(cpu, state, bytes) == bytes.size());
      return bytes;
    };
    // A stateful wrapper: P chunk states and the server state.
    auto chunks = make_chunk_states(cpu, ef, n, P);
    auto server = make_server_state(cpu, ef, n, P, t.rank());
    // A stateless codec with server error feedback alone.
    auto server4 = make_server_state(cpu, four_bit, n, P, t.rank());
    const auto feedback4 = server_codec_of(cpu, four_bit);
    for (std::uint64_t s = 0; s < 2; ++s) {
      auto data = gradient_of(t.rank(), n, s);
      (void)compressed_all_reduce(cpu, t, ef, std::span(chunks), server, std::span<float>(data), {.key = {.step = s}});
      auto data4 = gradient_of(t.rank(), n, s);
      (void)compressed_all_reduce(cpu, t, four_bit, server4, std::span<float>(data4), {.key = {.step = s}});
    }
    std::vector<std::vector<std::byte>> saved;
    for (const auto& c : chunks) saved.push_back(save(ef, c));
    const auto saved_server = save(ef, server);
    const auto saved_server4 = save(feedback4, server4);
    auto loaded = make_chunk_states(cpu, ef, n, P);
    for (std::size_t j = 0; j < loaded.size(); ++j) ef.load_state(cpu, saved[j], loaded[j]);
    auto loaded_server = make_server_state(cpu, ef, n, P, t.rank());
    ef.load_state(cpu, saved_server, loaded_server);
    auto loaded_server4 = make_server_state(cpu, four_bit, n, P, t.rank());
    feedback4.load_state(cpu, saved_server4, loaded_server4);
    CHECK(save(feedback4, loaded_server4) == saved_server4);
    for (std::uint64_t s = 2; s < 4; ++s) {
      auto data = gradient_of(t.rank(), n, s);
      (void)compressed_all_reduce(cpu, t, ef, std::span(loaded), loaded_server, std::span<float>(data),
                                  {.key = {.step = s}});
      results[static_cast<std::size_t>(t.rank())].push_back(data);
    }
    auto once = gradient_of(t.rank(), n, 2), again = once;
    (void)compressed_all_reduce(cpu, t, four_bit, server4, std::span<float>(once), {.key = {.step = 2}});
    (void)compressed_all_reduce(cpu, t, four_bit, loaded_server4, std::span<float>(again), {.key = {.step = 2}});
    CHECK(same_bits<float>(once, again));
  });
  for (int r = 0; r < P; ++r)
    for (std::size_t s = 0; s < 2; ++s)
      CHECK(same_bits<float>(results[static_cast<std::size_t>(r)][s], expected[s + 2]));
}

TEST_CASE("scatter_reduce: a rank that fails after the all-to-all rolls every rank's states back") {
  // The last rank's server state is of the wrong size: its re-encoding fails (size_mismatch)
  // after every rank's chunk states took their step; every rank throws it, with data, chunk and
  // server states as before the call.
  const error_feedback ef(topk_sparsifier<float>(sparsity{.density = 0.05}));
  constexpr int P = 4;
  constexpr std::size_t n = 403;
  std::vector<std::string> thrown(P);
  std::atomic<int> untouched{0};
  in_process_group(P).run([&](in_process_transport& t) {
    const cpu_executor cpu;
    auto chunks = make_chunk_states(cpu, ef, n, P);
    auto server = make_server_state(cpu, ef, n, P, t.rank());
    auto server4 = make_server_state(cpu, four_bit, n, P, t.rank());
    auto data = gradient_of(t.rank(), n, 0);
    (void)compressed_all_reduce(cpu, t, ef, std::span(chunks), server, std::span<float>(data), {.key = {.step = 0}});
    (void)compressed_all_reduce(cpu, t, four_bit, server4, std::span<float>(data), {.key = {.step = 0}});
    if (t.rank() == P - 1) {
      server = ef.make_state(cpu, 1);
      server4 = server_codec_of(cpu, four_bit).make_state(cpu, 1);
    }
    const auto chunks_before = chunks;
    const auto server_before = server;
    const auto server4_before = server4;
    data = gradient_of(t.rank(), n, 1);
    const auto data_before = data;
    thrown[static_cast<std::size_t>(t.rank())] = thrown_by([&] {
      compressed_all_reduce(cpu, t, ef, std::span(chunks), server, std::span<float>(data), {.key = {.step = 1}});
    });
    const std::string second = thrown_by(
        [&] { compressed_all_reduce(cpu, t, four_bit, server4, std::span<float>(data), {.key = {.step = 1}}); });
    bool same = second == thrown[static_cast<std::size_t>(t.rank())] && data == data_before &&
                server.residual == server_before.residual && server.steps == server_before.steps &&
                server4.residual == server4_before.residual && server4.steps == server4_before.steps;
    for (std::size_t j = 0; j < chunks.size(); ++j)
      same = same && chunks[j].residual == chunks_before[j].residual && chunks[j].steps == chunks_before[j].steps;
    if (same) ++untouched;
  });
  for (const auto& e : thrown) CHECK(e == named(errc::size_mismatch));
  CHECK(untouched == P);
}

TEST_CASE(
    "scatter_reduce: a NaN, a wrong state count or a transport without all-to-all is the same error on every rank") {
  const error_feedback ef(topk_sparsifier<float>(sparsity{.density = 0.05}));
  constexpr int P = 3;
  constexpr std::size_t n = 100;
  std::vector<std::vector<std::string>> thrown(P);
  in_process_group(P).run([&](in_process_transport& t) {
    const cpu_executor cpu;
    auto& mine = thrown[static_cast<std::size_t>(t.rank())];
    auto chunks = make_chunk_states(cpu, ef, n, P);
    auto server = make_server_state(cpu, ef, n, P, t.rank());
    auto server4 = make_server_state(cpu, four_bit, n, P, t.rank());
    auto data = gradient_of(t.rank(), n, 0);
    if (t.rank() == 1) data[7] = std::numeric_limits<float>::quiet_NaN();
    mine.push_back(
        thrown_by([&] { compressed_all_reduce(cpu, t, ef, std::span(chunks), server, std::span<float>(data)); }));
    mine.push_back(thrown_by([&] { compressed_all_reduce(cpu, t, four_bit, server4, std::span<float>(data)); }));
    const bool untouched = server.steps == 0 && server4.steps == 0 && chunks[0].steps == 0;
    CHECK(untouched);
    data = gradient_of(t.rank(), n, 0);
    const auto fewer = std::span(chunks).first(t.rank() == 0 ? P - 1 : P);
    mine.push_back(thrown_by([&] { compressed_all_reduce(cpu, t, ef, fewer, server, std::span<float>(data)); }));
    collectives_only<in_process_transport> no_all_to_all(t);
    mine.push_back(thrown_by([&] {
      compressed_all_reduce(cpu, no_all_to_all, four_bit, std::span<float>(data),
                            {.plan = all_reduce_plan::scatter_reduce});
    }));
    mine.push_back(thrown_by([&] {
      compressed_all_reduce(cpu, t, ef, chunks[0], std::span<float>(data), {.plan = all_reduce_plan::scatter_reduce});
    }));
    // Without an all-to-all, automatic falls back to gather_decode with the server state untouched.
    CHECK(compressed_all_reduce(cpu, no_all_to_all, four_bit, server4, std::span<float>(data)).sent_bytes ==
          gather_decode_cost(n, P, [](std::uint64_t m) { return four_bit.max_encoded_bytes(m); }).sent_bytes);
    CHECK(server4.steps == 0);
  });
  for (const auto& rank : thrown) {
    REQUIRE(rank.size() == 5);
    CHECK(rank[0] == named(errc::non_finite_input));
    CHECK(rank[1] == named(errc::non_finite_input));
    CHECK(rank[2] == named(errc::invalid_argument));
    CHECK(rank[3] == named(errc::invalid_argument));
    CHECK(rank[4] == named(errc::invalid_argument));
  }
}

TEST_CASE("scatter_reduce traffic per rank stays flat from P = 4 to P = 16; gather_decode's grows with P") {
  constexpr std::size_t n = 1 << 20;  // large enough that the frame and envelope headers are small
  const error_feedback ef(topk_sparsifier<float>(sparsity{.density = 0.01}));
  const auto sent = [&](int P, all_reduce_plan plan, bool wrapper) {
    std::vector<std::uint64_t> bytes(static_cast<std::size_t>(P));
    in_process_group(P).run([&](in_process_transport& t) {
      const cpu_executor cpu;
      auto data = gradient_of(t.rank(), n, 0);
      compressed_report report;
      if (wrapper && plan == all_reduce_plan::scatter_reduce) {
        auto chunks = make_chunk_states(cpu, ef, n, P);
        auto server = make_server_state(cpu, ef, n, P, t.rank());
        report = compressed_all_reduce(cpu, t, ef, std::span(chunks), server, std::span<float>(data));
      } else if (wrapper) {
        auto state = ef.make_state(cpu, n);
        report = compressed_all_reduce(cpu, t, ef, state, std::span<float>(data));
      } else {
        auto server = make_server_state(cpu, four_bit, n, P, t.rank());
        report = compressed_all_reduce(cpu, t, four_bit, server, std::span<float>(data), {.plan = plan});
      }
      bytes[static_cast<std::size_t>(t.rank())] = report.sent_bytes;
      CHECK(report.dense_bytes ==
            2 * static_cast<std::uint64_t>(P - 1) * n * sizeof(float) / static_cast<std::uint64_t>(P));
    });
    return bytes[0];  // rank 0 sends the most
  };
  for (bool wrapper : {false, true}) {
    CAPTURE(wrapper);
    const double sr4 = static_cast<double>(sent(4, all_reduce_plan::scatter_reduce, wrapper));
    const double sr16 = static_cast<double>(sent(16, all_reduce_plan::scatter_reduce, wrapper));
    const double gd4 = static_cast<double>(sent(4, all_reduce_plan::gather_decode, wrapper));
    const double gd16 = static_cast<double>(sent(16, all_reduce_plan::gather_decode, wrapper));
    // 2(P − 1)/P: 1.5 at P = 4, 1.875 at P = 16 (a ratio of 1.25), plus the frame headers.
    CHECK(sr16 / sr4 < 1.3);
    CHECK(gd16 / gd4 == doctest::Approx(5.0));  // P − 1
    CHECK(sr16 < gd16 / 7.0);
  }
}

TEST_CASE("dense warm-up: the first K steps are an uncompressed SUM all-reduce, bit for bit, states untouched") {
  const error_feedback ef(topk_sparsifier<float>(sparsity{.density = 0.01}));
  constexpr int P = 3;
  constexpr std::size_t n = 777;
  constexpr std::uint64_t K = 2;
  std::atomic<int> failures{0};
  std::vector<std::string> mismatch(P);
  in_process_group(P).run([&](in_process_transport& t) {
    const cpu_executor cpu;
    auto single = ef.make_state(cpu, n);
    auto chunks = make_chunk_states(cpu, ef, n, P);
    auto server = make_server_state(cpu, ef, n, P, t.rank());
    auto server4 = make_server_state(cpu, four_bit, n, P, t.rank());
    for (std::uint64_t s = 0; s < K; ++s) {
      for (bool average : {false, true}) {
        auto reference = gradient_of(t.rank(), n, s);
        t.all_reduce_sum(std::span<float>(reference));
        if (average)
          for (float& v : reference) v /= static_cast<float>(P);
        const all_reduce_options options{.key = {.step = s}, .average = average, .dense_steps = K};
        std::vector<std::vector<float>> got(5, gradient_of(t.rank(), n, s));
        const auto report = compressed_all_reduce(cpu, t, four_bit, std::span<float>(got[0]), options);
        (void)compressed_all_reduce(cpu, t, four_bit, server4, std::span<float>(got[1]), options);
        (void)compressed_all_reduce(cpu, t, ef, single, std::span<float>(got[2]), options);
        (void)compressed_all_reduce(cpu, t, ef, std::span(chunks), server, std::span<float>(got[3]), options);
        (void)compressed_all_reduce(
            cpu, t, mpc_codec<float>(), std::span<float>(got[4]),
            {.key = {.step = s}, .plan = all_reduce_plan::ring, .average = average, .dense_steps = K});
        for (const auto& g : got)
          if (!same_bits<float>(g, reference)) ++failures;
        if (report.sent_bytes != report.dense_bytes) ++failures;
      }
    }
    if (single.steps != 0 || server.steps != 0 || server4.steps != 0 || chunks[0].steps != 0) ++failures;
    // Step K compresses: the states take their step.
    auto data = gradient_of(t.rank(), n, K);
    (void)compressed_all_reduce(cpu, t, ef, std::span(chunks), server, std::span<float>(data),
                                {.key = {.step = K}, .dense_steps = K});
    if (server.steps != 1 || chunks[0].steps != 1) ++failures;
    // Ranks that disagree on the warm-up disagree on the plan.
    data = gradient_of(t.rank(), n, K + 1);
    mismatch[static_cast<std::size_t>(t.rank())] = thrown_by([&] {
      compressed_all_reduce(cpu, t, four_bit, std::span<float>(data),
                            {.key = {.step = K + 1}, .dense_steps = t.rank() == 0 ? K + 2 : K});
    });
  });
  CHECK(failures == 0);
  for (const auto& e : mismatch) CHECK(e == named(errc::parameter_mismatch));
}

TEST_CASE(
    "dense warm-up of compressed_reduce_scatter: each rank's chunk of the rank-order sum, bit for bit, any P and n") {
  const error_feedback ef(topk_sparsifier<float>(sparsity{.density = 0.01}));
  for (int P : {1, 3, 5}) {
    for (std::size_t n : {std::size_t{0}, std::size_t{2}, std::size_t{1001}}) {
      CAPTURE(P);
      CAPTURE(n);
      const std::vector<float> sum = rank_order_sum(P, n, 1);
      std::atomic<int> failures{0};
      in_process_group(P).run([&](in_process_transport& t) {
        const cpu_executor cpu;
        const auto mine = rank_chunk(n, P, t.rank());
        const std::vector<float> expected(sum.begin() + static_cast<std::ptrdiff_t>(mine.first),
                                          sum.begin() + static_cast<std::ptrdiff_t>(mine.first + mine.second));
        const auto data = gradient_of(t.rank(), n, 1);
        std::vector<float> out(mine.second, -1.0f), out_ef(mine.second, -1.0f);
        auto states = make_chunk_states(cpu, ef, n, P);
        const reduce_scatter_options options{.key = {.step = 1}, .dense_steps = 2};
        const auto report = compressed_reduce_scatter(cpu, t, topk_sparsifier<float>(), std::span<const float>(data),
                                                      std::span<float>(out), options);
        (void)compressed_reduce_scatter(cpu, t, ef, std::span(states), std::span<const float>(data),
                                        std::span<float>(out_ef), options);
        if (!same_bits<float>(out, expected) || !same_bits<float>(out_ef, expected) || states[0].steps != 0) ++failures;
        const std::uint64_t block = (n + static_cast<std::size_t>(P) - 1) / static_cast<std::size_t>(P);
        if (report.sent_bytes != block * sizeof(float) * static_cast<std::uint64_t>(P - 1)) ++failures;
      });
      CHECK(failures == 0);
    }
  }
}

TEST_CASE("density schedule: DGC's exponential warm-up, stage by stage") {
  const density_schedule dgc{.target = 0.001, .start = 0.25, .warm_up_steps = 400, .stages = 4};
  // 0.25 · (0.004)^(k/4): 0.25, 0.0625·…; written out: start · (target/start)^(k/4).
  const double ratio = std::pow(0.001 / 0.25, 0.25);
  CHECK(dgc.density_at(0) == 0.25);
  CHECK(dgc.density_at(99) == 0.25);
  CHECK(dgc.density_at(100) == doctest::Approx(0.25 * ratio));
  CHECK(dgc.density_at(250) == doctest::Approx(0.25 * ratio * ratio));
  CHECK(dgc.density_at(399) == doctest::Approx(0.25 * ratio * ratio * ratio));
  CHECK(dgc.density_at(400) == 0.001);
  CHECK(dgc.density_at(1u << 30) == 0.001);
  CHECK(dgc.sparsity_at(0).count(1000) == 250);
  CHECK(dgc.sparsity_at(400).count(1000) == 1);
  // No warm-up by default: the target from the first step.
  CHECK(density_schedule{.target = 0.01}.density_at(0) == 0.01);
  CHECK(thrown_by([] { (void)density_schedule{.target = 0.5, .start = 0.25}.density_at(0); }) ==
        named(errc::invalid_argument));
  // Ranks on different densities: the agreement's parameter_mismatch.
  std::vector<std::string> thrown(2);
  in_process_group(2).run([&](in_process_transport& t) {
    const std::uint64_t step = t.rank() == 0 ? 99 : 100;
    const topk_sparsifier<float> topk(dgc.sparsity_at(step));
    auto data = gradient_of(t.rank(), 64, 0);
    thrown[static_cast<std::size_t>(t.rank())] = thrown_by(
        [&] { compressed_all_reduce(cpu_executor{}, t, topk, std::span<float>(data), {.key = {.step = 5}}); });
  });
  for (const auto& e : thrown) CHECK(e == named(errc::parameter_mismatch));
}

}  // namespace gradcomp::test
