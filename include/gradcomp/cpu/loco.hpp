#pragma once
/// @file
/// CPU backend of LoCo, scalar. One pass forms h = g + dequant8(e) in the workspace and checks
/// it; the inner codec encodes h and decodes its own message into the workspace; a pass turns that
/// decoding into the new unquantized error β·dequant8(e) + (1 − β)·(h − ĥ) in place and checks it;
/// a last pass quantizes it group by group into the state. The state is written only by that last
/// pass, after everything that can fail. A reset due at this step is applied by reading the old
/// error as zero, so a failed step leaves it undone.

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
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
#include <gradcomp/core/rounded_product.hpp>
#include <gradcomp/core/wire_envelope.hpp>
#include <gradcomp/core/workspace.hpp>
#include <gradcomp/cpu/feedback_kernels.hpp>
#include <gradcomp/cpu/message.hpp>
#include <gradcomp/cpu/uniform.hpp>
#include <gradcomp/cpu/uniform_block_encoder.hpp>
#include <gradcomp/feedback/loco.hpp>
#include <gradcomp/quantize/uniform_math.hpp>

namespace gradcomp {

/// LoCo on the CPU.
template <class Codec>
struct backend<loco<Codec>, cpu_executor> {
  using T = typename Codec::value_type;
  using loco_type = loco<Codec>;
  using state_type = loco_state<T>;
  using format = loco_saved_format;

  /// Bits of the stored error.
  static constexpr int error_bits = 8;

  struct scratch {
    std::span<T> compensated;    ///< h = g + dequant8(e).
    std::span<T> decoded;        ///< ĥ, then the new error before quantization.
    std::span<std::byte> inner;  ///< The inner codec's workspace.
    std::span<std::int8_t> zero_codes;  ///< One error group of zero codes (the fused path's reset).
  };

  static scratch carve(workspace_arena& arena, const loco_type& lc, const cpu_executor& e, std::uint64_t n) {
    scratch s;
    s.compensated = arena.take<T>(static_cast<std::size_t>(n));
    s.decoded = arena.take<T>(static_cast<std::size_t>(n));
    s.inner = arena.take<std::byte>(lc.inner().workspace_bytes(e, n));
    s.zero_codes = arena.take<std::int8_t>(lc.params().error_group);
    return s;
  }

  static std::size_t workspace_bytes(const loco_type& lc, const cpu_executor& e, std::uint64_t n) {
    workspace_arena arena = workspace_arena::measure();
    carve(arena, lc, e, n);
    return arena.bytes_needed();
  }

  static state_type make_state(const loco_type& lc, const cpu_executor&, std::uint64_t n) {
    return state_type{std::vector<std::int8_t>(static_cast<std::size_t>(n), std::int8_t{0}),
                      std::vector<T>(static_cast<std::size_t>(lc.group_count(n)), T{0}), 0, 0};
  }

  static std::size_t encode(const loco_type& lc, const cpu_executor& e, std::span<const T> grad, state_type& state,
                            std::span<std::byte> out, std::span<std::byte> ws, message_key key) {
    const std::size_t n = grad.size();
    check_shape(lc, state, n, "gradient");
    workspace_arena arena(ws);
    const scratch s = carve(arena, lc, e, n);
    if constexpr (fusable) {
      if (lc.params().error_group == lc.inner().params().block && cpu::uniform_vectorised(lc.inner()) &&
          fused_is_finite(lc, e, grad, state))
        return encode_fused(lc, e, grad, state, out, s, key);
    }
    const std::size_t group = lc.params().error_group;
    const bool reset = state.steps >= lc.params().reset_period;
    const T* const g = grad.data();
    const std::int8_t* const codes = state.codes.data();
    const T* const scales = state.scales.data();
    T* const h = s.compensated.data();

    // NaN or ±Inf in g makes h NaN or ±Inf too, so testing h alone also catches an overflow of g + e.
    std::size_t non_finite = 0;
    for (std::size_t i = 0; i < n; ++i) {
      h[i] = g[i] + (reset ? T{0} : dequant(codes[i], scales[i / group]));
      non_finite += static_cast<std::size_t>(!is_finite(h[i]));
    }
    detail::require(non_finite == 0, errc::non_finite_input, [&] {
      return std::to_string(non_finite) + " of " + std::to_string(n) +
             " values of gradient + error are NaN or Inf; the state is unchanged";
    });

    const std::size_t bytes = lc.inner().encode(e, std::span<const T>(s.compensated), out, s.inner, key);
    lc.inner().decode(e, std::span<const std::byte>(out.first(bytes)), s.decoded, s.inner);

    // v = β·dequant8(e) + (1 − β)·(h − ĥ), written over ĥ.
    const auto beta = static_cast<T>(lc.params().beta);
    const T keep = T{1} - beta;
    T* const v = s.decoded.data();
    for (std::size_t i = 0; i < n; ++i) {
      const T old = reset ? T{0} : dequant(codes[i], scales[i / group]);
      v[i] = mul_rn(beta, old) + mul_rn(keep, h[i] - v[i]);
      non_finite += static_cast<std::size_t>(!is_finite(v[i]));
    }
    // The inner message is already in `out`; do not leave it passing for a sent step.
    if (non_finite != 0) std::memset(out.data(), 0, envelope::size);
    detail::require(non_finite == 0, errc::non_finite_input, [&] {
      return std::to_string(non_finite) + " of " + std::to_string(n) +
             " values of the new compensation error are NaN or Inf; the state is unchanged";
    });

    quantize_error(lc, std::span<const T>(v, n), state);
    state.steps = reset ? 1 : state.steps + 1;
    ++state.total_steps;
    return bytes;
  }

  static std::size_t save_state(const loco_type& lc, const cpu_executor&, const state_type& state,
                                std::span<std::byte> bytes) {
    const std::uint64_t n = state.codes.size();
    check_shape(lc, state, static_cast<std::size_t>(n), "state");
    return lc.write_saved_state(n, state.steps, state.total_steps, bytes, [&](std::byte* codes, std::byte* scales) {
      std::ranges::copy(std::as_bytes(std::span<const std::int8_t>(state.codes)), codes);
      std::ranges::copy(std::as_bytes(std::span<const T>(state.scales)), scales);
    });
  }

  static void load_state(const loco_type& lc, const cpu_executor&, std::span<const std::byte> bytes,
                         state_type& state) {
    const auto saved = lc.check_saved_state(bytes, state.codes.size(), state.scales.size());
    std::ranges::copy(saved.codes, std::as_writable_bytes(std::span<std::int8_t>(state.codes)).begin());
    std::ranges::copy(saved.scales, std::as_writable_bytes(std::span<T>(state.scales)).begin());
    state.steps = saved.steps;
    state.total_steps = saved.total_steps;
  }

  static void carried_error(const loco_type& lc, const cpu_executor&, const state_type& state, std::span<T> out) {
    check_shape(lc, state, out.size(), "output");
    const std::size_t group = lc.params().error_group;
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = dequant(state.codes[i], state.scales[i / group]);
  }

  static void set_carried_error(const loco_type& lc, const cpu_executor&, std::span<const T> error, state_type& state) {
    check_shape(lc, state, error.size(), "error");
    const auto non_finite =
        static_cast<std::size_t>(std::count_if(error.begin(), error.end(), [](T x) { return !is_finite(x); }));
    detail::require(non_finite == 0, errc::non_finite_input, [&] {
      return std::to_string(non_finite) + " values of the new carried error are NaN or Inf; the state is unchanged";
    });
    quantize_error(lc, error, state);
  }

 private:
  /// How far ahead of the block being coded the one-pass step prefetches g, in bytes. The step is
  /// faster with it; error feedback and the plain quantizer, whose steps are lighter, are faster
  /// without software prefetch (cpu/uniform.hpp). Measurements: docs/feedback.md §8.4.
  static constexpr std::uint64_t prefetch_bytes = 16384;

  /// Whether the fused path exists: LoCo around the float32 uniform quantizer.
  static constexpr bool fusable = std::is_same_v<Codec, uniform_quantizer<float>>;

  /// Checks g for NaN/±Inf (`non_finite_input`, nothing written) and whether g and the old error
  /// are small enough (below FLT_MAX/16) that no later step of the fused path can overflow; when
  /// they are not, the reference path runs (and decides).
  static bool fused_is_finite(const loco_type& lc, const cpu_executor& e, std::span<const T> grad,
                              const state_type& state) {
    constexpr T limit = std::numeric_limits<T>::max() / T{16};
    const T g = cpu::max_magnitude(grad.data(), grad.data() + grad.size(), e.avx2());
    T scale = 0;
    if (state.steps < lc.params().reset_period)
      for (const T v : state.scales) scale = std::max(scale, v);
    return g <= limit && scale <= limit / T{127};
  }

  /// One step in one pass over the blocks (error groups equal the quantizer's blocks): h, the
  /// inner message's block, ĥ, the new error and its codes are computed block by block in the
  /// workspace, and the block's error written back. fused_is_finite has ruled out every failure,
  /// so the state is written as the pass goes; every value equals the reference path's.
  static std::size_t encode_fused(const loco_type& lc, const cpu_executor& e, std::span<const T> grad,
                                  state_type& state, std::span<std::byte> out, const scratch& s, message_key key) {
    const std::uint64_t n = grad.size();
    const uniform_quantizer<float>& inner = lc.inner();
    cpu::uniform_block_encoder encoder(inner, e, out, n, key);
    const std::uint64_t block = inner.params().block;
    const int bits = inner.bits();
    const bool avx2 = e.avx2();
    const bool reset = state.steps >= lc.params().reset_period;
    const float beta = lc.params().beta;
    const float keep = 1.0f - beta;
    float* const h = s.compensated.data();
    float* const v = s.decoded.data();
    // After a reset the old error reads as +0, as the reference path's T{0} does.
    std::int8_t* const zeros = s.zero_codes.data();
    if (reset) std::ranges::fill(s.zero_codes, std::int8_t{0});
    constexpr std::uint64_t ahead = prefetch_bytes / sizeof(float);
    const float* const g = grad.data();
    for (std::uint64_t begin = 0, j = 0; begin < n; begin += block, ++j) {
      const std::uint64_t count = std::min(block, n - begin);
      cpu::prefetch(g + std::min(n, begin + ahead), g + std::min(n, begin + count + ahead));
      std::int8_t* const error = state.codes.data() + begin;
      const std::int8_t* const old = reset ? zeros : error;
      const float old_scale = reset ? 0.0f : state.scales[j];
      cpu::loco_compensate(g + begin, old, old_scale, count, h, avx2);
      const float step = encoder.next(h, count);
      cpu::uniform_decode_block(encoder.codes(), count, bits, step, v, false, false, avx2);
      cpu::loco_blend(h, old, old_scale, beta, keep, count, v, avx2);
      const float error_step = uniform_step(cpu::max_magnitude(v, v + count, avx2), error_bits);
      state.scales[j] = error_step;
      if (error_step == 0.0f) {
        std::memset(error, 0, static_cast<std::size_t>(count));
        continue;
      }
      cpu::loco_quantize_error(v, error_step, count, error, avx2);
    }
    const std::size_t size = encoder.finish();
    state.steps = reset ? 1 : state.steps + 1;
    ++state.total_steps;
    return size;
  }

  /// quant8 of the new error `v`, group by group, straight into the state's codes and scales.
  static void quantize_error(const loco_type& lc, std::span<const T> v, state_type& state) noexcept {
    const std::size_t n = v.size(), group = lc.params().error_group;
    std::int8_t* const new_codes = state.codes.data();
    T* const new_scales = state.scales.data();
    for (std::size_t begin = 0, j = 0; begin < n; begin += group, ++j) {
      const std::size_t end = std::min(n, begin + group);
      typename float_traits<T>::bits_type largest = 0;
      for (std::size_t i = begin; i < end; ++i) largest = std::max(largest, magnitude_key(v[i]));
      const T step = uniform_step(from_bits<T>(largest), error_bits);
      new_scales[j] = step;
      for (std::size_t i = begin; i < end; ++i)
        new_codes[i] =
            step == T{0}
                ? std::int8_t{0}
                : static_cast<std::int8_t>(uniform_level(v[i] / step, error_bits, rounding::nearest_even, T{0}));
    }
  }

  /// dequant8 of one element.
  [[nodiscard]] static T dequant(std::int8_t code, T scale) noexcept { return mul_rn(static_cast<T>(code), scale); }

  /// The state holds n codes and ⌈n/G⌉ scales; `size_mismatch` otherwise.
  static void check_shape(const loco_type& lc, const state_type& state, std::size_t n, const char* what) {
    detail::require(state.codes.size() == n, errc::size_mismatch, [&] {
      return std::string(what) + " has " + std::to_string(n) + " elements, the state " +
             std::to_string(state.codes.size());
    });
    detail::require(state.scales.size() == lc.group_count(n), errc::size_mismatch, [&] {
      return "state holds " + std::to_string(state.scales.size()) + " error scales, " + std::to_string(n) +
             " elements in groups of " + std::to_string(lc.params().error_group) + " need " +
             std::to_string(lc.group_count(n));
    });
  }
};

}  // namespace gradcomp
