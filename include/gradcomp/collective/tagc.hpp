#pragma once
/// @file
/// TAGC's compressed reduce-scatter for sharded training (FSDP, ZeRO; docs/sketches.md §3), a
/// scheme passed to `compressed_reduce_scatter` (its `tagc` plan), on any executor:
///
///     compressed_reduce_scatter(exec, transport, tagc_scheme, state, data, out, options)
///
/// The flat gradient of one parameter, n values on every rank, ends as this rank's chunk
/// (`ring_chunk_of(n, P, rank)`, the reduce-scatter's layout) of Σ_p x̃_p, the sum over ranks of
/// each rank's gradient after dynamic sparsification with error feedback (the mean with
/// `options.average`). With n = P·m every chunk is a shard of m values. For every chunk s, every
/// rank
///
///  1. sparsifies the block-aligned part of chunk s (⌊count_s/B⌋·B values) to the target zero
///     fraction, with its error-feedback residual kept under the key (tensor id, s);
///  2. encodes the index of what it kept; the indexes are aggregated (bitwise OR where the transport
///     has it, else summed 4- or 8-bit fields), so every rank knows the union and sizes the sketch
///     identically (`lossless_homomorphic::plan`);
///  3. sketches its sparsified values; the sketches, followed by the tail of chunk s (its last
///     count_s mod B values) sent uncompressed, are summed onto owner s;
///  4. owner s peels its sketch (and divides by P with `average`).
///
/// Two schedules give identical results: `per_shard` (P index all-reduces and P reduces, the
/// reference's order) and `fused` (one all-reduce of the P indexes and one reduce-scatter of the
/// P sketch-and-tail segments, each padded with zeros to the longest). Results are never silently
/// wrong: when an owner cannot peel its sketch completely, the `report` stall policy (default)
/// sums that chunk again uncompressed, and `median_estimate` keeps the estimates and counts them.
///
/// The ranks agree first through the agreement record of every compressed collective
/// (collective/agreement.hpp; plan `tagc`, docs/wire-format.md §21): a rank whose `out` is not its
/// chunk, whose residual of a chunk has another size, or whose gradient (or gradient + residual)
/// holds NaN or Inf makes every rank throw the same error at the same step, before any state
/// changes. The P owners' outcomes after peeling are agreed by one MAX all-reduce of P host
/// doubles; a call that fails after sparsifying restores every residual it changed. Every call has
/// a deadline, `options.timeout` from its start (collective/call_deadline.hpp): a rank that stops
/// calling makes the others throw `timeout`, with `out` and every residual as before the call.
///
/// bf16 and fp16 gradients (host executors): the sparsifier keeps float32 residuals and passes on
/// float32 values (sparsify/dynamic.hpp), which are sketched in float32 cells, and the tails travel
/// widened to float32, so every message is the float32 scheme's on the widened gradient; the owner's
/// float32 chunk (divided by P there with `average`) is rounded once into `out`, and a value beyond
/// the 16-bit range is `narrowing_overflow` on every rank (docs/half-precision.md §3).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include <gradcomp/collective/agreement.hpp>
#include <gradcomp/collective/call_deadline.hpp>
#include <gradcomp/collective/collective_memory.hpp>
#include <gradcomp/collective/compressed_frame.hpp>
#include <gradcomp/collective/compressed_reduce_scatter.hpp>
#include <gradcomp/collective/executor_transport.hpp>
#include <gradcomp/collective/lhc_stages.hpp>
#include <gradcomp/collective/ring.hpp>
#include <gradcomp/core/concepts.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/wire_envelope.hpp>
#include <gradcomp/sketch/lossless_homomorphic.hpp>
#include <gradcomp/sparsify/dynamic.hpp>
#include <gradcomp/transport/transport.hpp>

namespace gradcomp {

/// How the P per-chunk sums travel.
enum class tagc_schedule : std::uint8_t {
  per_shard,  ///< One index all-reduce and one reduce to the owner per chunk (as the reference).
  fused,      ///< One all-reduce of all indexes and one reduce-scatter of all sketches.
};

/// Parameters of the TAGC scheme; every rank must use the same (they are hashed into the agreement).
struct tagc_params {
  dynamic_params sparsify{};                      ///< Target zero fraction f* (default 0.80) and mode.
  lhc_params sketch{};                            ///< Block B, sizing, index coding, stall policy.
  tagc_schedule schedule = tagc_schedule::fused;  ///< Per-chunk or fused collectives.
};

/// What one TAGC reduce-scatter did on this rank: the compressed collectives' report (its
/// `sent_bytes` are the bytes this rank contributed: indexes, sketch-and-tail segments, padded to
/// the longest in the fused schedule, and resent chunks; `dense_bytes` the n values an uncompressed
/// reduce-scatter contributes; the agreement's control words are not counted), and what TAGC found.
struct tagc_report : compressed_report {
  /// `sent_bytes` by segment: they add up to it.
  std::uint64_t index_bytes = 0;    ///< The P indexes (step 2).
  std::uint64_t sketch_bytes = 0;   ///< The P sketches (step 3).
  std::uint64_t tail_bytes = 0;     ///< The P tails, sent uncompressed (step 3).
  std::uint64_t padding_bytes = 0;  ///< Zeros padding each sketch-and-tail segment to the longest (`fused`).
  std::uint64_t resent_bytes = 0;   ///< Chunks summed again uncompressed after a stall (`report`).
  std::uint64_t kept = 0;             ///< Values this rank kept over all chunks.
  std::uint64_t union_nonzeros = 0;   ///< Non-zeros of the aggregated index of this rank's chunk.
  std::uint64_t sketch_values = 0;    ///< Sketch cells (or dense values) of this rank's chunk.
  std::uint64_t unrecovered = 0;      ///< Values of this rank's chunk that peeling did not recover.
  std::uint64_t estimated = 0;        ///< Of those, values left as median estimates (`median_estimate`).
  std::uint64_t resent_shards = 0;    ///< Chunks summed again uncompressed after a stall (`report`).
};

/// The state of TAGC on executor E: the error-feedback residuals of every chunk of every tensor,
/// and buffers in E's memory reused across calls.
template <gradient_value T, executor E>
struct tagc_state {
  using value_type = compute_type<T>;  ///< Type of the residuals and of every buffer: float32 for bf16 and fp16.
  typename dynamic_sparsifier<T>::template state_on<E> feedback;  ///< Residuals keyed by `tagc<T>::residual_key`.
  collective_buffer<E, value_type>
      sparse;  ///< The last call's sparsified chunks (block-aligned parts, in chunk order).
  collective_buffer<E, std::byte> indexes;  ///< The P indexes, local then aggregated.
  collective_buffer<E, value_type> segments;  ///< Sketch-and-tail segments.
  collective_buffer<E, value_type> received;  ///< This rank's summed segment.
  collective_buffer<E, value_type>
      chunk;  ///< This rank's chunk of the result, copied to `out` once every collective is done.
  collective_buffer<E, std::byte> workspace;  ///< Sparsifier and decoder workspace.
  collective_buffer<E, value_type> saved_residuals;  ///< The residuals before a call, to undo it.
  std::vector<bool> had_residual;  ///< Which chunks had a residual before it.
  std::uint64_t saved_steps = 0;  ///< The sparsifier's step count before it.
};

/// TAGC's scheme for float, double, bf16 or fp16 gradients (the 16-bit ones on host executors):
/// its parameters, its state and checkpoints. Pass it to `compressed_reduce_scatter` (this file's
/// comment).
template <gradient_value T = float>
class tagc {
 public:
  using value_type = T;  ///< Element type of the gradient.
  /// Names the scheme's sketch in the agreement record; its plan (`reduce_scatter_plan::tagc`)
  /// tells it from an LHC all-reduce.
  static constexpr codec_id id = codec_id::lossless_homomorphic;
  /// The state on executor E.
  template <executor E>
  using state_on = tagc_state<T, E>;

  /// @throws error `invalid_argument` for invalid parameters.
  explicit tagc(tagc_params params = {}) : params_(params), sparsifier_(params.sparsify) { params_.sketch.validate(); }

  /// The parameters.
  [[nodiscard]] const tagc_params& params() const noexcept { return params_; }
  /// The dynamic sparsifier of step 1.
  [[nodiscard]] const dynamic_sparsifier<T>& sparsifier() const noexcept { return sparsifier_; }

  /// Hash of the value type and every parameter (the sparsifier's f* and mode, the sketch's
  /// parameters, the schedule), compared by the agreement.
  [[nodiscard]] std::uint64_t params_hash() const noexcept {
    return params_hasher{}
        .add(lossless_homomorphic<T>(params_.sketch).params_hash())
        .add(params_.sparsify.zero_fraction)
        .add(params_.sparsify.mode)
        .add(params_.schedule)
        .value();
  }

  /// Empty state in E's memory: residuals are created on first use of each (tensor id, chunk).
  template <executor E>
  [[nodiscard]] tagc_state<T, E> make_state(const E& e) const {
    tagc_state<T, E> state;
    state.feedback = sparsifier_.make_state(e);
    return state;
  }

  /// Size of `state`'s residuals saved (the dynamic sparsifier's "GCDS" bytes).
  template <class State>
  [[nodiscard]] static std::size_t saved_state_bytes(const State& state) noexcept {
    return dynamic_sparsifier<T>::saved_state_bytes(state.feedback);
  }
  /// Writes the residuals of `state` into `bytes` (at least `saved_state_bytes(state)`).
  /// @returns bytes written. @throws error `buffer_too_small`.
  template <executor E>
  std::size_t save_state(const E& e, const tagc_state<T, E>& state, std::span<std::byte> bytes) const {
    return sparsifier_.save_state(e, state.feedback, bytes);
  }
  /// Restores residuals saved by `save_state`; a restored run continues bit-identically.
  /// @throws error as `dynamic_sparsifier::load_state`; `state` is unchanged then.
  template <executor E>
  void load_state(const E& e, std::span<const std::byte> bytes, tagc_state<T, E>& state) const {
    sparsifier_.load_state(e, bytes, state.feedback);
  }

  /// Error-feedback key of chunk `chunk` of tensor `tensor_id` in a group of `ranks`:
  /// tensor_id·ranks + chunk, so the residuals of a job with a fixed number of ranks never mix
  /// (32-bit tensor ids: the key never wraps).
  [[nodiscard]] static std::uint64_t residual_key(std::uint32_t tensor_id, int ranks, int chunk) noexcept {
    return std::uint64_t{tensor_id} * static_cast<std::uint64_t>(ranks) + static_cast<std::uint64_t>(chunk);
  }

  /// The index coding used over transport `X` with `ranks` ranks (`lhc_index_coding_for`).
  /// @throws error `invalid_argument` when no coding fits.
  template <transport X>
  [[nodiscard]] lhc_index_coding index_coding(int ranks) const {
    return lhc_index_coding_for<X>(params_.sketch, ranks, "tagc");
  }

 private:
  tagc_params params_;
  dynamic_sparsifier<T> sparsifier_;
};

namespace detail {

/// Where chunk s of an n-value tensor and its parts lie: its chunk, block-aligned part and tail,
/// and the offsets of its sparsified values and of its index in the state's buffers.
struct tagc_layout {
  std::vector<ring_chunk> chunks;  ///< ring_chunk_of(n, P, s).
  std::vector<std::size_t> aligned;  ///< ⌊count_s/B⌋·B.
  std::vector<std::size_t> sparse_offset;  ///< Σ_{q<s} aligned_q.
  std::vector<std::size_t> index_offset;  ///< Σ_{q<s} index_bytes(aligned_q).
  std::vector<std::size_t> index_size;  ///< index_bytes(aligned_s).
  std::size_t sparse_total = 0;  ///< Σ aligned_s.
  std::size_t index_total = 0;  ///< Σ index_bytes(aligned_s).

  template <class T>
  tagc_layout(std::uint64_t n, int ranks, const lossless_homomorphic<T>& lhc) {
    const std::size_t block = lhc.params().block;
    for (int s = 0; s < ranks; ++s) {
      const ring_chunk c = ring_chunk_of(n, ranks, s);
      chunks.push_back(c);
      aligned.push_back(static_cast<std::size_t>(c.count) / block * block);
      sparse_offset.push_back(sparse_total);
      index_offset.push_back(index_total);
      index_size.push_back(static_cast<std::size_t>(lhc.index_bytes(aligned.back())));
      sparse_total += aligned.back();
      index_total += index_size.back();
    }
  }

  /// Values in the tail of chunk s.
  [[nodiscard]] std::size_t tail(int s) const noexcept {
    return static_cast<std::size_t>(chunks[static_cast<std::size_t>(s)].count) - aligned[static_cast<std::size_t>(s)];
  }
};

/// A span over a residual of the dynamic sparsifier's state (a host vector or a device array).
template <class Residual>
[[nodiscard]] auto residual_span(Residual& r) noexcept {
  return std::span(r.data(), r.size());
}

/// One TAGC reduce-scatter, once every rank has agreed that its inputs are valid: the scheme of
/// collective/tagc.hpp, with its state's residuals saved first and restored when it throws.
template <class T, executor E, transport X>
class tagc_call {
 public:
  using memory = collective_memory<E>;
  using C = compute_type<T>;  ///< The sparsified values', sketches' and result's type.

  tagc_call(const E& e, X& t, const tagc<T>& scheme, tagc_state<T, E>& state, lhc_index_coding coding,
            std::span<const T> data, std::span<T> out, message_key key, bool average)
      : e_(e),
        t_(t),
        scheme_(scheme),
        state_(state),
        lhc_(with_index(scheme.params().sketch, coding)),
        layout_(data.size(), t.size(), lhc_),
        data_(data),
        out_(out),
        key_(key),
        average_(average) {}

  /// Runs the scheme; on error every residual and `out` are as they were. Float and double results
  /// are copied to `out` as they are (the caller averages them); a 16-bit result is divided by P
  /// with `average` and rounded once, after every rank has found its chunk in range.
  tagc_report run() {
    save_residuals();
    try {
      tagc_report report = reduce_scatter();
      if constexpr (half_precision<T>) {
        collective_buffer<E, T> narrowed(e_, out_.size());
        agree_on_status(t_, static_cast<errc>(narrowing_status(result(), ranks(), average_, narrowed.span())),
                        "compressed_reduce_scatter (tagc)");
        memory::copy(e_, std::span<const T>(narrowed.span()), out_);
      } else {
        memory::copy(e_, std::span<const T>(result()), out_);
      }
      return report;
    } catch (...) {
      restore_residuals();
      throw;
    }
  }

 private:
  /// How decoding went on a chunk's owner.
  enum class chunk_outcome : std::uint8_t { peeled, stalled, overflowed };

  [[nodiscard]] int ranks() const { return t_.size(); }
  [[nodiscard]] std::uint64_t key_of(int s) const { return tagc<T>::residual_key(key_.tensor_id, ranks(), s); }
  [[nodiscard]] std::span<C> sparse_of(int s) {
    const auto i = static_cast<std::size_t>(s);
    return state_.sparse.span().subspan(layout_.sparse_offset[i], layout_.aligned[i]);
  }
  [[nodiscard]] std::span<std::byte> index_of(int s) {
    const auto i = static_cast<std::size_t>(s);
    return state_.indexes.span().subspan(layout_.index_offset[i], layout_.index_size[i]);
  }
  [[nodiscard]] std::span<const T> chunk_of(int s) const {
    const ring_chunk& c = layout_.chunks[static_cast<std::size_t>(s)];
    return data_.subspan(static_cast<std::size_t>(c.offset), static_cast<std::size_t>(c.count));
  }
  /// This rank's chunk of the result, assembled here until every collective of the call is done.
  [[nodiscard]] std::span<C> result() { return state_.chunk.span().first(out_.size()); }
  [[nodiscard]] std::span<C> saved_of(int s) {
    const auto i = static_cast<std::size_t>(s);
    return state_.saved_residuals.span().subspan(layout_.sparse_offset[i], layout_.aligned[i]);
  }

  template <class U>
  void reserve(collective_buffer<E, U>& buffer, std::size_t count) {
    if (buffer.size() < count) buffer.resize(e_, count);
  }

  /// Copies the residuals of the tensor's chunks, so that a call that fails after sparsifying
  /// leaves the state as it was on every rank.
  void save_residuals() {
    state_.saved_residuals.resize(e_, layout_.sparse_total);
    state_.had_residual.assign(static_cast<std::size_t>(ranks()), false);
    for (int s = 0; s < ranks(); ++s) {
      const auto found = state_.feedback.residuals.find(key_of(s));
      if (found == state_.feedback.residuals.end()) continue;
      state_.had_residual[static_cast<std::size_t>(s)] = true;
      memory::copy(e_, std::span<const C>(residual_span(found->second)), saved_of(s));
    }
    state_.saved_steps = state_.feedback.steps;
  }

  void restore_residuals() {
    for (int s = 0; s < ranks(); ++s) {
      const auto found = state_.feedback.residuals.find(key_of(s));
      if (!state_.had_residual[static_cast<std::size_t>(s)]) {
        if (found != state_.feedback.residuals.end()) state_.feedback.residuals.erase(found);
        continue;
      }
      memory::copy(e_, std::span<const C>(saved_of(s)), residual_span(found->second));
    }
    state_.feedback.steps = state_.saved_steps;
  }

  /// Copies gradient values into C values: as they are, or (16-bit, host memory) widened.
  void widen_into(std::span<const T> from, std::span<C> to) {
    if constexpr (half_precision<T>) std::transform(from.begin(), from.end(), to.begin(), [](T v) { return widen(v); });
    else
      memory::copy(e_, from, to);
  }

  /// Chunk s's segment: its sketch under `plan`, its tail, zeros up to the segment's size.
  void fill_segment(int s, const lhc_plan& plan, std::span<C> segment) {
    const auto sketch_values = static_cast<std::size_t>(plan.sketch_values());
    const std::size_t tail = layout_.tail(s);
    lhc_.encode_sketch(e_, std::span<const C>(sparse_of(s)), std::span<const std::byte>(index_of(s)), plan,
                       segment.first(sketch_values));
    widen_into(chunk_of(s).subspan(layout_.aligned[static_cast<std::size_t>(s)]), segment.subspan(sketch_values, tail));
    memory::fill(e_, segment.subspan(sketch_values + tail), C{0});
  }

  [[nodiscard]] lhc_plan plan_of(int s) {
    return lhc_.plan(e_, std::span<const std::byte>(index_of(s)), layout_.aligned[static_cast<std::size_t>(s)],
                     static_cast<std::uint64_t>(ranks()));
  }

  tagc_report reduce_scatter() {
    const int rank = t_.rank();
    tagc_report report;
    report.dense_bytes = data_.size() * sizeof(T);
    state_.sparse.resize(e_, layout_.sparse_total);
    state_.indexes.resize(e_, layout_.index_total);
    const dynamic_sparsifier<T>& sparsifier = scheme_.sparsifier();
    for (int s = 0; s < ranks(); ++s) {
      const std::size_t aligned = layout_.aligned[static_cast<std::size_t>(s)];
      reserve(state_.workspace, sparsifier.workspace_bytes(e_, aligned));
      report.kept += sparsifier
                         .sparsify(e_, state_.feedback, key_of(s), chunk_of(s).first(aligned), sparse_of(s),
                                   state_.workspace.span())
                         .kept;
      lhc_.encode_index(e_, std::span<const C>(sparse_of(s)), index_of(s));
    }
    report.index_bytes = layout_.index_total;

    lhc_plan own_plan{};
    if (scheme_.params().schedule == tagc_schedule::per_shard) {
      for (int s = 0; s < ranks(); ++s) {
        aggregate_lhc_index(t_, lhc_.params().index, index_of(s));
        const lhc_plan plan = plan_of(s);
        const std::size_t length = static_cast<std::size_t>(plan.sketch_values()) + layout_.tail(s);
        state_.segments.resize(e_, length);
        fill_segment(s, plan, state_.segments.span());
        report.sketch_bytes += plan.sketch_values() * sizeof(C);
        report.tail_bytes += layout_.tail(s) * sizeof(C);
        t_.reduce_sum(state_.segments.span(), s);
        if (s != rank) continue;
        own_plan = plan;
        state_.received.resize(e_, length);
        memory::copy(e_, std::span<const C>(state_.segments.span()), state_.received.span());
      }
    } else {
      aggregate_lhc_index(t_, lhc_.params().index, state_.indexes.span());
      std::vector<lhc_plan> plans;
      std::size_t longest = 0;
      for (int s = 0; s < ranks(); ++s) {
        plans.push_back(plan_of(s));
        longest = std::max(longest, static_cast<std::size_t>(plans.back().sketch_values()) + layout_.tail(s));
      }
      const auto P = static_cast<std::size_t>(ranks());
      state_.segments.resize(e_, P * longest);
      for (int s = 0; s < ranks(); ++s) {
        const lhc_plan& plan = plans[static_cast<std::size_t>(s)];
        fill_segment(s, plan, state_.segments.span().subspan(static_cast<std::size_t>(s) * longest, longest));
        report.sketch_bytes += plan.sketch_values() * sizeof(C);
        report.tail_bytes += layout_.tail(s) * sizeof(C);
        report.padding_bytes +=
            (longest - static_cast<std::size_t>(plan.sketch_values()) - layout_.tail(s)) * sizeof(C);
      }
      state_.received.resize(e_, longest);
      t_.reduce_scatter_sum(std::span<const C>(state_.segments.span()), state_.received.span());
      own_plan = plans[static_cast<std::size_t>(rank)];
    }

    const auto sketch_values = static_cast<std::size_t>(own_plan.sketch_values());
    const std::size_t aligned = layout_.aligned[static_cast<std::size_t>(rank)];
    reserve(state_.chunk, out_.size());
    const std::span<C> chunk = result();
    const lossless_homomorphic<C> peeler(with_stall_policy(lhc_.params(), lhc_stall_policy::median_estimate));
    reserve(state_.workspace, peeler.workspace_bytes(e_, own_plan));
    lhc_decode_result peeled{};
    chunk_outcome outcome = chunk_outcome::peeled;
    try {
      peeled = peeler.decode(e_, std::span<const std::byte>(index_of(rank)), own_plan,
                             std::span<const C>(state_.received.span()).first(sketch_values), chunk.first(aligned),
                             state_.workspace.span());
      if (peeled.unrecovered > 0 && scheme_.params().sketch.on_stall == lhc_stall_policy::report)
        outcome = chunk_outcome::stalled;
    } catch (const error& failure) {
      if (failure.code() != errc::non_finite_input) throw;
      outcome = chunk_outcome::overflowed;  // the sum does not fit T: every rank must learn it
    }
    memory::copy(e_, std::span<const C>(state_.received.span()).subspan(sketch_values, layout_.tail(rank)),
                 chunk.subspan(aligned));
    report.resent_shards = settle_outcomes(outcome, report);
    report.sent_bytes =
        report.index_bytes + report.sketch_bytes + report.tail_bytes + report.padding_bytes + report.resent_bytes;

    report.union_nonzeros = own_plan.union_nonzeros;
    report.sketch_values = sketch_values;
    report.unrecovered = peeled.unrecovered;
    report.estimated = scheme_.params().sketch.on_stall == lhc_stall_policy::median_estimate ? peeled.estimated : 0;
    return report;
  }

  /// One MAX all-reduce of the P owners' outcomes (host doubles, the control plane). A sum that
  /// does not fit the value type on any chunk makes every rank throw `non_finite_input` (the caller
  /// restores the residuals). Under the `report` policy a stalled chunk is never left wrong: its
  /// sparsified values and tail are summed again uncompressed onto its owner. Returns how many
  /// chunks were resent.
  std::uint64_t settle_outcomes(chunk_outcome mine, tagc_report& report) {
    const auto P = static_cast<std::size_t>(ranks());
    std::vector<double> outcomes(P, 0.0);
    outcomes[static_cast<std::size_t>(t_.rank())] = static_cast<double>(mine);
    control_all_reduce_max(t_, std::span<double>(outcomes));
    for (std::size_t s = 0; s < P; ++s)
      require(outcomes[s] != static_cast<double>(chunk_outcome::overflowed), errc::non_finite_input, [&] {
        return "tagc: the sum of chunk " + std::to_string(s) +
               " does not fit the value type; every rank skips this step";
      });
    std::uint64_t resent = 0;
    for (int s = 0; s < ranks(); ++s) {
      if (outcomes[static_cast<std::size_t>(s)] != static_cast<double>(chunk_outcome::stalled)) continue;
      ++resent;
      const std::size_t aligned = layout_.aligned[static_cast<std::size_t>(s)];
      const std::span<const T> chunk = chunk_of(s);
      state_.segments.resize(e_, chunk.size());
      const std::span<C> segment = state_.segments.span();
      memory::copy(e_, std::span<const C>(sparse_of(s)), segment.first(aligned));
      widen_into(chunk.subspan(aligned), segment.subspan(aligned));
      t_.reduce_sum(segment, s);
      report.resent_bytes += chunk.size() * sizeof(C);
      if (s == t_.rank()) memory::copy(e_, std::span<const C>(segment), result());
    }
    return resent;
  }

  [[nodiscard]] static lhc_params with_index(lhc_params p, lhc_index_coding coding) {
    p.index = coding;
    return p;
  }

  [[nodiscard]] static lhc_params with_stall_policy(lhc_params p, lhc_stall_policy policy) {
    p.on_stall = policy;
    return p;
  }

  const E& e_;
  X& t_;
  const tagc<T>& scheme_;
  tagc_state<T, E>& state_;
  lossless_homomorphic<C> lhc_;
  tagc_layout layout_;
  std::span<const T> data_;
  std::span<T> out_;
  message_key key_;
  bool average_;
};

/// What a rank found wrong with its TAGC call before any collective (empty: nothing): a plan
/// other than `automatic` or `tagc`, an `out` that is not its chunk, no index coding for P ranks
/// (`invalid_argument`), or a residual of the tensor with another size than its chunk's aligned
/// part (`size_mismatch`).
template <class T, transport X, class State>
[[nodiscard]] local_problem tagc_problem(const tagc<T>& scheme, const State& state, const tagc_layout& layout,
                                         int ranks, int rank, std::size_t out_size, reduce_scatter_plan plan,
                                         std::uint32_t tensor_id) {
  const std::string where = "compressed_reduce_scatter (tagc): ";
  if (plan != reduce_scatter_plan::automatic && plan != reduce_scatter_plan::tagc)
    return {errc::invalid_argument,
            where + "plan " + std::to_string(static_cast<int>(plan)) + " does not apply; TAGC runs plan tagc"};
  if (out_size != layout.chunks[static_cast<std::size_t>(rank)].count)
    return {errc::invalid_argument, where + "out holds " + std::to_string(out_size) +
                                        " values, not this rank's chunk of " +
                                        std::to_string(layout.chunks[static_cast<std::size_t>(rank)].count)};
  try {
    (void)scheme.template index_coding<X>(ranks);
  } catch (const error& failure) {
    return {failure.code(), failure.what()};
  }
  for (int s = 0; s < ranks; ++s) {
    const auto found = state.feedback.residuals.find(tagc<T>::residual_key(tensor_id, ranks, s));
    if (found != state.feedback.residuals.end() && found->second.size() != layout.aligned[static_cast<std::size_t>(s)])
      return {errc::size_mismatch, where + "the residual of chunk " + std::to_string(s) + " holds " +
                                       std::to_string(found->second.size()) + " values, its block-aligned part " +
                                       std::to_string(layout.aligned[static_cast<std::size_t>(s)])};
  }
  return {};
}

/// Whether every value TAGC reads is finite: per chunk, gradient + residual on the block-aligned
/// part where a residual exists (else the gradient), and the gradient on the tail.
template <class T, executor E, class State>
[[nodiscard]] bool tagc_inputs_finite(const E& e, const State& state, const tagc_layout& layout,
                                      std::span<const T> data, std::uint32_t tensor_id, int ranks) {
  using memory = collective_memory<E>;
  for (int s = 0; s < ranks; ++s) {
    const ring_chunk& c = layout.chunks[static_cast<std::size_t>(s)];
    const std::span<const T> chunk =
        data.subspan(static_cast<std::size_t>(c.offset), static_cast<std::size_t>(c.count));
    const std::size_t aligned = layout.aligned[static_cast<std::size_t>(s)];
    const auto found = state.feedback.residuals.find(tagc<T>::residual_key(tensor_id, ranks, s));
    using C = compute_type<T>;
    const std::span<const C> residual = found == state.feedback.residuals.end()
                                            ? std::span<const C>()
                                            : std::span<const C>(residual_span(found->second));
    if constexpr (half_precision<T>) {  // host memory: widen(g) + R in float32, as the sparsifier forms it
      for (std::size_t i = 0; i < residual.size(); ++i)
        if (!is_finite(C{widen(chunk[i])} + residual[i])) return false;
      if (!memory::all_finite(e, chunk.subspan(residual.size()))) return false;  // a finite g + R has a finite g
    } else if (!memory::all_finite(e, chunk.first(aligned), residual) ||
               !memory::all_finite(e, chunk.subspan(aligned))) {
      return false;
    }
  }
  return true;
}

}  // namespace detail

/// TAGC's reduce-scatter of `data` (n values on every rank, in executor `e`'s memory) with
/// `scheme` and this rank's `state` (`scheme.make_state(e)`): `out` (this rank's chunk,
/// `ring_chunk_of(n, P, rank)`) becomes that chunk of the sum over ranks of the sparsified
/// gradients (the mean with `options.average`). The residuals are keyed by `options.key.tensor_id`
/// and the chunk. While `options.key.step < options.dense_steps` (the warm-up) the call is an
/// uncompressed reduce-scatter instead and leaves every residual as it is. Collective: every rank
/// calls it with the same scheme, key, n and warm-up.
/// @throws error on every rank alike, with every state as it was: the agreement's errors (see
/// `compressed_all_reduce`); `invalid_argument` when a rank's `out` is not its chunk, its plan is
/// another than `tagc`, or the index coding cannot sum P ranks; `size_mismatch` when a rank's
/// residual of a chunk has another size; `non_finite_input` when a gradient, gradient + residual,
/// or a chunk's sum holds NaN or Inf; `timeout` (each waiting rank) when the deadline passes first;
/// `peer_failed` or a transport's own error when the transport fails.
template <executor E, transport X, gradient_value T>
tagc_report compressed_reduce_scatter(const E& e, X& t, const tagc<T>& scheme, tagc_state<T, E>& state,
                                      std::type_identity_t<std::span<const T>> data,
                                      std::type_identity_t<std::span<T>> out, reduce_scatter_options options = {}) {
  return detail::within_deadline(t, options.timeout, "compressed_reduce_scatter (tagc)", options.key, [&] {
    detail::require_executor_transport<E, X>(e, t);
    const int ranks = t.size();
    if (options.key.step < options.dense_steps) {
      // The warm-up (docs/transports.md §9): an uncompressed reduce-scatter, every residual untouched.
      const detail::local_problem problem =
          detail::reduce_scatter_problem(out.size(), data.size(), ranks, t.rank(), reduce_scatter_plan::dense, true);
      const bool finite = !problem.empty() || collective_memory<E>::all_finite(e, data);
      detail::agree(t,
                    detail::record_of(scheme, data.size(), detail::agreement_plan(reduce_scatter_plan::dense),
                                      options.key, !finite),
                    problem, "compressed_reduce_scatter (tagc)");
      tagc_report report;
      static_cast<compressed_report&>(report) = detail::dense_reduce_scatter(e, t, data, out, options.average);
      return report;
    }
    const detail::tagc_layout layout(data.size(), ranks, lossless_homomorphic<T>(scheme.params().sketch));
    const detail::local_problem problem = detail::tagc_problem<T, X>(scheme, state, layout, ranks, t.rank(), out.size(),
                                                                     options.plan, options.key.tensor_id);
    const bool finite =
        !problem.empty() || detail::tagc_inputs_finite(e, state, layout, data, options.key.tensor_id, ranks);
    detail::agree(t,
                  detail::record_of(scheme, data.size(), detail::agreement_plan(reduce_scatter_plan::tagc), options.key,
                                    !finite),
                  problem, "compressed_reduce_scatter (tagc)");
    tagc_report report = detail::tagc_call<T, E, X>(e, t, scheme, state, scheme.template index_coding<X>(ranks), data,
                                                    out, options.key, options.average)
                             .run();
    detail::apply_average(e, ranks, out, options.average);  // 16-bit results were averaged in float32
    return report;
  });
}

}  // namespace gradcomp
