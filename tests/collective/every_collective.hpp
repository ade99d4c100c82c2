#pragma once
// Every compressed collective, with every codec family, instantiated for one executor and one
// transport: the compile test of the executor-generic collectives (tests/cuda/test_collectives_compile.cu
// instantiates it for cuda_executor with the device transports and for cpu_executor with every host
// transport, so that CI, which compiles CUDA without a GPU, catches a combination that no longer
// builds). Never run.
#include <gradcomp/gradcomp.hpp>

#include <span>

namespace gradcomp::test {

using ef_topk = error_feedback<topk_sparsifier<float>>;
using loco_uniform = loco<uniform_quantizer<float>>;

/// The states the stateful calls take on executor E.
template <class E>
struct every_state {
  state_type_of<ef_topk, E>& ef;
  std::span<state_type_of<ef_topk, E>> ef_chunks;
  state_type_of<loco_uniform, E>& loco;
  std::span<state_type_of<loco_uniform, E>> loco_chunks;
  tagc_state<float, E>& tagc;
};

/// Calls every collective of `codec` (stateless) on E and X.
template <executor E, transport X, class C>
void every_stateless_collective(const E& e, X& t, const C& codec, std::span<float> data, std::span<const float> in) {
  (void)compressed_all_reduce(e, t, codec, data, {.average = true});
  (void)compressed_reduce_scatter(e, t, codec, in, data, {.average = true});
  (void)compressed_all_gather(e, t, codec, in, data);
  (void)compressed_all_reduce(e, t, codec, data, {.dense_steps = 1});
  auto server = make_server_state(e, codec, data.size(), t.size(), t.rank());
  (void)compressed_all_reduce(e, t, codec, server, data, {.average = true});
  if constexpr (detail::can_all_to_all<X>)
    (void)compressed_all_reduce(e, t, codec, data, {.plan = all_reduce_plan::scatter_reduce});
  if constexpr (transport_with_point_to_point<X>) {
    (void)ring_all_reduce(e, t, codec, data);
    (void)ring_reduce_scatter(e, t, codec, in, data);
    (void)compressed_send(e, t, codec, in, 0);
    (void)compressed_recv(e, t, codec, data, 0);
  }
}

/// Every collective with every codec family on E and X.
template <executor E, transport X>
void every_collective(const E& e, X& t, std::span<float> data, std::span<const float> in, every_state<E> states) {
  every_stateless_collective(e, t, topk_sparsifier<float>(sparsity{.density = 0.01}), data, in);
  every_stateless_collective(e, t, randomk_sparsifier<float>(), data, in);
  every_stateless_collective(e, t, threshold_sparsifier<float>(), data, in);
  every_stateless_collective(e, t, uniform_quantizer<float>(), data, in);
  every_stateless_collective(e, t, sign_quantizer<float>(), data, in);
  every_stateless_collective(e, t, qsgd_quantizer<float>(), data, in);
  every_stateless_collective(e, t, shared_scale_quantizer<float>(), data, in);
  every_stateless_collective(e, t, count_sketch<float>(), data, in);
  every_stateless_collective(e, t, mpc_codec<float>(), data, in);
  every_stateless_collective(e, t, zfp_fixed_rate_codec<float>(), data, in);
  every_stateless_collective(e, t, pipeline<topk_sparsifier<float>, uniform_quantizer<float>>(), data, in);
  const ef_topk ef;
  (void)compressed_all_reduce(e, t, ef, states.ef, data);
  (void)compressed_reduce_scatter(e, t, ef, states.ef_chunks, in, data);
  (void)compressed_all_reduce(e, t, ef, states.ef_chunks, states.ef, data);
  const loco_uniform lc;
  (void)compressed_all_reduce(e, t, lc, states.loco, data);
  (void)compressed_reduce_scatter(e, t, lc, states.loco_chunks, in, data);
  (void)compressed_all_reduce(e, t, lc, states.loco_chunks, states.loco, data, {.dense_steps = 2});
  (void)compressed_all_reduce(e, t, lossless_homomorphic<float>(), data);
  (void)compressed_reduce_scatter(e, t, tagc<float>(), states.tagc, in, data);
}

}  // namespace gradcomp::test
