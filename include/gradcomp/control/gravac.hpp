#pragma once
/// @file
/// GraVAC (Tyagi & Swany 2023): an adaptive controller that searches for the most aggressive
/// density θ of a sparsifier (top-k by default) whose compressed gradient still keeps enough of
/// the gradient, judged by compression gain and compression throughput (docs/control.md §1).
///
/// Each step the trainer compresses its gradient twice: at the candidate density θ_cur
/// ("current") and at the safe density θ_min ("safe"), each with its own error-feedback residual.
/// The controller smooths the magnitudes of the gradient and of both compressed gradients with a
/// windowed EWMA, and the gain of a candidate is EWMA(‖C(g)‖) / EWMA(‖g‖). It sends the candidate
/// when its gain reaches ε, else the safe level when that one does, else the dense gradient. It
/// records the compression throughput CT(θ) = samples/s × gain of what was sent and, window by
/// window, moves the candidate θ_cur ← θ_cur × step towards θ_max until the best two throughputs
/// differ by less than ω, keeping the more aggressive θ.
///
/// Back-off (`back_off`, not in the reference): at the end of every window, a candidate below θ_min
/// whose gain is below ε is replaced by θ_cur ÷ step (the last density that passed, capped at θ_min)
/// and the search stops; after the search the check goes on every W steps, so θ_cur only rises.
/// Without it the search only ever lowers θ_cur, and a candidate whose gain falls is merely
/// replaced step by step by the safe level. With error feedback the gain does not fall: the
/// residual grows until ‖C(g + e)‖ is about ‖g‖ at any density (on the LM task of
/// docs/lm-hook-runs.md, ‖C(g + e)‖/‖g‖ was 0.74-1.5 at θ = 0.16% over steps 25-75), so the back-off
/// also needs `gain_input = gradient`: the trainer measures C(g) without the residual, whose gain
/// is the fraction of the step's gradient the density keeps (there 0.91-0.94 at 10%, 0.74-0.79 at
/// 2.5%, 0.38-0.46 at 0.16%). docs/control.md §1.1 has the figures.
///
/// Fixes to the reference code (run/compression_throughput.py):
/// - the search is progressive, one candidate per window of W steps, down to θ_max (the reference
///   jumps from θ_min straight to θ_max);
/// - the EWMA is defined from the first sample (over the samples there are, at most W), and a
///   gain whose gradient EWMA is 0 is defined as 1: a zero gradient loses nothing (the reference
///   divides 0 by 0 during its first W steps);
/// - a gain divides EWMAs over the same steps: a new candidate's EWMA restarts, and is compared
///   with the gradient's of the steps it was observed (against the gradient's whole window, the
///   first sample after a gradient spike measured a gain of 6.3 on the LM task, and that sample
///   weighed on the candidate's gain for W steps);
/// - every step sends something, so gradients are always synchronised (the reference sends
///   nothing while θ_cur equals θ_min after its warm-up);
/// - a candidate's gain is computed from its own compressed norms (the reference re-reads the
///   safe compressor's);
/// - only the path actually sent updates its error-feedback residual (`gravac_feedback`, with the
///   reference's "both residuals every step" as the alternative);
/// - decisions depend only on rank-aggregated statistics (`aggregate_observation`), so every
///   rank takes the same decision and no collective deadlocks.
///
/// Why not the `controller` concept's `next(const round_stats&)`: a round_stats carries the norm
/// of one compressed gradient, and GraVAC needs the norms of both candidates every step. The
/// controller reads a `gravac_observation` instead; it still keeps the concept's shape (one
/// `next` per step returning the next `parameters`).
///
/// Checkpoints: `save_state` writes the controller's whole history (EWMA windows, search
/// position, throughputs) in the saved-state frame of core/saved_state.hpp, magic "GCGV"; a
/// controller with the same options that `load_state`s it decides exactly as the saved one would
/// have. Layout (little-endian), after the common head (bytes 0..16: magic, version 2, codec 0,
/// dtype float64, n = W). Version 2 hashes the options `back_off` and `gain_input` and, with
/// `back_off`, counts the window position after the search too (for the back-off check); version 1
/// states are refused (`unsupported_version`):
///
/// | offset | bytes | field |
/// |---|---|---|
/// | 17 | 8 | hash of the options (`gravac_options::hash`) |
/// | 25 | 8 | steps observed |
/// | 33 | 8 | θ_cur, float64 |
/// | 41 | 4 | steps into the current window (search, or back-off check after it) |
/// | 45 | 1 | searching (0 or 1) |
/// | 46 | 4 | T, the number of densities with a recorded throughput |
/// | 50 | 24 | next slot and sample count of the gradient, candidate and safe EWMAs, u32 each |
/// | 74 | 4 | CRC-32C of bytes 0..74 |
/// | 78 | 24·W | the three EWMA windows (gradient, candidate, safe), W float64 each |
/// | 78 + 24·W | 24·T | per density: θ, throughput sum (float64), count (u64) |
/// | end | 4 | CRC-32C of the payload |

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <span>
#include <vector>

#include <gradcomp/core/error.hpp>
#include <gradcomp/core/rounded_product.hpp>
#include <gradcomp/core/saved_state.hpp>
#include <gradcomp/core/wire_envelope.hpp>
#include <gradcomp/sparsify/sparsity.hpp>
#include <gradcomp/transport/transport.hpp>

namespace gradcomp {

/// What the gain compares.
enum class gravac_gain_measure : std::uint8_t {
  norm,          ///< Sums of per-layer L2 norms, Σ_l ‖x_l‖₂ (the reference code).
  squared_norm,  ///< Sums of per-layer squared L2 norms, Σ_l ‖x_l‖₂² (a variance ratio).
  /// The energy a compression keeps, Σ_l max(0, ‖x_l‖₂² − ‖x_l − C(x_l)‖₂²) for a path and
  /// Σ_l ‖g_l‖₂² for the gradient (`gravac_controller::kept_energy`). For a sparsifier that sends
  /// the values it keeps (top-k), ‖x − C(x)‖² = ‖x‖² − ‖C(x)‖², so this is `squared_norm`. A
  /// quantizer's output has about its input's norm at any bit width: only its error says what it
  /// loses, which this measure counts (a ladder of bit widths, docs/control.md §1.8).
  kept_energy,
};

/// Which error-feedback residuals a step updates.
enum class gravac_feedback : std::uint8_t {
  sent_path_only,  ///< Only the residual of the path sent (none when the dense gradient is sent).
  both_paths,      ///< Both candidates' residuals every step, whatever was sent (the reference).
};

/// What the trainer compresses to measure the magnitudes `current` and `safe` of an observation.
enum class gravac_gain_input : std::uint8_t {
  compensated,  ///< g + e, the gradient with its residual: the message sent (the reference).
  gradient,     ///< g alone, without the residual: what the density keeps of this step's gradient.
};

/// What a step sends.
enum class gravac_choice : std::uint8_t {
  current,  ///< The gradient compressed at the candidate density θ_cur.
  safe,     ///< The gradient compressed at the safe density θ_min.
  dense,    ///< The uncompressed gradient.
};

/// Hyper-parameters of the GraVAC controller; the defaults are the reference's.
struct gravac_options {
  double theta_min = 0.1;     ///< Safe density θ_min, where the search starts.
  double theta_max = 0.0001;  ///< Most aggressive density θ_max, where the search ends.
  double step = 0.5;          ///< Multiplier on θ_cur after each window of the search, in (0, 1).
  double epsilon = 0.75;      ///< Minimum gain ε of a compressed path to be sent.
  double omega = 0.05;        ///< Plateau threshold ω on the relative gap of the best two throughputs.
  std::uint32_t window = 25;  ///< Window W: steps per candidate, and the EWMA's length.
  double alpha = 0.05;        ///< EWMA smoothing α: the sample k steps old weighs (1 − α)^k.
  gravac_gain_measure measure = gravac_gain_measure::norm;       ///< What the gain compares.
  gravac_feedback feedback = gravac_feedback::sent_path_only;  ///< Which residuals a step updates.
  /// Multi-level compression: the trainer computes the candidate by compressing the safe result
  /// further (keeping θ_cur/θ_min of its values) instead of sparsifying the whole gradient again.
  /// The controller only reports the flag in its decisions; the trainer acts on it.
  bool multi_level = false;
  /// What the gain's compressed magnitudes are measured on; the trainer reads it here and acts on it.
  gravac_gain_input gain_input = gravac_gain_input::compensated;
  /// Raise θ_cur when its gain is below ε at the end of a window (class comment; not in the reference).
  bool back_off = false;

  /// Throws `invalid_argument` unless 0 < θ_max ≤ θ_min ≤ 1, 0 < step < 1, ε ≥ 0, ω ≥ 0 (both
  /// finite), W ≥ 1 and 0 < α ≤ 1.
  void validate() const {
    const auto require = [](bool ok, const char* what) { detail::require(ok, errc::invalid_argument, what); };
    require(theta_max > 0.0 && theta_max <= theta_min && theta_min <= 1.0,
            "GraVAC densities must satisfy 0 < theta_max <= theta_min <= 1");
    require(step > 0.0 && step < 1.0, "GraVAC step multiplier must lie in (0, 1)");
    require(epsilon >= 0.0 && std::isfinite(epsilon), "GraVAC minimum gain epsilon must be finite and >= 0");
    require(omega >= 0.0 && std::isfinite(omega), "GraVAC plateau threshold omega must be finite and >= 0");
    require(window >= 1, "GraVAC window must hold at least one step");
    require(alpha > 0.0 && alpha <= 1.0, "GraVAC EWMA alpha must lie in (0, 1]");
  }

  /// Hash of every option, which saved states carry so that a checkpoint is only restored into a
  /// controller configured alike.
  [[nodiscard]] std::uint64_t hash() const noexcept {
    return params_hasher{}
        .add(theta_min)
        .add(theta_max)
        .add(step)
        .add(epsilon)
        .add(omega)
        .add(window)
        .add(alpha)
        .add(static_cast<std::uint8_t>(measure))
        .add(static_cast<std::uint8_t>(feedback))
        .add(static_cast<std::uint8_t>(multi_level))
        .add(static_cast<std::uint8_t>(gain_input))
        .add(static_cast<std::uint8_t>(back_off))
        .value();
  }
};

/// The statistics of one step, summed over layers and aggregated over ranks
/// (`aggregate_observation`). Magnitudes are Σ_l `gravac_controller::magnitude(‖x_l‖₂²)`: norms
/// or squared norms as the options' `measure` says; under `kept_energy` the paths' are
/// Σ_l `gravac_controller::kept_energy(‖x_l‖₂², ‖x_l − C(x_l)‖₂²)`.
struct gravac_observation {
  double gradient = 0.0;       ///< Magnitude of the gradient g (without residuals).
  double current = 0.0;  ///< Magnitude of C_cur at θ_cur, of g + e_cur or g as `gain_input` says.
  double safe = 0.0;     ///< Magnitude of C_min at θ_min, of g + e_min or g as `gain_input` says.
  double seconds = 0.0;        ///< Wall time of the step; 0 marks an untimed step, which adds no throughput.
  std::uint64_t samples = 0;   ///< Samples the step processed.

  /// Throws `invalid_argument` unless every field is finite and ≥ 0.
  void validate() const {
    const auto ok = [](double v) { return v >= 0.0 && std::isfinite(v); };
    detail::require(ok(gradient) && ok(current) && ok(safe) && ok(seconds), errc::invalid_argument,
                    "GraVAC observations must be finite and >= 0");
  }
};

/// What the trainer does in the coming step.
struct gravac_decision {
  gravac_choice send = gravac_choice::safe;  ///< The path to send.
  sparsity current{};                        ///< Density θ_cur of the candidate to compute.
  sparsity safe{};                           ///< Density θ_min of the safe level to compute.
  std::optional<double> gain_current;        ///< Candidate's gain; empty until the candidate was observed.
  std::optional<double> gain_safe;           ///< Safe level's gain; empty before the first observation.
  bool searching = true;                     ///< Whether the search for θ is still running.
  bool update_current_residual = false;      ///< Whether the candidate's residual takes this step's error.
  bool update_safe_residual = true;          ///< Whether the safe level's residual takes this step's error.
  bool multi_level = false;                  ///< Compute the candidate from the safe result (options).

  /// The amount sent: θ_cur's or θ_min's sparsity, or empty for the dense gradient.
  [[nodiscard]] std::optional<sparsity> sent() const {
    if (send == gravac_choice::current) return current;
    if (send == gravac_choice::safe) return safe;
    return std::nullopt;
  }

  friend bool operator==(const gravac_decision&, const gravac_decision&) = default;
};

/// Aggregates one rank's step statistics over the ranks of `t`: magnitudes and samples are summed,
/// the time is the slowest rank's. Collective; every rank gets the same bits (the transport
/// reduces in rank order), so controllers fed the result decide identically. Nothing is checked
/// before the collectives: an invalid value on any rank reaches every rank, whose `next` throws.
template <transport X>
[[nodiscard]] gravac_observation aggregate_observation(X& t, const gravac_observation& local) {
  std::array<double, 3> magnitudes{local.gradient, local.current, local.safe};
  std::array<double, 1> seconds{local.seconds};
  std::array<std::uint64_t, 1> samples{local.samples};
  t.all_reduce_sum(std::span<double>(magnitudes));
  t.all_reduce_max(std::span<double>(seconds));
  t.all_reduce_sum(std::span<std::uint64_t>(samples));
  return {magnitudes[0], magnitudes[1], magnitudes[2], seconds[0], samples[0]};
}

namespace detail {

/// EWMA over the last `window` samples with weights (1 − α)^k (k = 0 newest), normalised by the
/// weights of the samples present (pandas' ewm(adjust=True) over a rolling window). Unlike the
/// reference it is defined from the first sample; empty, it is 0.
class windowed_ewma {
 public:
  windowed_ewma(std::uint32_t window, double alpha) : values_(window), decay_(1.0 - alpha) {}

  void push(double v) {
    values_[next_] = v;
    next_ = (next_ + 1) % values_.size();
    count_ = std::min(count_ + 1, values_.size());
  }
  void clear() noexcept { count_ = 0; }
  [[nodiscard]] bool empty() const noexcept { return count_ == 0; }
  /// The ring of samples, the slot the next sample goes to, and how many samples it holds.
  [[nodiscard]] const std::vector<double>& samples() const noexcept { return values_; }
  [[nodiscard]] std::size_t next_slot() const noexcept { return next_; }
  [[nodiscard]] std::size_t count() const noexcept { return count_; }
  /// Restores a ring saved from `samples`, `next_slot` and `count` (same window; checked by the caller).
  void restore(std::span<const double> samples, std::size_t next, std::size_t count) {
    std::copy(samples.begin(), samples.end(), values_.begin());
    next_ = next;
    count_ = count;
  }

  /// The EWMA of the newest min(`newest`, count()) samples (all of them by default).
  [[nodiscard]] double value(std::size_t newest = SIZE_MAX) const {
    const std::size_t n = std::min(newest, count_);
    double weighted = 0.0;
    double weights = 0.0;
    double w = 1.0;
    for (std::size_t k = 0; k < n; ++k) {
      weighted +=
          mul_rn(w, values_[(next_ + values_.size() - 1 - k) % values_.size()]);  // unfused: same bits on every rank
      weights += w;
      w *= decay_;
    }
    return n == 0 ? 0.0 : weighted / weights;
  }

 private:
  std::vector<double> values_;
  std::size_t next_ = 0;
  std::size_t count_ = 0;
  double decay_;
};

}  // namespace detail

/// The GraVAC controller. Per step the trainer:
/// 1. reads `decision()` (the first is: send the safe level);
/// 2. compresses g + e_cur at `decision().current` and g + e_min at `decision().safe` (once when
///    they are equal; from the safe result when `multi_level`); with `gain_input = gradient` it
///    also compresses g alone at both densities, for the magnitudes only;
/// 3. sends the path `decision().send` names (the dense gradient for `dense`) and updates the
///    residuals the decision's flags name;
/// 4. passes the step's statistics, aggregated over ranks, to `next`, which returns the decision
///    for the following step.
///
/// `next` pushes the magnitudes into the EWMAs; while searching it adds samples/s × gain of what
/// was sent to the throughput of that density (θ_cur, θ_min, or 1 for dense); at the end of each
/// window it checks for a plateau (best two throughputs with CT₁ − CT₂ < ω·CT₂: stop at the
/// smaller θ), else moves θ_cur ← max(θ_cur·step, θ_max), else (θ_max's window done) stops at
/// the density of the best throughput, θ_min if that is dense or nothing was timed. With
/// `back_off`, every window's end (searching or not) first checks the candidate: below θ_min with a
/// gain below ε, it becomes min(θ_cur ÷ step, θ_min) and the search stops. Then it
/// decides: the candidate if θ_cur ≠ θ_min and its gain is at least ε, else the safe level if its
/// gain is, else dense. A new candidate's EWMA starts empty, so it is observed for one step
/// before it can be sent. The decision for a step thus uses the statistics up to the step before.
class gravac_controller {
 public:
  using parameters = gravac_decision;  ///< What `next` returns.

  /// @throws error `invalid_argument` for invalid options.
  explicit gravac_controller(gravac_options options = {})
      : options_(validated(options)),
        gradient_(options_.window, options_.alpha),
        current_(options_.window, options_.alpha),
        safe_(options_.window, options_.alpha),
        theta_current_(options_.theta_min) {
    decision_ = decide();
  }

  /// The options.
  [[nodiscard]] const gravac_options& options() const noexcept { return options_; }
  /// The decision for the coming step.
  [[nodiscard]] const gravac_decision& decision() const noexcept { return decision_; }
  /// Steps observed so far.
  [[nodiscard]] std::uint64_t steps() const noexcept { return steps_; }

  /// What one layer with squared L2 norm `squared_norm` adds to an observation's magnitude:
  /// its norm, or the squared norm itself, as the options' `measure` says (`kept_energy`: the
  /// squared norm, which is a gradient's magnitude, and a top-k path's; see `kept_energy`).
  [[nodiscard]] double magnitude(double squared_norm) const {
    return options_.measure == gravac_gain_measure::norm ? std::sqrt(squared_norm) : squared_norm;
  }

  /// What one layer adds to a compressed path's magnitude under `gravac_gain_measure::kept_energy`:
  /// max(0, ‖x_l‖₂² − ‖x_l − C(x_l)‖₂²), from the layer's squared norm and its compression's
  /// squared error. 0 when the error outweighs the layer (a 1-bit code of a block whose largest
  /// value dominates can); NaN inputs give NaN, which `next` refuses.
  [[nodiscard]] static double kept_energy(double squared_norm, double squared_error) noexcept {
    const double kept = squared_norm - squared_error;
    return kept > 0.0 || std::isnan(kept) ? kept : 0.0;
  }

  /// Bytes `save_state` writes.
  [[nodiscard]] std::size_t saved_state_bytes() const noexcept {
    return state_format::header_bytes + 3 * sizeof(double) * std::size_t{options_.window} +
           state_format::record_bytes * throughputs_.size() + state_format::checksum_bytes;
  }

  /// Writes the controller's history for a checkpoint (layout in the file comment).
  /// @returns bytes written. @throws error `buffer_too_small` when `bytes` holds fewer than
  /// `saved_state_bytes()`.
  std::size_t save_state(std::span<std::byte> bytes) const {
    const std::size_t size = saved_state_bytes();
    detail::require_state_room(bytes, size);
    std::byte* const p = bytes.data();
    detail::write_state_head<state_format>(p, codec_id{}, value_dtype::float64, options_.window);
    state_format::options_hash.store(p, options_.hash());
    state_format::steps.store(p, steps_);
    state_format::theta_current.store(p, theta_current_);
    state_format::window_steps.store(p, window_steps_);
    state_format::searching.store(p, searching_ ? 1 : 0);
    state_format::throughput_count.store(p, static_cast<std::uint32_t>(throughputs_.size()));
    const auto ewma = ewmas();
    for (std::size_t i = 0; i < ewma.size(); ++i) {
      state_format::ewma_next(i).store(p, static_cast<std::uint32_t>(ewma[i]->next_slot()));
      state_format::ewma_count(i).store(p, static_cast<std::uint32_t>(ewma[i]->count()));
    }
    std::byte* q = p + state_format::header_bytes;
    for (const auto* e : ewmas())
      for (double v : e->samples()) {
        detail::store_le<double>(q, v);
        q += 8;
      }
    for (const auto& t : throughputs_) {
      state_format::record_theta.store(q, t.theta);
      state_format::record_sum.store(q, t.sum);
      state_format::record_count.store(q, t.count);
      q += state_format::record_bytes;
    }
    detail::seal_state<state_format>(p, size - state_format::header_bytes - state_format::checksum_bytes);
    return size;
  }

  /// Restores a history written by `save_state` of a controller with the same options; the
  /// controller then decides exactly as the saved one would have.
  /// @throws error `truncated`, `trailing_bytes`, `bad_magic`, `unsupported_version`,
  /// `header_checksum`, `payload_checksum`, `codec_mismatch`, `dtype_mismatch`;
  /// `parameter_mismatch` when the options differ; `malformed_payload` for values no controller
  /// reaches. The controller is unchanged on error.
  void load_state(std::span<const std::byte> bytes) {
    const std::uint64_t window =
        detail::check_state_head<state_format>(bytes, codec_id{}, value_dtype::float64, "GCGV");
    const std::byte* const p = bytes.data();
    detail::require(window == options_.window && state_format::options_hash.load(p) == options_.hash(),
                    errc::parameter_mismatch, "GraVAC state saved by a controller with other options");
    const auto throughput_count = state_format::throughput_count.load(p);
    const auto payload =
        detail::check_state_body<state_format>(bytes, 3 * sizeof(double) * std::size_t{options_.window} +
                                                          state_format::record_bytes * throughput_count);
    const auto bad = [](const char* what) {
      detail::fail(errc::malformed_payload, std::string("GraVAC state: ") + what);
    };
    const auto density = [&](double theta) { return theta >= options_.theta_max && theta <= 1.0; };

    const double theta = state_format::theta_current.load(p);
    const auto window_steps = state_format::window_steps.load(p);
    const auto searching = state_format::searching.load(p);
    if (!(density(theta) && theta <= options_.theta_min)) bad("candidate density out of range");
    if (window_steps >= options_.window || searching > 1) bad("window position out of range");
    std::array<std::uint32_t, 3> next{}, count{};
    for (std::size_t i = 0; i < 3; ++i) {
      next[i] = state_format::ewma_next(i).load(p);
      count[i] = state_format::ewma_count(i).load(p);
      if (next[i] >= options_.window || count[i] > options_.window) bad("EWMA position out of range");
    }
    std::vector<double> samples(3 * std::size_t{options_.window});
    for (std::size_t i = 0; i < samples.size(); ++i) {
      samples[i] = detail::load_le<double>(payload.data() + 8 * i);
      if (!(samples[i] >= 0.0 && std::isfinite(samples[i]))) bad("EWMA sample not finite and >= 0");
    }
    std::vector<throughput> throughputs(throughput_count);
    const std::byte* q = payload.data() + 8 * samples.size();
    for (auto& t : throughputs) {
      t = {state_format::record_theta.load(q), state_format::record_sum.load(q), state_format::record_count.load(q)};
      if (!density(t.theta) || !(t.sum >= 0.0 && std::isfinite(t.sum)) || t.count == 0)
        bad("throughput record out of range");
      q += state_format::record_bytes;
    }

    const auto ring = std::span<const double>(samples);
    const std::size_t w = options_.window;
    auto ewma = ewmas();
    for (std::size_t i = 0; i < 3; ++i) ewma[i]->restore(ring.subspan(i * w, w), next[i], count[i]);
    steps_ = state_format::steps.load(p);
    theta_current_ = theta;
    window_steps_ = window_steps;
    searching_ = searching == 1;
    throughputs_ = std::move(throughputs);
    decision_ = decide();
  }

  /// Takes the rank-aggregated statistics of the step just finished (made under `decision()`)
  /// and returns the decision for the next step.
  /// @throws error `invalid_argument` when the observation is invalid (nothing changes then).
  gravac_decision next(const gravac_observation& step) {
    step.validate();
    gradient_.push(step.gradient);
    current_.push(step.current);
    safe_.push(step.safe);
    if (searching_) record_throughput(step);
    if ((searching_ || options_.back_off) && ++window_steps_ == options_.window) {
      window_steps_ = 0;
      end_window();
    }
    ++steps_;
    decision_ = decide();
    return decision_;
  }

 private:
  /// The controller's saved-state header and payload records, field by field (the table in the
  /// file comment), after the frame's (core/saved_state.hpp).
  struct state_format : detail::saved_state_frame {
    static constexpr std::uint32_t magic = 0x56474347u;  ///< "GCGV" as a little-endian word.
    static constexpr std::uint16_t version = 2;          ///< The version this build writes and reads.
    static constexpr detail::state_field<std::uint64_t> options_hash = count.then<std::uint64_t>();
    static constexpr detail::state_field<std::uint64_t> steps = options_hash.then<std::uint64_t>();
    static constexpr detail::state_field<double> theta_current = steps.then<double>();
    static constexpr detail::state_field<std::uint32_t> window_steps = theta_current.then<std::uint32_t>();
    static constexpr detail::state_field<std::uint8_t> searching = window_steps.then<std::uint8_t>();
    static constexpr detail::state_field<std::uint32_t> throughput_count = searching.then<std::uint32_t>();
    /// EWMA i's next slot (gradient, candidate, safe: i = 0, 1, 2), after the fields above.
    static constexpr detail::state_field<std::uint32_t> ewma_next(std::size_t i) {
      return {throughput_count.end() + ewma_bytes * i};
    }
    /// EWMA i's sample count, after its next slot.
    static constexpr detail::state_field<std::uint32_t> ewma_count(std::size_t i) {
      return ewma_next(i).then<std::uint32_t>();
    }
    static constexpr std::size_t ewma_bytes = 8;  ///< Next slot and count of one EWMA.
    static constexpr std::size_t header_crc_offset = throughput_count.end() + 3 * ewma_bytes;  ///< After the EWMAs.
    static constexpr std::size_t header_bytes = header_crc_offset + checksum_bytes;  ///< Header size, its CRC included.
    /// A throughput record of the payload: θ, then the throughput sum and count.
    static constexpr detail::state_field<double> record_theta{0};
    static constexpr detail::state_field<double> record_sum = record_theta.then<double>();
    static constexpr detail::state_field<std::uint64_t> record_count = record_sum.then<std::uint64_t>();
    static constexpr std::size_t record_bytes = record_count.end();  ///< One throughput record.
  };
  static_assert(state_format::header_bytes == 78 && state_format::record_bytes == 24, "the table in the file comment");

  [[nodiscard]] std::array<const detail::windowed_ewma*, 3> ewmas() const noexcept {
    return {&gradient_, &current_, &safe_};
  }
  [[nodiscard]] std::array<detail::windowed_ewma*, 3> ewmas() noexcept { return {&gradient_, &current_, &safe_}; }

  /// The throughputs measured at one density during the search.
  struct throughput {
    double theta = 0.0;
    double sum = 0.0;
    std::uint64_t count = 0;
    [[nodiscard]] double mean() const { return sum / static_cast<double>(count); }
  };

  static gravac_options validated(const gravac_options& options) {
    options.validate();
    return options;
  }

  /// EWMA(magnitude) / EWMA(gradient) over the same steps (a candidate observed for fewer steps
  /// than the gradient is compared with the gradient of those steps only), 1 when the gradient's
  /// EWMA is 0.
  [[nodiscard]] double gain(const detail::windowed_ewma& compressed) const {
    const double g = gradient_.value(compressed.count());
    return g > 0.0 ? compressed.value() / g : 1.0;
  }

  void record_throughput(const gravac_observation& step) {
    if (step.seconds == 0.0) return;
    double theta = 1.0;
    double sent_gain = 1.0;
    if (decision_.send == gravac_choice::current) {
      theta = theta_current_;
      sent_gain = gain(current_);
    } else if (decision_.send == gravac_choice::safe) {
      theta = options_.theta_min;
      sent_gain = gain(safe_);
    }
    const double value = static_cast<double>(step.samples) / step.seconds * sent_gain;
    const auto it = std::ranges::find(throughputs_, theta, &throughput::theta);
    if (it == throughputs_.end()) throughputs_.push_back({theta, value, 1});
    else {
      it->sum += value;
      ++it->count;
    }
  }

  /// At the end of a window: back off from a candidate that loses too much (`back_off`), else
  /// move the search on.
  void end_window() {
    if (options_.back_off && theta_current_ < options_.theta_min && gain(current_) < options_.epsilon)
      finish_search(std::min(theta_current_ / options_.step, options_.theta_min));
    else if (searching_)
      advance_search();
  }

  void advance_search() {
    std::ranges::sort(throughputs_, [](const throughput& a, const throughput& b) {
      return a.mean() != b.mean() ? a.mean() > b.mean() : a.theta < b.theta;
    });
    if (throughputs_.size() >= 2 &&
        throughputs_[0].mean() - throughputs_[1].mean() < options_.omega * throughputs_[1].mean())
      finish_search(std::min(throughputs_[0].theta, throughputs_[1].theta));
    else if (theta_current_ > options_.theta_max)
      set_candidate(std::max(theta_current_ * options_.step, options_.theta_max));
    else
      finish_search(throughputs_.empty() ? options_.theta_min : std::min(throughputs_[0].theta, options_.theta_min));
  }

  void finish_search(double theta) {
    searching_ = false;
    set_candidate(theta);
  }

  void set_candidate(double theta) {
    if (theta == theta_current_) return;
    theta_current_ = theta;
    current_.clear();
  }

  [[nodiscard]] gravac_decision decide() const {
    gravac_decision d;
    d.current = sparsity{.density = theta_current_};
    d.safe = sparsity{.density = options_.theta_min};
    if (!current_.empty()) d.gain_current = gain(current_);
    if (!safe_.empty()) d.gain_safe = gain(safe_);
    d.searching = searching_;
    d.multi_level = options_.multi_level;
    if (theta_current_ != options_.theta_min && d.gain_current && *d.gain_current >= options_.epsilon)
      d.send = gravac_choice::current;
    else if (!d.gain_safe || *d.gain_safe >= options_.epsilon)
      d.send = gravac_choice::safe;
    else
      d.send = gravac_choice::dense;
    const bool both = options_.feedback == gravac_feedback::both_paths;
    d.update_current_residual = both || d.send == gravac_choice::current;
    d.update_safe_residual = both || d.send == gravac_choice::safe;
    return d;
  }

  gravac_options options_;
  detail::windowed_ewma gradient_;
  detail::windowed_ewma current_;
  detail::windowed_ewma safe_;
  double theta_current_;
  bool searching_ = true;
  std::uint32_t window_steps_ = 0;
  std::uint64_t steps_ = 0;
  std::vector<throughput> throughputs_;
  gravac_decision decision_;
};

}  // namespace gradcomp
