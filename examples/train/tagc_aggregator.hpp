#pragma once
// TAGC in the training demo: the workers are ranks of an in-process group, and every step each
// parameter tensor is reduce-scattered as a sharded trainer (FSDP, ZeRO) would do it. The layer
// policy decides per tensor: compressed tensors go through gradcomp's TAGC scheme (dynamic
// sparsification with error feedback, LHC index and sketch, peeling on the shard owner), the others
// through a plain fp32 reduce-scatter. Each tensor is padded with zeros to a multiple of the
// number of workers, as FSDP pads its flat parameters. The shards of the mean are then gathered
// into the model's flat gradient (the all-gather of a sharded trainer; not counted as gradient
// bytes here, since a sharded trainer all-gathers parameters whatever the codec).
#include <gradcomp/gradcomp.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "compressor.hpp"
#include "mlp.hpp"

namespace train {

/// Which tensors of `layout` the policy compresses with TAGC.
inline std::vector<bool> tagc_compressed_tensors(const gradcomp::layer_policy<gradcomp::tagc_treatment>& policy,
                                                 const std::vector<parameter>& layout) {
  std::vector<bool> compressed;
  for (const parameter& p : layout) {
    const std::uint64_t matrix[2] = {p.rows, p.cols};
    const std::uint64_t vector[1] = {p.cols};
    const std::span<const std::uint64_t> shape =
        p.rows == 1 ? std::span<const std::uint64_t>(vector) : std::span<const std::uint64_t>(matrix);
    const gradcomp::layer_info info{p.name, gradcomp::infer_layer_kind(p.name, shape.size()), p.size(), shape};
    compressed.push_back(policy.choose(info) == gradcomp::tagc_treatment::compressed);
  }
  return compressed;
}

/// One rank's step: every tensor of `layout` reduce-scattered (zero-padded to P equal shards) over
/// `t`, through TAGC where `compressed` says so, else a plain fp32 reduce-scatter divided by P;
/// `shard_done(tensor, first, values)` receives this rank's part of the tensor's mean, values
/// [first, first + values.size()) of the tensor. Tensor l keys its error feedback as
/// `tensor_ids[l]` (default: l). Returns the gradient bytes this rank sent.
template <gradcomp::transport X, class ShardDone>
std::size_t tagc_rank_step(X& t, const gradcomp::tagc<float>& scheme,
                           gradcomp::tagc_state<float, gradcomp::cpu_executor>& state,
                           const std::vector<parameter>& layout, const std::vector<bool>& compressed,
                           std::span<const float> grad, ShardDone shard_done,
                           std::span<const std::uint32_t> tensor_ids = {}) {
  const auto P = static_cast<std::size_t>(t.size());
  const auto r = static_cast<std::size_t>(t.rank());
  std::size_t sent = 0;
  std::vector<float> padded, shard;
  for (std::size_t l = 0; l < layout.size(); ++l) {
    const parameter& p = layout[l];
    const std::size_t m = (p.size() + P - 1) / P;
    padded.assign(P * m, 0.0f);
    std::copy_n(grad.begin() + static_cast<std::ptrdiff_t>(p.offset), p.size(), padded.begin());
    shard.resize(m);
    if (compressed[l]) {
      const auto id = tensor_ids.empty() ? static_cast<std::uint32_t>(l) : tensor_ids[l];
      sent += gradcomp::compressed_reduce_scatter(gradcomp::cpu_executor{}, t, scheme, state,
                                                  std::span<const float>(padded), std::span<float>(shard),
                                                  {.key = {.tensor_id = id}, .average = true})
                  .sent_bytes;
    } else {
      t.reduce_scatter_sum(std::span<const float>(padded), std::span<float>(shard));
      for (float& v : shard) v /= static_cast<float>(P);
      sent += padded.size() * sizeof(float);
    }
    const std::size_t first = r * m;
    const std::size_t count = first < p.size() ? std::min(m, p.size() - first) : 0;
    shard_done(l, first, std::span<const float>(shard).first(count));
  }
  return sent;
}

/// `tagc_rank_step`, then the shards of the mean all-gathered (a sharded trainer's parameter
/// all-gather, not counted in the returned gradient bytes), so that `grad` becomes the whole mean
/// on every rank.
template <gradcomp::transport X>
std::size_t tagc_rank_all_reduce(X& t, const gradcomp::tagc<float>& scheme,
                                 gradcomp::tagc_state<float, gradcomp::cpu_executor>& state,
                                 const std::vector<parameter>& layout, const std::vector<bool>& compressed,
                                 std::span<float> grad, std::span<const std::uint32_t> tensor_ids = {}) {
  const auto P = static_cast<std::size_t>(t.size());
  std::vector<float> mine;  // this rank's shards of every tensor's mean, in tensor order
  const std::size_t sent = tagc_rank_step(
      t, scheme, state, layout, compressed, std::span<const float>(grad),
      [&](std::size_t, std::size_t, std::span<const float> values) {
        mine.insert(mine.end(), values.begin(), values.end());
      },
      tensor_ids);
  const auto shards = t.all_gather_bytes(std::as_bytes(std::span<const float>(mine)));
  for (std::size_t q = 0; q < P; ++q) {
    const std::byte* from = shards[q].data();
    for (const parameter& p : layout) {
      const std::size_t m = (p.size() + P - 1) / P, first = q * m;
      const std::size_t count = first < p.size() ? std::min(m, p.size() - first) : 0;
      std::memcpy(grad.data() + p.offset + first, from, count * sizeof(float));
      from += count * sizeof(float);
    }
  }
  return sent;
}

class tagc_aggregator final : public aggregator {
 public:
  tagc_aggregator(gradcomp::tagc_params params, const gradcomp::layer_policy<gradcomp::tagc_treatment>& policy,
                  const std::vector<parameter>& layout, std::size_t workers)
      : tagc_(params),
        group_(static_cast<int>(workers)),
        layout_(layout),
        compressed_(tagc_compressed_tensors(policy, layout)) {
    for (std::size_t w = 0; w < workers; ++w) states_.push_back(tagc_.make_state(gradcomp::cpu_executor{}));
  }

  step_cost aggregate(const std::vector<std::vector<float>>& grads, std::span<float> mean, std::uint64_t) override {
    step_cost cost;
    std::mutex mutex;
    group_.run([&](gradcomp::in_process_transport& t) {
      const auto r = static_cast<std::size_t>(t.rank());
      const auto started = clock_type::now();
      // The gather of the shards: each rank writes its own part of each tensor into `mean`.
      const std::size_t sent =
          tagc_rank_step(t, tagc_, states_[r], layout_, compressed_, grads[r],
                         [&](std::size_t l, std::size_t first, std::span<const float> values) {
                           std::copy(values.begin(), values.end(),
                                     mean.begin() + static_cast<std::ptrdiff_t>(layout_[l].offset + first));
                         });
      const auto elapsed = clock_type::now() - started;
      const std::lock_guard lock(mutex);
      cost.bytes += sent;
      cost.encode += elapsed;
    });
    return cost;
  }

  /// Peeling runs inside the collective: its time is part of the encode column.
  [[nodiscard]] bool times_decode() const override { return false; }

 private:
  gradcomp::tagc<float> tagc_;
  gradcomp::in_process_group group_;
  std::vector<parameter> layout_;
  std::vector<bool> compressed_;
  std::vector<gradcomp::tagc_state<float, gradcomp::cpu_executor>> states_;
};

/// A demo row running TAGC with `params` and TAGC's layer policy (weights compressed, biases dense).
inline codec_entry tagc_entry(std::string name, gradcomp::tagc_params params) {
  return {std::move(name),
          [params](const std::vector<parameter>& layout, std::size_t workers) -> std::unique_ptr<aggregator> {
            return std::make_unique<tagc_aggregator>(params, gradcomp::tagc_layer_policy(), layout, workers);
          }};
}

}  // namespace train
