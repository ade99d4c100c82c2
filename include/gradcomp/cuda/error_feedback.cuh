#pragma once
/// @file
/// Error feedback on the GPU, with the CPU reference's bytes and residuals.
///
/// State: the residual e in device memory, and a second buffer of the same size that a step writes
/// its new residual into; the two are exchanged once the step has succeeded, so a step that fails
/// (NaN or Inf in g + e) leaves e as it was without a pass that checks g first. The state thus
/// takes 2·n values of device memory (docs/cuda.md §3).
///
/// A step: h = g + e into the workspace (checked on the host), the inner codec's encode and decode,
/// and the new residual fl(β·(h − decoded)) into `next` (checked: where it overflows, the step is
/// refused and the message's envelope zeroed, as on the host), computed with `decayed_residual`
/// (feedback/error_feedback.hpp) as the CPU does: the product is rounded on its own
/// (`__fmul_rn`), so the residuals stay the reference's. Where the inner codec's backend fuses the
/// step (`fuses_error_feedback`, feedback/fused_step.hpp: the uniform quantizer whose blocks fill
/// whole code words, one kernel, cuda/uniform_feedback.cuh), the fused step runs instead.

#include <gradcomp/cuda/config.cuh>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>

#include <gradcomp/core/backend.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/float_bits.hpp>
#include <gradcomp/core/wire_envelope.hpp>
#include <gradcomp/core/workspace.hpp>
#include <gradcomp/cuda/detail/block_codes.cuh>
#include <gradcomp/cuda/device_array.cuh>
#include <gradcomp/cuda/executor.cuh>
#include <gradcomp/cuda/detail/finite_check.cuh>
#include <gradcomp/cuda/detail/grid.cuh>
#include <gradcomp/cuda/detail/message.cuh>
#include <gradcomp/cuda/detail/operation.cuh>
#include <gradcomp/feedback/error_feedback.hpp>
#include <gradcomp/feedback/fused_step.hpp>

namespace gradcomp {

/// State of error feedback for one tensor on the GPU.
template <gradient_value T>
struct cuda_error_feedback_state {
  device_array<T> residual;  ///< What the codec has not sent yet, one value per element.
  device_array<T> next;  ///< Where a step writes the new residual; exchanged with `residual` when it succeeds.
  std::uint64_t steps = 0;  ///< Steps completed.
};

namespace detail::cuda {

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

/// next = fl(β·(h − decoded)) (h − decoded when β = 1), recording the first element where it is
/// NaN or Inf.
template <class T>
struct ef_residual {
  const T* h;
  const T* decoded;
  T* next;
  T beta;
  device_status* status;

  __device__ void operator()(std::uint64_t i) const {
    next[i] = decayed_residual(beta, h[i], decoded[i]);
    if (!is_finite(next[i])) record_failure(status, errc::non_finite_input, i);
  }
};

}  // namespace detail::cuda

/// Error feedback on the GPU.
template <class Codec>
struct backend<error_feedback<Codec>, cuda_executor> {
  using T = typename Codec::value_type;
  using ef_type = error_feedback<Codec>;
  using state_type = cuda_error_feedback_state<T>;

  static std::size_t workspace_bytes(const ef_type& ef, const cuda_executor& e, std::uint64_t n) {
    if constexpr (fuses_error_feedback<Codec, cuda_executor>)
      if (fused(ef, e)) return fused_feedback<Codec, cuda_executor>::error_feedback_workspace_bytes(ef.inner(), e, n);
    return detail::cuda::operation::workspace_bytes([&](workspace_arena& arena) { (void)carve(arena, ef, e, n); });
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
    ef_type::require_state_size(state, grad.size(), "gradient");
    const std::size_t bytes = fused(ef, exec) ? encode_fused(ef, exec, grad, state, out, ws, key)
                                              : encode_general(ef, exec, grad, state, out, ws, key);
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
    ef_type::require_state_size(state, out.size(), "output");
    GRADCOMP_CUDA_CHECK(cudaMemcpyAsync(out.data(), state.residual.data(), out.size() * sizeof(T),
                                        cudaMemcpyDeviceToDevice, exec.native_stream()));
  }

  /// Checks `error` on the device, then copies it.
  static void set_carried_error(const ef_type&, const cuda_executor& exec, std::span<const T> error,
                                state_type& state) {
    ef_type::require_state_size(state, error.size(), "error");
    detail::cuda::require_finite(exec, error, "the new carried error");
    GRADCOMP_CUDA_CHECK(cudaMemcpyAsync(state.residual.data(), error.data(), error.size() * sizeof(T),
                                        cudaMemcpyDeviceToDevice, exec.native_stream()));
  }

 private:
  /// The general steps' workspace (after the operation's status).
  struct scratch {
    std::span<T> compensated;    ///< h = g + e.
    std::span<T> decoded;        ///< The inner codec's decoding of its message.
    std::span<std::byte> inner;  ///< The inner codec's workspace.
  };
  static scratch carve(workspace_arena& arena, const ef_type& ef, const cuda_executor& e, std::uint64_t n) {
    scratch s;
    s.compensated = arena.take<T>(static_cast<std::size_t>(n));
    s.decoded = arena.take<T>(static_cast<std::size_t>(n));
    s.inner = arena.take<std::byte>(ef.inner().workspace_bytes(e, n));
    return s;
  }

  /// Whether the inner codec's backend fuses this step (the uniform quantizer whose blocks fill
  /// whole code words: cuda/uniform_feedback.cuh).
  static bool fused(const ef_type& ef, const cuda_executor& e) {
    if constexpr (fuses_error_feedback<Codec, cuda_executor>)
      return fused_feedback<Codec, cuda_executor>::fuses_error_feedback(ef.inner(), e);
    else
      return false;
  }

  static std::size_t encode_fused(const ef_type& ef, const cuda_executor& exec, std::span<const T> grad,
                                  state_type& state, std::span<std::byte> out, std::span<std::byte> ws,
                                  message_key key) {
    if constexpr (fuses_error_feedback<Codec, cuda_executor>) {
      const error_feedback_operands<T> step{grad, std::span<const T>(state.residual.data(), state.residual.size()),
                                            std::span<T>(state.next.data(), state.next.size()), ef.decay()};
      return fused_feedback<Codec, cuda_executor>::encode_with_error_feedback(ef.inner(), exec, step, out, ws, key);
    } else {
      return 0;  // not reached: `fused` is false
    }
  }

  /// h = g + e checked, the inner codec's message of h and its decoding, the new residual into `next`.
  static std::size_t encode_general(const ef_type& ef, const cuda_executor& exec, std::span<const T> grad,
                                    state_type& state, std::span<std::byte> out, std::span<std::byte> ws,
                                    message_key key) {
    const std::uint64_t n = grad.size();
    workspace_arena arena(ws);
    const detail::cuda::operation op(exec, arena);
    const scratch s = carve(arena, ef, exec, n);
    detail::cuda::for_each_item(exec, n,
                                detail::cuda::ef_compensate<T>{grad.data(), state.residual.data(), s.compensated.data(),
                                                               op.status()});
    op.finish([&](errc, std::uint64_t i, std::uint32_t) {
      return "gradient + residual is NaN or Inf at element " + std::to_string(i) + " of " + std::to_string(n) +
             "; the state is unchanged";
    });
    const std::size_t bytes = ef.inner().encode(exec, std::span<const T>(s.compensated), out, s.inner, key);
    ef.inner().decode(exec, std::span<const std::byte>(out.first(bytes)), s.decoded, s.inner);
    detail::cuda::for_each_item(exec, n,
                                detail::cuda::ef_residual<T>{s.compensated.data(), s.decoded.data(), state.next.data(),
                                                             ef.decay(), op.status()});
    try {
      op.finish([&](errc, std::uint64_t i, std::uint32_t) {
        return "the new residual (g + e minus its decoding) is NaN or Inf at element " + std::to_string(i) +
               "; the state is unchanged";
      });
    } catch (const error&) {
      // The inner message is already in `out`; do not leave it passing for a sent step.
      GRADCOMP_CUDA_CHECK(cudaMemsetAsync(out.data(), 0, envelope::size, exec.native_stream()));
      exec.synchronize();
      throw;
    }
    return bytes;
  }
};

}  // namespace gradcomp
