#pragma once
/// @file
/// The all-to-all of chunk messages that the `all_to_all` plan of `compressed_reduce_scatter` and
/// the first half of the `scatter_reduce` plan of `compressed_all_reduce` share: every rank encodes
/// each chunk (`ring_chunk_of(n, P, j)`) once and sends chunk j to rank j, in one
/// `all_to_all_bytes` where the transport has it (`transport_with_all_to_all`), else in P − 1
/// shifted `sendrecv_bytes`; rank r decodes the P frames of its chunk (its own included) in rank
/// order onto zeros (bf16 and fp16 values onto float32 zeros, rounded once at the end).

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include <gradcomp/collective/agreement.hpp>
#include <gradcomp/collective/collective_memory.hpp>
#include <gradcomp/collective/compressed_frame.hpp>
#include <gradcomp/collective/ring.hpp>
#include <gradcomp/core/concepts.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/transport/transport.hpp>

namespace gradcomp::detail {

/// Whether the `all_to_all` plan runs over transport `X`: with its all-to-all, or with point-to-point messages.
template <class X>
inline constexpr bool can_all_to_all = transport_with_all_to_all<X> || transport_with_point_to_point<X>;

/// Reads frame `bytes` and decodes it onto `sum` (of the codec's value type or, for a 16-bit
/// codec, float32); returns 0 or the code that stopped it.
template <class C, executor E, class O>
[[nodiscard]] std::uint8_t accumulate_frame(frame_coder<C, E>& coder, std::span<const std::byte> bytes,
                                            std::span<O> sum, double& bound) {
  frame_view f;
  try {
    f = coder.read(bytes);
  } catch (const gradcomp::error& e) {
    return static_cast<std::uint8_t>(e.code());
  }
  if (f.status != 0) return f.status;
  bound += f.bound;
  return coder.decode(f, sum, true);
}

/// The `all_to_all` plan: `encode_chunk(j)` returns the frame of chunk j (valid until the next
/// call). With `transport_with_all_to_all`, every frame is encoded (and copied) first and one
/// `all_to_all_bytes` delivers them; otherwise P − 1 shifted `sendrecv_bytes`, each received frame
/// kept until the P are there. Writes this rank's chunk sum into `out` unless some rank failed,
/// which every rank throws. 16-bit values are summed in float32 and rounded once into `out`,
/// divided by P first with `average` (`narrow_sums`; a sum beyond the type's range is
/// `narrowing_overflow` on every rank); other types are averaged by the caller.
template <transport X, class C, executor E, class EncodeChunk>
  requires can_all_to_all<X>
compressed_report all_to_all_reduce_scatter(X& t, frame_coder<C, E>& coder, std::uint64_t n,
                                            std::span<typename C::value_type> out, bool average,
                                            EncodeChunk encode_chunk) {
  using T = typename C::value_type;
  using S = compute_type<T>;
  using memory = collective_memory<E>;
  const E& e = coder.executor();
  const int ranks = t.size(), rank = t.rank();
  compressed_report report;
  // all_to_all_bytes: the frames to send, by destination; sendrecv_bytes: the frames received, by source.
  std::vector<collective_buffer<E, std::byte>> frames(static_cast<std::size_t>(ranks));
  const auto keep = [&](int p, std::span<const std::byte> frame) {
    auto& kept = frames[static_cast<std::size_t>(p)];
    kept.resize(e, frame.size());
    memory::copy(e, frame, kept.span());
  };
  for (int k = 0; k < ranks; ++k) {
    const int dest = (rank + k) % ranks, source = (rank - k + ranks) % ranks;
    const std::span<const std::byte> frame = encode_chunk(dest);
    if constexpr (transport_with_all_to_all<X>) {
      keep(dest, frame);
    } else if (k == 0) {
      keep(rank, frame);
    } else {
      const auto received = t.sendrecv_bytes(frame, dest, source);
      keep(source, std::span<const std::byte>(received));
    }
    if (k == 0) continue;
    report.sent_bytes += frame.size();
    report.dense_bytes += ring_chunk_of(n, ranks, dest).count * sizeof(T);
  }
  collective_buffer<E, S> sum(e, out.size());
  memory::fill(e, sum.span(), S{0});
  std::uint8_t status = 0;
  double bound = 0.0;
  const auto accumulate = [&](const auto& received) {
    for (std::size_t p = 0; p < static_cast<std::size_t>(ranks) && status == 0; ++p)
      status = accumulate_frame(coder, std::span<const std::byte>(received[p]), sum.span(), bound);
  };
  if constexpr (transport_with_all_to_all<X>) {
    std::vector<std::span<const std::byte>> to_each;
    to_each.reserve(frames.size());
    for (const auto& f : frames) to_each.push_back(f.span());
    accumulate(t.all_to_all_bytes(std::span<const std::span<const std::byte>>(to_each)));
  } else {
    std::vector<std::span<const std::byte>> received;
    received.reserve(frames.size());
    for (const auto& f : frames) received.push_back(f.span());
    accumulate(received);
  }
  report.error_bound = bound;
  if constexpr (half_precision<T>) {
    // Rounded into a copy first: a chunk sum beyond the type's range fails on every rank alike.
    collective_buffer<E, T> narrowed(e, out.size());
    if (status == 0) status = narrowing_status(sum.span(), ranks, average, narrowed.span());
    agree_on_status(t, static_cast<errc>(status), "compressed_reduce_scatter");
    memory::copy(e, std::span<const T>(narrowed.span()), out);
  } else {
    agree_on_status(t, static_cast<errc>(status), "compressed_reduce_scatter");
    memory::copy(e, std::span<const T>(sum.span()), out);
  }
  return report;
}

}  // namespace gradcomp::detail
