#pragma once
// TAGC over a DDP bucket (docs/pytorch.md): the mean of the bucket in three collectives, whatever
// the number of tensors in it. The tensors TAGC's layer policy compresses are concatenated and go
// through ONE TAGC reduce-scatter (keyed by the bucket); the others are concatenated and go through
// ONE uncompressed reduce-scatter; then the shards are all-gathered (every rank ends with the same
// bits): the sparse part's as a top-k message keeping every non-zero, or, where the row asks for it,
// re-sparsified by their owner with a second-level error feedback (`resparsified_gather`); the dense
// part's in MPC frames. Each concatenation is padded with zeros to P equal shards. The bytes are
// counted as ring collectives send them, the basis of the dense baseline (a ring all-reduce sends
// 2(P − 1)/P of the bucket).
#include <gradcomp/gradcomp.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cmath>
#include <optional>
#include <span>
#include <vector>

#include "../../examples/train/mlp.hpp"

namespace gradcomp_torch {

/// What one rank sends in `tagc_bucket_all_reduce`, by part, in bytes.
struct tagc_bucket_bytes {
  std::size_t index = 0;  ///< TAGC's index all-reduce: 2(P − 1)/P of the P indexes.
  std::size_t sketch = 0;  ///< TAGC's sketch reduce-scatter: (P − 1)/P of the P sketches...
  std::size_t tail = 0;  ///< ... of the P uncompressed tails ...
  std::size_t padding = 0;  ///< ... and of the zeros padding each segment to the longest.
  std::size_t resent = 0;  ///< (P − 1)/P of the chunks resent after a stall.
  std::size_t dense = 0;  ///< The uncompressed tensors' reduce-scatter: (P − 1) shards.
  std::size_t gather = 0;  ///< The all-gathers: this rank's two frames to each of the P − 1 others.
  [[nodiscard]] std::size_t total() const noexcept { return index + sketch + tail + padding + resent + dense + gather; }
  /// Adds another call's bytes, part by part.
  tagc_bucket_bytes& operator+=(const tagc_bucket_bytes& b) noexcept {
    index += b.index;
    sketch += b.sketch;
    tail += b.tail;
    padding += b.padding;
    resent += b.resent;
    dense += b.dense;
    gather += b.gather;
    return *this;
  }
};

/// The all-gather of the compressed part's shards, re-sparsified by their owners (a row's option,
/// docs/lm-hook-runs.md §2): the union of P ranks' kept values grows with P (1 − f*^P of the part for
/// independent supports: 56% at P = 16 and f* = 0.95), so the lossless gather of the peeled shards
/// costs more with every rank. Instead each owner adds its residual to its shard of the mean, sends
/// the k = m − ⌊zero_fraction·m⌋ values of largest magnitude (top-k, exactly; the dynamic
/// sparsifier's count, with the product rounded to double before the floor) and keeps the rest as
/// its residual: a second-level ("server") error feedback like the `scatter_reduce` plan's, so
/// residual + what was sent = shard + previous residual, value for value.
struct resparsified_gather {
  double zero_fraction = 0.95;  ///< The fraction of each shard's values not sent, in [0, 1).
  std::vector<float>* residual = nullptr;  ///< This rank's residual of its shard (zeros when it is not m values).
};

/// The bucket `grad` (the tensors of `layout` one after another) becomes the mean over the ranks of
/// `t`: the tensors `compressed` marks through TAGC (`scheme`, residuals in `state` under
/// `bucket_id`), the others exactly, then every shard all-gathered: losslessly, or the compressed
/// part's re-sparsified as `gather` says (its residual changes only once every collective succeeded).
template <gradcomp::transport X>
tagc_bucket_bytes tagc_bucket_all_reduce(X& t, const gradcomp::tagc<float>& scheme,
                                         gradcomp::tagc_state<float, gradcomp::cpu_executor>& state,
                                         const std::vector<train::parameter>& layout,
                                         const std::vector<bool>& compressed, std::span<float> grad,
                                         std::uint32_t bucket_id, std::optional<resparsified_gather> gather = {}) {
  const gradcomp::cpu_executor cpu;
  const auto P = static_cast<std::size_t>(t.size());
  // The two concatenations, in tensor order.
  std::vector<float> sparse_part, dense_part;
  for (std::size_t l = 0; l < layout.size(); ++l) {
    std::vector<float>& part = compressed[l] ? sparse_part : dense_part;
    const auto first = grad.begin() + static_cast<std::ptrdiff_t>(layout[l].offset);
    part.insert(part.end(), first, first + static_cast<std::ptrdiff_t>(layout[l].size()));
  }
  const std::size_t ms = (sparse_part.size() + P - 1) / P, md = (dense_part.size() + P - 1) / P;
  sparse_part.resize(P * ms, 0.0f);
  dense_part.resize(P * md, 0.0f);

  tagc_bucket_bytes bytes;
  std::vector<float> mine(ms + md);  // this rank's shard of each part
  const std::span<float> my_sparse = std::span<float>(mine).first(ms), my_dense = std::span<float>(mine).subspan(ms);
  const auto ring_share = [P](std::uint64_t b) { return static_cast<std::size_t>(b * (P - 1) / P); };
  if (ms > 0) {
    const gradcomp::tagc_report report =
        gradcomp::compressed_reduce_scatter(cpu, t, scheme, state, std::span<const float>(sparse_part), my_sparse,
                                            {.key = {.tensor_id = bucket_id}, .average = true});
    bytes.index = 2 * ring_share(report.index_bytes);
    bytes.sketch = ring_share(report.sketch_bytes);
    bytes.tail = ring_share(report.tail_bytes);
    bytes.padding = ring_share(report.padding_bytes);
    bytes.resent = ring_share(report.resent_bytes);
  }
  if (md > 0) {
    t.reduce_scatter_sum(std::span<const float>(dense_part), my_dense);
    for (float& v : my_dense) v /= static_cast<float>(P);
    bytes.dense = (P - 1) * md * sizeof(float);
  }

  // The all-gather of the sparse part. Losslessly: its shards hold at most the union of the ranks'
  // kept values, so top-k with k = the most non-zeros any shard holds (a MAX all-reduce of one
  // value) sends them all, exactly, as an index and their values. Re-sparsified: k of each owner's
  // shard plus residual, the same k on every rank (the shards are the same size), so no MAX.
  std::vector<float> all_sparse(P * ms), all_dense(P * md);
  std::vector<float> sent_from;  // re-sparsified: this rank's shard plus its residual
  if (ms > 0 && gather) {
    const std::vector<float>& residual = *gather->residual;
    sent_from.assign(my_sparse.begin(), my_sparse.end());
    if (residual.size() == ms)
      for (std::size_t i = 0; i < ms; ++i) sent_from[i] += residual[i];
    const auto dropped = static_cast<std::uint64_t>(std::floor(gather->zero_fraction * static_cast<double>(ms)));
    const std::uint64_t k = ms - std::min<std::uint64_t>(dropped, ms);
    const gradcomp::topk_sparsifier<float> largest(gradcomp::sparsity{.k = std::max<std::uint64_t>(1, k)});
    bytes.gather += gradcomp::compressed_all_gather(cpu, t, largest, std::span<const float>(sent_from),
                                                    std::span<float>(all_sparse),
                                                    {.key = {.tensor_id = bucket_id}, .measure_error = false})
                        .sent_bytes;
  } else if (ms > 0) {
    double nonzeros = 0.0;
    for (const float v : my_sparse) nonzeros += v != 0.0f ? 1.0 : 0.0;
    t.all_reduce_max(std::span<double>(&nonzeros, 1));
    const gradcomp::topk_sparsifier<float> exact(
        gradcomp::sparsity{.k = std::max<std::uint64_t>(1, static_cast<std::uint64_t>(nonzeros))});
    bytes.gather +=
        gradcomp::compressed_all_gather(cpu, t, exact, std::span<const float>(my_sparse), std::span<float>(all_sparse),
                                        {.key = {.tensor_id = bucket_id}, .measure_error = false})
            .sent_bytes;
  }
  if (md > 0)
    bytes.gather += gradcomp::compressed_all_gather(cpu, t, gradcomp::mpc_codec<float>{},
                                                    std::span<const float>(my_dense), std::span<float>(all_dense),
                                                    {.key = {.tensor_id = bucket_id}, .measure_error = false})
                        .sent_bytes;
  // The owner's new residual: what it did not send (its own block of the gather, decoded exactly).
  if (!sent_from.empty()) {
    const float* sent = all_sparse.data() + static_cast<std::size_t>(t.rank()) * ms;
    std::vector<float>& residual = *gather->residual;
    residual.resize(ms);
    for (std::size_t i = 0; i < ms; ++i) residual[i] = sent_from[i] - sent[i];
  }
  // Shard q of each part is block q of its gather: back into the tensors.
  sparse_part.swap(all_sparse);
  dense_part.swap(all_dense);
  std::size_t at_sparse = 0, at_dense = 0;
  for (std::size_t l = 0; l < layout.size(); ++l) {
    std::size_t& at = compressed[l] ? at_sparse : at_dense;
    const std::vector<float>& part = compressed[l] ? sparse_part : dense_part;
    std::copy_n(part.begin() + static_cast<std::ptrdiff_t>(at), layout[l].size(),
                grad.begin() + static_cast<std::ptrdiff_t>(layout[l].offset));
    at += layout[l].size();
  }
  return bytes;
}

}  // namespace gradcomp_torch
