#pragma once
/// @file
/// The `scatter_reduce` plan of `compressed_all_reduce` (docs/transports.md §9), DeepSpeed's 1-bit
/// Adam and ZeRO++ qgZ scheme, and LoCo's: the n values are cut into P chunks (`ring_chunk_of`:
/// the first n mod P chunks hold ⌈n/P⌉ values, the others ⌊n/P⌋, so any n and P work, n < P and
/// n = 0 included, with no padding sent); then
///
/// 1. the all-to-all of chunk messages (collective/all_to_all_chunks.hpp, the `all_to_all` plan of
///    the reduce-scatter): rank r ends with the sum of chunk r, decoded in rank order onto zeros;
/// 2. rank r re-encodes its chunk sum once, with the server state of its chunk where the call has
///    one (error feedback around the codec, or the stateful wrapper itself: what this encoding
///    drops is carried into the next step's chunk sum), else plainly;
/// 3. the re-encoded chunks are all-gathered and every rank, the owner included, decodes all P of
///    them from the same bytes, so every rank ends with the same bits.
///
/// Each rank sends Σ_{j≠r} F(c_j) + (P − 1) F(c_r) bytes (collective/all_reduce_cost.hpp): about
/// 2(P − 1)/P of one message of n values, independent of P.
///
/// bf16 and fp16 values (host executors): the owner sums its chunk in float32 and rounds the sum
/// once to the 16-bit type, which it re-encodes (the server state then carries what that encoding
/// drops from the rounded sum); every rank decodes the re-encoded chunks into float32, divides by
/// P there with `average`, and rounds once (docs/half-precision.md §3). A chunk sum beyond fp16's
/// range is `narrowing_overflow` on every rank.

#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include <gradcomp/collective/all_reduce_cost.hpp>
#include <gradcomp/collective/all_to_all_chunks.hpp>
#include <gradcomp/collective/collective_memory.hpp>
#include <gradcomp/collective/compressed_all_gather.hpp>
#include <gradcomp/collective/compressed_frame.hpp>
#include <gradcomp/collective/ring.hpp>
#include <gradcomp/core/concepts.hpp>
#include <gradcomp/feedback/error_feedback.hpp>
#include <gradcomp/transport/transport.hpp>

namespace gradcomp {

namespace detail {

/// No server codec for a type that is not a codec (e.g. `lossless_homomorphic`, which has its own
/// plan): `server_codec_t` then fails in substitution, so the overloads of `compressed_all_reduce`
/// that take a server state drop out of overload resolution instead of instantiating
/// `error_feedback` around it.
template <class C, class E>
struct server_codec {};
template <class C, class E>
  requires codec<C> && (!stateful<C, E>)
struct server_codec<C, E> {
  using type = error_feedback<C>;
};
template <class C, class E>
  requires codec<C> && stateful<C, E>
struct server_codec<C, E> {
  using type = C;
};

}  // namespace detail

/// What re-encodes a chunk sum with a server state in the `scatter_reduce` plan on executor E: a
/// stateful wrapper itself (error feedback, LoCo: the server keeps the same kind of state as the
/// workers), else error feedback around the codec.
template <class C, class E>
using server_codec_t = typename detail::server_codec<C, E>::type;

/// The server state of one rank in the `scatter_reduce` plan: a state of `server_codec_t<C, E>`
/// for that rank's chunk. It is that wrapper's own state, saved and loaded by its `save_state` and
/// `load_state` (error feedback: the "GCEF" format of feedback/error_feedback.hpp, of the chunk's
/// element count).
template <class C, class E>
using server_state_t = state_type_of<server_codec_t<C, E>, E>;

/// The wrapper that re-encodes the chunk sums of `codec` with a server state.
template <class C, executor E>
[[nodiscard]] server_codec_t<C, E> server_codec_of(const E&, const C& codec) {
  return server_codec_t<C, E>(codec);
}

/// A fresh server state for rank `rank` of `ranks` in the `scatter_reduce` plan of n values: a
/// state of `server_codec_of(e, codec)` for `ring_chunk_of(n, ranks, rank).count` values.
template <class C, executor E>
[[nodiscard]] server_state_t<C, E> make_server_state(const E& e, const C& codec, std::uint64_t n, int ranks, int rank) {
  return server_codec_of(e, codec).make_state(e, ring_chunk_of(n, ranks, rank).count);
}

/// The P worker states of a stateful wrapper in the `scatter_reduce` plan of n values: state j for
/// chunk j (`ring_chunk_of(n, ranks, j).count` values), as `compressed_reduce_scatter` takes them.
template <class C, executor E>
  requires stateful<C, E>
[[nodiscard]] std::vector<state_type_of<C, E>> make_chunk_states(const E& e, const C& codec, std::uint64_t n,
                                                                 int ranks) {
  std::vector<state_type_of<C, E>> states;
  states.reserve(static_cast<std::size_t>(ranks));
  for (int j = 0; j < ranks; ++j) states.push_back(codec.make_state(e, ring_chunk_of(n, ranks, j).count));
  return states;
}

namespace detail {

/// The `scatter_reduce` plan on `data` (n values, in E's memory): `encode_chunk(j)` returns the
/// frame of chunk j (as in `all_to_all_reduce_scatter`), `encode_sum(sum, bound)` the frame of this
/// rank's chunk sum re-encoded (`bound`: the error bound the sum carries). `coder` decodes both
/// (a server wrapper's messages are its inner codec's). Writes the result into `data` only when
/// every rank's every step succeeded; otherwise every rank throws the same error. `average`
/// divides 16-bit results by P before they are rounded (this file's comment); other types are
/// averaged by the caller.
template <transport X, class C, executor E, class EncodeChunk, class EncodeSum>
  requires can_all_to_all<X>
compressed_report scatter_reduce_all_reduce(X& t, frame_coder<C, E>& coder, std::span<typename C::value_type> data,
                                            bool average, EncodeChunk encode_chunk, EncodeSum encode_sum) {
  using T = typename C::value_type;
  const auto n = static_cast<std::uint64_t>(data.size());
  const int ranks = t.size();
  collective_buffer<E, T> sum(coder.executor(), static_cast<std::size_t>(ring_chunk_of(n, ranks, t.rank()).count));
  compressed_report report = all_to_all_reduce_scatter(t, coder, n, sum.span(), false, encode_chunk);
  const std::span<const std::byte> frame = encode_sum(std::span<const T>(sum.span()), report.error_bound);
  report.sent_bytes += frame.size() * static_cast<std::uint64_t>(ranks - 1);
  report.dense_bytes = ring_all_reduce_dense_bytes(n * sizeof(T), static_cast<std::uint64_t>(ranks));
  report.error_bound = gather_and_decode(
      t, coder, frame, data,
      [n, ranks](int p) {
        const ring_chunk c = ring_chunk_of(n, ranks, p);
        return std::pair{c.offset, c.count};
      },
      false, "compressed_all_reduce", average);
  return report;
}

}  // namespace detail
}  // namespace gradcomp
