// `automatic` chooses between scatter_reduce and gather_decode by the bytes the codec sends: for
// top-k 1% the plans' real `report.sent_bytes` from an in-process run of each (the oracle) decide
// which plan is cheaper on rank 0, and `automatic_plan` must pick that one; the cost model with
// `modelled_encoded_bytes` equals those real bytes on every rank.
#include <gradcomp/collective/all_reduce_cost.hpp>
#include <gradcomp/collective/compressed_all_reduce.hpp>
#include <gradcomp/sparsify/topk.hpp>
#include <gradcomp/transport/in_process.hpp>

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "collective_checks.hpp"

namespace gradcomp::test {
namespace {

// Bytes every rank sent in one all-reduce of gradient_of(r, n) by `plan`, with a server state.
template <class C>
std::vector<std::uint64_t> sent_bytes(const C& codec, std::size_t n, int P, all_reduce_plan plan) {
  std::vector<std::uint64_t> sent(static_cast<std::size_t>(P));
  in_process_group(P).run([&](in_process_transport& t) {
    const cpu_executor cpu;
    auto server = make_server_state(cpu, codec, n, t.size(), t.rank());
    auto data = gradient_of(t.rank(), n);
    sent[static_cast<std::size_t>(t.rank())] =
        compressed_all_reduce(cpu, t, codec, server, std::span<float>(data), {.plan = plan}).sent_bytes;
  });
  return sent;
}

}  // namespace

TEST_CASE("automatic picks the plan that sends fewer real bytes for top-k 1%, and the model equals them") {
  const topk_sparsifier<float> topk(sparsity{.density = 0.01});
  const auto model = [&](std::uint64_t m) { return modelled_encoded_bytes(topk, m); };
  for (const std::size_t n : {std::size_t{2080}, std::size_t{1} << 20}) {
    for (const int P : {3, 4, 8}) {
      CAPTURE(n);
      CAPTURE(P);
      const auto gather = sent_bytes(topk, n, P, all_reduce_plan::gather_decode);
      const auto scatter = sent_bytes(topk, n, P, all_reduce_plan::scatter_reduce);
      const auto chosen = sent_bytes(topk, n, P, all_reduce_plan::automatic);
      const bool scatter_cheaper = scatter[0] < gather[0];
      CHECK(automatic_plan(topk, n, P, true) ==
            (scatter_cheaper ? all_reduce_plan::scatter_reduce : all_reduce_plan::gather_decode));
      CHECK(chosen == (scatter_cheaper ? scatter : gather));
      for (int r = 0; r < P; ++r) {
        CAPTURE(r);
        CHECK(gather[static_cast<std::size_t>(r)] == gather_decode_cost(n, P, model).sent_bytes);
        CHECK(scatter[static_cast<std::size_t>(r)] == scatter_reduce_cost(n, P, r, model).sent_bytes);
      }
    }
  }
  // The case the worst-case size got wrong: 2,080 values over 3 ranks, where scatter_reduce sends
  // 560 bytes from rank 0 and gather_decode 504 (max_encoded_bytes, 8,664 bytes for 2,080 values,
  // made scatter_reduce look cheaper).
  CHECK(sent_bytes(topk, 2080, 3, all_reduce_plan::scatter_reduce)[0] == 560);
  CHECK(sent_bytes(topk, 2080, 3, all_reduce_plan::gather_decode)[0] == 504);
  CHECK(automatic_plan(topk, 2080, 3, true) == all_reduce_plan::gather_decode);
  const auto worst = [&](std::uint64_t m) { return topk.max_encoded_bytes(m); };
  CHECK(scatter_reduce_cost(2080, 3, 0, worst).sent_bytes < gather_decode_cost(2080, 3, worst).sent_bytes);
}

}  // namespace gradcomp::test
