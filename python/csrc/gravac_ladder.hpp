#pragma once
// GraVAC over a ladder of quantizer bit widths (docs/control.md §1.8): one gravac_controller for
// the model, whose densities stand for widths, θ = bits/32 (θ_min the safe level's width; each
// window of the search halves θ, so halves the width, down to θ_max). Each width sends with a codec
// row of the hook's table (a uniform quantizer of that width with LoCo), through that row's bucket
// states and plan like any codec (gradcomp/ddp.py keeps them per width: `scatter_reduce` with chunk
// and server states where it sends less). This object measures and decides:
//
//   measure(g, sizes)     this rank's magnitudes of one bucket: Σ_l ‖g_l‖₂² for the gradient, and
//                         for the candidate's and the safe level's widths b, Σ_l kept_energy(‖g_l‖₂²,
//                         ‖g_l − Q_b(g)_l‖₂²), Q_b the plain b-bit quantizer of the bucket (no LoCo
//                         error: the options' gain_input is `gradient`, and the measure `kept_energy`,
//                         since a quantized gradient's norm says nothing of what it lost)
//   end_step(t, observed, sent_bytes)   the step's observation aggregated over the ranks (the
//                         step's time modelled from the bytes sent, as gravac_buckets.hpp does),
//                         then controller.next: the decision for the next step, the same on every rank
//
// The hook feeds only steps that completed: a step skipped for NaN/Inf leaves the controller as it
// was. Only the path sent updates its LoCo states (`sent_path_only`): the other width is never
// encoded with them. A width that is neither the candidate nor the safe level keeps no state (the
// hook drops it), so a width tried again, after a back-off, starts from a zero error.
#include <gradcomp/gradcomp.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "../../examples/train/gravac_aggregator.hpp"

namespace gradcomp_torch {

class gravac_ladder {
 public:
  /// `widths` names, for every width of the ladder (θ_min·32 halved down to θ_max·32), the hook's
  /// codec row that sends at it; `block` is the quantizers' block (values per scale), the rows' own.
  /// @throws gradcomp::error `invalid_argument` when the options are not a ladder of widths (a
  /// measure other than `kept_energy`, a gain input other than `gradient`, a step other than 1/2, a
  /// θ that is not a width of 1, 2, 4 or 8 bits over 32, or a width with no row).
  gravac_ladder(gradcomp::gravac_options options, std::uint32_t block, std::map<int, std::string> widths,
                train::link_model link = {})
      : controller_(options), block_(block), widths_(std::move(widths)), link_(link) {
    const auto require = [](bool ok, const std::string& what) {
      gradcomp::detail::require(ok, gradcomp::errc::invalid_argument, what);
    };
    require(options.measure == gradcomp::gravac_gain_measure::kept_energy &&
                options.gain_input == gradcomp::gravac_gain_input::gradient && options.step == 0.5,
            "a GraVAC ladder of widths measures the kept energy of the gradient alone and halves θ each window");
    for (double theta = options.theta_min; theta >= options.theta_max; theta *= 0.5) {
      const int bits = bits_of(theta);
      require(bits == 1 || bits == 2 || bits == 4 || bits == 8,
              "GraVAC ladder: theta " + std::to_string(theta) + " is not a width of 1, 2, 4 or 8 bits over 32");
      require(widths_.count(bits) == 1, "GraVAC ladder: no codec row sends " + std::to_string(bits) + " bits");
    }
  }

  /// The width a density of the controller stands for: 32·θ bits.
  [[nodiscard]] static int bits_of(double theta) noexcept { return static_cast<int>(theta * 32.0 + 0.5); }

  [[nodiscard]] const gradcomp::gravac_controller& controller() const noexcept { return controller_; }

  /// The codec row that sends at `bits`. @throws gradcomp::error `invalid_argument` for a width
  /// not on the ladder.
  [[nodiscard]] const std::string& row_of(int bits) const {
    const auto it = widths_.find(bits);
    gradcomp::detail::require(it != widths_.end(), gradcomp::errc::invalid_argument,
                              [&] { return "GraVAC ladder: no width of " + std::to_string(bits) + " bits"; });
    return it->second;
  }

  /// This rank's magnitudes of a bucket `g` whose parameters have `sizes` values each, in order:
  /// {gradient, candidate, safe} (this file's comment). A bucket holding NaN or Inf measures NaN
  /// and throws nothing: the send that follows fails on every rank alike (a throw here, on this
  /// rank alone, would leave the others waiting in that send's collectives).
  [[nodiscard]] std::array<double, 3> measure(std::span<const float> g, const std::vector<std::size_t>& sizes,
                                              gradcomp::message_key key) {
    if (!std::all_of(g.begin(), g.end(), [](float v) { return std::isfinite(v); })) {
      const double nan = std::numeric_limits<double>::quiet_NaN();
      return {nan, nan, nan};
    }
    std::size_t total = 0;
    for (const std::size_t size : sizes) total += size;
    gradcomp::detail::require(total == g.size(), gradcomp::errc::size_mismatch,
                              "GraVAC ladder: the parameters' sizes do not add up to the bucket's");
    const gradcomp::gravac_decision& d = controller_.decision();
    const int candidate_bits = bits_of(d.current.density), safe_bits = bits_of(d.safe.density);
    const bool one_width = candidate_bits == safe_bits;  // then the candidate is the safe level
    for (auto* v : {&candidate_, &safe_}) v->resize(g.size());
    round_trip(safe_bits, g, safe_, key);
    if (!one_width) round_trip(candidate_bits, g, candidate_, key);
    std::array<double, 3> observed{};
    std::size_t offset = 0;
    for (const std::size_t size : sizes) {
      double squares = 0.0, candidate_error = 0.0, safe_error = 0.0;
      for (std::size_t i = offset; i < offset + size; ++i) {
        squares += static_cast<double>(g[i]) * g[i];
        safe_error += square(static_cast<double>(g[i]) - safe_[i]);
        if (!one_width) candidate_error += square(static_cast<double>(g[i]) - candidate_[i]);
      }
      observed[0] += controller_.magnitude(squares);
      observed[1] += gradcomp::gravac_controller::kept_energy(squares, one_width ? safe_error : candidate_error);
      observed[2] += gradcomp::gravac_controller::kept_energy(squares, safe_error);
      offset += size;
    }
    return observed;
  }

  /// Ends a step whose buckets gave the magnitudes `observed` (summed over this rank's buckets)
  /// and sent `sent_bytes` from this rank: aggregates them over the ranks of `t` and moves the
  /// controller on. Collective: every rank calls it after the step's last bucket.
  template <gradcomp::transport X>
  void end_step(X& t, const std::array<double, 3>& observed, std::size_t sent_bytes) {
    const gradcomp::gravac_observation local{.gradient = observed[0],
                                             .current = observed[1],
                                             .safe = observed[2],
                                             .seconds = link_.compute_seconds +
                                                        static_cast<double>(sent_bytes) / link_.bytes_per_second,
                                             .samples = 1};
    controller_.next(gradcomp::aggregate_observation(t, local));
  }

  /// The controller's saved state (its own self-checking format, core/saved_state.hpp).
  [[nodiscard]] std::vector<std::byte> save() const {
    std::vector<std::byte> bytes(controller_.saved_state_bytes());
    bytes.resize(controller_.save_state(bytes));
    return bytes;
  }

  /// Restores what `save` wrote. @throws gradcomp::error as gravac_controller::load_state; unchanged then.
  void load(std::span<const std::byte> bytes) { controller_.load_state(bytes); }

 private:
  static double square(double v) noexcept { return v * v; }

  // decoded = Q_bits(g): the plain quantizer of the rows' block, this rank alone.
  void round_trip(int bits, std::span<const float> g, std::vector<float>& decoded, gradcomp::message_key key) {
    train::round_trip(gradcomp::uniform_quantizer<float>({.bits = bits, .block = block_}), g, decoded, message_,
                      workspace_, key);
  }

  gradcomp::gravac_controller controller_;
  std::uint32_t block_;
  std::map<int, std::string> widths_;
  train::link_model link_;
  std::vector<float> candidate_, safe_;         // the round trips, scratch
  std::vector<std::byte> message_, workspace_;  // scratch
};

}  // namespace gradcomp_torch
