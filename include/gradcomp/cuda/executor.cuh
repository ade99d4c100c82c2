#pragma once
/// @file
/// The CUDA executor: codecs given a `cuda_executor` run their CUDA kernels on its stream, over
/// device memory the caller owns (gradients, messages, workspace and states all live on the
/// stream's device).
///
/// Synchronisation. Work is queued on the stream. An operation returns once its work is queued,
/// except where the host needs a result from the device: decoders read the message's envelope and
/// the verdict of the payload check before they write the output, and error feedback, LoCo and
/// the threshold sparsifier read back whether the step may proceed (or how many values were
/// kept). Encoders whose message size the host knows (the quantizers, random-k, top-k) wait only
/// to learn whether the input held NaN or Inf; with `deferred_errors` set they do not wait at
/// all, which makes them capturable in a CUDA graph (docs/cuda.md §2).

#include <gradcomp/cuda/config.cuh>

#include <cuda/stream_ref>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <string_view>

#include <gradcomp/core/error.hpp>
#include <gradcomp/core/memory_space.hpp>
#include <gradcomp/cuda/check.cuh>

namespace gradcomp {

/// Runs codecs on a CUDA stream. Cheap to copy; the same inputs and keys give the bytes of the CPU
/// reference, except for the count sketch's cells, whose atomic sums may round differently
/// (docs/cuda.md §4).
struct cuda_executor {
  /// Backend name used in benchmark records and messages.
  static constexpr std::string_view name = "cuda";
  /// Gradients, messages, workspace and states are device memory of the stream's device.
  static constexpr memory_space memory = memory_space::device;

  /// The stream every kernel and copy of an operation is queued on (the legacy default stream
  /// unless set).
  ::cuda::stream_ref stream{};
  /// Optional device word for deferred error reporting. When set, an encoder whose message size
  /// the host knows does not wait for the device: a failure it finds there (NaN or Inf in the
  /// gradient) is recorded as the `errc` value in this word, if it still holds 0, and the message
  /// is left unsealed (its envelope stays zero, so every decoder rejects it). The word is sticky:
  /// once it holds a code, later deferred encodes leave their messages unsealed too until the
  /// caller clears it. Read it with `check_deferred_errors`.
  std::uint32_t* deferred_errors = nullptr;
  /// Optional memory pool of the stream's device for the scratch buffers of the compressed
  /// collectives (frames, sums, sketches; cuda/collective_memory.cuh). Unset, they come from the
  /// device's default pool, whose release threshold (0 unless the application raised it) returns
  /// freed memory to the system at every synchronisation; a pool of the caller's with a high
  /// `cudaMemPoolAttrReleaseThreshold` keeps it for the next step. gradcomp never changes a pool's
  /// attributes.
  cudaMemPool_t memory_pool = nullptr;

  /// The native stream.
  [[nodiscard]] cudaStream_t native_stream() const noexcept { return stream.get(); }
  /// Waits for the stream. @throws error `device_failed`.
  void synchronize() const { GRADCOMP_CUDA_CHECK(cudaStreamSynchronize(stream.get())); }
};

/// Waits for `exec`'s stream, reads its `deferred_errors` word, clears it, and throws the error it
/// recorded, if any. Does nothing when the executor has no such word.
/// @throws error the recorded `errc`, or `device_failed`.
inline void check_deferred_errors(const cuda_executor& exec) {
  if (exec.deferred_errors == nullptr) return;
  std::uint32_t code = 0;
  GRADCOMP_CUDA_CHECK(
      cudaMemcpyAsync(&code, exec.deferred_errors, sizeof code, cudaMemcpyDeviceToHost, exec.native_stream()));
  exec.synchronize();
  if (code == 0) return;
  GRADCOMP_CUDA_CHECK(cudaMemsetAsync(exec.deferred_errors, 0, sizeof code, exec.native_stream()));
  throw error(static_cast<errc>(code), "a deferred encode on the GPU failed (its message was left unsealed)");
}

}  // namespace gradcomp
