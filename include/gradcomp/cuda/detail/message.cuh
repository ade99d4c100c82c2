#pragma once
/// @file
/// Messages in device memory: the checks an encoder makes before it writes (room, alignment, a
/// zeroed envelope), the seal it writes last (on the device, with the payload CRC when asked),
/// and a decoder's first steps (the envelope copied to the host and checked there, the payload CRC
/// checked on the device).
///
/// Device messages start on an 8-byte boundary: every field of the wire format is then naturally
/// aligned for the kernels (the envelope is 56 bytes, and each layout pads its sections to 8).

#include <gradcomp/cuda/config.cuh>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include <gradcomp/core/error.hpp>
#include <gradcomp/core/wire_envelope.hpp>
#include <gradcomp/core/workspace.hpp>
#include <gradcomp/cuda/detail/crc32c.cuh>
#include <gradcomp/cuda/executor.cuh>
#include <gradcomp/cuda/detail/operation.cuh>

namespace gradcomp::detail::cuda {

/// Alignment the CUDA backend requires of device messages.
inline constexpr std::size_t message_alignment = 8;

/// Checks that a device message buffer starts on an 8-byte boundary. @throws error `invalid_argument`.
inline void require_message_alignment(const void* p) {
  detail::require(reinterpret_cast<std::uintptr_t>(p) % message_alignment == 0, errc::invalid_argument,
                  "device messages must start on an 8-byte boundary");
}

/// Checks `out` (room for `size` bytes, alignment) and zeroes its envelope on the stream, so that
/// until the seal is written no earlier message in `out` can pass for this one.
/// @throws error `buffer_too_small`, `invalid_argument`, `device_failed`.
inline void begin_message(const cuda_executor& exec, std::span<std::byte> out, std::size_t size) {
  detail::require(out.size() >= size, errc::buffer_too_small, [&] {
    return "output of " + std::to_string(out.size()) + " bytes cannot hold the " + std::to_string(size) +
           "-byte message";
  });
  require_message_alignment(out.data());
  GRADCOMP_CUDA_CHECK(cudaMemsetAsync(out.data(), 0, envelope::size, exec.native_stream()));
}

/// Writes the envelope `e` at `out` unless a failure was recorded (then, with deferred errors,
/// passes its code on to the caller's word); with `payload_crc`, flags and carries that CRC.
template <class = void>
__global__ void seal_kernel(std::byte* out, envelope e, const std::uint32_t* payload_crc, const device_status* status,
                            std::uint32_t* deferred) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  if (status->code != 0) {
    if (deferred != nullptr) atomicCAS(deferred, 0u, status->code);
    return;
  }
  if (deferred != nullptr && *static_cast<volatile std::uint32_t*>(deferred) != 0) return;  // sticky
  if (payload_crc != nullptr) {
    e.flags = static_cast<std::uint16_t>(e.flags | flag_payload_checksum);
    e.payload_crc = *payload_crc;
  }
  detail::serialize_envelope(e, out);
}

/// The CRC scratch of an encoder: carved when its codec asks for payload checksums, else empty.
[[nodiscard]] inline crc_scratch carve_seal(workspace_arena& arena, bool checksum) {
  return checksum ? crc_scratch::carve(arena) : crc_scratch{};
}

/// Queues the seal of the message at `out` whose payload (`e.payload_bytes` bytes) is queued
/// before it: the payload CRC when `crc` has scratch (see `carve_seal`), then the envelope.
/// @throws error `device_failed`.
inline void seal_message(const cuda_executor& exec, std::byte* out, envelope e, const crc_scratch& crc_space,
                         const operation& op) {
  const std::uint32_t* crc = nullptr;
  if (!crc_space.result.empty()) {
    crc32c_device(exec, out + envelope::size, e.payload_bytes, crc_space);
    crc = crc_space.result.data();
  }
  e.flags = 0;
  e.payload_crc = 0;
  launch(exec, 1, 32, seal_kernel<>, out, e, crc, static_cast<const device_status*>(op.status()), exec.deferred_errors);
}

/// Reads the envelope of the device message `message` to the host (waiting for the stream) and
/// checks it as `parse_envelope` does, the payload CRC included (computed on the device in
/// `crc_space`, which every decoder carves from its workspace). With `first_payload_word`, also
/// reads the payload's first 8 bytes into it (0 when the payload is shorter), in the same copy:
/// the count field of the sparse layouts.
/// @throws error as `parse_envelope`; `invalid_argument` for a message not on an 8-byte
///         boundary; `device_failed`.
inline envelope fetch_envelope(const cuda_executor& exec, std::span<const std::byte> message,
                               const crc_scratch& crc_space, std::uint64_t* first_payload_word = nullptr) {
  require_message_alignment(message.data());
  std::byte head[envelope::size + 8] = {};
  const std::size_t have = std::min(message.size(), envelope::size);
  if (have == envelope::size) {
    const std::size_t copied = std::min(message.size(), first_payload_word != nullptr ? sizeof head : envelope::size);
    GRADCOMP_CUDA_CHECK(cudaMemcpyAsync(head, message.data(), copied, cudaMemcpyDeviceToHost, exec.native_stream()));
    exec.synchronize();
  }
  if (first_payload_word != nullptr) *first_payload_word = detail::load_le<std::uint64_t>(head + envelope::size);
  const envelope e = parse_envelope_header(std::span<const std::byte>(head, have), message.size());
  if ((e.flags & flag_payload_checksum) != 0) {
    crc32c_device(exec, message.data() + envelope::size, e.payload_bytes, crc_space);
    std::uint32_t crc = 0;
    GRADCOMP_CUDA_CHECK(
        cudaMemcpyAsync(&crc, crc_space.result.data(), sizeof crc, cudaMemcpyDeviceToHost, exec.native_stream()));
    exec.synchronize();
    detail::require(crc == e.payload_crc, errc::payload_checksum, "payload CRC-32C does not match");
  }
  return e;
}

/// `fetch_envelope`, then the envelope checked against `want` and `limits`: the CPU decoders'
/// checks in their order. @throws error as `parse_envelope` and `validate_envelope`.
inline envelope read_envelope(const cuda_executor& exec, std::span<const std::byte> message,
                              const envelope_expectation& want, const decode_limits& limits,
                              const crc_scratch& crc_space, std::uint64_t* first_payload_word = nullptr) {
  const envelope e = fetch_envelope(exec, message, crc_space, first_payload_word);
  validate_envelope(e, want, limits);
  return e;
}

/// Workspace bytes of an operation that needs only its status and the CRC scratch (the decoders
/// of the fixed layouts, and the encoders that checksum their payload).
inline std::size_t status_and_crc_bytes() {
  return operation::workspace_bytes([](workspace_arena& arena) { (void)crc_scratch::carve(arena); });
}

/// The status and CRC scratch (`status_and_crc_bytes`) of a call that has no workspace argument
/// (`block_maxima`, `accumulate_encoded`), from the stream's pool; its operation's status cleared.
struct pooled_status_and_crc {
  /// @throws error `device_failed`.
  explicit pooled_status_and_crc(const cuda_executor& exec)
      : memory(exec, status_and_crc_bytes()), arena(memory.span()), op(exec, arena), crc(crc_scratch::carve(arena)) {}
  pooled_status_and_crc(const pooled_status_and_crc&) = delete;
  pooled_status_and_crc& operator=(const pooled_status_and_crc&) = delete;

  stream_scratch memory;
  workspace_arena arena;
  operation op;
  crc_scratch crc;
};

}  // namespace gradcomp::detail::cuda
