#pragma once
// The codecs the PyTorch example offers, for the extension and replay_mpi alike: the rows of the
// training examples' table (train/codec_table.hpp), then a homomorphic codec, whose messages the
// ranks add with a SUM all-reduce instead of all-gathering them (the shared-scale 4-bit quantizer:
// block maxima agreed by a MAX all-reduce, codes in 7-bit fields with 3 headroom bits, so up to 8
// ranks), and top-k 1% with decayed error feedback (β = 0.9), the variant for Adam-trained models
// (docs/feedback.md §7).
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
}

}  // namespace gradcomp_torch
