// bf16 and fp16 data in the chunked plans: compressed_all_reduce's scatter_reduce (plain, with a
// server error-feedback state, and a stateful wrapper with chunk and server states) and ring, and
// compressed_reduce_scatter's all_to_all, gather_decode, dense and ring plans, over the in-process
// transport. The oracle, written here from the reference executor's encode and decode and the
// chunks cut independently of ring_chunk_of: every rank's chunk message decoded into float32 and
// summed in rank order (the ring: the partial sum of each hop in float32, rounded once for its
// encoding); for the all-reduce, that sum rounded once to the 16-bit type, re-encoded, decoded
// into float32, divided by P with `average` and rounded once. Plus the refusal of summed_encodings
// and fp16 overflow on one rank's chunk reported by every rank, data untouched.
#include <gradcomp/collective/compressed_all_reduce.hpp>
#include <gradcomp/collective/compressed_reduce_scatter.hpp>
#include <gradcomp/core/half_float.hpp>
#include <gradcomp/core/reference_executor.hpp>
#include <gradcomp/feedback/error_feedback.hpp>
#include <gradcomp/feedback/loco.hpp>
#include <gradcomp/quantize/uniform.hpp>
#include <gradcomp/sparsify/topk.hpp>
#include <gradcomp/transport/in_process.hpp>

#include <doctest/doctest.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "collective_checks.hpp"
#include "support/errors.hpp"

namespace gradcomp::test {
namespace {

/// `x`'s message made by the reference executor and decoded into float32.
template <class Codec>
std::vector<float> reference_decoding(const Codec& codec, std::span<const typename Codec::value_type> x) {
  const reference_executor ref;
  std::vector<std::byte> message(codec.max_encoded_bytes(x.size())), ws(codec.workspace_bytes(ref, x.size()));
  message.resize(codec.encode(ref, x, message, ws, {}));
  std::vector<float> decoded(x.size());
  codec.decode(ref, message, std::span<float>(decoded), ws);
  return decoded;
}

/// Chunk j (`rank_chunk`) of every rank's `half_gradient_of`, each encoded alone, decoded into
/// float32 and summed in rank order: what the owner of chunk j holds after the all-to-all.
template <class Codec>
std::vector<float> chunk_sum(const Codec& codec, int P, std::size_t n, int j) {
  using H = typename Codec::value_type;
  const auto [offset, count] = rank_chunk(n, P, j);
  std::vector<float> sum(count, 0.0f);
  for (int r = 0; r < P; ++r) {
    const std::vector<H> g = half_gradient_of<H>(r, n);
    const auto decoded = reference_decoding(codec, std::span<const H>(g).subspan(offset, count));
    for (std::size_t i = 0; i < count; ++i) sum[i] += decoded[i];
  }
  return sum;
}

/// float32 values divided by P with `average`, each rounded once to H.
template <class H>
std::vector<H> rounded(const std::vector<float>& sums, int P, bool average) {
  std::vector<H> out(sums.size());
  for (std::size_t i = 0; i < sums.size(); ++i) out[i] = narrow<H>(average ? sums[i] / static_cast<float>(P) : sums[i]);
  return out;
}

/// The oracle of a scatter_reduce all-reduce of 16-bit data whose re-encoding is the codec's own
/// message (plainly, or a fresh server or chunk state's first step).
template <class Codec>
std::vector<typename Codec::value_type> scatter_reduce_oracle(const Codec& codec, int P, std::size_t n, bool average) {
  using H = typename Codec::value_type;
  std::vector<float> decoded(n);
  for (int j = 0; j < P; ++j) {
    const std::size_t offset = rank_chunk(n, P, j).first;
    const std::vector<H> owner_sum = rounded<H>(chunk_sum(codec, P, n, j), P, false);
    const auto chunk = reference_decoding(codec, std::span<const H>(owner_sum));
    std::copy(chunk.begin(), chunk.end(), decoded.begin() + static_cast<std::ptrdiff_t>(offset));
  }
  return rounded<H>(decoded, P, average);
}

/// Runs `body(P, n, average)` for P = 2, 3, 5, the two sizes and both `average` settings.
template <class Body>
void for_each_setting(std::size_t small, std::size_t large, Body body) {
  for (const int P : {2, 3, 5})
    for (const std::size_t n : {small, large})
      for (const bool average : {false, true}) {
        CAPTURE(P);
        CAPTURE(n);
        CAPTURE(average);
        body(P, n, average);
      }
}

}  // namespace

TEST_CASE_TEMPLATE(
    "scatter_reduce of bf16 and fp16 data: float32 chunk sums rounded once, re-encoded, decoded in "
    "float32 and rounded once, on every rank",
    H, bf16, fp16) {
  const uniform_quantizer<H> q({.bits = 4, .block = 64});
  const topk_sparsifier<H> topk(sparsity{.density = 0.1});
  for_each_setting(3, 1501, [&](int P, std::size_t n, bool average) {
    const auto check = [&](const auto& codec) {
      const auto expected = patterns_of(scatter_reduce_oracle(codec, P, n, average));
      using C = std::remove_cvref_t<decltype(codec)>;
          // Plainly re-encoded.
      const auto plain = on_half_ranks<H>(P, n, [&](in_process_transport& t, std::vector<H>& data) {
        const auto report = compressed_all_reduce(cpu_executor{}, t, codec, std::span<H>(data),
                                                  {.plan = all_reduce_plan::scatter_reduce, .average = average});
        CHECK(report.dense_bytes == ring_all_reduce_dense_bytes(n * 2, static_cast<std::uint64_t>(P)));
      });
      for (const auto& r : plain) CHECK(patterns_of(r) == expected);
          // With a fresh server error-feedback state: its first message is the codec's own.
      const auto served = on_half_ranks<H>(P, n, [&](in_process_transport& t, std::vector<H>& data) {
        auto server = make_server_state(cpu_executor{}, codec, n, P, t.rank());
        compressed_all_reduce(cpu_executor{}, t, codec, server, std::span<H>(data),
                              {.plan = all_reduce_plan::scatter_reduce, .average = average});
        CHECK(server.steps == 1);
      });
      for (const auto& r : served) CHECK(patterns_of(r) == expected);
          // Error feedback with a state per chunk and a server state, all fresh.
      const error_feedback<C> ef(codec);
      const auto chunked = on_half_ranks<H>(P, n, [&](in_process_transport& t, std::vector<H>& data) {
        auto chunks = make_chunk_states(cpu_executor{}, ef, n, P);
        auto server = make_server_state(cpu_executor{}, ef, n, P, t.rank());
        compressed_all_reduce(cpu_executor{}, t, ef, std::span(chunks), server, std::span<H>(data),
                              {.average = average});
      });
      for (const auto& r : chunked) CHECK(patterns_of(r) == expected);
    };
    check(q);
    check(topk);
  });
}

TEST_CASE_TEMPLATE(
    "scatter_reduce of 16-bit data over steps: LoCo's chunk and server states carry on as a "
    "single-threaded replay, and automatic picks the plan as for float32",
    H, bf16, fp16) {
  constexpr int P = 4;
  constexpr std::size_t n = 4000;
  const loco lc(uniform_quantizer<H>({.bits = 4}));
  const auto results = on_half_ranks<H>(P, n, [&](in_process_transport& t, std::vector<H>& data) {
    auto chunks = make_chunk_states(cpu_executor{}, lc, n, P);
    auto server = make_server_state(cpu_executor{}, lc, n, P, t.rank());
    for (std::uint64_t step = 0; step < 3; ++step) {
      data = half_gradient_of<H>(t.rank(), n, step);
      compressed_all_reduce(cpu_executor{}, t, lc, std::span(chunks), server, std::span<H>(data),
                            {.key = {.step = step}, .average = true});
    }
    CHECK(server.total_steps == 3);
  });
  // A single-threaded replay through the wrapper's public encode and decode: rank r's chunk j
  // encoded with its state (r, j); the owner's float32 sum rounded once and encoded with its
  // server state; the chunks decoded into float32, divided by P, rounded once.
  const cpu_executor cpu;
  std::vector<std::vector<decltype(lc.make_state(cpu, 0))>> chunk_states(P);
  std::vector<decltype(lc.make_state(cpu, 0))> servers;
  for (int r = 0; r < P; ++r) {
    chunk_states[static_cast<std::size_t>(r)] = make_chunk_states(cpu, lc, n, P);
    servers.push_back(make_server_state(cpu, lc, n, P, r));
  }
  std::vector<std::byte> message(lc.max_encoded_bytes(n)), ws(lc.workspace_bytes(cpu, n));
  const auto encoded = [&](std::span<const H> x, auto& state, std::uint64_t step) {
    return std::span<const std::byte>(message).first(lc.encode(cpu, x, state, message, ws, {.step = step}));
  };
  std::vector<float> replay(n);
  for (std::uint64_t step = 0; step < 3; ++step) {
    for (int j = 0; j < P; ++j) {
      const auto [offset, count] = rank_chunk(n, P, j);
      std::vector<float> sum(count, 0.0f);
      for (int r = 0; r < P; ++r) {
        const std::vector<H> g = half_gradient_of<H>(r, n, step);
        lc.decode_accumulate(cpu,
                             encoded(std::span<const H>(g).subspan(offset, count),
                                     chunk_states[static_cast<std::size_t>(r)][static_cast<std::size_t>(j)], step),
                             std::span<float>(sum), ws);
      }
      const std::vector<H> owner_sum = rounded<H>(sum, P, false);
      lc.decode(cpu, encoded(std::span<const H>(owner_sum), servers[static_cast<std::size_t>(j)], step),
                std::span<float>(replay).subspan(offset, count), ws);
    }
  }
  const auto expected = patterns_of(rounded<H>(replay, P, true));
  for (const auto& r : results) CHECK(patterns_of(r) == expected);
  // The cost model in 16-bit bytes: 4-bit codes of 2-byte values save the same bytes as of 4-byte ones.
  const uniform_quantizer<H> q({.bits = 4});
  CHECK(automatic_plan(q, 1 << 20, 4, true) == automatic_plan(uniform_quantizer<float>({.bits = 4}), 1 << 20, 4, true));
  CHECK(automatic_plan(q, 1 << 20, 4, true) == all_reduce_plan::scatter_reduce);
  CHECK(automatic_plan(q, 1 << 20, 4, false) == all_reduce_plan::gather_decode);
}

TEST_CASE_TEMPLATE(
    "compressed_reduce_scatter of bf16 and fp16 data: this rank's chunk of the float32 sums, rounded "
    "once",
    H, bf16, fp16) {
  const uniform_quantizer<H> q({.bits = 8, .block = 64});
  for_each_setting(4, 1200, [&](int P, std::size_t n, bool average) {
        // all_to_all: rank r's chunk messages of chunk r, summed in float32.
        // gather_decode: the whole messages summed in float32, chunk r kept.
        // dense: the widened values summed in float32.
    std::vector<float> whole(n, 0.0f), dense(n, 0.0f);
    for (int r = 0; r < P; ++r) {
      const std::vector<H> g = half_gradient_of<H>(r, n);
      const auto decoded = reference_decoding(q, std::span<const H>(g));
      for (std::size_t i = 0; i < n; ++i) {
        whole[i] += decoded[i];
        dense[i] += widen(g[i]);
      }
    }
    for (const reduce_scatter_plan plan :
         {reduce_scatter_plan::all_to_all, reduce_scatter_plan::gather_decode, reduce_scatter_plan::dense}) {
      CAPTURE(static_cast<int>(plan));
      std::vector<std::vector<H>> outs(static_cast<std::size_t>(P));
      in_process_group(P).run([&](in_process_transport& t) {
        const std::vector<H> data = half_gradient_of<H>(t.rank(), n);
        std::vector<H> out(rank_chunk(n, P, t.rank()).second);
        compressed_reduce_scatter(cpu_executor{}, t, q, std::span<const H>(data), std::span<H>(out),
                                  {.plan = plan, .average = average});
        outs[static_cast<std::size_t>(t.rank())] = out;
      });
      for (int r = 0; r < P; ++r) {
        const auto [offset, count] = rank_chunk(n, P, r);
        std::vector<float> sums;
        if (plan == reduce_scatter_plan::all_to_all) sums = chunk_sum(q, P, n, r);
        else {
          const std::vector<float>& from = plan == reduce_scatter_plan::dense ? dense : whole;
          sums.assign(from.begin() + static_cast<std::ptrdiff_t>(offset),
                      from.begin() + static_cast<std::ptrdiff_t>(offset + count));
        }
        CHECK(patterns_of(outs[static_cast<std::size_t>(r)]) == patterns_of(rounded<H>(sums, P, average)));
      }
    }
  });
}

TEST_CASE_TEMPLATE(
    "the ring of bf16 and fp16 data: float32 partial sums, rounded once for each encoding and once "
    "at the end",
    H, bf16, fp16) {
  const uniform_quantizer<H> q({.bits = 8, .block = 64});
  for_each_setting(4, 1200, [&](int P, std::size_t n, bool average) {
    // Chunk c by the ring's definition: rank c + 1's own values, then at each later rank c + k its
    // own values (widened) plus the decoding of the previous partial sum rounded to H.
    std::vector<std::vector<float>> chunk_sums(static_cast<std::size_t>(P));
    std::vector<float> all_reduced(n);
    for (int c = 0; c < P; ++c) {
      const auto chunk = rank_chunk(n, P, c);
      const std::size_t offset = chunk.first, count = chunk.second;
      const auto own = [&](int k) {
        const std::vector<H> g = half_gradient_of<H>((c + k) % P, n);
        std::vector<float> v(count);
        for (std::size_t i = 0; i < count; ++i) v[i] = widen(g[offset + i]);
        return v;
      };
      std::vector<float> acc = own(1);
      for (int k = 2; k <= P; ++k) {
        const std::vector<H> sent = rounded<H>(acc, P, false);
        const auto decoded = reference_decoding(q, std::span<const H>(sent));
        acc = own(k);
        for (std::size_t i = 0; i < count; ++i) acc[i] += decoded[i];
      }
      chunk_sums[static_cast<std::size_t>(c)] = acc;
      const std::vector<H> owner_sum = rounded<H>(acc, P, false);
      const auto decoded = reference_decoding(q, std::span<const H>(owner_sum));
      std::copy(decoded.begin(), decoded.end(), all_reduced.begin() + static_cast<std::ptrdiff_t>(offset));
    }
    std::vector<std::vector<H>> outs(static_cast<std::size_t>(P));
    const auto all = on_half_ranks<H>(P, n, [&](in_process_transport& t, std::vector<H>& data) {
      std::vector<H> out(rank_chunk(n, P, t.rank()).second);
      compressed_reduce_scatter(cpu_executor{}, t, q, std::span<const H>(data), std::span<H>(out),
                                {.plan = reduce_scatter_plan::ring, .average = average});
      outs[static_cast<std::size_t>(t.rank())] = out;
      compressed_all_reduce(cpu_executor{}, t, q, std::span<H>(data),
                            {.plan = all_reduce_plan::ring, .average = average});
    });
    for (int r = 0; r < P; ++r)
      CHECK(patterns_of(outs[static_cast<std::size_t>(r)]) ==
            patterns_of(rounded<H>(chunk_sums[static_cast<std::size_t>(r)], P, average)));
    const auto expected = patterns_of(rounded<H>(all_reduced, P, average));
    for (const auto& r : all) CHECK(patterns_of(r) == expected);
  });
}

TEST_CASE_TEMPLATE(
    "16-bit data: summed_encodings refused, and an fp16 sum beyond range on one rank's chunk stops "
    "every rank alike, data untouched",
    H, bf16, fp16) {
  constexpr int P = 2;
  constexpr std::size_t n = 600;
  const uniform_quantizer<H> q({.bits = 8});
  const auto before = on_half_ranks<H>(P, n, [](in_process_transport&, std::vector<H>&) {});
  std::atomic<int> refused{0};
  const auto after = on_half_ranks<H>(P, n, [&](in_process_transport& t, std::vector<H>& data) {
    if (thrown_by([&] {
          compressed_all_reduce(cpu_executor{}, t, q, std::span<H>(data), {.plan = all_reduce_plan::summed_encodings});
        }) == named(errc::invalid_argument))
      ++refused;
  });
  CHECK(refused.load() == P);
  for (int r = 0; r < P; ++r)
    CHECK(patterns_of(after[static_cast<std::size_t>(r)]) == patterns_of(before[static_cast<std::size_t>(r)]));
  if constexpr (std::is_same_v<H, fp16>) {
    // 60000 on both ranks in chunk 0 only: its sum (120000) is beyond 65504, chunk 1's is not;
    // every rank throws narrowing_overflow in every plan and keeps its data, whichever rank holds
    // chunk 0.
    std::atomic<int> overflowed{0}, kept{0};
    in_process_group(P).run([&](in_process_transport& t) {
      std::vector<H> data = half_gradient_of<H>(t.rank(), n);
      data[5] = narrow<H>(60000.0f);
      const std::vector<H> copy = data;
      std::vector<H> out(n / 2, narrow<H>(7.0f));
      for (const reduce_scatter_plan plan :
           {reduce_scatter_plan::all_to_all, reduce_scatter_plan::dense, reduce_scatter_plan::ring})
        if (thrown_by([&] {
              compressed_reduce_scatter(cpu_executor{}, t, q, std::span<const H>(data), std::span<H>(out),
                                        {.plan = plan});
            }) == named(errc::narrowing_overflow))
          ++overflowed;
      for (const all_reduce_plan plan : {all_reduce_plan::gather_decode, all_reduce_plan::dense,
                                         all_reduce_plan::scatter_reduce, all_reduce_plan::ring})
        if (thrown_by([&] { compressed_all_reduce(cpu_executor{}, t, q, std::span<H>(data), {.plan = plan}); }) ==
            named(errc::narrowing_overflow))
          ++overflowed;
      if (patterns_of(data) == patterns_of(copy) &&
          patterns_of(out) == patterns_of(std::vector<H>(n / 2, narrow<H>(7.0f))))
        ++kept;
    });
    CHECK(overflowed.load() == 7 * P);
    CHECK(kept.load() == P);
  }
}

}  // namespace gradcomp::test
