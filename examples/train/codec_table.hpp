#pragma once
// The codecs the training examples compare, in the order of the demo's table, written once for
// both programs: `visit_codecs(visitor, batch)` calls, row by row,
//   visitor.dense(name)                    the uncompressed baseline (first row)
//   visitor.codec(name, codec)             any gradcomp codec, stateless or stateful (error
//                                          feedback, LoCo): each worker encodes its gradient and
//                                          every worker decodes every message in rank order
//   visitor.ring(name, codec)              the hybrid scheme's ring all-reduce with `codec`
//   visitor.sketched_sgd(name, sketch)     sketched SGD with a count sketch and a second exact round
//   visitor.tagc(name, params)             TAGC, every tensor reduce-scattered (sharded training)
//   visitor.gravac(name, options, batch)   GraVAC choosing the top-k density
//   visitor.powersgd(name, params)         PowerSGD, every tensor all-reduced as a low-rank matrix
// train_demo.cpp turns every row into an aggregator over simulated workers; mpi_train runs the rows
// its ranks can aggregate over a real transport.
#include <gradcomp/gradcomp.hpp>

#include <cstddef>
#include <cstdint>

namespace train {

template <class Visitor>
void visit_codecs(Visitor& visitor, std::size_t batch) {
  using namespace gradcomp;
  const sparsity one_percent{.density = 0.01};
  visitor.dense("dense");
  visitor.codec("top-k 1%", topk_sparsifier<float>(one_percent));
  visitor.codec("top-k 1% + EF", error_feedback(topk_sparsifier<float>(one_percent)));
  // Unscaled: under EF the n/k scaling of unbiased random-k only inflates the residual.
  visitor.codec("random-k 1% + EF",
                error_feedback(randomk_sparsifier<float>({.amount = one_percent, .seed = 7, .scaled = false})));
  visitor.codec("threshold 1% + EF", error_feedback(threshold_sparsifier<float>({.target = one_percent})));
  visitor.codec("uniform 4-bit", uniform_quantizer<float>({.bits = 4}));
  visitor.codec("uniform 4-bit + LoCo", loco(uniform_quantizer<float>({.bits = 4})));
  visitor.codec("uniform 2-bit", uniform_quantizer<float>({.bits = 2}));
  visitor.codec("uniform 2-bit + LoCo", loco(uniform_quantizer<float>({.bits = 2})));
  visitor.codec("sign + EF", error_feedback(sign_quantizer<float>()));
  visitor.codec("top-k 1% + 8-bit values + EF",
                error_feedback(pipeline(topk_sparsifier<float>(one_percent), uniform_quantizer<float>({.bits = 8}))));
  visitor.codec("QSGD 7 levels", qsgd_quantizer<float>({.levels = 7, .seed = 5}));
  visitor.codec("uniform 4-bit SR + EF",
                error_feedback(uniform_quantizer<float>({.bits = 4, .round = rounding::stochastic, .seed = 3})));
  // Sketched SGD: 3 x 512 sketches choose the 5% heavy hitters of the sum, whose exact values
  // travel in a second round; EF keeps the rest.
  visitor.sketched_sgd("count sketch 3x512 + 5% exact + EF",
                       count_sketch<float>(
                           {.rows = 3, .columns = 512, .seed = 11, .heavy_hitters = {.density = 0.05}}));
  // Sharded: each tensor reduce-scattered; the weights through TAGC (the biases dense, by TAGC's
  // layer policy). Blocks of 128 suit the demo's 2048-value shards.
  visitor.tagc("TAGC f*=0.80 (sharded)", tagc_params{.sparsify = {.zero_fraction = 0.80}, .sketch = {.block = 128}});
  visitor.tagc("TAGC f*=0.95 (sharded)", tagc_params{.sparsify = {.zero_fraction = 0.95}, .sketch = {.block = 128}});
  // The hybrid scheme's float codecs: ZFP fixed rate (8 bits per value) all-gathered (each
  // gradient encoded once), and the ring all-reduce (decode, add, re-encode at every hop) with
  // MPC (lossless) and ZFP (the error of P encodings per chunk).
  visitor.codec("ZFP R=8", zfp_fixed_rate_codec<float>(zfp_params{.rate_bits = 8}));
  visitor.ring("MPC ring all-reduce (lossless)", mpc_codec<float>());
  visitor.ring("ZFP R=8 ring all-reduce", zfp_fixed_rate_codec<float>(zfp_params{.rate_bits = 8}));
  // GraVAC searches top-k densities from 10% down to 0.1%, one window of 20 steps each, and
  // sends the most aggressive one whose gain (‖C(g)‖ / ‖g‖, EWMA) stays above 0.75. Both
  // paths keep their residuals every step (the reference's choice): with `sent_path_only`
  // a candidate that was never sent has no residual, its gain stays below 0.75 on this
  // model, and the run sends θ_min throughout (7.5x).
  visitor.gravac(
      "GraVAC top-k 10%..0.1% + EF",
      gravac_options{.theta_min = 0.1, .theta_max = 0.001, .window = 20, .feedback = gravac_feedback::both_paths},
      batch);
  // PowerSGD at ranks 1, 2 and 4 (warm start, the shared error of PyTorch's hook): both weight
  // matrices compressed (fc2's 10 x 128 only up to r = 4 by the (a + b)·r < a·b / 2 rule), the
  // biases sent dense.
  for (const std::uint32_t r : {1u, 2u, 4u})
    visitor.powersgd(r == 1 ? "PowerSGD r=1" : r == 2 ? "PowerSGD r=2" : "PowerSGD r=4", powersgd_params{.rank = r});
}

}  // namespace train
