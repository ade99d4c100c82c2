#pragma once
/// @file
/// Compressed point-to-point messages for any codec (pipeline-parallel activations in the hybrid
/// scheme, docs/transports.md §5): the sender encodes once and sends the frame
/// (collective/compressed_frame.hpp), the receiver decodes. A sender that cannot encode sends a
/// failed frame before it throws, so its receiver throws the same error instead of waiting. Runs
/// on any executor whose memory space is the transport's. Both calls have a deadline,
/// `options.timeout` from their start (collective/call_deadline.hpp): a receive from a rank that
/// never sends, or a send that its receiver never takes, throws `timeout`.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include <gradcomp/collective/call_deadline.hpp>
#include <gradcomp/collective/collective_memory.hpp>
#include <gradcomp/collective/compressed_frame.hpp>
#include <gradcomp/collective/executor_transport.hpp>
#include <gradcomp/core/concepts.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/transport/transport.hpp>

namespace gradcomp {

/// Options of `compressed_send` and `compressed_recv` (which reads only `timeout`: the key and the
/// measured error travel in the message).
struct point_to_point_options {
  message_key key{};          ///< Step and tensor: keys the codec.
  bool measure_error = true;  ///< Measure the lossy encoding's error (`report.max_error`, `report.error_bound`).
  /// How long the call may wait for its peer, from its start (`infinite_timeout`: as long as the
  /// transport's library does); past it the call throws `timeout`.
  std::chrono::milliseconds timeout = default_collective_timeout;
};

/// Sends `data` to rank `dest`, encoded with `codec` on executor `e`. `report.max_error` and
/// `error_bound` are the measured error of the encoding (with `measure_error`; 0 for a lossless
/// codec).
/// @throws error the codec's encoding error (`non_finite_input`, …), after sending a failed frame;
/// `timeout` when the transport's send waits past the deadline (MPI may wait for the receive);
/// `transport_failed`.
template <executor E, transport_with_point_to_point X, class C>
  requires codec_for<C, E>
compressed_report compressed_send(const E& e, X& t, const C& codec, std::span<const typename C::value_type> data,
                                  int dest, point_to_point_options options = {}) {
  return detail::within_deadline(t, options.timeout, "compressed_send", options.key, [&] {
    detail::require_executor_transport<E, X>(e, t);
    detail::frame_coder<C, E> coder(e, codec, data.size(), options.measure_error);
    compressed_report report;
    const auto frame = coder.encode(data, options.key, 0.0, report.max_error);
    t.send_bytes(frame, dest);
    if (coder.last_status() != 0) detail::fail_from_frame(coder.last_status(), "compressed_send");
    report.sent_bytes = frame.size();
    report.dense_bytes = data.size() * sizeof(typename C::value_type);
    report.error_bound = report.max_error;
    return report;
  });
}

/// Receives from rank `source` a message sent by `compressed_send` with the same codec and
/// decodes it into `out` on executor `e`, waiting at most `options.timeout` (the only option it
/// reads). `report.error_bound` is the sender's measured error.
/// @throws error the sender's failure, or what decoding finds (`size_mismatch` when `out` has
/// another size than the sent data, `parameter_mismatch`, …); `timeout` when nothing arrives by
/// the deadline; `transport_failed`. `out` is unchanged on error.
template <executor E, transport_with_point_to_point X, class C>
  requires codec_for<C, E>
compressed_report compressed_recv(const E& e, X& t, const C& codec, std::span<typename C::value_type> out, int source,
                                  point_to_point_options options = {}) {
  const std::string where = "compressed_recv from rank " + std::to_string(source);
  return detail::within_deadline(t, options.timeout, where.c_str(), std::nullopt, [&] {
    detail::require_executor_transport<E, X>(e, t);
    const auto received = t.recv_bytes(source);
    const detail::frame_view f = detail::read_frame(e, std::span<const std::byte>(received));
    if (f.status != 0) detail::fail_from_frame(f.status, "compressed_recv");
    collective_buffer<E, std::byte> workspace(e, codec.workspace_bytes(e, out.size()));
    codec.decode(e, f.message, out, workspace.span());
    compressed_report report;
    report.error_bound = f.bound;
    return report;
  });
}

}  // namespace gradcomp
