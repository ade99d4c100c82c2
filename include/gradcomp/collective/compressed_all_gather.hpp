#pragma once
/// @file
/// Compressed all-gather for any codec (the hybrid scheme's "compress once, forward bytes",
/// ALGORITHMS.md §5): every rank encodes its block once, the frames (collective/compressed_frame.hpp)
/// are all-gathered as bytes, and every rank decodes every block from the same bytes, its own
/// included, so all ranks hold identical values even under a lossy codec. The error of the result
/// is one encoding's, never accumulated.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <gradcomp/collective/compressed_frame.hpp>
#include <gradcomp/core/concepts.hpp>
#include <gradcomp/core/cpu_executor.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/transport/transport.hpp>

namespace gradcomp {

namespace detail {

/// All-gathers this rank's frame and decodes frame p into `out[offset(p), offset(p) + count(p))`
/// for every rank p (`block(p)` returns {offset, count}), in rank order; with `accumulate` the
/// decoded frames are added there, onto zeros. Every rank sees the same frames, so a failed or
/// unreadable frame makes every rank throw the same error (the largest code), before anything is
/// written to `out`. Returns the largest bound the frames carry.
template <transport X, class C, class Block>
double gather_and_decode(X& t, frame_coder<C>& coder, std::span<const std::byte> mine, std::span<typename C::value_type> out,
                         Block block, bool accumulate, const char* where) {
  const auto frames = t.all_gather_bytes(mine);
  std::vector<frame_view> views(frames.size());
  std::uint8_t status = 0;
  double bound = 0.0;
  for (std::size_t p = 0; p < frames.size(); ++p) {
    try {
      views[p] = read_frame(frames[p]);
    } catch (const gradcomp::error& e) {
      views[p].status = static_cast<std::uint8_t>(e.code());
    }
    status = std::max(status, views[p].status);
    bound = std::max(bound, views[p].bound);
  }
  if (status != 0) fail_from_frame(status, where);
  std::vector<typename C::value_type> result(out.size());
  for (std::size_t p = 0; p < frames.size(); ++p) {
    const auto [offset, count] = block(static_cast<int>(p));
    const std::uint8_t code =
        coder.decode(views[p], std::span(result).subspan(static_cast<std::size_t>(offset), static_cast<std::size_t>(count)), accumulate);
    if (code != 0) fail(static_cast<errc>(code), std::string(where) + ": the message of rank " + std::to_string(p) + " does not decode");
  }
  std::copy(result.begin(), result.end(), out.begin());
  return bound;
}

}  // namespace detail

/// Gathers every rank's `mine` (m values, the same m on every rank) into `out` (P·m values, rank
/// p's block at p·m), compressed with `codec`. Every rank decodes every block, its own included,
/// from the same bytes. `report.error_bound` is the largest measured error of the P encodings
/// (with `measure_error`; 0 for a lossless codec).
/// @throws error `invalid_argument` when out.size() ≠ P·m (this rank only); on every rank alike,
/// the error of a rank whose block could not be encoded (`non_finite_input` for NaN or Inf under a
/// codec that does not carry them) or decoded (`size_mismatch` or `parameter_mismatch` when the
/// ranks disagree on m or on the codec's parameters). `out` is unchanged on error.
template <transport X, class C>
  requires codec_for<C, cpu_executor>
compressed_report compressed_all_gather(X& t, const C& codec, std::span<const typename C::value_type> mine,
                                        std::span<typename C::value_type> out, message_key key = {},
                                        bool measure_error = true) {
  using T = typename C::value_type;
  const auto m = static_cast<std::uint64_t>(mine.size());
  const auto ranks = static_cast<std::uint64_t>(t.size());
  detail::require(out.size() == m * ranks, errc::invalid_argument, [&] {
    return "compressed_all_gather: out holds " + std::to_string(out.size()) + " values, not P·m = " + std::to_string(m * ranks);
  });
  detail::frame_coder<C> coder(codec, m, measure_error);
  compressed_report report;
  const auto frame = coder.encode(mine, key, 0.0, report.max_error);
  report.sent_bytes = frame.size() * (ranks - 1);
  report.dense_bytes = m * sizeof(T) * (ranks - 1);
  report.error_bound = detail::gather_and_decode(
      t, coder, frame, out, [m](int p) { return std::pair{static_cast<std::uint64_t>(p) * m, m}; }, false,
      "compressed_all_gather");
  return report;
}

}  // namespace gradcomp
