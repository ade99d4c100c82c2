#pragma once
/// @file
/// DGC's exponential warm-up of a sparsifier's density (Lin et al., "Deep Gradient Compression",
/// 2018: 25%, 6.25%, 1.5625%, 0.4%, 0.1% over the first epochs): the density falls from `start`
/// to `target` in `stages` equal geometric steps over the first `warm_up_steps` steps,
///
///     ρ(t) = start · (target / start)^(k / stages),  k = ⌊t · stages / warm_up_steps⌋ < stages,
///     ρ(t) = target                                   for t ≥ warm_up_steps,
///
/// and `sparsity_at(step)` makes the sparsity of the codec for a step. The density is a codec
/// parameter, so the agreement of the compressed collectives (collective/agreement.hpp) catches
/// ranks on different densities (`parameter_mismatch`). Defaults: no warm-up (`warm_up_steps` 0:
/// the target from the first step), start 25% and 4 stages as DGC.

#include <cmath>
#include <cstdint>
#include <string>

#include <gradcomp/core/error.hpp>
#include <gradcomp/sparsify/sparsity.hpp>

namespace gradcomp {

/// An exponential density warm-up (this file's comment).
struct density_schedule {
  double target = 0.01;              ///< Density after the warm-up, in (0, 1].
  double start = 0.25;               ///< Density of the first stage, in [target, 1].
  std::uint64_t warm_up_steps = 0;   ///< Steps of the warm-up (0: none).
  std::uint32_t stages = 4;          ///< Distinct densities during the warm-up (≥ 1).

  /// Throws `invalid_argument` unless 0 < target ≤ start ≤ 1 and stages ≥ 1.
  void validate() const {
    detail::require(target > 0.0 && target <= start && start <= 1.0 && stages >= 1, errc::invalid_argument, [&] {
      return "density_schedule: needs 0 < target <= start <= 1 and stages >= 1 (target " + std::to_string(target) +
             ", start " + std::to_string(start) + ", stages " + std::to_string(stages) + ")";
    });
  }

  /// The density at `step`.
  [[nodiscard]] double density_at(std::uint64_t step) const {
    validate();
    if (step >= warm_up_steps) return target;
    const std::uint64_t stage = step * stages / warm_up_steps;
    return start * std::pow(target / start, static_cast<double>(stage) / static_cast<double>(stages));
  }

  /// The sparsity of a sparsifier at `step` (`sparsity{.density = density_at(step)}`).
  [[nodiscard]] sparsity sparsity_at(std::uint64_t step) const { return sparsity{.density = density_at(step)}; }
};

}  // namespace gradcomp
