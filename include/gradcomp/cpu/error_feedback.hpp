#pragma once
/// @file
/// CPU reference of error feedback. One pass forms a = g + e in the workspace and checks it; the
/// inner codec encodes a and decodes its own message into the workspace; a last pass stores
/// e = a − decoded. The state is written only by that last pass, after everything that can fail.
/// Around the float32 uniform quantizer in its vectorised layout, a fused path reads g once to
/// check it, then does the whole step block by block in one pass (see `encode_fused`).

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

  struct scratch {
    std::span<T> compensated;   ///< a = g + e.
    std::span<T> decoded;       ///< The inner codec's decoding of its message of a.
    std::span<std::byte> inner; ///< The inner codec's workspace.
  };

  static scratch carve(workspace_arena& arena, const ef_type& ef, const cpu_executor& e, std::uint64_t n) {
    scratch s;
    s.compensated = arena.take<T>(static_cast<std::size_t>(n));
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
    return state_type{std::vector<T>(static_cast<std::size_t>(n), T{0}), 0, T{0}};
  }

  static std::size_t encode(const ef_type& ef, const cpu_executor& e, std::span<const T> grad, state_type& state,
                            std::span<std::byte> out, std::span<std::byte> ws, message_key key) {
    const std::size_t n = grad.size();
    check_size(state, n, "gradient");
    workspace_arena arena(ws);
    const scratch s = carve(arena, ef, e, n);
    if constexpr (fusable) {
      if (cpu::uniform_vectorised(ef.inner()) && fused_is_safe(e, grad, state))
        return encode_fused(ef, e, grad, state, out, s, key);
    }
    const T* const g = grad.data();
    T* const residual = state.residual.data();
    T* const a = s.compensated.data();
    // NaN or ±Inf in g makes a NaN or ±Inf too, so testing a alone also catches an overflow of g + e.
    std::size_t non_finite = 0;
    for (std::size_t i = 0; i < n; ++i) {
      a[i] = g[i] + residual[i];
      non_finite += static_cast<std::size_t>(!is_finite(a[i]));
    }
    detail::require(non_finite == 0, errc::non_finite_input, [&] {
      return std::to_string(non_finite) + " of " + std::to_string(n) +
             " values of gradient + residual are NaN or Inf; the state is unchanged";
    });

    const std::size_t bytes = ef.inner().encode(e, std::span<const T>(s.compensated), out, s.inner, key);
    ef.inner().decode(e, std::span<const std::byte>(out.first(bytes)), s.decoded, s.inner);
    const T* const decoded = s.decoded.data();
    typename float_traits<T>::bits_type largest = 0;
    for (std::size_t i = 0; i < n; ++i) {
      residual[i] = a[i] - decoded[i];
      largest = std::max(largest, magnitude_key(residual[i]));
    }
    state.residual_max = bound_of(largest);
    ++state.steps;
    return bytes;
  }

  static std::size_t save_state(const ef_type& ef, const cpu_executor&, const state_type& state,
                                std::span<std::byte> bytes) {
    return ef.write_saved_state(state.residual.size(), state.steps, bytes, [&](std::byte* at) {
      std::ranges::copy(std::as_bytes(std::span<const T>(state.residual)), at);
    });
  }

  static void load_state(const ef_type& ef, const cpu_executor&, std::span<const std::byte> bytes,
                         state_type& state) {
    const auto saved = ef.check_saved_state(bytes, state.residual.size());
    std::ranges::copy(saved.residual, std::as_writable_bytes(std::span<T>(state.residual)).begin());
    state.steps = saved.steps;
    typename float_traits<T>::bits_type largest = 0;
    for (const T v : state.residual) largest = std::max(largest, magnitude_key(v));
    state.residual_max = bound_of(largest);
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
    state.residual_max = from_bits<T>(largest);
  }

 private:
  /// Whether the fused path exists: error feedback around the float32 uniform quantizer.
  static constexpr bool fusable = std::is_same_v<Codec, uniform_quantizer<float>>;

  /// The state holds n residual values; `size_mismatch` otherwise.
  static void check_size(const state_type& state, std::size_t n, const char* what) {
    detail::require(state.residual.size() == n, errc::size_mismatch, [&] {
      return std::string(what) + " has " + std::to_string(n) + " elements, the state " + std::to_string(state.residual.size());
    });
  }

  /// The bound recorded for a residual whose largest magnitude key is `key` (NaN records +Inf).
  [[nodiscard]] static T bound_of(typename float_traits<T>::bits_type key) noexcept {
    return key > float_traits<T>::infinity_key ? std::numeric_limits<T>::infinity() : from_bits<T>(key);
  }

  /// Checks g for NaN/±Inf (`non_finite_input`, nothing written) and whether g and the residual
  /// are small enough (below FLT_MAX/16) that no h = g + e, decoding or new residual of the fused
  /// path can overflow; when they are not, the reference path runs (and decides).
  static bool fused_is_safe(const cpu_executor& e, std::span<const T> grad, const state_type& state) {
    constexpr T limit = std::numeric_limits<T>::max() / T{16};
    const T g = cpu::max_magnitude(grad.data(), grad.data() + grad.size(), e.avx2());
    return g <= limit && state.residual_max <= limit;
  }

  /// One step in one pass over the blocks: h = g + e, the inner message's block, its decoding ĥ
  /// and the new residual h − ĥ are computed block by block in the workspace and the residual
  /// written back. fused_is_safe has ruled out every failure, so the state is written as the pass
  /// goes; every value equals the reference path's.
  static std::size_t encode_fused(const ef_type& ef, const cpu_executor& e, std::span<const T> grad,
                                  state_type& state, std::span<std::byte> out, const scratch& s, message_key key) {
    const std::uint64_t n = grad.size();
    const uniform_quantizer<float>& inner = ef.inner();
    cpu::uniform_block_encoder encoder(inner, e, out, n, key);
    const std::uint64_t block = inner.params().block;
    const int bits = inner.bits();
    const bool avx2 = e.avx2();
    float* const h = s.compensated.data();
    float* const decoded = s.decoded.data();
    constexpr std::uint64_t ahead = cpu::prefetch_distance / sizeof(float);
    const float* const g = grad.data();
    float* const residual = state.residual.data();
    std::uint32_t largest = 0;
    for (std::uint64_t begin = 0; begin < n; begin += block) {
      const std::uint64_t count = std::min(block, n - begin);
      cpu::prefetch(g + std::min(n, begin + ahead), g + std::min(n, begin + count + ahead));
      cpu::prefetch(residual + std::min(n, begin + ahead), residual + std::min(n, begin + count + ahead));
      cpu::ef_compensate(g + begin, residual + begin, count, h, avx2);
      const float step = encoder.next(h, count);
      cpu::uniform_decode_block(encoder.codes(), count, bits, step, decoded, false, false, avx2);
      largest = std::max(largest, cpu::ef_residual(h, decoded, count, residual + begin, avx2));
    }
    const std::size_t size = encoder.finish();
    state.residual_max = from_bits<float>(largest);
    ++state.steps;
    return size;
  }
};

}  // namespace gradcomp
