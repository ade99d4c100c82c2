#pragma once
// The codecs the PyTorch example offers, for the extension and replay_mpi alike: the rows of the
// training examples' table (train/codec_table.hpp), then a homomorphic codec, whose messages the
// ranks add with a SUM all-reduce instead of all-gathering them (the shared-scale 4-bit quantizer:
// block maxima agreed by a MAX all-reduce, codes in 7-bit fields with 3 headroom bits, so up to 8
// ranks), top-k 1% with decayed error feedback (β = 0.9), top-k 3% and 5% with error feedback, the variant for Adam-trained models
// (docs/feedback.md §7), four 2-bit LoCo variants, batched PowerSGD, and GraVAC with its back-off.
#include <gradcomp/gradcomp.hpp>

#include "../train/codec_table.hpp"

namespace gradcomp_torch {

template <class Visitor>
void visit_hook_codecs(Visitor& visitor) {
  train::visit_codecs(visitor, 0);
  visitor.codec("uniform 4-bit shared scale (summed)",
                gradcomp::shared_scale_quantizer<float>({.bits = 4, .headroom_bits = 3}));
  visitor.codec("top-k 1% + EF decay 0.9",
                gradcomp::error_feedback(gradcomp::topk_sparsifier<float>(gradcomp::sparsity{.density = 0.01}),
                                         {.decay = 0.9}));
  // The sparsification curve through the hook (docs/lm-hook-runs.md §2): top-k with error feedback
  // at the densities around the curve's knee (docs/feedback.md §10.5), where 10x saved within 5% is
  // nearest.
  visitor.codec("top-k 3% + EF",
                gradcomp::error_feedback(gradcomp::topk_sparsifier<float>(gradcomp::sparsity{.density = 0.03})));
  visitor.codec("top-k 5% + EF",
                gradcomp::error_feedback(gradcomp::topk_sparsifier<float>(gradcomp::sparsity{.density = 0.05})));
  // 2-bit LoCo variants for the large-batch gap (docs/lm-hook-runs.md §2): a scale per 64 values
  // instead of 256 (2.5 bits per value), and stochastic rounding (unbiased codes).
  visitor.codec("uniform 2-bit, blocks of 64 + LoCo",
                gradcomp::loco(gradcomp::uniform_quantizer<float>({.bits = 2, .block = 64}), {.error_group = 64}));
  // LoCo's β above its default 0.8: the error averaged over more steps (docs/lm-hook-runs.md §2);
  // with a scale per 64 values, the row that keeps 2-bit LoCo within 5% at P = 16 (12.47×).
  visitor.codec("uniform 2-bit + LoCo beta 0.9",
                gradcomp::loco(gradcomp::uniform_quantizer<float>({.bits = 2}), {.beta = 0.9f}));
  visitor.codec("uniform 2-bit, blocks of 64 + LoCo beta 0.95",
                gradcomp::loco(gradcomp::uniform_quantizer<float>({.bits = 2, .block = 64}),
                               {.beta = 0.95f, .error_group = 64}));
  visitor.codec("uniform 2-bit SR + LoCo", gradcomp::loco(gradcomp::uniform_quantizer<float>(
                                               {.bits = 2, .round = gradcomp::rounding::stochastic, .seed = 3})));
  // PowerSGD as PyTorch's batched_powerSGD_hook: each bucket padded to one square matrix.
  visitor.powersgd("PowerSGD r=4, batched", gradcomp::powersgd_params{.rank = 4}, true);
  // The table's GraVAC row with the back-off (docs/control.md §1.1): the gain measured on the
  // gradient without its residual, and θ_cur raised when that gain is below ε at a window's end.
  visitor.gravac("GraVAC top-k 10%..0.1% + EF, back-off",
                 gradcomp::gravac_options{.theta_min = 0.1,
                                          .theta_max = 0.001,
                                          .window = 20,
                                          .feedback = gradcomp::gravac_feedback::both_paths,
                                          .gain_input = gradcomp::gravac_gain_input::gradient,
                                          .back_off = true},
                 0);
}

}  // namespace gradcomp_torch
