#pragma once
/// @file
/// Compressed all-reduce over any transport, on any executor: every rank's gradient goes in, the
/// sum over ranks of what the codec carries comes out (the mean with `average`), the same bits on
/// every rank. The executor comes first and decides where the data lives: `cpu_executor` with host
/// spans over a host transport, `cuda_executor` with device spans over a device transport
/// (`nccl_transport`, or a host transport wrapped in `staged_transport`); the two memory spaces must
/// match (collective/executor_transport.hpp). The plan follows the codec's traits (docs/design.md
/// §2, docs/transports.md §6 and §9); what each plan sends is collective/all_reduce_cost.hpp:
///
/// - `summed_encodings`, for homomorphic codecs with a summable region (count sketch; the
///   shared-scale quantizer, whose scales are agreed first by a MAX all-reduce of block maxima):
///   the SUM collective adds the encodings themselves, in place in the message, and every rank
///   decodes the sum once.
/// - `gather_decode`, for every other codec and for stateful wrappers with one state (error
///   feedback, LoCo): the messages are all-gathered and every rank decodes them in rank order into
///   zeros, so the result is ((D(m_0) + D(m_1)) + …) on every rank.
/// - `scatter_reduce` (collective/scatter_reduce.hpp), for a transport with an all-to-all or
///   point-to-point messages: the all-to-all of chunk messages, each owner decodes, sums and
///   re-encodes its chunk (with its server state where the call passes one), then an all-gather
///   of the re-encoded chunks; about 2(P − 1)/P of one message, independent of P. `automatic`
///   picks it in the calls with a server state when the cost model says it sends fewer bytes than
///   `gather_decode`; a call without one runs it only on request, re-encoding plainly (an
///   uncompensated second compression, which `automatic` never adds by itself).
/// - `dense`: the warm-up (`options.dense_steps`): an uncompressed SUM all-reduce, states untouched.
/// - `ring`, on request: the hybrid scheme's per-hop ring (collective/ring.hpp), for a transport
///   with point-to-point messages.
/// - `two_stage`, for lossless homomorphic compression (its own overload): the ranks' indexes are
///   aggregated (bitwise OR where the transport has it, else summed 4- or 8-bit fields), every rank
///   sizes the sketch from the union alike, the sketches are SUM-reduced and every rank peels the
///   same sum. Every rank holds the same index and sketch, so a stall happens on every rank alike;
///   the ranks then sum `data` again uncompressed, so the result is never silently wrong.
///
/// Before anything is encoded, the ranks agree (collective/agreement.hpp; one all-gather of a
/// 40-byte host record per call, docs/wire-format.md §21): the format version, codec id, dtype,
/// plan, parameter hash, element count, step and tensor id must be equal on every rank, no rank's
/// own arguments may be wrong, and no rank's gradient may hold NaN or ±Inf. Otherwise every rank
/// throws the same named error in the same call, with its gradient and its codec state untouched,
/// so every rank skips the same step.
///
/// Every call has a deadline, `options.timeout` from its start (collective/call_deadline.hpp): a
/// rank that died or stopped calling makes every rank still waiting throw `timeout`, naming the
/// call, its step and tensor and, where the transport knows them, the ranks that did not arrive;
/// `data` and the codec state are then as before the call.

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <gradcomp/collective/agreement.hpp>
#include <gradcomp/collective/all_reduce_cost.hpp>
#include <gradcomp/collective/all_to_all_chunks.hpp>
#include <gradcomp/collective/call_deadline.hpp>
#include <gradcomp/collective/collective_memory.hpp>
#include <gradcomp/collective/compressed_all_gather.hpp>
#include <gradcomp/collective/compressed_frame.hpp>
#include <gradcomp/collective/executor_transport.hpp>
#include <gradcomp/collective/lhc_stages.hpp>
#include <gradcomp/collective/ring.hpp>
#include <gradcomp/collective/scatter_reduce.hpp>
#include <gradcomp/core/concepts.hpp>
#include <gradcomp/core/cpu_executor.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/float_bits.hpp>
#include <gradcomp/core/wire_envelope.hpp>
#include <gradcomp/feedback/step_rollback.hpp>
#include <gradcomp/sketch/lossless_homomorphic.hpp>
#include <gradcomp/transport/transport.hpp>

namespace gradcomp {

/// How `compressed_all_reduce` aggregates the ranks' encodings.
enum class all_reduce_plan : std::uint8_t {
  automatic = 0,         ///< `summed_encodings` for a codec with a summable encoding, else `gather_decode`.
  gather_decode = 1,     ///< All-gather the messages; every rank decodes them in rank order.
  summed_encodings = 2,  ///< SUM-reduce the summable region of the encodings; decode the sum once.
  ring = 3,              ///< The per-hop ring (decode, add, re-encode); needs point-to-point messages.
  two_stage = 4,         ///< Lossless homomorphic compression: aggregate the indexes, then SUM the sketches.
  scatter_reduce = 5,  ///< All-to-all of chunks; each owner sums and re-encodes its chunk; all-gather of the chunks.
  dense = 6,  ///< Uncompressed SUM all-reduce (the warm-up steps); codec states untouched.
  low_rank = 7,  ///< PowerSGD: SUM all-reduces of its factors P and Q (collective/low_rank_collectives.hpp).
};

/// Options of `compressed_all_reduce`.
struct all_reduce_options {
  message_key key{};  ///< Step and tensor: keys the codec and is checked across ranks.
  all_reduce_plan plan = all_reduce_plan::automatic;  ///< How to aggregate.
  /// Divide the sum by P in the value type (v / T(P)): every rank gets the mean. `error_bound` is
  /// divided alike.
  bool average = false;
  /// Decode lossy messages once more to measure their error (`report.max_error`,
  /// `report.error_bound`; `gather_decode` and `ring` only).
  bool measure_error = false;
  /// How long the call may wait for its peers in all, from its start (`infinite_timeout`: as long
  /// as the transport's library does); past it every waiting rank throws `timeout`.
  std::chrono::milliseconds timeout = default_collective_timeout;
  /// Warm-up: while `key.step < dense_steps` the call runs the `dense` plan, an uncompressed SUM
  /// all-reduce (the mean with `average`), whatever `plan` says, with every codec and server
  /// state untouched; the ranks still agree (the plan is in the record, so ranks that disagree on
  /// the warm-up throw `parameter_mismatch`). 0 (the default): no warm-up, as PyTorch's PowerSGD
  /// hook with `start_powerSGD_iter` = 1.
  std::uint64_t dense_steps = 0;
};

/// A homomorphic codec whose messages end in (or are) a region that a SUM collective adds:
/// bytes [summable_offset(n), summable_offset(n) + summable_bytes(n)), starting on an 8-byte
/// boundary of the message.
template <class C>
concept summable_encoding = codec<C> && C::is_homomorphic && requires(const C& c, std::uint64_t n) {
  { c.summable_offset(n) } -> std::same_as<std::size_t>;
  { c.summable_bytes(n) } -> std::same_as<std::size_t>;
};

/// A summable encoding whose ranks agree their block scales first (the shared-scale quantizer):
/// `block_maxima` → MAX all-reduce → `encode_shared`; its summable region holds uint64 words. The
/// maxima are of the compute type (float32 for a 16-bit gradient).
template <class C>
concept agreed_scale_encoding =
    summable_encoding<C> &&
    requires(const C& c, const cpu_executor& e, std::uint64_t n, std::span<const typename C::value_type> grad,
             std::span<compute_type<typename C::value_type>> maxima,
             std::span<const compute_type<typename C::value_type>> agreed, std::span<std::byte> out,
             std::span<std::byte> ws, message_key key, std::uint32_t rank) {
      { c.block_count(n) } -> std::same_as<std::uint64_t>;
      c.block_maxima(e, grad, maxima);
      { c.encode_shared(e, grad, agreed, out, ws, key, rank) } -> std::same_as<std::size_t>;
    };

namespace detail {

/// The type whose values a summable encoding's region holds: uint64 words for an agreed-scale
/// encoding, the codec's `cell_type` where it names one (the count sketch's cells, float32 for a
/// 16-bit gradient), else its value type.
template <class C>
struct summed_word {
  using type = typename C::value_type;
};
template <class C>
  requires requires { typename C::cell_type; }
struct summed_word<C> {
  using type = typename C::cell_type;
};
template <agreed_scale_encoding C>
struct summed_word<C> {
  using type = std::uint64_t;
};

}  // namespace detail

/// The type a SUM collective adds the summable region of codec C's messages as.
template <class C>
using summed_word_t = typename detail::summed_word<C>::type;

/// A summable encoding that can run `summed_encodings` for its value type: any whose summed region
/// holds no 16-bit values (those would lose their low bits in the sum, docs/half-precision.md §3).
/// For bf16 and fp16 gradients that is the shared-scale quantizer (integer code fields) and the
/// count sketch (float32 cells).
template <class C>
concept summed_in_messages = summable_encoding<C> && !half_precision<summed_word_t<C>>;

/// The plan `automatic` picks for `codec` on n values over `ranks` ranks in a call that can keep a
/// server state (collective/scatter_reduce.hpp): `summed_encodings` for a summable encoding; else
/// `scatter_reduce` where the transport can run it (`can_all_to_all`: it has an all-to-all or
/// point-to-point messages) and the cost model (collective/all_reduce_cost.hpp) says that rank 0,
/// which sends the most, sends fewer bytes than under `gather_decode` with the codec's modelled
/// size B(m) (`modelled_encoded_bytes`: the size it sends, not its worst case, where the codec
/// states it; P ≥ 3 for a fixed-size codec on a large tensor); else `gather_decode`. The same on
/// every rank, so the PyTorch hook calls it too.
template <class C>
[[nodiscard]] all_reduce_plan automatic_plan(const C& codec, std::uint64_t n, int ranks, bool can_all_to_all) {
  if constexpr (summed_in_messages<C>) {
    return all_reduce_plan::summed_encodings;
  } else {
    const auto encoded = [&](std::uint64_t m) { return modelled_encoded_bytes(codec, m); };
    const bool cheaper =
        scatter_reduce_cost(n, ranks, 0, encoded).sent_bytes < gather_decode_cost(n, ranks, encoded).sent_bytes;
    return can_all_to_all && cheaper ? all_reduce_plan::scatter_reduce : all_reduce_plan::gather_decode;
  }
}

namespace detail {

/// The plan a call runs: `dense` during the warm-up, else `options.plan`, `automatic` resolved to
/// `automatic_choice`.
[[nodiscard]] constexpr all_reduce_plan resolved_plan(const all_reduce_options& options,
                                                      all_reduce_plan automatic_choice) noexcept {
  if (options.key.step < options.dense_steps) return all_reduce_plan::dense;
  return options.plan == all_reduce_plan::automatic ? automatic_choice : options.plan;
}

/// The plan `automatic` resolves to for codec `C` in a call without a server state.
template <class C>
inline constexpr all_reduce_plan stateless_automatic =
    summed_in_messages<C> ? all_reduce_plan::summed_encodings : all_reduce_plan::gather_decode;

/// How a call holds its codec state, which decides the plans it can run.
enum class call_state : std::uint8_t {
  none,  ///< A stateless codec, no server state.
  server,  ///< A stateless codec with a server state for `scatter_reduce`.
  single,  ///< A stateful wrapper with one state for the n values (`gather_decode`).
  chunked,  ///< A stateful wrapper with a state per chunk and a server state (`scatter_reduce`).
};

/// Why codec `C` cannot run `plan` over transport `X` in a call holding `state` (empty: it can).
template <class X, class C>
[[nodiscard]] local_problem plan_problem(all_reduce_plan plan, call_state state) {
  const bool stateless = state == call_state::none || state == call_state::server;
  bool ok = false;
  switch (plan) {
    case all_reduce_plan::dense: ok = true; break;
    case all_reduce_plan::gather_decode: ok = state != call_state::chunked; break;
    case all_reduce_plan::summed_encodings: ok = summable_encoding<C> && stateless; break;
    case all_reduce_plan::ring: ok = transport_with_point_to_point<X> && stateless; break;
    case all_reduce_plan::scatter_reduce: ok = can_all_to_all<X> && state != call_state::single; break;
    default: break;
  }
  if (ok && !summed_in_messages<C> && plan == all_reduce_plan::summed_encodings)
    return {errc::invalid_argument,
            "compressed_all_reduce: bf16 and fp16 data are summed in float32 (docs/half-precision.md §3), not in "
            "the messages by summed_encodings (only the shared-scale quantizer's integer fields and the count "
            "sketch's float32 cells are)"};
  if (ok) return {};
  return {errc::invalid_argument,
          "compressed_all_reduce: plan " + std::to_string(static_cast<int>(plan)) +
              " does not apply to this codec, state or transport (summed_encodings needs a summable encoding, ring a "
              "transport with point-to-point messages, scatter_reduce one with an all-to-all or point-to-point "
              "messages; a stateful wrapper aggregates with gather_decode (one state) or scatter_reduce (a state per "
              "chunk and a server state))"};
}

/// The `dense` plan: an uncompressed SUM all-reduce of a copy of `data` (so that a transport that
/// fails midway leaves `data` as it was), the mean with `average`.
template <executor E, transport X, class T>
compressed_report dense_all_reduce(const E& e, X& t, std::span<T> data, bool average) {
  using memory = collective_memory<E>;
  compressed_report report;
  report.dense_bytes = ring_all_reduce_dense_bytes(data.size() * sizeof(T), static_cast<std::uint64_t>(t.size()));
  if constexpr (half_precision<T>) {
    // Summed in float32 (a 16-bit SUM over many ranks loses the low bits), so twice the bytes.
    collective_buffer<E, compute_type<T>> sum(e, data.size());
    for (std::size_t i = 0; i < data.size(); ++i) sum.span()[i] = widen(data[i]);
    t.all_reduce_sum(sum.span());
    narrow_sums(sum.span(), t.size(), average, data);
    report.sent_bytes = 2 * report.dense_bytes;
  } else {
    collective_buffer<E, T> sum(e, data.size());
    memory::copy(e, std::span<const T>(data), sum.span());
    t.all_reduce_sum(sum.span());
    memory::copy(e, std::span<const T>(sum.span()), data);
    apply_average(e, t.size(), data, average);
    report.sent_bytes = report.dense_bytes;
  }
  return report;
}

/// Agreement of a compressed all-reduce or reduce-scatter with `scheme` on `data` (E's memory):
/// the record (collective/agreement.hpp) with `plan` and this rank's finiteness and `problem`.
/// Every rank throws the same error, or none does.
template <executor E, transport X, class Scheme>
void agree_on(const E& e, X& t, const Scheme& scheme, std::span<const typename Scheme::value_type> data,
              std::uint8_t plan, message_key key, const local_problem& problem, const char* where) {
  const bool finite = collective_memory<E>::all_finite(e, data);
  agree(t, record_of(scheme, data.size(), plan, key, !finite), problem, where);
}

/// The `gather_decode` plan: all-gathers `frame` and decodes every rank's frame in rank order into
/// zeros, then into `data` (16-bit data: into float32 zeros, divided by P with `average`, then
/// rounded once into `data`; other types are averaged by the caller).
template <transport X, class C, executor E>
compressed_report gather_decode_all_reduce(X& t, frame_coder<C, E>& coder, std::span<const std::byte> frame,
                                           std::span<typename C::value_type> data, double max_error,
                                           bool average = false) {
  using T = typename C::value_type;
  const auto ranks = static_cast<std::uint64_t>(t.size());
  const auto n = static_cast<std::uint64_t>(data.size());
  compressed_report report;
  report.sent_bytes = frame.size() * (ranks - 1);
  report.dense_bytes = ring_all_reduce_dense_bytes(n * sizeof(T), ranks);
  report.max_error = max_error;
  const double bound = gather_and_decode(
      t, coder, frame, data,
      [n](int) {
        return std::pair{std::uint64_t{0}, n};
      },
      true, "compressed_all_reduce", average);
  // Each of the P messages adds at most its own error to the sum.
  report.error_bound = bound * static_cast<double>(ranks);
  return report;
}

/// The `summed_encodings` plan: encodes (agreeing the scales first where the codec needs it),
/// SUM-reduces the summable region in place in the message and decodes the sum into `data`
/// (16-bit data: into float32, divided there by P with `average`, rounded once into `data`;
/// other types are averaged by the caller).
template <executor E, transport X, summed_in_messages C>
compressed_report summed_all_reduce(const E& e, X& t, const C& codec, std::span<typename C::value_type> data,
                                    message_key key, bool average) {
  using T = typename C::value_type;
  using word = summed_word_t<C>;
  const auto n = static_cast<std::uint64_t>(data.size());
  const auto ranks = static_cast<std::uint64_t>(t.size());
  collective_buffer<E, std::byte> message(e, codec.max_encoded_bytes(n));
  collective_buffer<E, std::byte> ws(e, codec.workspace_bytes(e, n));
  compressed_report report;
  report.dense_bytes = ring_all_reduce_dense_bytes(n * sizeof(T), ranks);
  errc status{};
  std::size_t bytes = 0;
  if constexpr (agreed_scale_encoding<C>) {
    using M = compute_type<T>;
    collective_buffer<E, M> maxima(e, static_cast<std::size_t>(codec.block_count(n)));
    codec.block_maxima(e, std::span<const T>(data), maxima.span());
    t.all_reduce_max(maxima.span());
    report.sent_bytes += ring_all_reduce_dense_bytes(maxima.size() * sizeof(M), ranks);
    try {
      bytes = codec.encode_shared(e, std::span<const T>(data), std::span<const M>(maxima.span()), message.span(),
                                  ws.span(), key, static_cast<std::uint32_t>(t.rank()));
    } catch (const gradcomp::error& failure) {
      status = failure.code();
    }
  } else {
    try {
      bytes = codec.encode(e, std::span<const T>(data), message.span(), ws.span(), key);
    } catch (const gradcomp::error& failure) {
      status = failure.code();
    }
  }
  agree_on_status(t, status, "compressed_all_reduce");
  const std::span<std::byte> region = message.span().subspan(codec.summable_offset(n), codec.summable_bytes(n));
  t.all_reduce_sum(std::span<word>(reinterpret_cast<word*>(region.data()), region.size() / sizeof(word)));
  report.sent_bytes += ring_all_reduce_dense_bytes(region.size(), ranks);
  const std::span<const std::byte> sum = std::span<const std::byte>(message.span()).first(bytes);
  if constexpr (half_precision<T>) {
    // Every rank holds the same summed message, so a sum beyond the 16-bit range is
    // `narrowing_overflow` on every rank alike.
    collective_buffer<E, compute_type<T>> sums(e, data.size());
    codec.decode(e, sum, sums.span(), ws.span());
    narrow_sums(sums.span(), t.size(), average, data);
  } else {
    (void)average;
    codec.decode(e, sum, data, ws.span());
  }
  return report;
}

}  // namespace detail

namespace detail {

/// A stateless codec's all-reduce of `data` by `plan` (agreed already), re-encoding the chunk sums
/// of `scatter_reduce` with `*server` (restored when the call fails after its step), or plainly
/// where `server` is null.
template <executor E, transport X, class C>
compressed_report stateless_all_reduce(const E& e, X& t, const C& codec, server_state_t<C, E>* server,
                                       std::span<typename C::value_type> data, const all_reduce_options& options,
                                       all_reduce_plan plan) {
  using T = typename C::value_type;
  compressed_report report;
  if (plan == all_reduce_plan::dense) return dense_all_reduce(e, t, data, options.average);
  if (plan == all_reduce_plan::summed_encodings) {
    // 16-bit data of another codec: the agreement refused summed_encodings (plan_problem).
    if constexpr (summed_in_messages<C>) report = summed_all_reduce(e, t, codec, data, options.key, options.average);
  } else if (plan == all_reduce_plan::ring) {
    if constexpr (transport_with_point_to_point<X>)
      return ring_all_reduce_within(
          e, t, codec, data, {.key = options.key, .average = options.average, .measure_error = options.measure_error});
  } else if (plan == all_reduce_plan::scatter_reduce) {
    if constexpr (can_all_to_all<X>) {
      const std::uint64_t n = data.size();
      frame_coder<C, E> coder(e, codec, ring_chunk_of(n, t.size(), 0).count,
                              options.measure_error && server == nullptr);
      double max_error = 0.0;
      const auto encode_chunk = [&](int j) {
        const ring_chunk c = ring_chunk_of(n, t.size(), j);
        double error = 0.0;
        const auto frame = coder.encode(std::span<const T>(data).subspan(static_cast<std::size_t>(c.offset),
                                                                         static_cast<std::size_t>(c.count)),
                                        options.key, 0.0, error);
        max_error = std::max(max_error, error);
        return frame;
      };
      if (server == nullptr) {
        report = scatter_reduce_all_reduce(t, coder, data, options.average, encode_chunk,
                                           [&](std::span<const T> sum, double bound) {
                                             double error = 0.0;
                                             const auto frame = coder.encode(sum, options.key, bound, error);
                                             max_error = std::max(max_error, error);
                                             return frame;
                                           });
      } else {
        const server_codec_t<C, E> feedback = server_codec_of(e, codec);
        frame_coder<server_codec_t<C, E>, E> server_coder(e, feedback, ring_chunk_of(n, t.size(), 0).count, false);
        step_rollback<server_state_t<C, E>> before = rollback_point(e, *server);
        try {
          report = scatter_reduce_all_reduce(t, coder, data, options.average, encode_chunk,
                                             [&](std::span<const T> sum, double) {
                                               return server_coder.encode_stateful(sum, *server, options.key);
                                             });
        } catch (...) {
          before.restore(*server);
          throw;
        }
      }
      report.max_error = max_error;
    }
  } else {
    frame_coder<C, E> coder(e, codec, data.size(), options.measure_error);
    double error = 0.0;
    const auto frame = coder.encode(std::span<const T>(data), options.key, 0.0, error);
    report = gather_decode_all_reduce(t, coder, frame, data, error, options.average);
  }
  report.error_bound *= apply_average(e, t.size(), data, options.average);
  return report;
}

}  // namespace detail

/// All-reduces `data` (n values on every rank, in place, in executor `e`'s memory) compressed with
/// `codec`: `data` becomes the sum over ranks of what the codec carries (the mean with
/// `options.average`), the same bits on every rank. The plan is `options.plan`, by default chosen
/// from the codec's traits (this file's comment: `summed_encodings` or `gather_decode`; a
/// requested `scatter_reduce` re-encodes the chunk sums plainly). `report.dense_bytes` is what an
/// uncompressed ring all-reduce sends from this rank, 2(P − 1)/P · n · sizeof(T). bf16 and fp16
/// data (host executors) run every plan, summed in float32 (docs/half-precision.md §3), but
/// `summed_encodings`, which only the shared-scale quantizer runs for them (its summed fields are
/// integers).
/// @throws error on every rank alike, with `data` unchanged: `codec_mismatch`, `dtype_mismatch`,
/// `parameter_mismatch` (codec parameters or plan), `size_mismatch` (n), `step_mismatch` (step or
/// tensor id) when the ranks disagree; `non_finite_input` when any rank's gradient holds NaN or
/// ±Inf; the code of a rank whose encoding or decoding failed. `invalid_argument` (every rank
/// alike) for a plan the codec, its value type or the transport cannot run; `narrowing_overflow`
/// for a 16-bit sum beyond the type's range. `timeout` (each waiting rank) when the
/// deadline passes first, `transport_failed` when the transport fails.
template <executor E, transport X, class C>
  requires codec_for<C, E>
compressed_report compressed_all_reduce(const E& e, X& t, const C& codec, std::span<typename C::value_type> data,
                                        all_reduce_options options = {}) {
  using T = typename C::value_type;
  return detail::within_deadline(t, options.timeout, "compressed_all_reduce", options.key, [&] {
    detail::require_executor_transport<E, X>(e, t);
    const all_reduce_plan plan = detail::resolved_plan(options, detail::stateless_automatic<C>);
    detail::agree_on(e, t, codec, std::span<const T>(data), static_cast<std::uint8_t>(plan), options.key,
                     detail::plan_problem<X, C>(plan, detail::call_state::none), "compressed_all_reduce");
    return detail::stateless_all_reduce(e, t, codec, nullptr, data, options, plan);
  });
}

/// All-reduces `data` as the overload without a server state, with `server` (`make_server_state(e,
/// codec, n, P, rank)`: error feedback for this rank's chunk, collective/scatter_reduce.hpp) for
/// the `scatter_reduce` plan: rank r re-encodes its chunk sum s with residual ε as C(s + ε) and
/// keeps ε ← s + ε − D(C(s + ε)). `automatic` is `automatic_plan(codec, n, P, …)`: `scatter_reduce`
/// where it sends fewer bytes than `gather_decode`. The other plans leave `server` untouched.
/// @throws error as the overload without a server state; `server` is untouched when the ranks
/// disagree or a gradient is not finite, and restored when a later stage fails on any rank or the
/// deadline passes; `size_mismatch` (every rank alike) when `server` is not of this rank's chunk.
template <executor E, transport X, class C>
  requires codec_for<C, E> && (!stateful<C, E>)
compressed_report compressed_all_reduce(const E& e, X& t, const C& codec, server_state_t<C, E>& server,
                                        std::span<typename C::value_type> data, all_reduce_options options = {}) {
  using T = typename C::value_type;
  return detail::within_deadline(t, options.timeout, "compressed_all_reduce", options.key, [&] {
    detail::require_executor_transport<E, X>(e, t);
    const all_reduce_plan plan =
        detail::resolved_plan(options, automatic_plan(codec, data.size(), t.size(), detail::can_all_to_all<X>));
    detail::agree_on(e, t, codec, std::span<const T>(data), static_cast<std::uint8_t>(plan), options.key,
                     detail::plan_problem<X, C>(plan, detail::call_state::server), "compressed_all_reduce");
    return detail::stateless_all_reduce(e, t, codec, &server, data, options, plan);
  });
}

/// All-reduces `data` with lossless homomorphic compression in its two collective stages (the
/// `two_stage` plan, this file's comment) on executor `e`: `data` becomes the sum over ranks (the
/// mean with `options.average`), the same bits on every rank; exact when the sums in the sketch
/// cells are (docs/sketches.md §2.3), and the uncompressed rank-order sum after a stall, whatever
/// `lhc`'s stall policy (median estimates would be a silently wrong sum). 16-bit data (host
/// executors) are sketched in float32 cells, decoded into float32, divided there by P with
/// `average` and rounded once into `data` (docs/half-precision.md §3); after a stall, the `dense`
/// plan's float32 sum. `report.sent_bytes` counts both stages as ring all-reduces (and the
/// uncompressed sum after a stall).
/// @throws error as the codec overload, on every rank alike, with `data` unchanged: the agreement's
/// errors (LHC's parameters are hashed), `invalid_argument` for a plan other than `automatic` or
/// `two_stage` or for more ranks than the index coding can sum, LHC's own `too_large` and
/// `non_finite_input` (a sum beyond the cell type), and `narrowing_overflow` (16-bit data whose sum,
/// or mean, is beyond the type's range); `timeout` and `transport_failed` as the codec overload.
template <executor E, transport X, gradient_value T>
compressed_report compressed_all_reduce(const E& e, X& t, const lossless_homomorphic<T>& lhc,
                                        std::type_identity_t<std::span<T>> data, all_reduce_options options = {}) {
  return detail::within_deadline(t, options.timeout, "compressed_all_reduce", options.key, [&] {
    using memory = collective_memory<E>;
    detail::require_executor_transport<E, X>(e, t);
    const all_reduce_plan plan = options.plan == all_reduce_plan::automatic ? all_reduce_plan::two_stage : options.plan;
    detail::local_problem problem;
    lhc_index_coding coding = lhc.params().index;
    if (plan != all_reduce_plan::two_stage) {
      problem = {errc::invalid_argument,
                 "compressed_all_reduce: lossless homomorphic compression runs the two_stage plan only"};
    } else {
      try {
        coding = lhc_index_coding_for<X>(lhc.params(), t.size(), "compressed_all_reduce");
      } catch (const error& failure) {
        problem = {failure.code(), failure.what()};
      }
    }
    detail::agree_on(e, t, lhc, std::span<const T>(data), static_cast<std::uint8_t>(plan), options.key, problem,
                     "compressed_all_reduce");

    lhc_params staged_params = lhc.params();
    staged_params.index = coding;
    staged_params.on_stall = lhc_stall_policy::report;  // a stall is resent uncompressed below
    const lossless_homomorphic<T> staged(staged_params);
    using cell = typename lossless_homomorphic<T>::cell_type;
    const std::uint64_t n = data.size();
    const auto ranks = static_cast<std::uint64_t>(t.size());
    compressed_report report;
    report.dense_bytes = ring_all_reduce_dense_bytes(n * sizeof(T), ranks);
    // Stage 1: the union of the non-zero positions, on every rank.
    collective_buffer<E, std::byte> index(e, static_cast<std::size_t>(staged.index_bytes(n)));
    staged.encode_index(e, std::span<const T>(data), index.span());
    aggregate_lhc_index(t, coding, index.span());
    report.sent_bytes += ring_all_reduce_dense_bytes(index.size(), ranks);
    // Stage 2: the sketches, sized from the union alike on every rank, summed.
    const lhc_plan sizes = staged.plan(e, std::span<const std::byte>(index.span()), n, ranks);
    collective_buffer<E, cell> sketch(e, static_cast<std::size_t>(sizes.sketch_values()));
    try {
      staged.encode_sketch(e, std::span<const T>(data), std::span<const std::byte>(index.span()), sizes, sketch.span());
    } catch (const error&) {
      // Only a transport that corrupted the index gets here. Join the SUM with a poisoned sketch,
      // so that every rank's decode fails alike instead of the others waiting for this one.
      memory::fill(e, sketch.span(), from_bits<cell>(float_traits<cell>::infinity_key | 1));
    }
    t.all_reduce_sum(sketch.span());
    report.sent_bytes += ring_all_reduce_dense_bytes(sketch.size() * sizeof(cell), ranks);
    collective_buffer<E, std::byte> ws(e, staged.workspace_bytes(e, sizes));
    const std::span<const std::byte> aggregated(index.span());
    try {
      if constexpr (half_precision<T>) {
        // Every rank holds the same sums, so a sum beyond the 16-bit range is `narrowing_overflow`
        // on every rank alike.
        collective_buffer<E, cell> sums(e, data.size());
        staged.decode(e, aggregated, sizes, std::span<const cell>(sketch.span()), sums.span(), ws.span());
        detail::narrow_sums(sums.span(), t.size(), options.average, data);
      } else {
        staged.decode(e, aggregated, sizes, std::span<const cell>(sketch.span()), data, ws.span());
        detail::apply_average(e, t.size(), data, options.average);
      }
    } catch (const error& failure) {
      if (failure.code() != errc::peeling_stalled) throw;
      // Every rank stalled alike: the uncompressed sum instead (`dense`, of a copy, so that a
      // transport that fails or times out midway leaves `data` as it was).
      report.sent_bytes += detail::dense_all_reduce(e, t, data, options.average).sent_bytes;
    }
    return report;
  });
}

/// All-reduces `data` with a stateful wrapper (`error_feedback`, `loco`) on executor `e`: each
/// rank encodes its gradient with its own `state` (`make_state(e, n)`, in E's memory), and every
/// rank decodes every message in rank order (`gather_decode`, or `dense` in the warm-up). `data`
/// becomes the sum of the decoded messages on every rank (the mean with `options.average`).
/// @throws error as the stateless overload, on every rank alike. `data` and `state` are unchanged
/// when the ranks disagree or a gradient is not finite (checked before encoding); when a rank's
/// encoding or any decoding fails, or the deadline passes during the exchange, `data` is unchanged
/// and `state` is restored to what it was (`step_rollback`).
template <executor E, transport X, class C>
  requires stateful<C, E> && codec<C>
compressed_report compressed_all_reduce(const E& e, X& t, const C& codec, state_type_of<C, E>& state,
                                        std::span<typename C::value_type> data, all_reduce_options options = {}) {
  using T = typename C::value_type;
  return detail::within_deadline(t, options.timeout, "compressed_all_reduce", options.key, [&] {
    detail::require_executor_transport<E, X>(e, t);
    const all_reduce_plan plan = detail::resolved_plan(options, all_reduce_plan::gather_decode);
    detail::agree_on(e, t, codec, std::span<const T>(data), static_cast<std::uint8_t>(plan), options.key,
                     detail::plan_problem<X, C>(plan, detail::call_state::single), "compressed_all_reduce");
    if (plan == all_reduce_plan::dense) return detail::dense_all_reduce(e, t, data, options.average);
    detail::frame_coder<C, E> coder(e, codec, data.size(), false);
    step_rollback<state_type_of<C, E>> before = rollback_point(e, state);
    const auto frame = coder.encode_stateful(std::span<const T>(data), state, options.key);
    try {
      compressed_report report = detail::gather_decode_all_reduce(t, coder, frame, data, 0.0, options.average);
      detail::apply_average(e, t.size(), data, options.average);
      return report;
    } catch (...) {
      before.restore(state);
      throw;
    }
  });
}

/// All-reduces `data` with a stateful wrapper by `scatter_reduce` (collective/scatter_reduce.hpp)
/// on executor `e`: `chunk_states` holds P states, state j carrying what the codec dropped from
/// chunk j of this rank's gradient (`make_chunk_states(e, codec, n, P)`, as
/// `compressed_reduce_scatter` takes them), and `server` the wrapper's state for this rank's chunk
/// sum (`make_server_state(e, codec, n, P, rank)`): LoCo around LoCo, error feedback around error
/// feedback, as in 1-bit Adam and LoCo. `automatic` is `scatter_reduce` (these states are laid
/// out for it; `automatic_plan` tells a caller when the one-state overload would send less);
/// `dense` in the warm-up leaves every state untouched.
/// @throws error as the stateless overload; `invalid_argument` (every rank alike) unless
/// `chunk_states` holds P states and the transport has an all-to-all or point-to-point messages.
/// The states are untouched when the agreement fails, and restored when a later stage fails on any
/// rank or the deadline passes.
template <executor E, transport X, class C>
  requires stateful<C, E> && codec<C>
compressed_report compressed_all_reduce(const E& e, X& t, const C& codec, std::span<state_type_of<C, E>> chunk_states,
                                        state_type_of<C, E>& server, std::span<typename C::value_type> data,
                                        all_reduce_options options = {}) {
  using T = typename C::value_type;
  return detail::within_deadline(t, options.timeout, "compressed_all_reduce", options.key, [&]() -> compressed_report {
    detail::require_executor_transport<E, X>(e, t);
    const all_reduce_plan plan = detail::resolved_plan(options, all_reduce_plan::scatter_reduce);
    detail::local_problem problem = detail::plan_problem<X, C>(plan, detail::call_state::chunked);
    if (problem.empty() && chunk_states.size() != static_cast<std::size_t>(t.size()))
      problem = {errc::invalid_argument,
                 "compressed_all_reduce: scatter_reduce needs one state per chunk (P = " + std::to_string(t.size()) +
                     "), not " + std::to_string(chunk_states.size())};
    detail::agree_on(e, t, codec, std::span<const T>(data), static_cast<std::uint8_t>(plan), options.key, problem,
                     "compressed_all_reduce");
    if (plan == all_reduce_plan::dense) return detail::dense_all_reduce(e, t, data, options.average);
    if constexpr (detail::can_all_to_all<X>) {
      const std::uint64_t n = data.size();
      detail::frame_coder<C, E> coder(e, codec, ring_chunk_of(n, t.size(), 0).count, false);
      std::vector<step_rollback<state_type_of<C, E>>> before;
      before.reserve(chunk_states.size() + 1);
      for (const auto& state : chunk_states) before.push_back(rollback_point(e, state));
      before.push_back(rollback_point(e, server));
      try {
        compressed_report report = detail::scatter_reduce_all_reduce(
            t, coder, data, options.average,
            [&](int j) {
              const ring_chunk c = ring_chunk_of(n, t.size(), j);
              return coder.encode_stateful(std::span<const T>(data).subspan(static_cast<std::size_t>(c.offset),
                                                                            static_cast<std::size_t>(c.count)),
                                           chunk_states[static_cast<std::size_t>(j)], options.key);
            },
            [&](std::span<const T> sum, double) { return coder.encode_stateful(sum, server, options.key); });
        detail::apply_average(e, t.size(), data, options.average);
        return report;
      } catch (...) {
        for (std::size_t j = 0; j < chunk_states.size(); ++j) before[j].restore(chunk_states[j]);
        before.back().restore(server);
        throw;
      }
    }
    return {};  // not reached: the agreement threw without an all-to-all or point-to-point messages
  });
}

}  // namespace gradcomp
