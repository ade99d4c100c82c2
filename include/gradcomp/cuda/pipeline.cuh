#pragma once
/// @file
/// A sparsifier followed by a quantizer, on the GPU, byte-identical to the CPU pipeline: the
/// sparsifier's message is written into the workspace, its envelope and count are read back
/// (the pipeline's layout depends on them), its index section is copied into the message, and the
/// quantizer encodes the kept values straight from the sparsifier's message behind it. Decoding
/// checks the index section on the device, checks the nested message's key, lets the quantizer
/// decode the k values into the workspace, and scatters them.

#include <gradcomp/cuda/config.cuh>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>

#include <gradcomp/core/backend.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/wire_envelope.hpp>
#include <gradcomp/core/workspace.hpp>
#include <gradcomp/cuda/executor.cuh>
#include <gradcomp/cuda/detail/message.cuh>
#include <gradcomp/cuda/detail/operation.cuh>
#include <gradcomp/cuda/detail/sparse_coding.cuh>
#include <gradcomp/pipeline.hpp>
#include <gradcomp/sparsify/sparse_format.hpp>

namespace gradcomp {

/// A sparsifier followed by a quantizer, on the GPU.
template <class S, class Q>
struct backend<pipeline<S, Q>, cuda_executor> {
  using T = typename S::value_type;

  struct scratch {
    detail::cuda::crc_scratch crc;                  ///< Envelope checks and the pipeline's payload CRC.
    detail::cuda::sparse_decode_scratch sparse;     ///< The index section's check and scatter.
    std::span<std::byte> sparse_message;           ///< The sparsifier's message.
    std::span<std::byte> stage;                    ///< Workspace of whichever stage runs.
    std::span<T> values;                           ///< Kept values, decoded.
  };

  static scratch carve(workspace_arena& arena, const pipeline<S, Q>& codec, const cuda_executor& e, std::uint64_t n) {
    scratch s;
    s.crc = detail::cuda::crc_scratch::carve(arena);
    s.sparse = detail::cuda::sparse_decode_scratch::carve(arena, n);
    s.sparse_message = arena.take<std::byte>(codec.sparsify_stage().max_encoded_bytes(n));
    s.stage = arena.take<std::byte>(
        std::max(codec.sparsify_stage().workspace_bytes(e, n), codec.quantize_stage().workspace_bytes(e, n)));
    s.values = arena.take<T>(static_cast<std::size_t>(n));
    return s;
  }

  static std::size_t workspace_bytes(const pipeline<S, Q>& codec, const cuda_executor& e, std::uint64_t n) {
    return detail::cuda::operation::workspace_bytes([&](workspace_arena& arena) { (void)carve(arena, codec, e, n); });
  }

  static std::size_t encode(const pipeline<S, Q>& codec, const cuda_executor& caller, std::span<const T> grad,
                            std::span<std::byte> out, std::span<std::byte> ws, message_key key) {
    // Deferred errors do not apply: the step waits for its verdict anyway, and its stages must not
    // leave a sticky word behind.
    const cuda_executor exec{.stream = caller.stream};
    workspace_arena arena(ws);
    const detail::cuda::operation op(exec, arena);
    const scratch s = carve(arena, codec, exec, grad.size());
    const std::size_t sparse_bytes = codec.sparsify_stage().encode(exec, grad, s.sparse_message, s.stage, key);
    const std::span<const std::byte> sparse_message(s.sparse_message.data(), sparse_bytes);
    std::uint64_t k = 0;
    const envelope inner = detail::cuda::fetch_envelope(exec, sparse_message, s.crc, &k);
    const sparse_indices index = check_sparse_sizes(inner, inner.payload_bytes, k, sizeof(T));
    const std::uint64_t head = index.bytes();  // count field and index section
    detail::cuda::begin_message(exec, out, static_cast<std::size_t>(envelope::size + head));
    GRADCOMP_CUDA_CHECK(cudaMemcpyAsync(out.data() + envelope::size, sparse_message.data() + envelope::size, head,
                                        cudaMemcpyDeviceToDevice, exec.native_stream()));
    const auto* const values = reinterpret_cast<const T*>(sparse_message.data() + envelope::size + head);
    const std::size_t values_bytes =
        codec.quantize_stage().encode(exec, std::span<const T>(values, static_cast<std::size_t>(k)),
                                      out.subspan(static_cast<std::size_t>(envelope::size + head)), s.stage, key);
    const std::uint64_t payload_bytes = head + values_bytes;
    const bool checksum = (inner.flags & flag_payload_checksum) != 0;
    detail::cuda::seal_message(exec, out.data(),
                               {codec_id::pipeline, dtype_of<T>, inner.layout, 0, key, grad.size(), payload_bytes,
                                codec.params_hash(), 0},
                               checksum ? s.crc : detail::cuda::crc_scratch{}, op);
    // Each stage has thrown what it found (its own status); nothing records into this one.
    return static_cast<std::size_t>(envelope::size + payload_bytes);
  }

  static void decode(const pipeline<S, Q>& codec, const cuda_executor& exec, std::span<const std::byte> message,
                     std::span<T> out, std::span<std::byte> ws, const decode_limits& limits, bool accumulate) {
    workspace_arena arena(ws);
    const detail::cuda::operation op(exec, arena);
    const scratch s = carve(arena, codec, exec, out.size());
    std::uint64_t k = 0;
    const envelope env =
        detail::cuda::read_envelope(exec, message, {codec_id::pipeline, dtype_of<T>, out.size(), codec.params_hash()},
                                    limits, s.crc, &k);
    const sparse_indices index = check_sparse_sizes(env, env.payload_bytes, k, 0);
    const std::byte* const payload = message.data() + envelope::size;
    const detail::cuda::sparse_section section{index.coding, index.elements, index.kept, payload + 8};
    detail::cuda::check_sparse_payload<T>(exec, section, nullptr, op, s.sparse);
    // The nested message must belong to the same step and tensor and hold exactly k values; its own
    // decoder checks the rest.
    const std::span<const std::byte> nested = message.subspan(static_cast<std::size_t>(envelope::size + index.bytes()));
    detail::require(detail::cuda::fetch_envelope(exec, nested, s.crc).key == env.key, errc::step_mismatch,
                    "the nested quantizer message belongs to another step or tensor");
    const std::span<T> values(s.values.data(), static_cast<std::size_t>(index.kept));
    codec.quantize_stage().decode(exec, nested, values, s.stage,
                                  {.max_elements = index.kept, .require_checksum = limits.require_checksum});
    detail::cuda::scatter_sparse<T>(exec, section, values.data(), out, accumulate, s.sparse);
  }
};

}  // namespace gradcomp
