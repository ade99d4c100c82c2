#pragma once
/// @file
/// The cost model of the all-reduce plans (docs/transports.md §9): the bytes one rank sends and
/// the sequential message rounds of each plan, as functions of the element count n, the number of
/// ranks P and the codec's encoded size B(m) of m values (`modelled_encoded_bytes`), and the time
/// on a link of latency α and bandwidth β (the α–β model: rounds · α + bytes / β). B(m) is the
/// codec's `expected_encoded_bytes(m)` where it has one, else its `max_encoded_bytes(m)`:
///
/// | codec | B(m) | |
/// |---|---|---|
/// | top-k | k(m) values in the index coding the encoder chooses for k of m | exact |
/// | random-k | k(m) values | exact |
/// | `pipeline<S, Q>` | S's count and index section for k(m) of m, then Q's message of k(m) values | exact for top-k |
/// | threshold, alone or in a pipeline | top-k's size for the target k(m) | an estimate: the data decide the count |
/// | quantizers, count sketch, zfp fixed rate | `max_encoded_bytes(m)` | exact |
/// | MPC (lossless) | `max_encoded_bytes(m)` | an upper bound |
/// | error feedback, LoCo | the inner codec's | as the inner codec's |
///
/// Every compressed message travels in a frame of `frame_overhead_bytes` more
/// (collective/compressed_frame.hpp), and an all-gathered frame counts P − 1 times, as a ring
/// all-gather forwards it over P − 1 links: these are the counts `compressed_report::sent_bytes`
/// reports, so where B is exact the report equals the model exactly. With
/// c_j = `ring_chunk_of(n, P, j).count` and F(m) = 16 + B(m):
///
/// | plan | bytes rank r sends | rounds |
/// |---|---|---|
/// | dense ring | ⌊2(P − 1) · n · sizeof(T) / P⌋ | 2(P − 1) |
/// | `gather_decode` | (P − 1) · F(n) | P − 1 |
/// | `scatter_reduce` | Σ_{j≠r} F(c_j) + (P − 1) · F(c_r) ≈ 2(P − 1)/P · B(n) | 2(P − 1) |
/// | `ring` | the same as `scatter_reduce` (a partial sum of one chunk per hop, then the all-gather) | 2(P − 1) |
/// | `summed_encodings` | ⌊2(P − 1) · S / P⌋, S the summable region's bytes | 2(P − 1) |
///
/// `gather_decode` grows with P; `scatter_reduce` tends to 2 · B(n), independent of P. The model
/// is what `all_reduce_plan::automatic` compares (collective/compressed_all_reduce.hpp).

#include <concepts>
#include <cstddef>
#include <cstdint>

#include <gradcomp/collective/ring.hpp>

namespace gradcomp {

/// A codec that states the size its message has for m values where that is determined by m and
/// its parameters (an honest estimate, documented as such, where the data decide it), unlike
/// `max_encoded_bytes`, which bounds every message.
template <class C>
concept expected_size_codec = requires(const C& c, std::uint64_t m) {
  { c.expected_encoded_bytes(m) } -> std::same_as<std::size_t>;
};

/// B(m), the encoded size the cost model uses for m values: `expected_encoded_bytes(m)` where the
/// codec has it, else `max_encoded_bytes(m)`.
template <class C>
[[nodiscard]] std::size_t modelled_encoded_bytes(const C& codec, std::uint64_t m) noexcept {
  if constexpr (expected_size_codec<C>) {
    return codec.expected_encoded_bytes(m);
  } else {
    return codec.max_encoded_bytes(m);
  }
}

/// Bytes a frame header adds to every compressed message.
inline constexpr std::uint64_t frame_overhead_bytes = 16;

/// A link in the α–β model.
struct link_model {
  double latency_seconds = 0.0;   ///< α: the time of one message round, whatever its size.
  double bytes_per_second = 1.0;  ///< β: the bandwidth one rank sends at.
};

/// What one rank of an all-reduce plan sends.
struct all_reduce_cost {
  std::uint64_t sent_bytes = 0;  ///< Bytes this rank sends (what `compressed_report::sent_bytes` counts).
  std::uint64_t rounds = 0;      ///< Sequential message rounds (each one latency α).

  /// The time on `link`: rounds · α + sent_bytes / β.
  [[nodiscard]] constexpr double seconds(const link_model& link) const noexcept {
    return static_cast<double>(rounds) * link.latency_seconds + static_cast<double>(sent_bytes) / link.bytes_per_second;
  }
};

/// Bytes one rank sends in a ring all-reduce of `bytes` bytes over `ranks` ranks: 2(P − 1)/P of
/// them (the dense baseline of a compressed all-reduce).
[[nodiscard]] constexpr std::uint64_t ring_all_reduce_dense_bytes(std::uint64_t bytes, std::uint64_t ranks) noexcept {
  return ranks == 0 ? 0 : 2 * (ranks - 1) * bytes / ranks;
}

/// The uncompressed ring all-reduce of `bytes` bytes over `ranks` ranks.
[[nodiscard]] constexpr all_reduce_cost dense_ring_cost(std::uint64_t bytes, int ranks) noexcept {
  const auto p = static_cast<std::uint64_t>(ranks);
  return {ring_all_reduce_dense_bytes(bytes, p), ranks > 1 ? 2 * (p - 1) : 0};
}

/// `summed_encodings`: a ring SUM all-reduce of the `summable_bytes` bytes of the summable region
/// (a shared-scale quantizer adds the MAX all-reduce of its block maxima, not counted here).
[[nodiscard]] constexpr all_reduce_cost summed_encodings_cost(std::uint64_t summable_bytes, int ranks) noexcept {
  return dense_ring_cost(summable_bytes, ranks);
}

/// `gather_decode` of n values whose message takes `encoded_bytes(m)` bytes for m values: every
/// rank's whole frame, all-gathered.
template <class EncodedBytes>
[[nodiscard]] constexpr all_reduce_cost gather_decode_cost(std::uint64_t n, int ranks, EncodedBytes encoded_bytes) {
  const auto others = static_cast<std::uint64_t>(ranks > 1 ? ranks - 1 : 0);
  return {others * (frame_overhead_bytes + static_cast<std::uint64_t>(encoded_bytes(n))), others};
}

/// `scatter_reduce` on rank `rank`: one frame of every other rank's chunk (the all-to-all), then
/// the frame of its own re-encoded chunk sum, all-gathered. Rank 0 holds the largest chunk and
/// sends the most.
template <class EncodedBytes>
[[nodiscard]] constexpr all_reduce_cost scatter_reduce_cost(std::uint64_t n, int ranks, int rank,
                                                            EncodedBytes encoded_bytes) {
  const auto frame = [&](int j) {
    return frame_overhead_bytes + static_cast<std::uint64_t>(encoded_bytes(ring_chunk_of(n, ranks, j).count));
  };
  all_reduce_cost cost;
  for (int j = 0; j < ranks; ++j)
    if (j != rank) cost.sent_bytes += frame(j) + frame(rank);
  cost.rounds = ranks > 1 ? 2 * static_cast<std::uint64_t>(ranks - 1) : 0;
  return cost;
}

/// The compressed `ring` on rank `rank`: P − 1 hops of one chunk's partial sum (each chunk but its
/// own once), then its own chunk all-gathered; the bytes of `scatter_reduce`.
template <class EncodedBytes>
[[nodiscard]] constexpr all_reduce_cost ring_cost(std::uint64_t n, int ranks, int rank, EncodedBytes encoded_bytes) {
  return scatter_reduce_cost(n, ranks, rank, encoded_bytes);
}

}  // namespace gradcomp
