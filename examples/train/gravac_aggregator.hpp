#pragma once
// GraVAC-controlled top-k with error feedback in the training demo (docs/control.md §1.7). Each step,
// every worker compresses g + e_cur at the candidate density θ_cur and g + e_min at the safe
// density θ_min (each path with its own residual), and sends the path the controller's decision
// names (or the dense gradient); the messages are all-gathered and summed in rank order. The
// step's statistics (per-layer norms of g and of both compressed gradients, summed over layers and
// workers, as `aggregate_observation` would over a transport) go to one `gravac_controller`: every
// worker would hold an identical copy fed the identical aggregate.
//
// GraVAC judges densities by compression throughput, samples/s × gain, so it needs the time of a
// step. The demo's workers share one machine, so the time is modelled, not measured: a fixed
// compute time plus the bytes each worker receives (P − 1 messages) over a slow link. That keeps
// the run deterministic; the decisions and densities printed are those of that model.
#include <gradcomp/gradcomp.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "compressor.hpp"
#include "mlp.hpp"

namespace train {

/// The modelled cost of a step: compute time plus receiving P − 1 messages over one link.
struct link_model {
  double compute_seconds = 0.5e-3;   ///< Forward and backward pass of one minibatch.
  double bytes_per_second = 25e6;    ///< A 200 Mbit/s link.

  /// A step whose largest message has `bytes`, among `workers` workers.
  [[nodiscard]] double seconds(std::size_t bytes, std::size_t workers) const {
    return compute_seconds + static_cast<double>(bytes * (workers - 1)) / bytes_per_second;
  }
};

/// Σ over the layers of `layout` of the layer's magnitude in `x` as `controller` measures it (its
/// L2 norm, GraVAC's default).
[[nodiscard]] inline double gravac_magnitude(const gradcomp::gravac_controller& controller,
                                             const std::vector<parameter>& layout, std::span<const float> x) {
  double total = 0.0;
  for (const auto& p : layout) {
    double squares = 0.0;
    for (std::size_t i = p.offset; i < p.offset + p.size(); ++i) squares += static_cast<double>(x[i]) * x[i];
    total += controller.magnitude(squares);
  }
  return total;
}

/// e ← g + e − decoded: what was compensated but not sent.
inline void keep_error(std::span<const float> g, std::vector<float>& e, std::span<const float> decoded) {
  for (std::size_t i = 0; i < e.size(); ++i) e[i] = (g[i] + e[i]) - decoded[i];
}

/// Encodes `compensated` with the stateless `codec` (top-k, a quantizer) and decodes the message
/// into `decoded`, on this worker alone (what GraVAC measures of a path); `message` and
/// `workspace` are scratch, grown as needed. Returns the message's size.
template <class Codec>
std::size_t round_trip(const Codec& codec, std::span<const float> compensated, std::span<float> decoded,
                       std::vector<std::byte>& message, std::vector<std::byte>& workspace,
                       gradcomp::message_key key = {}) {
  const gradcomp::cpu_executor cpu;
  message.resize(std::max(message.size(), codec.max_encoded_bytes(compensated.size())));
  workspace.resize(std::max(workspace.size(), codec.workspace_bytes(cpu, compensated.size())));
  const std::size_t bytes = codec.encode(cpu, compensated, message, workspace, key);
  codec.decode(cpu, std::span<const std::byte>(message.data(), bytes), decoded, workspace);
  return bytes;
}

/// One GraVAC path of a worker: compensated = g + e (e is read, not changed) and decoded its top-k
/// round trip with `sparsifier`; returns the message's size.
inline std::size_t compress_path(const gradcomp::topk_sparsifier<float>& sparsifier, std::span<const float> g,
                                 const std::vector<float>& e, std::vector<float>& compensated,
                                 std::vector<float>& decoded, std::vector<std::byte>& message,
                                 std::vector<std::byte>& workspace) {
  std::transform(g.begin(), g.end(), e.begin(), compensated.begin(), std::plus<>());
  return round_trip(sparsifier, compensated, decoded, message, workspace);
}

class gravac_aggregator final : public aggregator {
 public:
  gravac_aggregator(gradcomp::gravac_options options, std::vector<parameter> layout, std::size_t workers,
                    std::size_t batch, link_model link)
      : controller_(options),
        layout_(std::move(layout)),
        n_(total_size(layout_)),
        batch_(batch),
        link_(link),
        residual_current_(workers, std::vector<float>(n_, 0.0f)),
        residual_safe_(workers, std::vector<float>(n_, 0.0f)),
        compensated_(n_),
        decoded_current_(n_),
        decoded_safe_(n_) {}

  step_cost aggregate(const std::vector<std::vector<float>>& grads, std::span<float> mean,
                      std::uint64_t step) override {
    step_cost cost;
    const gradcomp::gravac_decision d = controller_.decision();
    const gradcomp::topk_sparsifier<float> current(d.current), safe(d.safe);
    const bool same_density = d.current.density == d.safe.density;
    gradcomp::gravac_observation observed{};
    std::fill(mean.begin(), mean.end(), 0.0f);
    std::size_t sent_per_worker = 0;
    for (std::size_t w = 0; w < grads.size(); ++w) {
      const auto t0 = clock_type::now();
      // While θ_cur = θ_min the controller sends the safe path; the candidate is not computed.
      const std::size_t safe_bytes = compress(safe, grads[w], residual_safe_[w], decoded_safe_);
      std::size_t current_bytes = safe_bytes;
      if (same_density) decoded_current_ = decoded_safe_;
      else
        current_bytes = compress(current, grads[w], residual_current_[w], decoded_current_);
      observed.gradient += gravac_magnitude(controller_, layout_, grads[w]);
      observed.current += gravac_magnitude(controller_, layout_, decoded_current_);
      observed.safe += gravac_magnitude(controller_, layout_, decoded_safe_);
      // Send the decided path and keep its error as the residual (the other path's residual is
      // left as it was: `sent_path_only`).
      std::span<const float> sent = grads[w];
      std::size_t bytes = n_ * sizeof(float);
      if (d.send == gradcomp::gravac_choice::current) {
        sent = decoded_current_;
        bytes = current_bytes;
      } else if (d.send == gradcomp::gravac_choice::safe) {
        sent = decoded_safe_;
        bytes = safe_bytes;
      }
      if (d.update_current_residual) keep_error(grads[w], residual_current_[w], decoded_current_);
      if (d.update_safe_residual) keep_error(grads[w], residual_safe_[w], decoded_safe_);
      cost.encode += clock_type::now() - t0;
      cost.bytes += bytes;
      sent_per_worker = std::max(sent_per_worker, bytes);
      for (std::size_t i = 0; i < n_; ++i) mean[i] += sent[i];
    }
    for (float& v : mean) v /= static_cast<float>(grads.size());
    observed.samples = batch_ * grads.size();
    observed.seconds = link_.seconds(sent_per_worker, grads.size());
    record(step, d);
    controller_.next(observed);
    return cost;
  }

  /// Decoding happens with encoding (both paths are decoded to measure their norms).
  [[nodiscard]] bool times_decode() const override { return false; }

  [[nodiscard]] std::string notes() const override {
    std::string text = "what was sent, step range by step range (θ = density kept; search ";
    text += searching_until_ == 0 ? "still running at the end)" : fmt::format("ended at step {})", searching_until_);
    for (const auto& span : timeline_)
      text += fmt::format("\n  steps {:>3}-{:>3}: {}", span.first, span.last, span.what);
    return text;
  }

 private:
  struct span_of_steps {
    std::uint64_t first, last;
    std::string what;
  };

  std::size_t compress(const gradcomp::topk_sparsifier<float>& sparsifier, const std::vector<float>& g,
                       const std::vector<float>& e, std::vector<float>& decoded) {
    return compress_path(sparsifier, g, e, compensated_, decoded, message_, workspace_);
  }

  void record(std::uint64_t step, const gradcomp::gravac_decision& d) {
    std::string what = d.send == gradcomp::gravac_choice::dense
                           ? std::string("dense")
                           : fmt::format("top-k θ = {:g} ({})", d.sent()->density,
                                         d.send == gradcomp::gravac_choice::current ? "candidate" : "safe");
    if (!d.searching && searching_until_ == 0) searching_until_ = step;
    if (!timeline_.empty() && timeline_.back().what == what) timeline_.back().last = step;
    else
      timeline_.push_back({step, step, std::move(what)});
  }

  gradcomp::gravac_controller controller_;
  std::vector<parameter> layout_;
  std::size_t n_;
  std::size_t batch_;
  link_model link_;
  std::vector<std::vector<float>> residual_current_, residual_safe_;
  std::vector<float> compensated_, decoded_current_, decoded_safe_;
  std::vector<std::byte> message_, workspace_;
  std::vector<span_of_steps> timeline_;
  std::uint64_t searching_until_ = 0;
};

/// A demo row: top-k with EF whose density GraVAC chooses.
inline codec_entry gravac_entry(std::string name, gradcomp::gravac_options options, std::size_t batch,
                                link_model link = {}) {
  return {std::move(name),
          [options, batch, link](const std::vector<parameter>& layout,
                                 std::size_t workers) -> std::unique_ptr<aggregator> {
            return std::make_unique<gravac_aggregator>(options, layout, workers, batch, link);
          }};
}

}  // namespace train
