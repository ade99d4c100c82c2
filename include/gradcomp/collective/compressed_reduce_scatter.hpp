#pragma once
/// @file
/// Compressed reduce-scatter over any transport, on any executor: every rank's n values go in;
/// rank r gets chunk r (`ring_chunk_of(n, P, r)`) of the sum over ranks of what the codec carries
/// (the mean with `average`). The executor comes first, as in `compressed_all_reduce`. The plans:
///
/// - `all_to_all` (LoCo's scheme, the default where the transport has an all-to-all or
///   point-to-point messages): every rank encodes each chunk once and sends chunk j to rank j, in
///   one `all_to_all_bytes` where the transport has it (`transport_with_all_to_all`), else in
///   P − 1 shifted `sendrecv_bytes`; rank r decodes the P messages of its chunk (its own included)
///   in rank order onto zeros. A stateful wrapper (error feedback, LoCo) keeps one state per chunk.
/// - `ring`, on request: the per-hop ring of collective/ring.hpp (partial sums re-encoded at every
///   hop).
/// - `gather_decode`, for a transport with neither: every rank's whole message is all-gathered
///   and rank r decodes its chunk of the rank-order sum.
/// - `tagc`: TAGC's sharded sketch, the plan of a `tagc` scheme (collective/tagc.hpp).
/// - `dense`: the warm-up (`options.dense_steps`, docs/transports.md §9): an uncompressed
///   reduce-scatter, every chunk padded with zeros to ⌈n/P⌉ values for the transport's
///   equal-block `reduce_scatter_sum`; codec states untouched.
///
/// The ranks agree first, exactly as in `compressed_all_reduce` (collective/agreement.hpp,
/// docs/wire-format.md §21), so a mismatch, a rank's invalid arguments or a non-finite gradient is
/// the same named error on every rank, with nothing encoded. Every call has a deadline,
/// `options.timeout` from its start (collective/call_deadline.hpp), as in `compressed_all_reduce`.

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <gradcomp/collective/agreement.hpp>
#include <gradcomp/collective/all_to_all_chunks.hpp>
#include <gradcomp/collective/call_deadline.hpp>
#include <gradcomp/collective/collective_memory.hpp>
#include <gradcomp/collective/compressed_all_reduce.hpp>
#include <gradcomp/collective/compressed_frame.hpp>
#include <gradcomp/collective/executor_transport.hpp>
#include <gradcomp/collective/ring.hpp>
#include <gradcomp/core/concepts.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/feedback/step_rollback.hpp>
#include <gradcomp/transport/transport.hpp>

namespace gradcomp {

/// How `compressed_reduce_scatter` aggregates.
enum class reduce_scatter_plan : std::uint8_t {
  automatic =
      0,  ///< `all_to_all` where the transport has an all-to-all or point-to-point messages, else `gather_decode`.
  all_to_all =
      1,  ///< Each chunk encoded once and sent to its owner, who decodes the P messages in rank order; needs either.
  ring = 2,  ///< The per-hop ring; needs point-to-point messages and a stateless codec.
  gather_decode = 3,  ///< All-gather of whole messages; each rank decodes its chunk of the rank-order sum.
  tagc = 4,  ///< TAGC's sharded sketch (collective/tagc.hpp): the only plan of a `tagc` scheme.
  dense = 5,  ///< Uncompressed reduce-scatter (the warm-up steps); codec states untouched.
  low_rank = 6,  ///< PowerSGD: its factors all-reduced, this rank's chunk kept (collective/low_rank_collectives.hpp).
};

/// Options of `compressed_reduce_scatter`.
struct reduce_scatter_options {
  message_key key{};  ///< Step and tensor, checked across ranks.
  reduce_scatter_plan plan = reduce_scatter_plan::automatic;  ///< How to aggregate.
  /// Divide the sum by P in the value type (v / T(P)): every rank gets its chunk of the mean.
  /// `error_bound` is divided alike.
  bool average = false;
  bool measure_error = false;  ///< Measure lossy encodings' errors (`report.max_error`, `report.error_bound`).
  /// How long the call may wait for its peers in all, from its start (`infinite_timeout`: as long
  /// as the transport's library does); past it every waiting rank throws `timeout`.
  std::chrono::milliseconds timeout = default_collective_timeout;
  /// Warm-up: while `key.step < dense_steps` the call runs the `dense` plan whatever `plan` says,
  /// with every codec state untouched; the ranks still agree on it. 0 (the default): none.
  std::uint64_t dense_steps = 0;
};

namespace detail {

/// The plan `automatic` resolves to over transport `X`.
template <class X>
[[nodiscard]] constexpr reduce_scatter_plan resolved_plan(reduce_scatter_plan requested) noexcept {
  if (requested != reduce_scatter_plan::automatic) return requested;
  return can_all_to_all<X> ? reduce_scatter_plan::all_to_all : reduce_scatter_plan::gather_decode;
}

/// The plan a call runs: `dense` during the warm-up, else `chosen`.
[[nodiscard]] constexpr reduce_scatter_plan warm_up_or(const reduce_scatter_options& options,
                                                       reduce_scatter_plan chosen) noexcept {
  return options.key.step < options.dense_steps ? reduce_scatter_plan::dense : chosen;
}

/// The `dense` plan: chunk j of `data` (`ring_chunk_of(n, P, j)`) goes to block j of a buffer of P
/// blocks of ⌈n/P⌉ values, zero-padded, which the transport's `reduce_scatter_sum` reduces; `out`
/// receives the first values of this rank's block (the mean with `average`). 16-bit values are
/// widened and summed in float32 (twice the bytes), then rounded once (`narrowing_overflow` on
/// every rank when a rank's chunk sum is beyond the type's range).
template <executor E, transport X, class T>
compressed_report dense_reduce_scatter(const E& e, X& t, std::span<const T> data, std::span<T> out, bool average) {
  using memory = collective_memory<E>;
  using S = compute_type<T>;
  const auto n = static_cast<std::uint64_t>(data.size());
  const int ranks = t.size();
  const auto block = static_cast<std::size_t>(ring_chunk_of(n, ranks, 0).count);
  collective_buffer<E, S> blocks(e, block * static_cast<std::size_t>(ranks));
  collective_buffer<E, S> mine(e, block);
  memory::fill(e, blocks.span(), S{0});
  for (int j = 0; j < ranks; ++j) {
    const ring_chunk c = ring_chunk_of(n, ranks, j);
    const auto from = data.subspan(static_cast<std::size_t>(c.offset), static_cast<std::size_t>(c.count));
    const auto to = blocks.span().subspan(static_cast<std::size_t>(j) * block, static_cast<std::size_t>(c.count));
    if constexpr (half_precision<T>) std::transform(from.begin(), from.end(), to.begin(), [](T v) { return widen(v); });
    else
      memory::copy(e, from, to);
  }
  t.reduce_scatter_sum(std::span<const S>(blocks.span()), mine.span());
  if constexpr (half_precision<T>) {
    collective_buffer<E, T> narrowed(e, out.size());
    agree_on_status(t,
                    static_cast<errc>(narrowing_status(mine.span().first(out.size()), ranks, average, narrowed.span())),
                    "compressed_reduce_scatter");
    memory::copy(e, std::span<const T>(narrowed.span()), out);
  } else {
    memory::copy(e, std::span<const T>(mine.span()).first(out.size()), out);
    apply_average(e, ranks, out, average);
  }
  compressed_report report;
  report.sent_bytes = block * sizeof(S) * static_cast<std::uint64_t>(ranks - 1);
  report.dense_bytes = (n - out.size()) * sizeof(T);
  return report;
}

/// The value the agreement record carries for a reduce-scatter plan (16 + plan, so that an
/// all-reduce and a reduce-scatter never agree).
[[nodiscard]] constexpr std::uint8_t agreement_plan(reduce_scatter_plan plan) noexcept {
  return static_cast<std::uint8_t>(16 + static_cast<int>(plan));
}

/// Why this rank's arguments cannot run (empty: they can): `out` of another size than this
/// rank's chunk, a plan that is no `reduce_scatter_plan` of a codec or cannot run here (`runnable`),
/// or (`states` ≥ 0) a stateful call without one state per chunk. Carried by the agreement record,
/// so every rank throws when one rank's arguments are wrong.
[[nodiscard]] inline local_problem reduce_scatter_problem(std::size_t out_size, std::uint64_t n, int ranks, int rank,
                                                          reduce_scatter_plan plan, bool runnable,
                                                          long long states = -1) {
  const std::string where = "compressed_reduce_scatter: ";
  if (out_size != ring_chunk_of(n, ranks, rank).count)
    return {errc::invalid_argument, where + "out holds " + std::to_string(out_size) +
                                        " values, not this rank's chunk of " +
                                        std::to_string(ring_chunk_of(n, ranks, rank).count)};
  if (plan == reduce_scatter_plan::dense) runnable = true;
  if ((plan > reduce_scatter_plan::gather_decode && plan != reduce_scatter_plan::dense) || !runnable)
    return {errc::invalid_argument,
            where + "plan " + std::to_string(static_cast<int>(plan)) +
                " does not apply (all_to_all needs an all-to-all or point-to-point messages; ring point-to-point "
                "messages and a stateless codec; tagc a tagc scheme)"};
  if (states >= 0 && states != ranks)
    return {errc::invalid_argument, where + "a stateful codec needs one state per chunk (P = " + std::to_string(ranks) +
                                        "), not " + std::to_string(states)};
  return {};
}

}  // namespace detail

/// Reduce-scatters `data` (n values on every rank, in executor `e`'s memory) compressed with
/// `codec`: `out`, this rank's chunk (`ring_chunk_of(n, P, rank)`), becomes that chunk of the sum
/// over ranks of what the codec carries (the mean with `options.average`). `report.dense_bytes` is
/// what an uncompressed reduce-scatter sends from this rank.
/// @throws error on every rank alike, with `out` unchanged: the agreement's errors (see
/// `compressed_all_reduce`), `non_finite_input` for NaN or ±Inf in any rank's data, the code of a
/// rank whose encoding or decoding failed; `invalid_argument` when any rank's `out` is not its
/// chunk's size or its plan cannot run here (that rank's message names the problem); `timeout`
/// (each waiting rank) when the deadline passes first, `transport_failed` when the transport fails.
template <executor E, transport X, class C>
  requires codec_for<C, E>
compressed_report compressed_reduce_scatter(const E& e, X& t, const C& codec,
                                            std::span<const typename C::value_type> data,
                                            std::span<typename C::value_type> out,
                                            reduce_scatter_options options = {}) {
  using T = typename C::value_type;
  return detail::within_deadline(t, options.timeout, "compressed_reduce_scatter", options.key, [&] {
    detail::require_executor_transport<E, X>(e, t);
    const auto plan = detail::warm_up_or(options, detail::resolved_plan<X>(options.plan));
    const auto n = static_cast<std::uint64_t>(data.size());
    constexpr bool p2p = transport_with_point_to_point<X>;
    detail::agree_on(
        e, t, codec, data, detail::agreement_plan(plan), options.key,
        detail::reduce_scatter_problem(out.size(), n, t.size(), t.rank(), plan,
                                       plan == reduce_scatter_plan::gather_decode ||
                                           (plan == reduce_scatter_plan::ring ? p2p : detail::can_all_to_all<X>)),
        "compressed_reduce_scatter");
    if (plan == reduce_scatter_plan::dense) return detail::dense_reduce_scatter(e, t, data, out, options.average);
    if constexpr (p2p) {
      if (plan == reduce_scatter_plan::ring)
        return detail::ring_reduce_scatter_within(e, t, codec, data, out,
                                                  {.key = options.key,
                                                   .average = options.average,
                                                   .measure_error = options.measure_error});
    }
    compressed_report report;
    if (plan == reduce_scatter_plan::all_to_all) {
      if constexpr (detail::can_all_to_all<X>) {
        detail::frame_coder<C, E> coder(e, codec, ring_chunk_of(n, t.size(), 0).count, options.measure_error);
        double max_error = 0.0;
        report = detail::all_to_all_reduce_scatter(t, coder, n, out, options.average, [&](int j) {
          const ring_chunk c = ring_chunk_of(n, t.size(), j);
          double error = 0.0;
          const auto frame =
              coder.encode(data.subspan(static_cast<std::size_t>(c.offset), static_cast<std::size_t>(c.count)),
                           options.key, 0.0, error);
          max_error = std::max(max_error, error);
          return frame;
        });
        report.max_error = max_error;
      }
    } else {
      // gather_decode: the all-reduce's gather, then this rank's chunk.
      detail::frame_coder<C, E> coder(e, codec, n, options.measure_error);
      collective_buffer<E, T> sum(e, data.size());
      double error = 0.0;
      const auto frame = coder.encode(data, options.key, 0.0, error);
      report = detail::gather_decode_all_reduce(t, coder, frame, sum.span(), error, options.average);
      const ring_chunk mine = ring_chunk_of(n, t.size(), t.rank());
      report.dense_bytes = (n - mine.count) * sizeof(T);
      collective_memory<E>::copy(e,
                                 std::span<const T>(sum.span())
                                     .subspan(static_cast<std::size_t>(mine.offset),
                                              static_cast<std::size_t>(mine.count)),
                                 out);
    }
    report.error_bound *= detail::apply_average(e, t.size(), out, options.average);
    return report;
  });
}

/// Reduce-scatters `data` with a stateful wrapper (`error_feedback`, `loco`) by `all_to_all` on
/// executor `e`: `states` holds P states, state j for chunk j (`make_state(e, ring_chunk_of(n, P,
/// j).count)`, in E's memory), each carrying what the codec dropped from that chunk into later
/// steps.
/// @throws error as the stateless overload; `invalid_argument` unless `states` holds P states and
/// the transport has an all-to-all or point-to-point messages. The states are untouched when the
/// agreement fails, and restored when a later stage fails on any rank or the deadline passes.
template <executor E, transport X, class C>
  requires stateful<C, E> && codec<C>
compressed_report compressed_reduce_scatter(const E& e, X& t, const C& codec, std::span<state_type_of<C, E>> states,
                                            std::span<const typename C::value_type> data,
                                            std::span<typename C::value_type> out,
                                            reduce_scatter_options options = {}) {
  return detail::within_deadline(
      t, options.timeout, "compressed_reduce_scatter", options.key, [&]() -> compressed_report {
        detail::require_executor_transport<E, X>(e, t);
        const auto plan =
            detail::warm_up_or(options, options.plan == reduce_scatter_plan::automatic ? reduce_scatter_plan::all_to_all
                                                                                       : options.plan);
        const auto n = static_cast<std::uint64_t>(data.size());
        detail::agree_on(e, t, codec, data, detail::agreement_plan(plan), options.key,
                         detail::reduce_scatter_problem(out.size(), n, t.size(), t.rank(), plan,
                                                        detail::can_all_to_all<X> &&
                                                            plan == reduce_scatter_plan::all_to_all,
                                                        static_cast<long long>(states.size())),
                         "compressed_reduce_scatter");
        if (plan == reduce_scatter_plan::dense) return detail::dense_reduce_scatter(e, t, data, out, options.average);
        if constexpr (detail::can_all_to_all<X>) {
          detail::frame_coder<C, E> coder(e, codec, ring_chunk_of(n, t.size(), 0).count, false);
          std::vector<step_rollback<state_type_of<C, E>>> before;
          before.reserve(states.size());
          for (const auto& state : states) before.push_back(rollback_point(e, state));
          try {
            compressed_report report = detail::all_to_all_reduce_scatter(t, coder, n, out, options.average, [&](int j) {
              const ring_chunk c = ring_chunk_of(n, t.size(), j);
              return coder.encode_stateful(data.subspan(static_cast<std::size_t>(c.offset),
                                                        static_cast<std::size_t>(c.count)),
                                           states[static_cast<std::size_t>(j)], options.key);
            });
            detail::apply_average(e, t.size(), out, options.average);
            return report;
          } catch (...) {
            for (std::size_t j = 0; j < states.size(); ++j) before[j].restore(states[j]);
            throw;
          }
        }
        return {};  // not reached: the agreement threw without an all-to-all or point-to-point messages
      });
}

}  // namespace gradcomp
