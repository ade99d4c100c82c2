#pragma once
/// @file
/// TAGC's compressed reduce-scatter for sharded training (FSDP, ZeRO; ALGORITHMS.md §4, TAGC):
/// the flat gradient of one parameter, N = P·m values on every rank, ends as this rank's shard of
/// the mean, (1/P)·Σ_p x̃_p[rank·m, rank·m + m), where x̃_p is rank p's gradient after dynamic
/// sparsification with error feedback. For every shard s, every rank
///
///  1. sparsifies the block-aligned part of shard s (⌊m/B⌋·B values) to the target zero fraction,
///     with its error-feedback residual kept under the key (tensor id, s);
///  2. encodes the index of what it kept; the indexes are aggregated (bitwise OR where the transport
///     has it, else summed 4- or 8-bit fields), so every rank knows the union and sizes the sketch
///     identically (`lossless_homomorphic::plan`);
///  3. sketches its sparsified values; the sketches, followed by the m mod B tail values sent
///     uncompressed, are summed onto owner s;
///  4. owner s peels its sketch, and divides by P.
///
/// Two schedules give identical results: `per_shard` (P index all-reduces and P reduces, the
/// reference's order) and `fused` (one all-reduce of the P indexes and one reduce-scatter of the
/// P sketch-and-tail segments, each padded with zeros to the longest). Results are never silently
/// wrong: when an owner cannot peel its sketch completely, the `report` stall policy (default)
/// sums that shard again uncompressed (one extra MAX all-reduce of P flags per call tells every
/// rank), and `median_estimate` keeps the estimates and counts them. A gradient holding NaN or
/// Inf is detected collectively before any state changes: every rank throws
/// `errc::non_finite_input` at the same step.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include <gradcomp/collective/lhc_stages.hpp>
#include <gradcomp/core/cpu_executor.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/float_bits.hpp>
#include <gradcomp/sketch/lossless_homomorphic.hpp>
#include <gradcomp/sparsify/dynamic.hpp>
#include <gradcomp/transport/transport.hpp>

namespace gradcomp {

/// How the P per-shard sums travel.
enum class tagc_schedule : std::uint8_t {
  per_shard,  ///< One index all-reduce and one reduce to the owner per shard (as the reference).
  fused,      ///< One all-reduce of all indexes and one reduce-scatter of all sketches.
};

/// Parameters of the TAGC scheme; every rank must use the same.
struct tagc_params {
  dynamic_params sparsify{};                      ///< Target zero fraction f* (default 0.80) and mode.
  lhc_params sketch{};                            ///< Block B, sizing, index coding, stall policy.
  tagc_schedule schedule = tagc_schedule::fused;  ///< Per-shard or fused collectives.
};

/// What one call did on this rank.
struct tagc_report {
  std::uint64_t sent_bytes = 0;       ///< Bytes this rank contributed: indexes, sketch-and-tail segments
                                      ///< (padded to the longest in the fused schedule), resent shards;
                                      ///< not the 8·(1 + P) bytes of the two agreement all-reduces.
  std::uint64_t dense_bytes = 0;      ///< Bytes an uncompressed reduce-scatter contributes: N values.
  std::uint64_t kept = 0;             ///< Values this rank kept over all shards.
  std::uint64_t union_nonzeros = 0;   ///< Non-zeros of the aggregated index of this rank's shard.
  std::uint64_t sketch_values = 0;    ///< Sketch cells (or dense values) of this rank's shard.
  std::uint64_t unrecovered = 0;      ///< Values of this rank's shard that peeling did not recover.
  std::uint64_t estimated = 0;        ///< Of those, values left as median estimates (`median_estimate`).
  std::uint64_t resent_shards = 0;    ///< Shards summed again uncompressed after a stall (`report`).
};

/// TAGC's compressed reduce-scatter of one flat parameter over a user transport, for float or
/// double gradients. Stateful: the error-feedback residuals of every shard live in `state_type`.
template <gradient_value T = float>
class tagc_reduce_scatter {
 public:
  /// Residuals and reusable buffers of one rank.
  struct state_type {
    typename dynamic_sparsifier<T>::state_type feedback;   ///< Residuals keyed by (tensor id, shard).
    std::vector<T> sparse;                                 ///< The sparsified shards, P·⌊m/B⌋·B.
    std::vector<std::byte> indexes;                        ///< P indexes, local then aggregated.
    std::vector<T> segments;                               ///< Sketch-and-tail segments.
    std::vector<T> received;                               ///< This rank's summed segment.
    std::vector<std::byte> workspace;                      ///< Sparsifier and decoder workspace.
    std::vector<T> saved_residuals;                        ///< The residuals before a call, to undo it.
    std::vector<bool> had_residual;                        ///< Which shards had a residual before it.
    std::uint64_t saved_steps = 0;                         ///< The sparsifier's step count before it.
  };

  /// @throws error `invalid_argument` for invalid parameters.
  explicit tagc_reduce_scatter(tagc_params params = {}) : params_(params), sparsifier_(params.sparsify) {
    params_.sketch.validate();
  }

  /// The parameters.
  [[nodiscard]] const tagc_params& params() const noexcept { return params_; }

  /// Empty state: residuals are created on first use of each (tensor id, shard).
  [[nodiscard]] state_type make_state(const cpu_executor& e) const {
    return {sparsifier_.make_state(e), {}, {}, {}, {}, {}, {}, {}, 0};
  }

  /// Bytes `save_state` writes: the residuals in the dynamic sparsifier's saved format (the other
  /// members of the state are scratch and are not saved).
  [[nodiscard]] static std::size_t saved_state_bytes(const state_type& state) noexcept {
    return dynamic_sparsifier<T>::saved_state_bytes(state.feedback);
  }
  /// Writes the residuals of `state` for a checkpoint; returns the bytes written.
  std::size_t save_state(const cpu_executor& e, const state_type& state, std::span<std::byte> bytes) const {
    return sparsifier_.save_state(e, state.feedback, bytes);
  }
  /// Restores residuals saved by `save_state`; a restored run continues bit-identically.
  /// @throws error as `dynamic_sparsifier::load_state`; `state` is unchanged then.
  void load_state(const cpu_executor& e, std::span<const std::byte> bytes, state_type& state) const {
    sparsifier_.load_state(e, bytes, state.feedback);
  }

  /// Error-feedback key of shard `shard` of tensor `tensor_id` in a group of `ranks`:
  /// tensor_id·ranks + shard, so the residuals of a job with a fixed number of ranks never mix.
  /// `reduce_scatter` rejects tensor ids at or above 2^64 / ranks, whose keys would wrap.
  [[nodiscard]] static std::uint64_t residual_key(std::uint64_t tensor_id, int ranks, int shard) noexcept {
    return tensor_id * static_cast<std::uint64_t>(ranks) + static_cast<std::uint64_t>(shard);
  }

  /// The index coding used over transport `X` with `ranks` ranks (`lhc_index_coding_for`).
  /// @throws error `invalid_argument` when no coding fits.
  template <transport X>
  [[nodiscard]] lhc_index_coding index_coding(int ranks) const {
    return lhc_index_coding_for<X>(params_.sketch, ranks, "tagc");
  }

  /// Reduce-scatters `grad` (N = P·m values on every rank) into `shard` (m values): on return
  /// `shard` holds this rank's part of the mean of the sparsified gradients. Collective: every rank
  /// calls it with the same tensor id and N.
  /// Every rank throws the same error, or none does, and a call that throws leaves the state as
  /// it was: problems found locally are agreed on by a MAX all-reduce of one value before any other
  /// collective, and a sum that overflows on a shard's owner by the closing all-reduce of outcomes.
  /// @throws error `size_mismatch` when N ≠ P·shard.size() or a residual of the tensor has another
  ///         size; `invalid_argument` for a tensor id ≥ 2^64/P; `non_finite_input` when a gradient,
  ///         gradient + residual, or a shard's sum holds NaN or Inf; `peer_failed` or a transport's
  ///         own error when the transport fails.
  template <transport X>
  tagc_report reduce_scatter(const cpu_executor& e, X& t, state_type& state, std::uint64_t tensor_id,
                             std::span<const T> grad, std::span<T> shard) const {
    const int ranks = t.size();
    const std::size_t m = shard.size();
    const lossless_homomorphic<T> lhc(with_index(index_coding<X>(ranks)));
    const std::size_t block = params_.sketch.block;
    const std::size_t aligned = m / block * block;
    agree_on(t, local_problem(state, tensor_id, ranks, grad, m, aligned));

    save_residuals(state, tensor_id, ranks, aligned);
    try {
      return reduce_scatter_checked(e, t, lhc, state, tensor_id, grad, shard, aligned);
    } catch (...) {
      restore_residuals(state, tensor_id, ranks, aligned);
      throw;
    }
  }

 private:
  /// What a rank found wrong before any collective, ordered by the errc every rank then throws.
  enum class problem : std::uint8_t { none, non_finite, size, tensor_id };

  /// The checks that could otherwise fail on one rank only, after others had entered a
  /// collective: sizes, the tensor id's key range, NaN/Inf in the gradient, and, for every shard
  /// with a residual, its size and the finiteness of gradient + residual.
  [[nodiscard]] static problem local_problem(const state_type& state, std::uint64_t tensor_id, int ranks,
                                             std::span<const T> grad, std::size_t m, std::size_t aligned) {
    const auto P = static_cast<std::size_t>(ranks);
    if (grad.size() != P * m) return problem::size;
    if (tensor_id > (std::numeric_limits<std::uint64_t>::max() - P) / P) return problem::tensor_id;
    // One pass over the gradient: where a residual exists, g + R (finite residuals make it
    // non-finite whenever g is); elsewhere, g itself.
    const auto finite = [](T v) { return std::isfinite(v); };
    for (int s = 0; s < ranks; ++s) {
      const T* g = grad.data() + static_cast<std::size_t>(s) * m;
      const auto found = state.feedback.residuals.find(residual_key(tensor_id, ranks, s));
      if (found == state.feedback.residuals.end()) {
        if (!std::all_of(g, g + aligned, finite)) return problem::non_finite;
      } else {
        if (found->second.size() != aligned) return problem::size;
        for (std::size_t i = 0; i < aligned; ++i)
          if (!finite(g[i] + found->second[i])) return problem::non_finite;
      }
      if (!std::all_of(g + aligned, g + m, finite)) return problem::non_finite;
    }
    return problem::none;
  }

  /// One MAX all-reduce of the ranks' problems: every rank throws the same error, or none does.
  template <transport X>
  static void agree_on(X& t, problem mine) {
    double worst = static_cast<double>(mine);
    t.all_reduce_max(std::span<double>(&worst, 1));
    const auto found = static_cast<problem>(static_cast<int>(worst));
    const std::string who = found == mine ? "this rank" : "another rank";
    detail::require(found != problem::non_finite, errc::non_finite_input, [&] {
      return "tagc: " + who + "'s gradient (or gradient + residual) holds NaN or Inf; every rank skips this step";
    });
    detail::require(found != problem::size, errc::size_mismatch, [&] {
      return "tagc: " + who + " has a gradient that is not P shards, or a residual of another size";
    });
    detail::require(found != problem::tensor_id, errc::invalid_argument, [&] {
      return "tagc: " + who + " passed a tensor id at or above 2^64 / P, whose residual keys would wrap";
    });
  }

  /// Copies the residuals of the tensor's shards, so that a call that fails after sparsifying
  /// leaves the state as it was on every rank.
  static void save_residuals(state_type& state, std::uint64_t tensor_id, int ranks, std::size_t aligned) {
    const auto P = static_cast<std::size_t>(ranks);
    state.saved_residuals.resize(P * aligned);
    state.had_residual.assign(P, false);
    for (std::size_t s = 0; s < P; ++s) {
      const auto found = state.feedback.residuals.find(residual_key(tensor_id, ranks, static_cast<int>(s)));
      if (found == state.feedback.residuals.end()) continue;
      state.had_residual[s] = true;
      std::copy(found->second.begin(), found->second.end(),
                state.saved_residuals.begin() + static_cast<std::ptrdiff_t>(s * aligned));
    }
    state.saved_steps = state.feedback.steps;
  }

  static void restore_residuals(state_type& state, std::uint64_t tensor_id, int ranks, std::size_t aligned) noexcept {
    const auto P = static_cast<std::size_t>(ranks);
    for (std::size_t s = 0; s < P; ++s) {
      const auto key = residual_key(tensor_id, ranks, static_cast<int>(s));
      if (!state.had_residual[s]) {
        state.feedback.residuals.erase(key);
        continue;
      }
      const auto first = state.saved_residuals.begin() + static_cast<std::ptrdiff_t>(s * aligned);
      std::copy(first, first + static_cast<std::ptrdiff_t>(aligned), state.feedback.residuals[key].begin());
    }
    state.feedback.steps = state.saved_steps;
  }

  /// The scheme, once every rank has agreed that its inputs are valid.
  template <transport X>
  tagc_report reduce_scatter_checked(const cpu_executor& e, X& t, const lossless_homomorphic<T>& lhc,
                                     state_type& state, std::uint64_t tensor_id, std::span<const T> grad,
                                     std::span<T> shard, std::size_t aligned) const {
    const int ranks = t.size();
    const auto P = static_cast<std::size_t>(ranks);
    const std::size_t m = shard.size();
    const std::size_t tail = m - aligned;
    const std::size_t index_bytes = static_cast<std::size_t>(lhc.index_bytes(aligned));

    tagc_report report;
    report.dense_bytes = grad.size() * sizeof(T);
    state.sparse.resize(P * aligned);
    state.indexes.resize(P * index_bytes);
    for (int s = 0; s < ranks; ++s) {
      const auto part = grad.subspan(static_cast<std::size_t>(s) * m, aligned);
      const auto sparse = std::span<T>(state.sparse).subspan(static_cast<std::size_t>(s) * aligned, aligned);
      reserve_workspace(state, sparsifier_.workspace_bytes(e, aligned));
      report.kept += sparsifier_.sparsify(e, state.feedback, residual_key(tensor_id, ranks, s), part, sparse,
                                          state.workspace).kept;
      lhc.encode_index(e, sparse, index_of(state, s, index_bytes));
    }
    report.sent_bytes += state.indexes.size();

    const auto aggregate_index = [&](std::span<std::byte> index) { aggregate_lhc_index(t, lhc.params().index, index); };
    const auto plan_of = [&](int s) { return lhc.plan(e, index_of(state, s, index_bytes), aligned, P); };
    const auto fill_segment = [&](int s, const lhc_plan& plan, std::span<T> segment) {
      lhc.encode_sketch(e, std::span<const T>(state.sparse).subspan(static_cast<std::size_t>(s) * aligned, aligned),
                        index_of(state, s, index_bytes), plan, segment.first(plan.sketch_values()));
      const auto tail_values = grad.subspan(static_cast<std::size_t>(s) * m + aligned, tail);
      std::copy(tail_values.begin(), tail_values.end(), segment.begin() + static_cast<std::ptrdiff_t>(plan.sketch_values()));
      std::fill(segment.begin() + static_cast<std::ptrdiff_t>(plan.sketch_values() + tail), segment.end(), T{0});
    };

    lhc_plan own_plan{};
    if (params_.schedule == tagc_schedule::per_shard) {
      for (int s = 0; s < ranks; ++s) {
        aggregate_index(index_of(state, s, index_bytes));
        const lhc_plan plan = plan_of(s);
        state.segments.resize(plan.sketch_values() + tail);
        fill_segment(s, plan, state.segments);
        report.sent_bytes += state.segments.size() * sizeof(T);
        t.reduce_sum(std::span<T>(state.segments), s);
        if (s == t.rank()) {
          own_plan = plan;
          state.received = state.segments;
        }
      }
    } else {
      aggregate_index(state.indexes);
      std::vector<lhc_plan> plans;
      plans.reserve(P);
      std::size_t longest = 0;
      for (int s = 0; s < ranks; ++s) {
        plans.push_back(plan_of(s));
        longest = std::max(longest, static_cast<std::size_t>(plans.back().sketch_values()) + tail);
      }
      state.segments.resize(P * longest);
      for (int s = 0; s < ranks; ++s)
        fill_segment(s, plans[static_cast<std::size_t>(s)],
                     std::span<T>(state.segments).subspan(static_cast<std::size_t>(s) * longest, longest));
      state.received.resize(longest);
      report.sent_bytes += state.segments.size() * sizeof(T);
      t.reduce_scatter_sum(std::span<const T>(state.segments), std::span<T>(state.received));
      own_plan = plans[static_cast<std::size_t>(t.rank())];
    }

    const std::size_t sketch_values = own_plan.sketch_values();
    const lossless_homomorphic<T> peeler(with_stall_policy(lhc.params(), lhc_stall_policy::median_estimate));
    reserve_workspace(state, peeler.workspace_bytes(e, own_plan));
    lhc_decode_result peeled{};
    shard_outcome outcome = shard_outcome::peeled;
    try {
      peeled = peeler.decode(e, index_of(state, t.rank(), index_bytes), own_plan,
                             std::span<const T>(state.received).first(sketch_values), shard.first(aligned),
                             state.workspace);
      if (peeled.unrecovered > 0 && params_.sketch.on_stall == lhc_stall_policy::report) outcome = shard_outcome::stalled;
    } catch (const error& failure) {
      if (failure.code() != errc::non_finite_input) throw;
      outcome = shard_outcome::overflowed;  // the sum does not fit T: every rank must learn it
    }
    std::copy_n(state.received.begin() + static_cast<std::ptrdiff_t>(sketch_values), tail,
                shard.begin() + static_cast<std::ptrdiff_t>(aligned));
    report.resent_shards = settle_outcomes(t, state, grad, shard, outcome, aligned, report);
    for (T& v : shard) v /= static_cast<T>(ranks);

    report.union_nonzeros = own_plan.union_nonzeros;
    report.sketch_values = sketch_values;
    report.unrecovered = peeled.unrecovered;
    report.estimated = params_.sketch.on_stall == lhc_stall_policy::median_estimate ? peeled.estimated : 0;
    return report;
  }

  [[nodiscard]] lhc_params with_index(lhc_index_coding coding) const {
    lhc_params p = params_.sketch;
    p.index = coding;
    return p;
  }

  [[nodiscard]] static lhc_params with_stall_policy(lhc_params p, lhc_stall_policy policy) {
    p.on_stall = policy;
    return p;
  }

  /// How decoding went on a shard's owner.
  enum class shard_outcome : std::uint8_t { peeled, stalled, overflowed };

  /// One MAX all-reduce of the P owners' outcomes. A sum that does not fit the value type on any
  /// shard makes every rank throw `non_finite_input` (the caller restores the residuals). Under the
  /// `report` policy a stalled shard is never left wrong: its sparsified values and tail are summed
  /// again uncompressed onto its owner. Returns how many shards were resent.
  template <transport X>
  std::uint64_t settle_outcomes(X& t, state_type& state, std::span<const T> grad, std::span<T> shard,
                                shard_outcome mine, std::size_t aligned, tagc_report& report) const {
    const auto P = static_cast<std::size_t>(t.size());
    const std::size_t m = shard.size();
    std::vector<double> outcomes(P, 0.0);
    outcomes[static_cast<std::size_t>(t.rank())] = static_cast<double>(mine);
    t.all_reduce_max(std::span<double>(outcomes));
    for (std::size_t s = 0; s < P; ++s)
      detail::require(outcomes[s] != static_cast<double>(shard_outcome::overflowed), errc::non_finite_input, [&] {
        return "tagc: the sum of shard " + std::to_string(s) + " does not fit the value type; every rank skips this step";
      });
    std::uint64_t resent = 0;
    for (std::size_t s = 0; s < P; ++s) {
      if (outcomes[s] != static_cast<double>(shard_outcome::stalled)) continue;
      ++resent;
      state.segments.resize(m);
      std::copy_n(state.sparse.begin() + static_cast<std::ptrdiff_t>(s * aligned), aligned, state.segments.begin());
      std::copy_n(grad.begin() + static_cast<std::ptrdiff_t>(s * m + aligned), m - aligned,
                  state.segments.begin() + static_cast<std::ptrdiff_t>(aligned));
      t.reduce_sum(std::span<T>(state.segments), static_cast<int>(s));
      report.sent_bytes += m * sizeof(T);
      if (s == static_cast<std::size_t>(t.rank())) std::copy(state.segments.begin(), state.segments.end(), shard.begin());
    }
    return resent;
  }

  static std::span<std::byte> index_of(state_type& state, int shard, std::size_t index_bytes) {
    return std::span<std::byte>(state.indexes).subspan(static_cast<std::size_t>(shard) * index_bytes, index_bytes);
  }

  static void reserve_workspace(state_type& state, std::size_t bytes) {
    if (state.workspace.size() < bytes) state.workspace.resize(bytes);
  }

  tagc_params params_;
  dynamic_sparsifier<T> sparsifier_;
};

}  // namespace gradcomp
