#pragma once
/// @file
/// Ring reduce-scatter and all-reduce with a codec whose messages do not add (MPC, ZFP, a
/// sparsifier, a quantizer): the hybrid scheme's decompress–add–recompress per hop
/// (docs/transports.md §5).
///
/// The n values are cut into P chunks (`ring_chunk_of`). In hop s = 0 … P−2, rank r encodes the
/// partial sum of chunk (r − s − 1) mod P (its own values at s = 0), sends the frame to rank r + 1
/// and receives chunk (r − s − 2) mod P from rank r − 1, decoding it onto its own values of that
/// chunk. After P − 1 hops rank r holds the sum of chunk r, added in the order r+1, r+2, …, r
/// (mod P). The all-reduce then encodes each chunk sum once more and all-gathers the frames; every
/// rank, the owner included, decodes every chunk from the same bytes, so all ranks hold identical
/// values.
///
/// A lossless codec gives exactly the sums of an uncompressed ring (the same additions in the
/// same order). A lossy one adds the error of each encoding to the chunk: a chunk crosses P − 1
/// encodings in the reduce-scatter and one more in the all-reduce, so its error grows with P.
/// Each frame carries the bound accumulated so far (the sum of the measured errors of the
/// encodings the chunk went through), and `report.error_bound` is the largest over the chunks:
/// the result differs from the uncompressed ring's by at most that, plus the float rounding of
/// the additions. A failure on any rank (a value the codec cannot encode, a message that does not
/// decode because the ranks disagree on n or on the codec's parameters) travels along the ring as
/// a failed frame, and every rank throws the same error; the output is then unchanged. Under a
/// codec that is not lossless, a NaN or Inf anywhere in a rank's input is such a failure
/// (`non_finite_input`), whether or not an encoding would meet it. A rank that stops calling makes
/// the others throw `timeout` at the call's deadline (`ring_options::timeout`,
/// collective/call_deadline.hpp), with the output unchanged.
///
/// bf16 and fp16 values (host executors, docs/half-precision.md §3): each rank keeps its partial
/// sum in float32 (its own values widened, the received ones decoded into float32) and rounds it
/// once to the 16-bit type for each encoding; the result is rounded once more from float32 (after
/// dividing by P with `average`). A partial sum beyond fp16's range is `narrowing_overflow`, which
/// travels as any failure does.

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>

#include <gradcomp/collective/call_deadline.hpp>
#include <gradcomp/collective/collective_memory.hpp>
#include <gradcomp/collective/compressed_all_gather.hpp>
#include <gradcomp/collective/compressed_frame.hpp>
#include <gradcomp/collective/executor_transport.hpp>
#include <gradcomp/core/concepts.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/transport/transport.hpp>

namespace gradcomp {

/// Options of the ring collectives.
struct ring_options {
  message_key key{};  ///< Step and tensor: keys the codec.
  /// Divide the result by P (in the value type, after the sum): the mean instead of the sum. The
  /// error bound is divided alike.
  bool average = false;
  /// Decode every lossy message once more to measure its error, for `report.error_bound` and
  /// `report.max_error` (one extra decode per hop). Without it both stay 0.
  bool measure_error = true;
  /// How long the call may wait for its peers in all, from its start (`infinite_timeout`: as long
  /// as the transport's library does); past it every waiting rank throws `timeout`.
  std::chrono::milliseconds timeout = default_collective_timeout;
};

/// Values [offset, offset + count) of an n-value tensor: chunk c of P.
struct ring_chunk {
  std::uint64_t offset = 0;  ///< First value.
  std::uint64_t count = 0;   ///< Number of values.
};

/// Chunk c of an n-value tensor cut into P: the first n mod P chunks hold ⌈n/P⌉ values, the
/// others ⌊n/P⌋, in order.
[[nodiscard]] constexpr ring_chunk ring_chunk_of(std::uint64_t n, int ranks, int c) noexcept {
  const auto p = static_cast<std::uint64_t>(ranks);
  const auto i = static_cast<std::uint64_t>(c);
  const std::uint64_t base = n / p;
  const std::uint64_t extra = n % p;
  return {i * base + std::min(i, extra), base + (i < extra ? 1 : 0)};
}

namespace detail {

/// What the hops of the ring reduce-scatter leave on one rank.
template <class T, executor E>
struct ring_sum {
  using sum_type = compute_type<T>;  ///< What the partial sums are kept in: float32 for 16-bit values.
  collective_buffer<E, sum_type>
      values;  ///< The sum of this rank's chunk in its first `count` values (valid when `status` is 0).
  collective_buffer<E, T> rounded;  ///< 16-bit values: the partial sum rounded for an encoding.
  std::size_t count = 0;           ///< Values of this rank's chunk.
  double bound = 0.0;              ///< The error bound accumulated over its encodings.
  std::uint8_t status = 0;         ///< 0, or the code of the first failure this rank saw.

  [[nodiscard]] std::span<sum_type> chunk() noexcept { return values.span().first(count); }

  /// The values to encode: the chunk's sum, or for 16-bit values that sum rounded once
  /// (`narrowing_overflow` in `status` when it cannot be, divided by `ranks` first with `average`).
  [[nodiscard]] std::span<const T> encodable(const E& e, int ranks, bool average) {
    if constexpr (half_precision<T>) {
      rounded.resize(e, count);
      if (status == 0) status = narrowing_status(chunk(), ranks, average, rounded.span());
      return rounded.span();
    } else {
      return chunk();
    }
  }
};

/// The P − 1 hops of the ring reduce-scatter of `data` (P ≥ 2).
template <transport_with_point_to_point X, class C, executor E>
ring_sum<typename C::value_type, E> ring_hops(X& t, frame_coder<C, E>& coder,
                                              std::span<const typename C::value_type> data, message_key key,
                                              compressed_report& report) {
  using T = typename C::value_type;
  using memory = collective_memory<E>;
  const E& e = coder.executor();
  const int ranks = t.size();
  const int rank = t.rank();
  const auto n = static_cast<std::uint64_t>(data.size());
  const auto chunk_at = [&](int hop_offset) {
    const ring_chunk c = ring_chunk_of(n, ranks, ((rank - hop_offset) % ranks + ranks) % ranks);
    return data.subspan(static_cast<std::size_t>(c.offset), static_cast<std::size_t>(c.count));
  };
  const auto take = [&](ring_sum<T, E>& sum, std::span<const T> values) {
    sum.count = values.size();
    if constexpr (half_precision<T>)
      std::transform(values.begin(), values.end(), sum.chunk().begin(), [](T v) { return widen(v); });
    else
      memory::copy(e, values, sum.chunk());
  };
  ring_sum<T, E> sum;
  sum.values.resize(e, static_cast<std::size_t>(ring_chunk_of(n, ranks, 0).count));
  if constexpr (!codec_is_lossless<C>) {
    // A value the codec may not carry fails here, before any hop, even where no encoding would
    // see it (this rank's own contribution to its own chunk).
    if (!memory::all_finite(e, data)) sum.status = static_cast<std::uint8_t>(errc::non_finite_input);
  }
  take(sum, chunk_at(1));
  for (int s = 0; s < ranks - 1; ++s) {
    double error = 0.0;
    const std::span<const T> values = sum.encodable(e, ranks, false);
    const auto frame =
        sum.status != 0 ? coder.failure(static_cast<errc>(sum.status)) : coder.encode(values, key, sum.bound, error);
    if (sum.status == 0) sum.status = coder.last_status();
    report.sent_bytes += frame.size();
    report.dense_bytes += sum.count * sizeof(T);
    report.max_error = std::max(report.max_error, error);
    const auto received = t.sendrecv_bytes(frame, (rank + 1) % ranks, (rank + ranks - 1) % ranks);
    take(sum, chunk_at(s + 2));
    if (sum.status != 0) continue;
    frame_view f;
    try {
      f = coder.read(std::span<const std::byte>(received));
    } catch (const gradcomp::error& failure) {
      f.status = static_cast<std::uint8_t>(failure.code());
    }
    sum.status = f.status != 0 ? f.status : coder.decode(f, sum.chunk(), true);
    sum.bound = f.bound;
  }
  return sum;
}

/// `ring_reduce_scatter` without its deadline scope (which its callers set).
template <executor E, transport_with_point_to_point X, class C>
  requires codec_for<C, E>
compressed_report ring_reduce_scatter_within(const E& e, X& t, const C& codec,
                                             std::span<const typename C::value_type> data,
                                             std::span<typename C::value_type> out, const ring_options& options) {
  using T = typename C::value_type;
  require_executor_transport<E, X>(e, t);
  const ring_chunk mine = ring_chunk_of(data.size(), t.size(), t.rank());
  require(out.size() == mine.count, errc::invalid_argument, [&] {
    return "ring_reduce_scatter: out holds " + std::to_string(out.size()) + " values, not this rank's chunk of " +
           std::to_string(mine.count);
  });
  compressed_report report;
  if (t.size() == 1) {
    collective_memory<E>::copy(e, data, out);
    return report;
  }
  frame_coder<C, E> coder(e, codec, ring_chunk_of(data.size(), t.size(), 0).count, options.measure_error);
  auto sum = ring_hops(t, coder, data, options.key, report);
  // 16-bit values are rounded here, the mean divided first, so that a failure is agreed on below.
  const std::span<const T> result = sum.encodable(e, t.size(), options.average);
  std::array<double, 2> agreed{static_cast<double>(sum.status), sum.bound};
  control_all_reduce_max(t, std::span<double>(agreed));
  if (agreed[0] != 0.0) fail_from_frame(static_cast<std::uint8_t>(agreed[0]), "ring_reduce_scatter");
  collective_memory<E>::copy(e, result, out);
  report.error_bound = agreed[1] * apply_average(e, t.size(), out, options.average);
  return report;
}

/// `ring_all_reduce` without its deadline scope (which its callers set).
template <executor E, transport_with_point_to_point X, class C>
  requires codec_for<C, E>
compressed_report ring_all_reduce_within(const E& e, X& t, const C& codec, std::span<typename C::value_type> data,
                                         const ring_options& options) {
  using T = typename C::value_type;
  require_executor_transport<E, X>(e, t);
  compressed_report report;
  const int ranks = t.size();
  if (ranks == 1) return report;
  const auto n = static_cast<std::uint64_t>(data.size());
  frame_coder<C, E> coder(e, codec, ring_chunk_of(n, ranks, 0).count, options.measure_error);
  auto sum = ring_hops(t, coder, std::span<const T>(data), options.key, report);
  double error = 0.0;
  const std::span<const T> values = sum.encodable(e, ranks, false);
  const auto frame = sum.status != 0 ? coder.failure(static_cast<errc>(sum.status))
                                     : coder.encode(values, options.key, sum.bound, error);
  report.sent_bytes += frame.size() * static_cast<std::uint64_t>(ranks - 1);
  report.dense_bytes += sum.count * sizeof(T) * static_cast<std::uint64_t>(ranks - 1);
  report.max_error = std::max(report.max_error, error);
  report.error_bound = gather_and_decode(
      t, coder, frame, data,
      [&](int c) {
        const ring_chunk chunk = ring_chunk_of(n, ranks, c);
        return std::pair{chunk.offset, chunk.count};
      },
      false, "ring_all_reduce", options.average);
  report.error_bound *= apply_average(e, t.size(), data, options.average);
  return report;
}

}  // namespace detail

/// Ring reduce-scatter of `data` (n values on every rank) with `codec` on executor `e`,
/// re-encoding the partial sums at every hop: `out` (chunk rank() of `ring_chunk_of`, its count
/// values) becomes the sum over ranks of that chunk (the mean with `options.average`). One MAX
/// all-reduce of two doubles at the end makes every rank agree on failures and on
/// `report.error_bound`.
/// @throws error `invalid_argument` when `out` is not this rank's chunk size (this rank only); on
/// every rank alike, the first failure of any rank (`non_finite_input`, `size_mismatch`,
/// `parameter_mismatch`, …); `timeout` when the deadline passes first. `out` is unchanged on error.
template <executor E, transport_with_point_to_point X, class C>
  requires codec_for<C, E>
compressed_report ring_reduce_scatter(const E& e, X& t, const C& codec, std::span<const typename C::value_type> data,
                                      std::span<typename C::value_type> out, ring_options options = {}) {
  return detail::within_deadline(t, options.timeout, "ring_reduce_scatter", options.key,
                                 [&] { return detail::ring_reduce_scatter_within(e, t, codec, data, out, options); });
}

/// Ring all-reduce of `data` (n values on every rank, in place) with `codec` on executor `e`:
/// the ring reduce-scatter, then each chunk sum encoded once by its owner and all-gathered, every
/// rank decoding every chunk from the same bytes. Every rank ends with identical values: the sum
/// (the mean with `options.average`).
/// @throws error on every rank alike, the first failure of any rank (`non_finite_input`,
/// `size_mismatch`, `parameter_mismatch`, …); `timeout` when the deadline passes first. `data` is
/// unchanged on error.
template <executor E, transport_with_point_to_point X, class C>
  requires codec_for<C, E>
compressed_report ring_all_reduce(const E& e, X& t, const C& codec, std::span<typename C::value_type> data,
                                  ring_options options = {}) {
  return detail::within_deadline(t, options.timeout, "ring_all_reduce", options.key,
                                 [&] { return detail::ring_all_reduce_within(e, t, codec, data, options); });
}

}  // namespace gradcomp
