// The compressed collectives on reference_executor (collective_memory for host executors): every
// plan a codec with a reference backend runs, error feedback and LoCo with their chunk and server
// states included, gives on every rank the bits the same call gives on cpu_executor, and the same
// bytes sent; the cpu_executor results are themselves checked against
// independent oracles in test_compressed_all_reduce.cpp and test_compressed_reduce_scatter.cpp.
// Here the oracle of the sum is also written out once: the rank-order sum of the reference's own
// decodes.
#include <gradcomp/collective/compressed_all_gather.hpp>
#include <gradcomp/collective/compressed_all_reduce.hpp>
#include <gradcomp/collective/compressed_reduce_scatter.hpp>
#include <gradcomp/collective/scatter_reduce.hpp>
#include <gradcomp/feedback/error_feedback.hpp>
#include <gradcomp/feedback/loco.hpp>
#include <gradcomp/quantize/qsgd.hpp>
#include <gradcomp/quantize/shared_scale.hpp>
#include <gradcomp/quantize/uniform.hpp>
#include <gradcomp/sparsify/randomk.hpp>
#include <gradcomp/sparsify/topk.hpp>
#include <gradcomp/transport/in_process.hpp>

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "collective_checks.hpp"
#include "support/executor_io.hpp"

namespace gradcomp::test {
namespace {

struct rank_result {
  std::vector<float> values;
  std::size_t sent = 0;
};

/// `call(exec, t, data)` on P in-process ranks, each starting from gradient_of(rank, n).
template <class Exec, class Call>
std::vector<rank_result> run_on(int P, std::size_t n, Call call) {
  std::vector<rank_result> results(static_cast<std::size_t>(P));
  in_process_group(P).run([&](in_process_transport& t) {
    std::vector<float> data = gradient_of(t.rank(), n);
    rank_result& r = results[static_cast<std::size_t>(t.rank())];
    r.sent = call(Exec{}, t, data);
    r.values = std::move(data);
  });
  return results;
}

/// The same call on reference_executor and cpu_executor: the same bits and bytes sent on every rank.
template <class Call>
std::vector<rank_result> same_on_both(int P, std::size_t n, Call call) {
  const auto ref = run_on<reference_executor>(P, n, call);
  const auto cpu = run_on<cpu_executor>(P, n, call);
  for (int r = 0; r < P; ++r) {
    CAPTURE(r);
    CHECK(bit_patterns(ref[static_cast<std::size_t>(r)].values) ==
          bit_patterns(cpu[static_cast<std::size_t>(r)].values));
    CHECK(ref[static_cast<std::size_t>(r)].sent == cpu[static_cast<std::size_t>(r)].sent);
  }
  return ref;
}

/// The rank-order sum of what the reference decodes from each rank's message of gradient_of(r, n).
template <class Codec>
std::vector<float> sum_of_reference_decodes(const Codec& codec, int P, std::size_t n, message_key key) {
  const reference_executor ref;
  std::vector<float> sum(n, 0.0f);
  for (int r = 0; r < P; ++r) {
    const std::vector<float> g = gradient_of(r, n);
    std::vector<std::byte> message(codec.max_encoded_bytes(n));
    std::vector<std::byte> ws(codec.workspace_bytes(ref, n));
    message.resize(codec.encode(ref, std::span<const float>(g), message, ws, key));
    codec.decode_accumulate(ref, message, std::span<float>(sum), ws);
  }
  return sum;
}

}  // namespace

TEST_CASE("compressed_all_reduce on reference_executor: gather_decode, scatter_reduce and ring as on cpu_executor") {
  const message_key key{.step = 4, .tensor_id = 1};
  const topk_sparsifier<float> topk(sparsity{.density = 0.05});
  const uniform_quantizer<float> q4(uniform_params{.bits = 4});
  for (int P : {1, 3, 4}) {
    for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{1000}, std::size_t{4097}}) {
      CAPTURE(P);
      CAPTURE(n);
      const auto gathered = same_on_both(P, n, [&](const auto& e, in_process_transport& t, std::vector<float>& d) {
        return compressed_all_reduce(e, t, topk, std::span<float>(d),
                                     {.key = key, .plan = all_reduce_plan::gather_decode})
            .sent_bytes;
      });
      const std::vector<float> expected = sum_of_reference_decodes(topk, P, n, key);
      for (const rank_result& r : gathered) CHECK(bit_patterns(r.values) == bit_patterns(expected));

      same_on_both(P, n, [&](const auto& e, in_process_transport& t, std::vector<float>& d) {
        return compressed_all_reduce(e, t, q4, std::span<float>(d), {.key = key, .plan = all_reduce_plan::ring})
            .sent_bytes;
      });
      same_on_both(P, n, [&](const auto& e, in_process_transport& t, std::vector<float>& d) {
        return compressed_all_reduce(e, t, q4, std::span<float>(d),
                                     {.key = key, .plan = all_reduce_plan::scatter_reduce, .average = true})
            .sent_bytes;
      });
    }
  }
}

TEST_CASE("compressed_all_reduce on reference_executor: summed encodings of random-k and the shared-scale quantizer") {
  const message_key key{.step = 9, .tensor_id = 2};
  const randomk_sparsifier<float> rk(randomk_params{.amount = sparsity{.density = 0.1}, .seed = 7});
  const shared_scale_quantizer<float> shared(shared_scale_params{.bits = 4});
  for (int P : {2, 4}) {
    for (std::size_t n : {std::size_t{1}, std::size_t{777}, std::size_t{4096}}) {
      CAPTURE(P);
      CAPTURE(n);
      same_on_both(P, n, [&](const auto& e, in_process_transport& t, std::vector<float>& d) {
        return compressed_all_reduce(e, t, rk, std::span<float>(d), {.key = key}).sent_bytes;
      });
      same_on_both(P, n, [&](const auto& e, in_process_transport& t, std::vector<float>& d) {
        return compressed_all_reduce(e, t, shared, std::span<float>(d), {.key = key}).sent_bytes;
      });
    }
  }
}

TEST_CASE("compressed_reduce_scatter and compressed_all_gather on reference_executor, as on cpu_executor") {
  const message_key key{.step = 2, .tensor_id = 8};
  const qsgd_quantizer<float> qsgd(qsgd_params{.levels = 7, .seed = 3});
  constexpr int P = 4;
  for (std::size_t n : {std::size_t{0}, std::size_t{5}, std::size_t{1001}}) {
    CAPTURE(n);
    same_on_both(P, n, [&](const auto& e, in_process_transport& t, std::vector<float>& d) {
      std::vector<float> out(static_cast<std::size_t>(ring_chunk_of(n, P, t.rank()).count));
      const std::size_t sent =
          compressed_reduce_scatter(e, t, qsgd, std::span<const float>(d), std::span<float>(out), {.key = key})
              .sent_bytes;
      d = out;
      return sent;
    });
    same_on_both(P, n, [&](const auto& e, in_process_transport& t, std::vector<float>& d) {
      std::vector<float> all(d.size() * static_cast<std::size_t>(P));
      const std::size_t sent =
          compressed_all_gather(e, t, qsgd, std::span<const float>(d), std::span<float>(all), {.key = key}).sent_bytes;
      d = all;
      return sent;
    });
  }
}

TEST_CASE(
    "stateful collectives on reference_executor: error feedback and LoCo, chunk and server states, as on cpu_executor") {
  const error_feedback ef(topk_sparsifier<float>(sparsity{.density = 0.05}), {.decay = 0.9});
  const loco lc(uniform_quantizer<float>(uniform_params{.bits = 4}));
  for (int P : {1, 3, 4}) {
    for (std::size_t n : {std::size_t{2}, std::size_t{1500}, std::size_t{4099}}) {
      CAPTURE(P);
      CAPTURE(n);
      // Three steps each: gather_decode with the wrapper's own state, then scatter_reduce with a
      // state per chunk and the server's; the bits of the last step and the bytes of all three.
      const auto steps = [&](const auto& wrapper) {
        return [&](const auto& e, in_process_transport& t, std::vector<float>& d) {
          auto own = wrapper.make_state(e, n);
          auto chunks = make_chunk_states(e, wrapper, n, P);
          auto server = make_server_state(e, wrapper, n, P, t.rank());
          std::size_t sent = 0;
          std::vector<float> last;
          for (std::uint64_t s = 0; s < 3; ++s) {
            std::vector<float> a = gradient_of(t.rank(), n, s), b = a;
            sent += compressed_all_reduce(e, t, wrapper, own, std::span<float>(a), {.key = {.step = s}}).sent_bytes;
            sent += compressed_all_reduce(e, t, wrapper, std::span(chunks), server, std::span<float>(b),
                                          {.key = {.step = s}})
                        .sent_bytes;
            last = a;
            last.insert(last.end(), b.begin(), b.end());
          }
          d = last;
          return sent;
        };
      };
      same_on_both(P, n, steps(ef));
      same_on_both(P, n, steps(lc));
    }
  }
}

}  // namespace gradcomp::test
