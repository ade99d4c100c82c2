#pragma once
/// @file
/// Ring reduce-scatter and all-reduce with a codec whose messages do not add (MPC, ZFP, a
/// sparsifier, a quantizer): the hybrid scheme's decompress–add–recompress per hop
/// (ALGORITHMS.md §5, docs/transports.md §5).
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
/// (`non_finite_input`), whether or not an encoding would meet it.

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <gradcomp/collective/compressed_all_gather.hpp>
#include <gradcomp/collective/compressed_frame.hpp>
#include <gradcomp/core/concepts.hpp>
#include <gradcomp/core/cpu_executor.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/float_bits.hpp>
#include <gradcomp/transport/transport.hpp>

namespace gradcomp {

/// Options of the ring collectives.
struct ring_options {
  /// Decode every lossy message once more to measure its error, for `report.error_bound` and
  /// `report.max_error` (one extra decode per hop). Without it both stay 0.
  bool measure_error = true;
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
template <class T>
struct ring_sum {
  std::vector<T> values;    ///< The sum of this rank's chunk (valid when `status` is 0).
  double bound = 0.0;       ///< The error bound accumulated over its encodings.
  std::uint8_t status = 0;  ///< 0, or the code of the first failure this rank saw.
};

/// The P − 1 hops of the ring reduce-scatter of `data` (P ≥ 2).
template <transport_with_point_to_point X, class C>
ring_sum<typename C::value_type> ring_hops(X& t, frame_coder<C>& coder, std::span<const typename C::value_type> data,
                                           message_key key, compressed_report& report) {
  using T = typename C::value_type;
  const int ranks = t.size();
  const int rank = t.rank();
  const auto n = static_cast<std::uint64_t>(data.size());
  const auto chunk_at = [&](int hop_offset) {
    const ring_chunk c = ring_chunk_of(n, ranks, ((rank - hop_offset) % ranks + ranks) % ranks);
    return data.subspan(static_cast<std::size_t>(c.offset), static_cast<std::size_t>(c.count));
  };
  ring_sum<T> sum;
  if constexpr (!codec_is_lossless<C>) {
    // A value the codec may not carry fails here, before any hop, even where no encoding would
    // see it (this rank's own contribution to its own chunk).
    if (!std::all_of(data.begin(), data.end(), [](T v) { return is_finite(v); }))
      sum.status = static_cast<std::uint8_t>(errc::non_finite_input);
  }
  const auto first = chunk_at(1);
  sum.values.assign(first.begin(), first.end());
  for (int s = 0; s < ranks - 1; ++s) {
    double error = 0.0;
    const auto frame = sum.status != 0 ? coder.failure(static_cast<errc>(sum.status))
                                       : coder.encode(sum.values, key, sum.bound, error);
    if (sum.status == 0) sum.status = std::to_integer<std::uint8_t>(frame[0]);
    report.sent_bytes += frame.size();
    report.dense_bytes += sum.values.size() * sizeof(T);
    report.max_error = std::max(report.max_error, error);
    const std::vector<std::byte> received = t.sendrecv_bytes(frame, (rank + 1) % ranks, (rank + ranks - 1) % ranks);
    const auto own = chunk_at(s + 2);
    sum.values.assign(own.begin(), own.end());
    if (sum.status != 0) continue;
    frame_view f;
    try {
      f = read_frame(received);
    } catch (const gradcomp::error& e) {
      f.status = static_cast<std::uint8_t>(e.code());
    }
    sum.status = f.status != 0 ? f.status : coder.decode(f, sum.values, true);
    sum.bound = f.bound;
  }
  return sum;
}

}  // namespace detail

/// Ring reduce-scatter of `data` (n values on every rank) with `codec` re-encoding the partial
/// sums at every hop: `out` (chunk rank() of `ring_chunk_of`, its count values) becomes the sum
/// over ranks of that chunk. One MAX all-reduce of two doubles at the end makes every rank agree
/// on failures and on `report.error_bound`.
/// @throws error `invalid_argument` when `out` is not this rank's chunk size (this rank only); on
/// every rank alike, the first failure of any rank (`non_finite_input`, `size_mismatch`,
/// `parameter_mismatch`, …). `out` is unchanged on error.
template <transport_with_point_to_point X, class C>
  requires codec_for<C, cpu_executor>
compressed_report ring_reduce_scatter(X& t, const C& codec, std::span<const typename C::value_type> data,
                                      std::span<typename C::value_type> out, message_key key = {}, ring_options options = {}) {
  const ring_chunk mine = ring_chunk_of(data.size(), t.size(), t.rank());
  detail::require(out.size() == mine.count, errc::invalid_argument, [&] {
    return "ring_reduce_scatter: out holds " + std::to_string(out.size()) + " values, not this rank's chunk of " +
           std::to_string(mine.count);
  });
  compressed_report report;
  if (t.size() == 1) {
    std::copy(data.begin(), data.end(), out.begin());
    return report;
  }
  detail::frame_coder<C> coder(codec, ring_chunk_of(data.size(), t.size(), 0).count, options.measure_error);
  const auto sum = detail::ring_hops(t, coder, data, key, report);
  std::array<double, 2> agreed{static_cast<double>(sum.status), sum.bound};
  t.all_reduce_max(std::span<double>(agreed));
  if (agreed[0] != 0.0) detail::fail_from_frame(static_cast<std::uint8_t>(agreed[0]), "ring_reduce_scatter");
  report.error_bound = agreed[1];
  std::copy(sum.values.begin(), sum.values.end(), out.begin());
  return report;
}

/// Ring all-reduce of `data` (n values on every rank, in place) with `codec`: the ring
/// reduce-scatter, then each chunk sum encoded once by its owner and all-gathered, every rank
/// decoding every chunk from the same bytes. Every rank ends with identical values.
/// @throws error on every rank alike, the first failure of any rank (`non_finite_input`,
/// `size_mismatch`, `parameter_mismatch`, …); `data` is unchanged on error.
template <transport_with_point_to_point X, class C>
  requires codec_for<C, cpu_executor>
compressed_report ring_all_reduce(X& t, const C& codec, std::span<typename C::value_type> data, message_key key = {},
                                  ring_options options = {}) {
  using T = typename C::value_type;
  compressed_report report;
  const int ranks = t.size();
  if (ranks == 1) return report;
  const auto n = static_cast<std::uint64_t>(data.size());
  detail::frame_coder<C> coder(codec, ring_chunk_of(n, ranks, 0).count, options.measure_error);
  const auto sum = detail::ring_hops(t, coder, std::span<const T>(data), key, report);
  double error = 0.0;
  const auto frame = sum.status != 0 ? coder.failure(static_cast<errc>(sum.status)) : coder.encode(sum.values, key, sum.bound, error);
  report.sent_bytes += frame.size() * static_cast<std::uint64_t>(ranks - 1);
  report.dense_bytes += sum.values.size() * sizeof(T) * static_cast<std::uint64_t>(ranks - 1);
  report.max_error = std::max(report.max_error, error);
  report.error_bound = detail::gather_and_decode(
      t, coder, frame, data,
      [&](int c) {
        const ring_chunk chunk = ring_chunk_of(n, ranks, c);
        return std::pair{chunk.offset, chunk.count};
      },
      false, "ring_all_reduce");
  return report;
}

}  // namespace gradcomp
