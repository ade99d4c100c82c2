#pragma once
// PowerSGD in the training examples: every parameter tensor goes through gradcomp's PowerSGD
// all-reduce as its own matrix (rows × cols of the layout), with a state per tensor; the scheme's
// rule sends the small matrices and the biases uncompressed. The demo runs its workers as ranks of
// an in-process group; mpi_train calls the same rank step over its transport.
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

/// One rank's step: every tensor of `layout` in `grad` replaced, in place, by its mean over ranks
/// through PowerSGD (`states[l]` for tensor l, keyed as tensor l). Returns the step's report, its
/// bytes summed over the tensors.
template <gradcomp::transport X>
gradcomp::compressed_report powersgd_rank_all_reduce(X& t, const gradcomp::powersgd<float>& scheme,
                                                     std::vector<gradcomp::powersgd_state<float>>& states,
                                                     const std::vector<parameter>& layout, std::span<float> grad,
                                                     std::uint64_t step) {
  gradcomp::compressed_report total;
  for (std::size_t l = 0; l < layout.size(); ++l) {
    const parameter& p = layout[l];
    const gradcomp::compressed_report report =
        gradcomp::compressed_all_reduce(gradcomp::cpu_executor{}, t, scheme, states[l],
                                        grad.subspan(p.offset, p.size()), {p.rows, p.cols},
                                        {.key = {.step = step, .tensor_id = static_cast<std::uint32_t>(l)},
                                         .average = true});
    total.sent_bytes += report.sent_bytes;
    total.dense_bytes += report.dense_bytes;
  }
  return total;
}

/// The demo's aggregator: the workers run `powersgd_rank_all_reduce` as ranks of an in-process
/// group, on copies of their gradients; every rank ends with the same mean, rank 0's is kept.
class powersgd_aggregator final : public aggregator {
 public:
  powersgd_aggregator(gradcomp::powersgd_params params, const std::vector<parameter>& layout, std::size_t workers)
      : scheme_(params),
        group_(static_cast<int>(workers)),
        layout_(layout),
        states_(workers, std::vector<gradcomp::powersgd_state<float>>(layout.size())),
        workers_(workers) {}

  step_cost aggregate(const std::vector<std::vector<float>>& grads, std::span<float> mean,
                      std::uint64_t step) override {
    return group_step(
        group_, grads,
        [&](gradcomp::in_process_transport& t, std::vector<float>& mine) {
          return powersgd_rank_all_reduce(t, scheme_, states_[static_cast<std::size_t>(t.rank())], layout_,
                                          std::span<float>(mine), step);
        },
        [&](std::size_t r, const std::vector<float>& mine, const gradcomp::compressed_report&) {
          if (r == 0) std::copy(mine.begin(), mine.end(), mean.begin());  // every rank holds the same mean
        });
  }

  /// The products and the reconstruction run inside the collective: the encode column.
  [[nodiscard]] bool times_decode() const override { return false; }

  /// PowerSGD's reports count ring all-reduces: the baseline is the uncompressed ring all-reduce.
  [[nodiscard]] double dense_bytes(std::size_t n) const override {
    return static_cast<double>(gradcomp::ring_all_reduce_dense_bytes(n * sizeof(float), workers_));
  }

 private:
  gradcomp::powersgd<float> scheme_;
  gradcomp::in_process_group group_;
  std::vector<parameter> layout_;
  std::vector<std::vector<gradcomp::powersgd_state<float>>> states_;  // [worker][tensor]
  std::size_t workers_;
};

/// A demo row running PowerSGD with `params` on every tensor.
inline codec_entry powersgd_entry(std::string name, gradcomp::powersgd_params params) {
  return {std::move(name),
          [params](const std::vector<parameter>& layout, std::size_t workers) -> std::unique_ptr<aggregator> {
            return std::make_unique<powersgd_aggregator>(params, layout, workers);
          }};
}

}  // namespace train
