#pragma once
/// @file
/// CPU reference of error feedback. A step writes a = g + e into the state's `next` buffer and
/// checks it; the inner codec encodes a and decodes its own message into the workspace; a last
/// pass turns `next` into the new residual fl(β·(a − decoded)) (a − decoded when β = 1) and checks
/// it, and the two buffers are exchanged only then. Around the float32 uniform quantizer in its
/// vectorised layout, one pass does the whole step block by block (see `encode_one_pass`).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include <gradcomp/core/backend.hpp>
#include <gradcomp/core/cpu_executor.hpp>
#include <gradcomp/core/crc32c.hpp>
#include <gradcomp/core/saved_state.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/float_bits.hpp>
#include <gradcomp/core/wire_envelope.hpp>
#include <gradcomp/core/workspace.hpp>
#include <gradcomp/cpu/feedback_kernels.hpp>
#include <gradcomp/cpu/message.hpp>
#include <gradcomp/cpu/uniform.hpp>
#include <gradcomp/cpu/uniform_block_encoder.hpp>
#include <gradcomp/feedback/error_feedback.hpp>

namespace gradcomp {

/// Error feedback on the CPU.
template <class Codec>
struct backend<error_feedback<Codec>, cpu_executor> {
  using T = typename Codec::value_type;
  using ef_type = error_feedback<Codec>;
  using state_type = error_feedback_state<T>;
  using format = error_feedback_saved_format;

  /// The workspace of a step: the reference path decodes the whole message into `decoded` and
  /// gives the inner codec `inner`; the one-pass path only needs one block of h = g + e.
  struct scratch {
    std::span<T> decoded;       ///< Reference path: the inner codec's decoding of its message of a.
    std::span<std::byte> inner; ///< Reference path: the inner codec's workspace.
    std::span<T> block;         ///< One-pass path: h = g + e of the block being coded.
  };

  static scratch carve(workspace_arena& arena, const ef_type& ef, const cpu_executor& e, std::uint64_t n) {
    scratch s;
    if constexpr (fusable) {
      if (cpu::uniform_vectorised(ef.inner())) {
        s.block = arena.take<T>(static_cast<std::size_t>(std::min<std::uint64_t>(n, ef.inner().params().block)));
        return s;
      }
    }
    s.decoded = arena.take<T>(static_cast<std::size_t>(n));
    s.inner = arena.take<std::byte>(ef.inner().workspace_bytes(e, n));
    return s;
  }

  static std::size_t workspace_bytes(const ef_type& ef, const cpu_executor& e, std::uint64_t n) {
    workspace_arena arena = workspace_arena::measure();
    carve(arena, ef, e, n);
    return arena.bytes_needed();
  }

  static state_type make_state(const ef_type&, const cpu_executor&, std::uint64_t n) {
    const auto size = static_cast<std::size_t>(n);
    return state_type{std::vector<T>(size, T{0}), std::vector<T>(size, T{0}), 0};
  }

  static std::size_t encode(const ef_type& ef, const cpu_executor& e, std::span<const T> grad, state_type& state,
                            std::span<std::byte> out, std::span<std::byte> ws, message_key key) {
    const std::size_t n = grad.size();
    check_size(state, n, "gradient");
    workspace_arena arena(ws);
    const scratch s = carve(arena, ef, e, n);
    if constexpr (fusable) {
      if (cpu::uniform_vectorised(ef.inner())) return encode_one_pass(ef, e, grad, state, out, s, key);
    }
    const T* const g = grad.data();
    const T* const residual = state.residual.data();
    T* const a = state.next.data();
    bool finite = true;
    for (std::size_t i = 0; i < n; ++i) {
      a[i] = g[i] + residual[i];
      finite = finite && is_finite(a[i]);
    }
    if (!finite) fail_non_finite(grad, state);

    const std::size_t bytes = ef.inner().encode(e, std::span<const T>(state.next), out, s.inner, key);
    ef.inner().decode(e, std::span<const std::byte>(out.first(bytes)), s.decoded, s.inner);
    const T* const decoded = s.decoded.data();
    std::size_t overflowed = 0;
    const auto residual_pass = [&](auto new_residual) {
      for (std::size_t i = 0; i < n; ++i) {
        a[i] = new_residual(a[i], decoded[i]);
        overflowed += static_cast<std::size_t>(!is_finite(a[i]));
      }
    };
    const T beta = ef.decay();
    if (beta == T{1}) residual_pass([](T h, T d) { return h - d; });  // without the multiply: vectorised
    else
      residual_pass([beta](T h, T d) { return decayed_residual(beta, h, d); });
    detail::require(overflowed == 0, errc::non_finite_input, [&] {
      return std::to_string(overflowed) + " of " + std::to_string(n) +
             " values of the new residual (g + e minus its decoding) are NaN or Inf; the state is unchanged";
    });
    std::swap(state.residual, state.next);
    ++state.steps;
    return bytes;
  }

  static std::size_t save_state(const ef_type& ef, const cpu_executor&, const state_type& state,
                                std::span<std::byte> bytes) {
    return ef.write_saved_state(state.residual.size(), state.steps, bytes, [&](std::byte* at) {
      std::ranges::copy(std::as_bytes(std::span<const T>(state.residual)), at);
    });
  }

  static void load_state(const ef_type& ef, const cpu_executor&, std::span<const std::byte> bytes, state_type& state) {
    const auto saved = ef.check_saved_state(bytes, state.residual.size());
    std::ranges::copy(saved.residual, std::as_writable_bytes(std::span<T>(state.residual)).begin());
    state.steps = saved.steps;
  }

  static void carried_error(const ef_type&, const cpu_executor&, const state_type& state, std::span<T> out) {
    check_size(state, out.size(), "output");
    std::ranges::copy(state.residual, out.begin());
  }

  static void set_carried_error(const ef_type&, const cpu_executor&, std::span<const T> error, state_type& state) {
    check_size(state, error.size(), "error");
    typename float_traits<T>::bits_type largest = 0;
    for (const T v : error) largest = std::max(largest, magnitude_key(v));
    detail::require(largest < float_traits<T>::infinity_key, errc::non_finite_input,
                    "the new carried error holds NaN or Inf; the state is unchanged");
    std::ranges::copy(error, state.residual.begin());
  }

 private:
  /// Whether the one-pass path exists: error feedback around the float32 uniform quantizer.
  static constexpr bool fusable = std::is_same_v<Codec, uniform_quantizer<float>>;

  /// Both residual buffers hold n values; `size_mismatch` otherwise.
  static void check_size(const state_type& state, std::size_t n, const char* what) {
    detail::require(state.residual.size() == n && state.next.size() == n, errc::size_mismatch, [&] {
      return std::string(what) + " has " + std::to_string(n) + " elements, the state " +
             std::to_string(state.residual.size()) + " (and " + std::to_string(state.next.size()) + " in next)";
    });
  }

  /// Throws `non_finite_input` with the number of values of g + e that are NaN or ±Inf (NaN or
  /// ±Inf in g, or a finite g whose sum with the residual overflows).
  [[noreturn]] static void fail_non_finite(std::span<const T> grad, const state_type& state) {
    std::size_t non_finite = 0;
    for (std::size_t i = 0; i < grad.size(); ++i)
      non_finite += static_cast<std::size_t>(!is_finite(grad[i] + state.residual[i]));
    detail::fail(errc::non_finite_input, std::to_string(non_finite) + " of " + std::to_string(grad.size()) +
                                             " values of gradient + residual are NaN or Inf; the state is unchanged");
  }

  /// One step in one pass over the blocks: per block, h = g + e and its largest magnitude (which
  /// finds NaN and ±Inf), the inner message's codes (cpu/uniform_block_encoder.hpp), and the new
  /// residual h − decoded written into `next` straight from the codes (streamed when large, per
  /// the executor). It reads g and e once and writes the codes and the new residual once; a
  /// failure part-way leaves `residual` as it was. With β ≠ 1 each block's residual is then
  /// multiplied by β while it is in cache (not streamed). Every value equals the reference path's.
  /// The new residual needs no check: a code's level has the sign of its value (or is 0) and its
  /// decoding stays finite (uniform_step), so |β·(h − decoded)| ≤ max(|h|, |decoded|) is finite.
  static std::size_t encode_one_pass(const ef_type& ef, const cpu_executor& e, std::span<const T> grad,
                                     state_type& state, std::span<std::byte> out, const scratch& s, message_key key) {
    const std::uint64_t n = grad.size();
    const uniform_quantizer<float>& inner = ef.inner();
    cpu::uniform_block_encoder encoder(inner, e, out, n, key);
    const std::uint64_t block = inner.params().block;
    const bool avx2 = e.avx2();
    float* const next = state.next.data();
    const float beta = ef.decay();
    const bool decays = beta != 1.0f;
    const bool streaming = !decays && e.streams(n * sizeof(float)) && cpu::streamable(next);
    float* const h = s.block.data();
    const float* const g = grad.data();
    const float* const residual = state.residual.data();
    for (std::uint64_t begin = 0; begin < n; begin += block) {
      const std::uint64_t count = std::min(block, n - begin);
      const std::uint32_t largest = cpu::ef_compensate(g + begin, residual + begin, count, h, avx2);
      if (largest >= float_traits<float>::infinity_key) fail_non_finite(grad, state);
      encoder.next(h, count, from_bits<float>(largest), next + begin, streaming);
      if (decays) cpu::ef_decay(next + begin, count, beta, avx2);
    }
    const std::size_t size = encoder.finish();
    if (streaming) cpu::streaming_fence();
    std::swap(state.residual, state.next);
    ++state.steps;
    return size;
  }
};

}  // namespace gradcomp
