#pragma once
/// @file
/// LoCo on the GPU, with the CPU backend's bytes and 8-bit error state.
///
/// State: the error codes (int8, one per element) and scales in device memory, about one byte per
/// element as on the CPU, and the step counters on the host.
///
/// A step: h = g + dequant8(e) into the workspace (checked), the inner codec's encode and decode,
/// v = β·dequant8(e) + (1 − β)·(h − ĥ) (checked; a failure zeroes the message's envelope), and the
/// error quantized group by group into the state. Where the inner codec's backend fuses the step
/// (`fuses_loco`, feedback/fused_step.hpp: the uniform quantizer whose blocks fill whole code words
/// and equal the error groups, the defaults; cuda/uniform_feedback.cuh) and the magnitudes allow
/// it, the fused step runs instead.

#include <gradcomp/cuda/config.cuh>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include <gradcomp/core/backend.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/float_bits.hpp>
#include <gradcomp/core/rounded_product.hpp>
#include <gradcomp/core/wire_envelope.hpp>
#include <gradcomp/core/workspace.hpp>
#include <gradcomp/cuda/detail/block_codes.cuh>
#include <gradcomp/cuda/device_array.cuh>
#include <gradcomp/cuda/error_feedback.cuh>
#include <gradcomp/cuda/executor.cuh>
#include <gradcomp/cuda/detail/finite_check.cuh>
#include <gradcomp/cuda/detail/grid.cuh>
#include <gradcomp/cuda/detail/message.cuh>
#include <gradcomp/cuda/detail/operation.cuh>
#include <gradcomp/feedback/fused_step.hpp>
#include <gradcomp/feedback/loco.hpp>
#include <gradcomp/quantize/uniform_math.hpp>

namespace gradcomp {

/// State of LoCo for one tensor on the GPU: the 8-bit compensation error and step counters.
template <gradient_value T>
struct cuda_loco_state {
  device_array<std::int8_t> codes;  ///< Error codes in [−127, 127], one per element.
  device_array<T> scales;           ///< Error scales, one per group of `error_group` elements.
  std::uint64_t steps = 0;          ///< Steps since the last reset (t).
  std::uint64_t total_steps = 0;    ///< Steps completed in all.
};

namespace detail::cuda {

/// The stored error: dequant8(e)_i = code_i·scale_{i/G}, or +0 at a reset.
template <class T>
struct loco_error {
  const std::int8_t* codes;
  const T* scales;
  std::uint64_t group;
  bool reset;

  __device__ T at(std::uint64_t i) const { return reset ? T{0} : mul_rn(static_cast<T>(codes[i]), scales[i / group]); }
};

/// dequant8 of every element into `out` (the carried error).
template <class T>
struct loco_dequantize {
  loco_error<T> error;
  T* out;

  __device__ void operator()(std::uint64_t i) const { out[i] = error.at(i); }
};

/// h = g + dequant8(e) into the workspace, recording the first NaN or Inf.
template <class T>
struct loco_compensate {
  const T* g;
  loco_error<T> old;
  T* h;
  device_status* status;

  __device__ void operator()(std::uint64_t i) const {
    h[i] = g[i] + old.at(i);
    if (!is_finite(h[i])) record_failure(status, errc::non_finite_input, i);
  }
};

/// v = β·dequant8(e) + (1 − β)·(h − ĥ) over ĥ, recording the first NaN or Inf.
template <class T>
struct loco_new_error {
  const T* h;
  loco_error<T> old;
  T beta;
  T keep;
  T* decoded;  ///< ĥ in, v out.
  device_status* status;

  __device__ void operator()(std::uint64_t i) const {
    decoded[i] = loco_blend(old.at(i), h[i], decoded[i], beta, keep);
    if (!is_finite(decoded[i])) record_failure(status, errc::non_finite_input, i);
  }
};

/// One warp per error group: quant8 of v into the state's codes and scale.
template <class T>
struct loco_quantize_error {
  const T* v;
  std::uint64_t n;
  std::uint64_t group;
  std::int8_t* codes;
  T* scales;

  __device__ void operator()(std::uint64_t j) const {
    const std::uint64_t begin = j * group;
    const std::uint64_t count = n - begin < group ? n - begin : group;
    const T step = uniform_step(from_bits<T>(warp_max_key(plain_values<T>{v}, begin, begin + count)), 8);
    if (lane_id() == 0) scales[j] = step;
    for (std::uint64_t i = begin + lane_id(); i < begin + count; i += 32) codes[i] = loco_error_code(v[i], step);
  }
};

}  // namespace detail::cuda

/// LoCo on the GPU.
template <class Codec>
struct backend<loco<Codec>, cuda_executor> {
  using T = typename Codec::value_type;
  using loco_type = loco<Codec>;
  using state_type = cuda_loco_state<T>;

  static std::size_t workspace_bytes(const loco_type& lc, const cuda_executor& e, std::uint64_t n) {
    std::size_t bytes =
        detail::cuda::operation::workspace_bytes([&](workspace_arena& arena) { (void)carve(arena, lc, e, n); });
    if constexpr (fuses_loco<Codec, cuda_executor>)
      if (fused(lc, e)) bytes += fused_workspace_bytes(lc, e, n);
    return bytes;
  }

  static state_type make_state(const loco_type& lc, const cuda_executor& exec, std::uint64_t n) {
    return state_type{device_array<std::int8_t>(static_cast<std::size_t>(n), exec),
                      device_array<T>(static_cast<std::size_t>(lc.group_count(n)), exec), 0, 0};
  }

  static std::size_t encode(const loco_type& lc, const cuda_executor& caller, std::span<const T> grad,
                            state_type& state, std::span<std::byte> out, std::span<std::byte> ws, message_key key) {
    // Deferred errors do not apply: the step waits for its verdict anyway, and its stages must not
    // leave a sticky word behind.
    const cuda_executor exec{.stream = caller.stream};
    const std::uint64_t n = grad.size();
    lc.require_state_shape(state, n, "gradient");
    const bool reset = state.steps >= lc.params().reset_period;
    std::optional<std::size_t> bytes;
    if constexpr (fuses_loco<Codec, cuda_executor>) {
      if (fused(lc, exec)) {
        // The fused step's workspace follows the plain steps'.
        const std::size_t plain =
            detail::cuda::operation::workspace_bytes([&](workspace_arena& arena) { (void)carve(arena, lc, exec, n); });
        const loco_operands<T> step{grad, std::span<std::int8_t>(state.codes.data(), state.codes.size()),
                                    std::span<T>(state.scales.data(), state.scales.size()), reset,
                                    static_cast<T>(lc.params().beta)};
        bytes =
            fused_feedback<Codec, cuda_executor>::encode_with_loco(lc.inner(), exec, step, out, ws.subspan(plain), key);
      }
    }
    if (!bytes) {
      workspace_arena arena(ws);
      const detail::cuda::operation op(exec, arena);
      const scratch s = carve(arena, lc, exec, n);
      bytes = encode_plain(lc, exec, grad, state, out, s, op, key, reset);
    }
    state.steps = reset ? 1 : state.steps + 1;
    ++state.total_steps;
    return *bytes;
  }

  static std::size_t save_state(const loco_type& lc, const cuda_executor& exec, const state_type& state,
                                std::span<std::byte> bytes) {
    const std::uint64_t n = state.codes.size();
    lc.require_state_shape(state, n, "state");
    return lc.write_saved_state(n, state.steps, state.total_steps, bytes, [&](std::byte* codes, std::byte* scales) {
      GRADCOMP_CUDA_CHECK(
          cudaMemcpyAsync(codes, state.codes.data(), state.codes.size(), cudaMemcpyDeviceToHost, exec.native_stream()));
      GRADCOMP_CUDA_CHECK(cudaMemcpyAsync(scales, state.scales.data(), state.scales.size() * sizeof(T),
                                          cudaMemcpyDeviceToHost, exec.native_stream()));
      exec.synchronize();
    });
  }

  static void load_state(const loco_type& lc, const cuda_executor& exec, std::span<const std::byte> bytes,
                         state_type& state) {
    const auto saved = lc.check_saved_state(bytes, state.codes.size(), state.scales.size());
    GRADCOMP_CUDA_CHECK(cudaMemcpyAsync(state.codes.data(), saved.codes.data(), saved.codes.size(),
                                        cudaMemcpyHostToDevice, exec.native_stream()));
    GRADCOMP_CUDA_CHECK(cudaMemcpyAsync(state.scales.data(), saved.scales.data(), saved.scales.size(),
                                        cudaMemcpyHostToDevice, exec.native_stream()));
    exec.synchronize();
    state.steps = saved.steps;
    state.total_steps = saved.total_steps;
  }

  static void carried_error(const loco_type& lc, const cuda_executor& exec, const state_type& state, std::span<T> out) {
    lc.require_state_shape(state, out.size(), "output");
    detail::cuda::for_each_item(exec, out.size(),
                                detail::cuda::loco_dequantize<T>{error_of(lc, state, false), out.data()});
  }

  /// Checks `error` on the device, then stores it in 8 bits.
  static void set_carried_error(const loco_type& lc, const cuda_executor& exec, std::span<const T> error,
                                state_type& state) {
    lc.require_state_shape(state, error.size(), "error");
    detail::cuda::require_finite(exec, error, "the new carried error");
    quantize_error(lc, exec, error.data(), state);
  }

 private:
  /// The plain steps' workspace (after the operation's status).
  struct scratch {
    std::span<T> compensated;    ///< h.
    std::span<T> decoded;        ///< ĥ, then v.
    std::span<std::byte> inner;  ///< The inner codec's workspace.
  };
  static scratch carve(workspace_arena& arena, const loco_type& lc, const cuda_executor& e, std::uint64_t n) {
    scratch s;
    s.compensated = arena.take<T>(static_cast<std::size_t>(n));
    s.decoded = arena.take<T>(static_cast<std::size_t>(n));
    s.inner = arena.take<std::byte>(lc.inner().workspace_bytes(e, n));
    return s;
  }

  /// Whether the inner codec's backend fuses this step with these parameters.
  static bool fused(const loco_type& lc, const cuda_executor& e) {
    if constexpr (fuses_loco<Codec, cuda_executor>)
      return fused_feedback<Codec, cuda_executor>::fuses_loco(lc.inner(), e, lc.params().error_group);
    else
      return false;
  }

  /// The fused step's workspace (where `fused`): it follows the plain steps', in an arena of its own.
  static std::size_t fused_workspace_bytes(const loco_type& lc, const cuda_executor& e, std::uint64_t n) {
    if constexpr (fuses_loco<Codec, cuda_executor>)
      return fused_feedback<Codec, cuda_executor>::loco_workspace_bytes(lc.inner(), e, n);
    else
      return 0;
  }

  static detail::cuda::loco_error<T> error_of(const loco_type& lc, const state_type& state, bool reset) {
    return {state.codes.data(), state.scales.data(), lc.params().error_group, reset};
  }

  static void quantize_error(const loco_type& lc, const cuda_executor& exec, const T* v, state_type& state) {
    detail::cuda::for_each_block(exec, state.scales.size(),
                                 detail::cuda::loco_quantize_error<T>{v, state.codes.size(), lc.params().error_group,
                                                                      state.codes.data(), state.scales.data()});
  }

  /// The plain steps; the state is written only by the last one, after every check.
  static std::size_t encode_plain(const loco_type& lc, const cuda_executor& exec, std::span<const T> grad,
                                  state_type& state, std::span<std::byte> out, const scratch& s,
                                  const detail::cuda::operation& op, message_key key, bool reset) {
    const std::uint64_t n = grad.size();
    const detail::cuda::loco_error<T> old = error_of(lc, state, reset);
    detail::cuda::for_each_item(exec, n,
                                detail::cuda::loco_compensate<T>{grad.data(), old, s.compensated.data(), op.status()});
    op.finish([&](errc, std::uint64_t i, std::uint32_t) {
      return "gradient + error is NaN or Inf at element " + std::to_string(i) + " of " + std::to_string(n) +
             "; the state is unchanged";
    });
    const std::size_t bytes = lc.inner().encode(exec, std::span<const T>(s.compensated), out, s.inner, key);
    lc.inner().decode(exec, std::span<const std::byte>(out.first(bytes)), s.decoded, s.inner);
    const auto beta = static_cast<T>(lc.params().beta);
    detail::cuda::for_each_item(exec, n,
                                detail::cuda::loco_new_error<T>{s.compensated.data(), old, beta, T{1} - beta,
                                                                s.decoded.data(), op.status()});
    try {
      op.finish([&](errc, std::uint64_t i, std::uint32_t) {
        return "the new compensation error is NaN or Inf at element " + std::to_string(i) + "; the state is unchanged";
      });
    } catch (const error&) {
      // The inner message is already in `out`; do not leave it passing for a sent step.
      GRADCOMP_CUDA_CHECK(cudaMemsetAsync(out.data(), 0, envelope::size, exec.native_stream()));
      exec.synchronize();
      throw;
    }
    quantize_error(lc, exec, s.decoded.data(), state);
    return bytes;
  }
};

}  // namespace gradcomp
