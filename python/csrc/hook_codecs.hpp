#pragma once
// The codecs the PyTorch package offers, for the extension and replay_mpi alike: the rows of the
// training examples' table (examples/train/codec_table.hpp), then a homomorphic codec, whose messages the
// ranks add with a SUM all-reduce instead of all-gathering them (the shared-scale 4-bit quantizer:
// block maxima agreed by a MAX all-reduce, codes in 7-bit fields with 3 headroom bits, so up to 8
// ranks), top-k 1% with decayed error feedback (β = 0.9), top-k 3% and 5% with error feedback, the variant for Adam-trained models
// (docs/feedback.md §7), 2-bit LoCo variants and 4- and 1-bit ones, batched PowerSGD, GraVAC with
// its back-off, GraVAC over bit widths, and TAGC with the shards' all-gather re-sparsified.
#include <gradcomp/gradcomp.hpp>

#include <map>
#include <string>

#include "../../examples/train/codec_table.hpp"

namespace gradcomp_torch {

/// The name of the hook's row that sends `bits`-bit uniform codes, a scale per 64 values, with LoCo
/// at β = 0.95: a width of the GraVAC ladder.
inline std::string ladder_row(int bits) {
  return "uniform " + std::to_string(bits) + "-bit, blocks of 64 + LoCo beta 0.95";
}

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
  // With the 4- and 1-bit rows alike, the widths of the GraVAC ladder below.
  for (const int bits : {4, 2, 1})
    visitor.codec(ladder_row(bits).c_str(),
                  gradcomp::loco(gradcomp::uniform_quantizer<float>({.bits = bits, .block = 64}),
                                 {.beta = 0.95f, .error_group = 64}));
  visitor.codec("uniform 2-bit SR + LoCo", gradcomp::loco(gradcomp::uniform_quantizer<float>(
                                               {.bits = 2, .round = gradcomp::rounding::stochastic, .seed = 3})));
  // TAGC at f* = 0.95 whose owners re-sparsify their shards of the mean to the same 5% for the
  // all-gather, with a residual of their own (tagc_bucket.hpp): the lossless gather sends the union
  // of the ranks' supports, which grows with P (docs/lm-hook-runs.md §2).
  visitor.tagc("TAGC f*=0.95 (sharded), re-sparsified gather",
               gradcomp::tagc_params{.sparsify = {.zero_fraction = 0.95}, .sketch = {.block = 128}}, 0.95);
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
  // GraVAC over bit widths (gravac_ladder.hpp, docs/control.md §1.8): θ = bits/32 from 4 bits (the
  // safe level) down to 1, each width sent by its row above (scatter_reduce, LoCo β = 0.95). The
  // gain is the energy of g that Q_b(g) keeps; on the LM task 4 bits keep 0.99 of it, 2 bits
  // 0.48-0.67 and 1 bit at most 0.02 (lm/gravac_ladder_gains.txt), so ε = 0.4 takes 2 bits and
  // backs off from 1.
  visitor.gravac_ladder("GraVAC uniform 4..1 bits, blocks of 64 + LoCo beta 0.95",
                        gradcomp::gravac_options{.theta_min = 4.0 / 32,
                                                 .theta_max = 1.0 / 32,
                                                 .epsilon = 0.4,
                                                 .window = 20,
                                                 .measure = gradcomp::gravac_gain_measure::kept_energy,
                                                 .gain_input = gradcomp::gravac_gain_input::gradient,
                                                 .back_off = true},
                        64, std::map<int, std::string>{{4, ladder_row(4)}, {2, ladder_row(2)}, {1, ladder_row(1)}});
}

}  // namespace gradcomp_torch
