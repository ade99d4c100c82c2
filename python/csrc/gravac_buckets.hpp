#pragma once
// GraVAC over DDP's buckets: top-k with error feedback whose density one gravac_controller chooses
// for the whole model (docs/control.md §1; the demo's in-process version is
// examples/train/gravac_aggregator.hpp). A step is the buckets DDP hands over one after another:
//
//   first bucket   the step's decision d = controller.decision() (the same on every rank: the
//                  controller only ever sees rank-aggregated statistics)
//   every bucket   NaN/Inf on any rank (a MAX all-reduce of a flag) → non_finite_input on every
//                  rank, nothing changed, and the step does not feed the controller. Else
//                  compress g + e_safe at θ_min and g + e_cur at θ_cur (residuals kept per
//                  parameter, keyed by its index in the model, so bucket layouts do not matter),
//                  add the layers' magnitudes to the step's observation (of those two results,
//                  or of g's own round trips at θ_min and θ_cur when the options' gain_input is
//                  `gradient`), send the path d names
//                  through compressed_all_reduce (top-k, all-gathered) or the dense all-reduce,
//                  and keep the residuals d says
//   last bucket    aggregate_observation over the ranks; controller.next(observation)
//
// The step's time is modelled as in the demo (train::link_model: a fixed compute time plus the
// bytes sent over a 200 Mbit/s link), so decisions do not depend on the machine's timing and a
// checkpointed run resumes bit for bit.
#include <gradcomp/gradcomp.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "../../examples/train/gravac_aggregator.hpp"

namespace gradcomp_torch {

/// A parameter of a bucket: its index in the model and its number of values.
struct bucket_parameter {
  std::uint32_t index = 0;
  std::size_t size = 0;
};

class gravac_buckets {
 public:
  explicit gravac_buckets(gradcomp::gravac_options options, train::link_model link = {})
      : controller_(options), link_(link) {}

  [[nodiscard]] const gradcomp::gravac_controller& controller() const noexcept { return controller_; }

  /// `data` (the bucket's parameters one after another) becomes the mean over the ranks.
  /// Returns the bytes this rank sent. @throws gradcomp::error `non_finite_input` on every rank
  /// alike when any rank's bucket holds NaN or Inf (nothing changed).
  template <gradcomp::transport X>
  std::size_t all_reduce_mean(X& t, std::span<float> data, const std::vector<bucket_parameter>& params,
                              gradcomp::message_key key, bool last) {
    if (!in_step_) {
      decision_ = controller_.decision();
      observed_ = {};
      step_failed_ = false;
      in_step_ = true;
    }
    std::size_t sent = 0;
    try {
      sent = reduce_bucket(t, data, params, key);
    } catch (...) {
      step_failed_ = true;
      in_step_ = !last;
      throw;
    }
    if (last) {
      in_step_ = false;
      if (!step_failed_) {
        observed_.seconds += link_.compute_seconds;
        observed_.samples = 1;
        controller_.next(gradcomp::aggregate_observation(t, observed_));
      }
    }
    return sent;
  }

  /// The state as bytes: the length of the controller's saved state (u64) and that state (its own
  /// self-checking format), then per parameter its index (u64), size n (u64) and both residuals
  /// (candidate, safe; n float32 each), native byte order.
  [[nodiscard]] std::vector<std::byte> save() const {
    std::vector<std::byte> controller(controller_.saved_state_bytes());
    controller.resize(controller_.save_state(controller));
    std::vector<std::byte> bytes;
    append(bytes, static_cast<std::uint64_t>(controller.size()));
    bytes.insert(bytes.end(), controller.begin(), controller.end());
    for (const auto& [index, r] : residuals_) {
      append(bytes, static_cast<std::uint64_t>(index));
      append(bytes, static_cast<std::uint64_t>(r[0].size()));
      for (const auto& v : r) {
        const auto raw = std::as_bytes(std::span<const float>(v));
        bytes.insert(bytes.end(), raw.begin(), raw.end());
      }
    }
    return bytes;
  }

  /// Restores what `save` wrote. @throws gradcomp::error naming what is wrong; unchanged then.
  void load(std::span<const std::byte> bytes) {
    std::size_t at = 0;
    const auto take = [&](std::size_t size) {
      gradcomp::detail::require(bytes.size() - at >= size, gradcomp::errc::truncated, "GraVAC hook state ends early");
      const auto part = bytes.subspan(at, size);
      at += size;
      return part;
    };
    const auto u64 = [&] {
      std::uint64_t v = 0;
      std::memcpy(&v, take(8).data(), 8);
      return v;
    };
    const std::uint64_t controller_bytes = u64();
    gradcomp::detail::require(controller_bytes <= bytes.size(), gradcomp::errc::truncated,
                              "GraVAC hook state ends early");
    gradcomp::gravac_controller controller(controller_.options());
    controller.load_state(take(static_cast<std::size_t>(controller_bytes)));
    std::map<std::uint32_t, std::array<std::vector<float>, 2>> residuals;
    while (at < bytes.size()) {
      const std::uint64_t index = u64(), n = u64();
      gradcomp::detail::require(index <= UINT32_MAX && n <= bytes.size() / sizeof(float),
                                gradcomp::errc::malformed_payload,
                                "GraVAC hook state: impossible parameter index or size");
      auto& r = residuals[static_cast<std::uint32_t>(index)];
      for (auto& v : r) {
        v.resize(static_cast<std::size_t>(n));
        std::memcpy(v.data(), take(v.size() * sizeof(float)).data(), v.size() * sizeof(float));
      }
    }
    controller_ = std::move(controller);
    residuals_ = std::move(residuals);
    in_step_ = false;
  }

 private:
  static constexpr std::size_t candidate = 0, safe = 1;  ///< Which residual of a parameter.

  template <gradcomp::transport X>
  std::size_t reduce_bucket(X& t, std::span<float> data, const std::vector<bucket_parameter>& params,
                            gradcomp::message_key key) {
    std::array<float, 1> non_finite{
        std::all_of(data.begin(), data.end(), [](float v) { return std::isfinite(v); }) ? 0.0f : 1.0f};
    t.all_reduce_max(std::span<float>(non_finite));
    gradcomp::detail::require(non_finite[0] == 0.0f, gradcomp::errc::non_finite_input,
                              "a rank's bucket holds NaN or Inf: every rank skips the step");
    const std::size_t n = data.size();
    for (auto* v : {&safe_in_, &current_in_, &safe_out_, &current_out_}) v->resize(n);
    auto &safe_in = safe_in_, &current_in = current_in_, &safe_out = safe_out_, &current_out = current_out_;
    gather_residuals(params, data, safe, safe_in);
    compress(decision_.safe, safe_in, safe_out, key);
    if (decision_.current.density == decision_.safe.density) {
      current_in = safe_in;
      current_out = safe_out;
    } else {
      gather_residuals(params, data, candidate, current_in);
      compress(decision_.current, current_in, current_out, key);
    }
    observe(params, data, key);
    std::size_t sent = 0;
    const auto P = static_cast<std::size_t>(t.size());
    if (decision_.send == gradcomp::gravac_choice::dense) {
      t.all_reduce_sum(data);
      sent = gradcomp::ring_all_reduce_dense_bytes(data.size_bytes(), P);
    } else {
      const bool current = decision_.send == gradcomp::gravac_choice::current;
      std::vector<float> sum = current ? current_in : safe_in;
      const gradcomp::all_reduce_options options{.key = key, .plan = gradcomp::all_reduce_plan::gather_decode};
      sent = gradcomp::compressed_all_reduce(gradcomp::cpu_executor{}, t,
                                             gradcomp::topk_sparsifier<float>(current ? decision_.current
                                                                                      : decision_.safe),
                                             std::span<float>(sum), options)
                 .sent_bytes;
      std::copy(sum.begin(), sum.end(), data.begin());
    }
    for (float& v : data) v /= static_cast<float>(P);
    // e ← (g + e) − C(g + e) on the paths the decision names.
    if (decision_.update_safe_residual) scatter_residuals(params, safe_in, safe_out, safe);
    if (decision_.update_current_residual) scatter_residuals(params, current_in, current_out, candidate);
    observed_.seconds += static_cast<double>(sent) / link_.bytes_per_second;
    return sent;
  }

  // Adds the bucket's magnitudes to the step's observation: of g, and of what the controller's
  // gain compares (the decoded messages, or g's own round trips without residuals).
  void observe(const std::vector<bucket_parameter>& params, std::span<const float> g, gradcomp::message_key key) {
    std::span<const float> measured_current = current_out_, measured_safe = safe_out_;
    if (controller_.options().gain_input == gradcomp::gravac_gain_input::gradient) {
      for (auto* v : {&safe_raw_, &current_raw_}) v->resize(g.size());
      compress(decision_.safe, g, safe_raw_, key);
      if (decision_.current.density == decision_.safe.density) current_raw_ = safe_raw_;
      else
        compress(decision_.current, g, current_raw_, key);
      measured_current = current_raw_;
      measured_safe = safe_raw_;
    }
    std::size_t offset = 0;
    for (const bucket_parameter& p : params) {
      observed_.gradient += magnitude(g.subspan(offset, p.size));
      observed_.current += magnitude(measured_current.subspan(offset, p.size));
      observed_.safe += magnitude(measured_safe.subspan(offset, p.size));
      offset += p.size;
    }
  }

  template <class V>
  static void append(std::vector<std::byte>& bytes, V value) {
    const auto raw = std::as_bytes(std::span<const V>(&value, 1));
    bytes.insert(bytes.end(), raw.begin(), raw.end());
  }

  // out = g + e_path, parameter by parameter (zero residuals for a parameter not seen yet).
  void gather_residuals(const std::vector<bucket_parameter>& params, std::span<const float> g, std::size_t path,
                        std::vector<float>& out) {
    std::size_t offset = 0;
    for (const bucket_parameter& p : params) {
      auto& r = residuals_[p.index];
      for (auto& v : r) v.resize(p.size, 0.0f);
      for (std::size_t i = 0; i < p.size; ++i) out[offset + i] = g[offset + i] + r[path][i];
      offset += p.size;
    }
  }

  void scatter_residuals(const std::vector<bucket_parameter>& params, const std::vector<float>& compensated,
                         const std::vector<float>& decoded, std::size_t path) {
    std::size_t offset = 0;
    for (const bucket_parameter& p : params) {
      auto& e = residuals_[p.index][path];
      for (std::size_t i = 0; i < p.size; ++i) e[i] = compensated[offset + i] - decoded[offset + i];
      offset += p.size;
    }
  }

  // decoded = D(C(compensated)) with top-k at `amount`, this rank alone.
  void compress(gradcomp::sparsity amount, std::span<const float> compensated, std::span<float> decoded,
                gradcomp::message_key key) {
    train::round_trip(gradcomp::topk_sparsifier<float>(amount), compensated, decoded, message_, workspace_, key);
  }

  [[nodiscard]] double magnitude(std::span<const float> x) const {
    double squares = 0.0;
    for (const float v : x) squares += static_cast<double>(v) * v;
    return controller_.magnitude(squares);
  }

  gradcomp::gravac_controller controller_;
  train::link_model link_;
  std::map<std::uint32_t, std::array<std::vector<float>, 2>> residuals_;  // by parameter: candidate, safe
  // Scratch kept across calls: both paths' g + e and their decodings, the decodings of g alone
  // (gain_input = gradient), a message, a workspace.
  std::vector<float> safe_in_, current_in_, safe_out_, current_out_, safe_raw_, current_raw_;
  std::vector<std::byte> message_, workspace_;
  gradcomp::gravac_decision decision_{};
  gradcomp::gravac_observation observed_{};
  bool in_step_ = false;
  bool step_failed_ = false;
};

}  // namespace gradcomp_torch
