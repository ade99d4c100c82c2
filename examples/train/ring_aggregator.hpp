#pragma once
// The hybrid scheme's ring all-reduce in the training demo (docs/transports.md §5): the workers are
// ranks of an in-process group, and every step the flat gradient goes through
// `ring_all_reduce`, which decodes, adds and re-encodes the partial sums at every hop, then
// all-gathers each chunk's sum encoded once. Under a lossy codec the error grows with the hops;
// the row's notes print the largest bound the ring reported.
#include <gradcomp/gradcomp.hpp>

#include <fmt/format.h>

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

template <class Codec>
class ring_aggregator final : public aggregator {
 public:
  ring_aggregator(Codec codec, std::size_t workers) : codec_(std::move(codec)), group_(static_cast<int>(workers)) {}

  step_cost aggregate(const std::vector<std::vector<float>>& grads, std::span<float> mean,
                      std::uint64_t step) override {
    return group_step(
        group_, grads,
        [&](gradcomp::in_process_transport& t, std::vector<float>& sum) {
          return gradcomp::ring_all_reduce(gradcomp::cpu_executor{}, t, codec_, std::span<float>(sum),
                                           {.key = {.step = step}});
        },
        [&](std::size_t r, const std::vector<float>& sum, const gradcomp::compressed_report& report) {
          // Every rank holds the same sum; rank 0 writes the mean.
          if (r == 0)
            std::transform(sum.begin(), sum.end(), mean.begin(),
                           [&](float v) { return v / static_cast<float>(grads.size()); });
          largest_bound_ = std::max(largest_bound_, report.error_bound);
        });
  }

  /// An uncompressed ring sends 2(P − 1)/P of the gradient per rank: P − 1 chunks in each phase.
  [[nodiscard]] double dense_bytes(std::size_t n) const override {
    const auto P = static_cast<double>(group_.size());
    return 2.0 * (P - 1.0) / P * static_cast<double>(n * sizeof(float));
  }

  /// Decoding happens at every hop inside the collective: its time is part of the encode column.
  [[nodiscard]] bool times_decode() const override { return false; }

  [[nodiscard]] std::string notes() const override {
    return fmt::format("largest error bound the ring reported on the summed gradient, over all steps: {:.3g}",
                       largest_bound_);
  }

 private:
  Codec codec_;
  gradcomp::in_process_group group_;
  double largest_bound_ = 0.0;
};

/// A demo row: the flat gradient ring-all-reduced with `codec` re-encoded at every hop.
template <class Codec>
codec_entry ring_entry(std::string name, Codec codec) {
  return {std::move(name),
          [codec = std::move(codec)](const std::vector<parameter>&, std::size_t workers)
              -> std::unique_ptr<aggregator> { return std::make_unique<ring_aggregator<Codec>>(codec, workers); }};
}

}  // namespace train
