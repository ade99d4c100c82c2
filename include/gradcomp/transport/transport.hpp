#pragma once
/// @file
/// The `transport` concept (docs/transports.md §4): the collectives that gradcomp's compressed schemes need
/// from a communicator the user already has (MPI, NCCL, Gloo, threads). gradcomp never creates a
/// communicator; an adapter wraps one and exposes these calls. Capabilities that not every library
/// offers (a bitwise-OR reduction, point-to-point messages, an all-to-all of bytes) are separate
/// concepts that schemes query at compile time.
///
/// Every call is collective: all ranks of the communicator make the same calls in the same order
/// with the same counts. Reductions combine the contributions of ranks 0, 1, …, P−1 in that order,
/// so every rank (and every run) gets the same bits.
///
/// **Memory spaces.** A transport declares where its buffers live with a
/// `static constexpr memory_space memory` member (core/memory_space.hpp); without one it takes host
/// buffers. A device transport (`nccl_transport`, `staged_transport`) takes device spans in every
/// call above and also offers two calls on small host buffers, the control plane of the
/// collectives (the agreement record, status words): `all_gather_control` and
/// `all_reduce_max_control`. The collectives reach them through `control_all_gather` and
/// `control_all_reduce_max`, which are the ordinary calls on a host transport.
///
/// **Deadlines.** A transport that models `transport_with_deadline` holds a `deadline`
/// (transport/deadline.hpp): every blocking wait of its calls ends there with `errc::timeout`
/// instead of waiting for a peer that died or stopped calling. The compressed collectives set it for
/// the span of each call from their options' `timeout` (collective/call_deadline.hpp).

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include <gradcomp/core/memory_space.hpp>
#include <gradcomp/transport/deadline.hpp>
#include <gradcomp/transport/received_bytes.hpp>

namespace gradcomp {

/// A communicator of `size()` ranks, this one being `rank()`, with the collectives below on
/// float, double, uint8 and uint64 buffers.
///
/// - `all_reduce_sum(data)`: every rank's `data` becomes the element-wise sum over ranks.
///   Unsigned integers wrap modulo 2^bits, as the libraries' SUM does.
/// - `all_reduce_max(data)`: element-wise maximum (float and double).
/// - `reduce_sum(data, root)`: `data` of rank `root` becomes the sum; other ranks' buffers are
///   left unchanged.
/// - `reduce_scatter_sum(in, out)`: `in` holds P equal blocks of `out.size()` values; rank r's
///   `out` becomes the sum over ranks of block r.
/// - `broadcast(data, root)`: every rank's `data` becomes rank `root`'s.
/// - `all_gather_bytes(mine)`: every rank receives every rank's byte buffer (sizes may differ),
///   in rank order, as `received_buffers` (received_bytes.hpp): host transports return
///   `std::vector<std::vector<std::byte>>`, device transports a `received_bytes` view.
///
/// A device transport (`memory_space_of<X> == memory_space::device`) also has
/// `all_gather_control(mine)` → `std::vector<std::vector<std::byte>>` and
/// `all_reduce_max_control(span<double>)`, the same collectives on host buffers.
template <class X>
concept transport =
    requires(X& t, const X& ct, std::span<float> f, std::span<double> d, std::span<std::uint8_t> u8,
             std::span<std::uint64_t> u64, std::span<const float> cf, std::span<const double> cd,
             std::span<std::byte> bytes, std::span<const std::byte> cbytes, int root) {
      { ct.rank() } -> std::same_as<int>;
      { ct.size() } -> std::same_as<int>;
      t.all_reduce_sum(f);
      t.all_reduce_sum(d);
      t.all_reduce_sum(u8);
      t.all_reduce_sum(u64);
      t.all_reduce_max(f);
      t.all_reduce_max(d);
      t.reduce_sum(f, root);
      t.reduce_sum(d, root);
      t.reduce_scatter_sum(cf, f);
      t.reduce_scatter_sum(cd, d);
      t.broadcast(bytes, root);
      { t.all_gather_bytes(cbytes) } -> received_buffers;
    } &&
    (memory_space_of<X> == memory_space::host ||
     requires(X& t, std::span<const std::byte> cbytes, std::span<double> d) {
       { t.all_gather_control(cbytes) } -> std::same_as<std::vector<std::vector<std::byte>>>;
       t.all_reduce_max_control(d);
     });

/// A transport that can also reduce bytes with bitwise OR (MPI_BOR, Gloo's custom reductions),
/// which the bitmap index of lossless homomorphic compression needs. Stock NCCL cannot; schemes
/// fall back to summable index fields there.
template <class X>
concept transport_with_bitwise_or = transport<X> && requires(X& t, std::span<std::uint8_t> u8) { t.all_reduce_or(u8); };

/// A transport that can also move bytes between two ranks (MPI_Send / MPI_Recv, Gloo's pairs,
/// ncclSend / ncclRecv), which compressed point-to-point messages and the per-hop ring of the
/// hybrid scheme need. These calls involve two ranks, not the group: every `send_bytes` to `dest`
/// must be matched by one `recv_bytes` (or `sendrecv_bytes`) of `dest` naming this rank as source,
/// and messages from one source arrive in the order they were sent.
///
/// - `send_bytes(data, dest)`: sends a byte buffer to `dest`; it may block until `dest` receives
///   it (MPI without buffering does), so two ranks must not both send first to each other.
/// - `recv_bytes(source)`: waits for the next buffer from `source` and returns it (any size): a
///   `std::vector<std::byte>` on a host transport, a `std::span<const std::byte>` of the
///   transport's memory (valid until its next call, starting on an 8-byte boundary) on a device
///   transport.
/// - `sendrecv_bytes(data, dest, source)`: sends to `dest` and receives from `source` at once, so
///   a ring in which every rank sends to its successor and receives from its predecessor cannot
///   deadlock.
template <class X>
concept transport_with_point_to_point = transport<X> && requires(X& t, std::span<const std::byte> cbytes, int peer) {
  t.send_bytes(cbytes, peer);
  { t.recv_bytes(peer) } -> std::convertible_to<std::span<const std::byte>>;
  { t.sendrecv_bytes(cbytes, peer, peer) } -> std::convertible_to<std::span<const std::byte>>;
};

/// A transport that can also exchange a byte buffer between every pair of ranks at once
/// (MPI_Alltoallv, gloo::alltoallv, grouped ncclSend / ncclRecv), which the `all_to_all` plan of
/// the compressed reduce-scatter uses to send each rank its chunk's frame in one call. Collective:
/// every rank calls it, each with P buffers.
///
/// - `all_to_all_bytes(to_each)`: `to_each` holds P buffers, buffer j for rank j (sizes may differ
///   between buffers and ranks, empty ones included; buffer rank() comes back to this rank). Returns
///   P buffers (`received_buffers`), buffer i the one rank i sent to this rank.
template <class X>
concept transport_with_all_to_all =
    transport<X> && requires(X& t, std::span<const std::span<const std::byte>> to_each) {
      { t.all_to_all_bytes(to_each) } -> received_buffers;
    };

/// A transport whose blocking waits end at a deadline: `set_deadline(d)` bounds every wait of its
/// later calls by `d` (a default-constructed `deadline`, the initial one, bounds none);
/// `current_deadline()` returns it. A wait that reaches it throws `errc::timeout`, naming the call
/// and, where the library can know it, the ranks that did not arrive. What the transport can still
/// do afterwards depends on its library (docs/transports.md §8): the in-process group and MPI's
/// communicator cannot complete the abandoned call and refuse further calls, Gloo closes the
/// context's connections, NCCL's communicator is aborted.
template <class X>
concept transport_with_deadline = transport<X> && requires(X& t, const X& ct, const deadline& d) {
  t.set_deadline(d);
  { ct.current_deadline() } -> std::same_as<deadline>;
};

/// Whether transport X takes device buffers.
template <class X>
inline constexpr bool device_transport = memory_space_of<X> == memory_space::device;

/// Every rank's small host buffer `mine`, in rank order (the control plane: the agreement record):
/// `all_gather_control` on a device transport, `all_gather_bytes` on a host one.
template <transport X>
[[nodiscard]] auto control_all_gather(X& t, std::span<const std::byte> mine) {
  if constexpr (device_transport<X>) return t.all_gather_control(mine);
  else
    return t.all_gather_bytes(mine);
}

/// Element-wise maximum over ranks of a few host doubles, in place (the control plane: status
/// words, error bounds): `all_reduce_max_control` on a device transport, `all_reduce_max` on a host
/// one.
template <transport X>
void control_all_reduce_max(X& t, std::span<double> words) {
  if constexpr (device_transport<X>) t.all_reduce_max_control(words);
  else
    t.all_reduce_max(words);
}

}  // namespace gradcomp
