#pragma once
/// @file
/// Compressed all-gather for any codec (the hybrid scheme's "compress once, forward bytes",
/// docs/transports.md §5): every rank encodes its block once, the frames (collective/compressed_frame.hpp)
/// are all-gathered as bytes, and every rank decodes every block from the same bytes, its own
/// included, so all ranks hold identical values even under a lossy codec. The error of the result
/// is one encoding's, never accumulated. Runs on any executor whose memory space is the transport's
/// (collective/executor_transport.hpp). Every call has a deadline, `options.timeout` from its start
/// (collective/call_deadline.hpp).

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <gradcomp/collective/call_deadline.hpp>
#include <gradcomp/collective/collective_memory.hpp>
#include <gradcomp/collective/compressed_frame.hpp>
#include <gradcomp/collective/executor_transport.hpp>
#include <gradcomp/core/concepts.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/transport/transport.hpp>

namespace gradcomp {

/// Options of `compressed_all_gather`.
struct all_gather_options {
  message_key key{};          ///< Step and tensor: keys the codec.
  bool measure_error = true;  ///< Measure the lossy encodings' errors (`report.max_error`, `report.error_bound`).
  /// How long the call may wait for its peers in all, from its start (`infinite_timeout`: as long
  /// as the transport's library does); past it every waiting rank throws `timeout`.
  std::chrono::milliseconds timeout = default_collective_timeout;
};

namespace detail {

/// All-gathers this rank's frame and decodes frame p into `out[offset(p), offset(p) + count(p))`
/// for every rank p (`block(p)` returns {offset, count}), in rank order; with `accumulate` the
/// decoded frames are added there, onto zeros. Every rank sees the same frames, so a failed or
/// unreadable frame makes every rank throw the same error (the largest code), before anything is
/// written to `out`. Returns the largest bound the frames carry. 16-bit values are decoded (and
/// accumulated) in float32 when they are summed or averaged, divided by P there with `average`,
/// and narrowed once (`narrow_sums`); other types are averaged by the caller (`apply_average`).
template <transport X, class C, executor E, class Block>
double gather_and_decode(X& t, frame_coder<C, E>& coder, std::span<const std::byte> mine,
                         std::span<typename C::value_type> out, Block block, bool accumulate, const char* where,
                         bool average = false) {
  using T = typename C::value_type;
  using memory = collective_memory<E>;
  const auto frames = t.all_gather_bytes(mine);
  std::vector<frame_view> views(frames.size());
  std::uint8_t status = 0;
  double bound = 0.0;
  for (std::size_t p = 0; p < frames.size(); ++p) {
    try {
      views[p] = coder.read(std::span<const std::byte>(frames[p]));
    } catch (const gradcomp::error& e) {
      views[p].status = static_cast<std::uint8_t>(e.code());
    }
    status = std::max(status, views[p].status);
    bound = std::max(bound, views[p].bound);
  }
  if (status != 0) fail_from_frame(status, where);
  // Every frame decoded into `result` in rank order (added onto zeros with `accumulate`).
  const auto decode_all = [&]<class R>(std::span<R> result) {
    if (accumulate) memory::fill(coder.executor(), result, R{0});
    for (std::size_t p = 0; p < frames.size(); ++p) {
      const auto [offset, count] = block(static_cast<int>(p));
      const std::uint8_t code =
          coder.decode(views[p], result.subspan(static_cast<std::size_t>(offset), static_cast<std::size_t>(count)),
                       accumulate);
      if (code != 0)
        fail(static_cast<errc>(code),
             std::string(where) + ": the message of rank " + std::to_string(p) + " does not decode");
    }
  };
  if constexpr (half_precision<T>) {
    if (accumulate || average) {
      typename memory::template buffer<compute_type<T>> sums(coder.executor(), out.size());
      decode_all(sums.span());
      narrow_sums(sums.span(), t.size(), average, out);
      return bound;
    }
  }
  typename memory::template buffer<T> result(coder.executor(), out.size());
  decode_all(result.span());
  memory::copy(coder.executor(), std::span<const T>(result.span()), out);
  return bound;
}

}  // namespace detail

/// Gathers every rank's `mine` (m values, the same m on every rank) into `out` (P·m values, rank
/// p's block at p·m), compressed with `codec` on executor `e` (spans in its memory). Every rank
/// decodes every block, its own included, from the same bytes. `report.error_bound` is the largest
/// measured error of the P encodings (with `measure_error`; 0 for a lossless codec).
/// @throws error `invalid_argument` when out.size() ≠ P·m (this rank only); on every rank alike,
/// the error of a rank whose block could not be encoded (`non_finite_input` for NaN or Inf under a
/// codec that does not carry them) or decoded (`size_mismatch` or `parameter_mismatch` when the
/// ranks disagree on m or on the codec's parameters); `timeout` (each waiting rank) when the
/// deadline passes first, `transport_failed` when the transport fails. `out` is unchanged on error.
template <executor E, transport X, class C>
  requires codec_for<C, E>
compressed_report compressed_all_gather(const E& e, X& t, const C& codec, std::span<const typename C::value_type> mine,
                                        std::span<typename C::value_type> out, all_gather_options options = {}) {
  using T = typename C::value_type;
  return detail::within_deadline(t, options.timeout, "compressed_all_gather", options.key, [&] {
    detail::require_executor_transport<E, X>(e, t);
    const auto m = static_cast<std::uint64_t>(mine.size());
    const auto ranks = static_cast<std::uint64_t>(t.size());
    detail::require(out.size() == m * ranks, errc::invalid_argument, [&] {
      return "compressed_all_gather: out holds " + std::to_string(out.size()) +
             " values, not P·m = " + std::to_string(m * ranks);
    });
    detail::frame_coder<C, E> coder(e, codec, m, options.measure_error);
    compressed_report report;
    const auto frame = coder.encode(mine, options.key, 0.0, report.max_error);
    report.sent_bytes = frame.size() * (ranks - 1);
    report.dense_bytes = m * sizeof(T) * (ranks - 1);
    report.error_bound = detail::gather_and_decode(
        t, coder, frame, out,
        [m](int p) {
          return std::pair{static_cast<std::uint64_t>(p) * m, m};
        },
        false, "compressed_all_gather");
    return report;
  });
}

}  // namespace gradcomp
