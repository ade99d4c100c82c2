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
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "compressor.hpp"
#include "mlp.hpp"

namespace train {

class tagc_aggregator final : public aggregator {
 public:
  tagc_aggregator(gradcomp::tagc_params params, const gradcomp::layer_policy<gradcomp::tagc_treatment>& policy,
                  const std::vector<parameter>& layout, std::size_t workers)
      : tagc_(params), group_(static_cast<int>(workers)), layout_(layout) {
    for (const parameter& p : layout_) {
      const std::uint64_t matrix[2] = {p.rows, p.cols};
      const std::uint64_t vector[1] = {p.cols};
      const std::span<const std::uint64_t> shape =
          p.rows == 1 ? std::span<const std::uint64_t>(vector) : std::span<const std::uint64_t>(matrix);
      const gradcomp::layer_info info{p.name, gradcomp::infer_layer_kind(p.name, shape.size()), p.size(), shape};
      compressed_.push_back(policy.choose(info) == gradcomp::tagc_treatment::compressed);
    }
    for (std::size_t w = 0; w < workers; ++w) states_.push_back(tagc_.make_state(gradcomp::cpu_executor{}));
  }

  step_cost aggregate(const std::vector<std::vector<float>>& grads, std::span<float> mean, std::uint64_t) override {
    const std::size_t P = states_.size();
    step_cost cost;
    std::mutex mutex;
    group_.run([&](gradcomp::in_process_transport& t) {
      const auto r = static_cast<std::size_t>(t.rank());
      const auto started = clock_type::now();
      std::size_t sent = 0;
      std::vector<float> padded, shard;
      for (std::size_t l = 0; l < layout_.size(); ++l) {
        const parameter& p = layout_[l];
        const std::size_t m = (p.size() + P - 1) / P;
        padded.assign(P * m, 0.0f);
        std::copy_n(grads[r].begin() + static_cast<std::ptrdiff_t>(p.offset), p.size(), padded.begin());
        shard.resize(m);
        if (compressed_[l]) {
          sent += tagc_.reduce_scatter(gradcomp::cpu_executor{}, t, states_[r], l, std::span<const float>(padded),
                                       std::span<float>(shard))
                      .sent_bytes;
        } else {
          t.reduce_scatter_sum(std::span<const float>(padded), std::span<float>(shard));
          for (float& v : shard) v /= static_cast<float>(P);
          sent += padded.size() * sizeof(float);
        }
        // The gather of the shards: each rank writes its own part of the tensor into `mean`.
        const std::size_t first = r * m;
        const std::size_t count = first < p.size() ? std::min(m, p.size() - first) : 0;
        std::copy_n(shard.begin(), count, mean.begin() + static_cast<std::ptrdiff_t>(p.offset + first));
      }
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
  gradcomp::tagc_reduce_scatter<float> tagc_;
  gradcomp::in_process_group group_;
  std::vector<parameter> layout_;
  std::vector<bool> compressed_;
  std::vector<gradcomp::tagc_reduce_scatter<float>::state_type> states_;
};

/// A demo row running TAGC with `params` and TAGC's layer policy (weights compressed, biases dense).
inline codec_entry tagc_entry(std::string name, gradcomp::tagc_params params) {
  return {std::move(name), [params](const std::vector<parameter>& layout, std::size_t workers)
                               -> std::unique_ptr<aggregator> {
            return std::make_unique<tagc_aggregator>(params, gradcomp::tagc_layer_policy(), layout, workers);
          }};
}

}  // namespace train
