#pragma once
/// @file
/// Compressed point-to-point messages for any codec (pipeline-parallel activations in the hybrid
/// scheme, ALGORITHMS.md §5): the sender encodes once and sends the frame
/// (collective/compressed_frame.hpp), the receiver decodes. A sender that cannot encode sends a
/// failed frame before it throws, so its receiver throws the same error instead of waiting.

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include <gradcomp/collective/compressed_frame.hpp>
#include <gradcomp/core/concepts.hpp>
#include <gradcomp/core/cpu_executor.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/transport/transport.hpp>

namespace gradcomp {

/// Sends `data` to rank `dest`, encoded with `codec`. `report.max_error` and `error_bound` are the
/// measured error of the encoding (with `measure_error`; 0 for a lossless codec).
/// @throws error the codec's encoding error (`non_finite_input`, …), after sending a failed frame.
template <transport_with_point_to_point X, class C>
  requires codec_for<C, cpu_executor>
compressed_report compressed_send(X& t, const C& codec, std::span<const typename C::value_type> data, int dest,
                                  message_key key = {}, bool measure_error = true) {
  detail::frame_coder<C> coder(codec, data.size(), measure_error);
  compressed_report report;
  const auto frame = coder.encode(data, key, 0.0, report.max_error);
  t.send_bytes(frame, dest);
  const auto status = std::to_integer<std::uint8_t>(frame[0]);
  if (status != 0) detail::fail_from_frame(status, "compressed_send");
  report.sent_bytes = frame.size();
  report.dense_bytes = data.size() * sizeof(typename C::value_type);
  report.error_bound = report.max_error;
  return report;
}

/// Receives from rank `source` a message sent by `compressed_send` with the same codec and
/// decodes it into `out`. `report.error_bound` is the sender's measured error.
/// @throws error the sender's failure, or what decoding finds (`size_mismatch` when `out` has
/// another size than the sent data, `parameter_mismatch`, …); `out` is unchanged on error.
template <transport_with_point_to_point X, class C>
  requires codec_for<C, cpu_executor>
compressed_report compressed_recv(X& t, const C& codec, std::span<typename C::value_type> out, int source) {
  const std::vector<std::byte> received = t.recv_bytes(source);
  const detail::frame_view f = detail::read_frame(received);
  if (f.status != 0) detail::fail_from_frame(f.status, "compressed_recv");
  const cpu_executor cpu;
  std::vector<std::byte> workspace(codec.workspace_bytes(cpu, out.size()));
  codec.decode(cpu, f.message, out, workspace);
  compressed_report report;
  report.error_bound = f.bound;
  return report;
}

}  // namespace gradcomp
