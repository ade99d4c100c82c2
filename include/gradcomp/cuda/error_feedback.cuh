#pragma once
/// @file
/// Error feedback on the GPU, with the CPU reference's bytes and residuals.
///
/// State: the residual e in device memory, and a second buffer of the same size that a step writes
/// its new residual into; the two are exchanged once the step has succeeded, so a step that fails
/// (NaN or Inf in g + e) leaves e as it was without a pass that checks g first. The state thus
/// takes 2·n values of device memory (docs/cuda.md §3).
///
/// Around the uniform quantizer whose blocks fill whole code words, one kernel does the step: a
/// warp per block forms h = g + e, finds its largest magnitude, writes the scale and the codes,
/// and writes fl(β·(h − code·s)) as the new residual (one read of g and e, one write of the codes and of
/// the new residual; for 8- and 4-bit codes and blocks of at most 256 values the block stays in
/// registers and moves by 128-bit accesses, cuda/uniform.cuh). Around any other codec with a CUDA backend: h = g + e into the workspace
/// (checked on the host), the inner codec's encode and decode, and the new residual
/// fl(β·(h − decoded)). Both compute it with `decayed_residual` (feedback/error_feedback.hpp), as
/// the CPU does: the product is rounded on its own (`__fmul_rn`), so the residuals stay the CPU's.

#include <gradcomp/cuda/config.cuh>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <utility>

#include <gradcomp/core/backend.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/float_bits.hpp>
#include <gradcomp/core/wire_envelope.hpp>
#include <gradcomp/core/workspace.hpp>
#include <gradcomp/cuda/block_codes.cuh>
#include <gradcomp/cuda/device_array.cuh>
#include <gradcomp/cuda/executor.cuh>
#include <gradcomp/cuda/finite_check.cuh>
#include <gradcomp/cuda/grid.cuh>
#include <gradcomp/cuda/message.cuh>
#include <gradcomp/cuda/operation.cuh>
#include <gradcomp/cuda/uniform.cuh>
#include <gradcomp/feedback/error_feedback.hpp>

namespace gradcomp {

/// State of error feedback for one tensor on the GPU.
template <gradient_value T>
struct cuda_error_feedback_state {
  device_array<T> residual;  ///< What the codec has not sent yet, one value per element.
  device_array<T> next;  ///< Where a step writes the new residual; exchanged with `residual` when it succeeds.
  std::uint64_t steps = 0;  ///< Steps completed.
};

namespace cuda_detail {

/// h = g + e, recording the first element where it is NaN or Inf.
template <class T>
struct ef_compensate {
  const T* g;
  const T* e;
  T* h;
  device_status* status;

  __device__ void operator()(std::uint64_t i) const {
    h[i] = g[i] + e[i];
    if (!is_finite(h[i])) record_failure(status, errc::non_finite_input, i);
  }
};

/// next = fl(β·(h − decoded)) (h − decoded when β = 1).
template <class T>
struct ef_residual {
  const T* h;
  const T* decoded;
  T* next;
  T beta;

  __device__ void operator()(std::uint64_t i) const { next[i] = decayed_residual(beta, h[i], decoded[i]); }
};

/// The values error feedback codes: h = g + e; the new residual fl(β·(h − decoded)) is written to
/// `next` as each value is coded (the uniform encoder's one-warp-per-block kernel, cuda/uniform.cuh).
template <class T>
struct compensated_values {
  const T* g;
  const T* e;
  T* next;
  T beta;

  __device__ T operator()(std::uint64_t i) const { return g[i] + e[i]; }
  __device__ void coded(std::uint64_t i, T h, T decoded) const { next[i] = decayed_residual(beta, h, decoded); }

  /// Whether the quad kernel may use 128-bit loads and stores.
  [[nodiscard]] bool aligned() const { return vector_aligned(g) && vector_aligned(e) && vector_aligned(next); }
  /// Reads h = g + e of the calling lane's quads of the block from element `begin`.
  __device__ void load(std::uint64_t begin, bool vector, lane_quads<T>& h) const {
    T residual[quad_rows][quad_values];
#pragma unroll
    for (unsigned r = 0; r < quad_rows; ++r) {
      const std::uint64_t first = begin + quad_offset(r, lane_id());
      load_quad(g + first, h.count[r], vector, h.x[r]);
      load_quad(e + first, h.count[r], vector, residual[r]);
#pragma unroll
      for (unsigned k = 0; k < quad_values; ++k) h.x[r][k] = h.x[r][k] + residual[r][k];
    }
  }
  /// Writes fl(β·(h − decoded)) of a coded quad as its new residual.
  __device__ void coded_quad(std::uint64_t first, unsigned count, bool vector, const T (&h)[quad_values],
                             const T (&decoded)[quad_values]) const {
    T residual[quad_values];
#pragma unroll
    for (unsigned k = 0; k < quad_values; ++k) residual[k] = decayed_residual(beta, h[k], decoded[k]);
    store_quad(next + first, count, vector, residual);
  }
};

}  // namespace cuda_detail

/// Error feedback on the GPU.
template <class Codec>
struct backend<error_feedback<Codec>, cuda_executor> {
  using T = typename Codec::value_type;
  using ef_type = error_feedback<Codec>;
  using state_type = cuda_error_feedback_state<T>;

  struct scratch {
    std::span<T> compensated;  ///< h = g + e (the general path).
    std::span<T> decoded;  ///< The inner codec's decoding of its message (the general path).
    std::span<std::byte> inner;  ///< The inner codec's workspace (the general path).
    cuda_detail::crc_scratch crc;  ///< The payload CRC (the one-kernel path, with checksums).
  };

  static std::size_t workspace_bytes(const ef_type& ef, const cuda_executor& e, std::uint64_t n) {
    return cuda_detail::operation::workspace_bytes([&](workspace_arena& arena) { (void)carve(arena, ef, e, n); });
  }

  static state_type make_state(const ef_type&, const cuda_executor& exec, std::uint64_t n) {
    return state_type{device_array<T>(static_cast<std::size_t>(n), exec),
                      device_array<T>(static_cast<std::size_t>(n), exec), 0};
  }

  static std::size_t encode(const ef_type& ef, const cuda_executor& caller, std::span<const T> grad, state_type& state,
                            std::span<std::byte> out, std::span<std::byte> ws, message_key key) {
    // Deferred errors do not apply: the step waits for its verdict anyway, and its stages must not
    // leave a sticky word behind.
    const cuda_executor exec{.stream = caller.stream};
    const std::uint64_t n = grad.size();
    check_size(state, n, "gradient");
    workspace_arena arena(ws);
    const cuda_detail::operation op(exec, arena);
    const scratch s = carve(arena, ef, exec, n);
    std::size_t bytes = 0;
    if constexpr (fusable) {
      if (one_kernel(ef.inner())) bytes = encode_fused(ef, exec, grad, state, out, s, op, key);
      else
        bytes = encode_general(ef, exec, grad, state, out, s, op, key);
    } else {
      bytes = encode_general(ef, exec, grad, state, out, s, op, key);
    }
    std::swap(state.residual, state.next);
    ++state.steps;
    return bytes;
  }

  static std::size_t save_state(const ef_type& ef, const cuda_executor& exec, const state_type& state,
                                std::span<std::byte> bytes) {
    return ef.write_saved_state(state.residual.size(), state.steps, bytes, [&](std::byte* at) {
      GRADCOMP_CUDA_CHECK(cudaMemcpyAsync(at, state.residual.data(), state.residual.size() * sizeof(T),
                                          cudaMemcpyDeviceToHost, exec.native_stream()));
      exec.synchronize();
    });
  }

  static void load_state(const ef_type& ef, const cuda_executor& exec, std::span<const std::byte> bytes,
                         state_type& state) {
    const auto saved = ef.check_saved_state(bytes, state.residual.size());
    GRADCOMP_CUDA_CHECK(cudaMemcpyAsync(state.residual.data(), saved.residual.data(), saved.residual.size(),
                                        cudaMemcpyHostToDevice, exec.native_stream()));
    exec.synchronize();
    state.steps = saved.steps;
  }

  static void carried_error(const ef_type&, const cuda_executor& exec, const state_type& state, std::span<T> out) {
    check_size(state, out.size(), "output");
    GRADCOMP_CUDA_CHECK(cudaMemcpyAsync(out.data(), state.residual.data(), out.size() * sizeof(T),
                                        cudaMemcpyDeviceToDevice, exec.native_stream()));
  }

  /// Checks `error` on the device, then copies it.
  static void set_carried_error(const ef_type&, const cuda_executor& exec, std::span<const T> error,
                                state_type& state) {
    check_size(state, error.size(), "error");
    cuda_detail::require_finite(exec, error, "the new carried error");
    GRADCOMP_CUDA_CHECK(cudaMemcpyAsync(state.residual.data(), error.data(), error.size() * sizeof(T),
                                        cudaMemcpyDeviceToDevice, exec.native_stream()));
  }

 private:
  /// Whether a one-kernel path exists: error feedback around the uniform quantizer.
  static constexpr bool fusable = std::is_same_v<Codec, uniform_quantizer<T>>;

  /// Whether this uniform quantizer's blocks fill whole code words (the one-kernel path).
  static bool one_kernel(const Codec& inner) {
    return backend<uniform_quantizer<T>, cuda_executor>::layout_of(inner, 0).whole_words();
  }

  static scratch carve(workspace_arena& arena, const ef_type& ef, const cuda_executor& e, std::uint64_t n) {
    scratch s;
    if constexpr (fusable) {
      if (one_kernel(ef.inner())) {
        s.crc = cuda_detail::carve_seal(arena, ef.inner().wire().payload_checksum);
        return s;
      }
    }
    s.compensated = arena.take<T>(static_cast<std::size_t>(n));
    s.decoded = arena.take<T>(static_cast<std::size_t>(n));
    s.inner = arena.take<std::byte>(ef.inner().workspace_bytes(e, n));
    return s;
  }

  static void check_size(const state_type& state, std::uint64_t n, const char* what) {
    detail::require(state.residual.size() == n && state.next.size() == n, errc::size_mismatch, [&] {
      return std::string(what) + " has " + std::to_string(n) + " elements, the state " +
             std::to_string(state.residual.size());
    });
  }

  /// h = g + e checked, the inner codec's message of h and its decoding, the new residual into `next`.
  static std::size_t encode_general(const ef_type& ef, const cuda_executor& exec, std::span<const T> grad,
                                    state_type& state, std::span<std::byte> out, const scratch& s,
                                    const cuda_detail::operation& op, message_key key) {
    const std::uint64_t n = grad.size();
    cuda_detail::for_each_item(exec, n,
                               cuda_detail::ef_compensate<T>{grad.data(), state.residual.data(), s.compensated.data(),
                                                             op.status()});
    op.finish([&](errc, std::uint64_t i, std::uint32_t) {
      return "gradient + residual is NaN or Inf at element " + std::to_string(i) + " of " + std::to_string(n) +
             "; the state is unchanged";
    });
    const std::size_t bytes = ef.inner().encode(exec, std::span<const T>(s.compensated), out, s.inner, key);
    ef.inner().decode(exec, std::span<const std::byte>(out.first(bytes)), s.decoded, s.inner);
    cuda_detail::for_each_item(exec, n,
                               cuda_detail::ef_residual<T>{s.compensated.data(), s.decoded.data(), state.next.data(),
                                                           ef.decay()});
    return bytes;
  }

  /// The whole step in one kernel (uniform quantizer, blocks filling whole code words).
  static std::size_t encode_fused(const ef_type& ef, const cuda_executor& exec, std::span<const T> grad,
                                  state_type& state, std::span<std::byte> out, const scratch& s,
                                  const cuda_detail::operation& op, message_key key) {
    const uniform_quantizer<T>& inner = ef.inner();
    const std::uint64_t n = grad.size();
    const std::size_t size = inner.max_encoded_bytes(n);
    cuda_detail::begin_message(exec, out, size);
    using uniform_backend = backend<uniform_quantizer<T>, cuda_executor>;
    const cuda_detail::block_layout layout = uniform_backend::layout_of(inner, n);
    cuda_detail::encode_whole_word_blocks(
        exec, cuda_detail::compensated_values<T>{grad.data(), state.residual.data(), state.next.data(), ef.decay()},
        layout, uniform_backend::rule_of(inner, key), cuda_detail::scales_of<T>(out.data()),
        cuda_detail::codes_of<T>(out.data(), layout), op.status());
    cuda_detail::seal_message(exec, out.data(),
                              {codec_id::uniform, dtype_of<T>, 0, 0, key, n, inner.payload_bytes(n),
                               inner.params_hash(), 0},
                              s.crc, op);
    op.finish([&](errc, std::uint64_t i, std::uint32_t) {
      return "gradient + residual is NaN or Inf at element " + std::to_string(i) + " of " + std::to_string(n) +
             "; the state is unchanged";
    });
    return size;
  }
};

}  // namespace gradcomp
