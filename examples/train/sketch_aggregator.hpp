#pragma once
// Count sketch with error feedback in the training demo, in two rounds (sketched SGD, FetchSGD's
// "second round of exact values"):
//  1. every worker w adds its residual to its gradient, a_w = g_w + e_w, and sends the count
//     sketch of a_w; the sketches are summed (a plain SUM all-reduce of the cells would do it,
//     since the sketch is linear: here `accumulate_encoded`), so every worker holds the same sum;
//  2. every worker takes the same k heavy hitters of the summed sketch (`heavy_hitters`) and sends
//     its exact values of a_w there (`gather_values`), summed again; the update is that sum / P at
//     those k indices. Each worker keeps the rest of a_w as its residual: e_w = a_w, zeroed at the
//     k indices.
// Bytes per worker: one sketch message and k values. The sketch only chooses the indices, so its
// collisions cost accuracy of the choice, never wrong values: keeping the error in sketch space
// instead (FetchSGD without the second round) diverged on this small, dense gradient, because a
// collision moves one coordinate's accumulated error onto another.
//
// The sketch's hashes depend on its seed only, so every message is encoded under one fixed key
// (step 0, tensor 0): `accumulate_encoded` requires equal keys.
#include <gradcomp/gradcomp.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "compressor.hpp"
#include "mlp.hpp"

namespace train {

class sketched_sgd_aggregator final : public aggregator {
 public:
  sketched_sgd_aggregator(gradcomp::count_sketch<float> sketch, std::size_t n, std::size_t workers)
      : sketch_(std::move(sketch)),
        k_(static_cast<std::size_t>(sketch_.heavy_hitter_count(n))),
        workspace_(sketch_.workspace_bytes(cpu_, n)),
        compensated_(workers, std::vector<float>(n, 0.0f)),
        messages_(workers, std::vector<std::byte>(sketch_.max_encoded_bytes(n))),
        indices_(k_),
        values_(k_),
        sum_(k_) {}

  step_cost aggregate(const std::vector<std::vector<float>>& grads, std::span<float> mean, std::uint64_t) override {
    step_cost cost;
    const std::size_t workers = messages_.size();
    for (std::size_t w = 0; w < workers; ++w) {
      const auto t0 = clock_type::now();
      auto& a = compensated_[w];  // holds e_w on entry
      std::transform(grads[w].begin(), grads[w].end(), a.begin(), a.begin(), std::plus<>());
      cost.bytes += sketch_.encode(cpu_, std::span<const float>(a), std::span<std::byte>(messages_[w]),
                                   std::span<std::byte>(workspace_), gradcomp::message_key{.step = 0, .tensor_id = 0});
      cost.encode += clock_type::now() - t0;
    }
    auto t0 = clock_type::now();
    for (std::size_t w = 1; w < workers; ++w) sketch_.accumulate_encoded(cpu_, messages_[0], messages_[w]);
    const std::size_t k = sketch_.heavy_hitters(cpu_, messages_[0], mean.size(), indices_, workspace_);
    cost.decode = clock_type::now() - t0;
    // Second round: each worker's exact values at the chosen indices, summed in rank order.
    std::fill(sum_.begin(), sum_.end(), 0.0f);
    for (std::size_t w = 0; w < workers; ++w) {
      t0 = clock_type::now();
      auto& a = compensated_[w];
      gradcomp::gather_values(std::span<const float>(a), std::span<const std::uint64_t>(indices_).first(k),
                              std::span<float>(values_).first(k));
      for (std::size_t m = 0; m < k; ++m) a[indices_[m]] = 0.0f;  // what is sent leaves the residual
      cost.encode += clock_type::now() - t0;
      cost.bytes += k * sizeof(float);
      for (std::size_t m = 0; m < k; ++m) sum_[m] += values_[m];
    }
    std::fill(mean.begin(), mean.end(), 0.0f);
    for (std::size_t m = 0; m < k; ++m) mean[indices_[m]] = sum_[m] / static_cast<float>(workers);
    return cost;
  }

 private:
  gradcomp::cpu_executor cpu_;
  gradcomp::count_sketch<float> sketch_;
  std::size_t k_;
  std::vector<std::byte> workspace_;
  std::vector<std::vector<float>> compensated_;  // per worker: the residual e_w, then a_w
  std::vector<std::vector<std::byte>> messages_;
  std::vector<std::uint64_t> indices_;
  std::vector<float> values_, sum_;
};

/// A demo row: count sketch to choose the heavy hitters, exact values in a second round, EF.
inline codec_entry sketched_sgd_entry(std::string name, gradcomp::count_sketch<float> sketch) {
  return {std::move(name),
          [sketch = std::move(sketch)](const std::vector<parameter>& layout,
                                       std::size_t workers) -> std::unique_ptr<aggregator> {
            return std::make_unique<sketched_sgd_aggregator>(sketch, total_size(layout), workers);
          }};
}

}  // namespace train
