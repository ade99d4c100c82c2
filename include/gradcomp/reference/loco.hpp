#pragma once
/// @file
/// LoCo (feedback/loco.hpp, docs/feedback.md §8) on a host executor: the reference backend on
/// `reference_executor`, whose inner codec runs its own reference backend, and the CPU backend on
/// `cpu_executor`, the same steps with the inner codec's CPU backend. One loop forms
/// h = g + dequant8(e) in the workspace and checks it; the inner codec encodes h and decodes its
/// own message into the workspace; a loop turns that decoding into the new unquantized error
/// β·dequant8(e) + (1 − β)·(h − ĥ) in place and checks it; a last loop quantizes it group by group
/// into the state. The state is written only by that last loop, after everything that can fail.
/// A reset due at this step is applied by reading the old error as zero, so a failed step leaves it
/// undone. Where the inner codec's backend fuses the step (`fuses_loco`, feedback/fused_step.hpp:
/// the float32 uniform quantizer on the CPU, error groups equal to its blocks) and the values
/// allow it, the fused step runs instead and writes the same bytes and state.

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <gradcomp/core/backend.hpp>
#include <gradcomp/core/cpu_executor.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/float_bits.hpp>
#include <gradcomp/core/reference_executor.hpp>
#include <gradcomp/core/rounded_product.hpp>
#include <gradcomp/core/wire_envelope.hpp>
#include <gradcomp/core/workspace.hpp>
#include <gradcomp/feedback/fused_step.hpp>
#include <gradcomp/reference/values.hpp>
#include <gradcomp/feedback/loco.hpp>
#include <gradcomp/quantize/uniform_math.hpp>

namespace gradcomp {

/// LoCo around `Codec` on a host executor E (the reference, or the CPU). A bf16 or fp16 gradient's
/// error and arithmetic are float32 (R); h is rounded to the gradient's type for the inner codec,
/// whose message is decoded into float32 (docs/half-precision.md §5).
template <class Codec, class E>
  requires(std::same_as<E, reference_executor> || std::same_as<E, cpu_executor>)
struct backend<loco<Codec>, E> {
  using T = typename Codec::value_type;
  using R = compute_type<T>;  ///< The error's and the arithmetic's type: float32 for a 16-bit gradient.
  using loco_type = loco<Codec>;
  using state_type = loco_state<R>;
  using format = loco_saved_format;

  /// Bits of the stored error.
  static constexpr int error_bits = 8;

  /// The plain step's workspace.
  struct scratch {
    std::span<R> compensated;    ///< h = g + dequant8(e).
    std::span<R> decoded;        ///< ĥ, then the new error before quantization.
    std::span<std::byte> inner;  ///< The inner codec's workspace.
    std::span<std::byte> fused;  ///< The fused step's workspace, where the inner codec fuses one.
    std::span<T> rounded;        ///< A 16-bit gradient's h rounded to its type, the inner codec's input.
  };

  static scratch carve(workspace_arena& arena, const loco_type& lc, const E& e, std::uint64_t n) {
    scratch s;
    s.compensated = arena.take<R>(static_cast<std::size_t>(n));
    s.decoded = arena.take<R>(static_cast<std::size_t>(n));
    s.inner = arena.take<std::byte>(lc.inner().workspace_bytes(e, n));
    if constexpr (half_precision<T>) s.rounded = arena.take<T>(static_cast<std::size_t>(n));
    if constexpr (fuses_loco<Codec, E>)
      if (fused(lc, e))
        s.fused = arena.take<std::byte>(fused_feedback<Codec, E>::loco_workspace_bytes(lc.inner(), e, n));
    return s;
  }

  static std::size_t workspace_bytes(const loco_type& lc, const E& e, std::uint64_t n) {
    workspace_arena arena = workspace_arena::measure();
    carve(arena, lc, e, n);
    return arena.bytes_needed();
  }

  static state_type make_state(const loco_type& lc, const E&, std::uint64_t n) {
    return state_type{std::vector<std::int8_t>(static_cast<std::size_t>(n), std::int8_t{0}),
                      std::vector<R>(static_cast<std::size_t>(lc.group_count(n)), R{0}), 0, 0};
  }

  static std::size_t encode(const loco_type& lc, const E& e, std::span<const T> grad, state_type& state,
                            std::span<std::byte> out, std::span<std::byte> ws, message_key key) {
    const std::size_t n = grad.size();
    lc.require_state_shape(state, n, "gradient");
    workspace_arena arena(ws);
    const scratch s = carve(arena, lc, e, n);
    const bool reset = state.steps >= lc.params().reset_period;
    if constexpr (fuses_loco<Codec, E>) {
      if (fused(lc, e)) {
        const loco_operands<T> step{grad, state.codes, state.scales, reset, static_cast<T>(lc.params().beta)};
        if (const std::optional<std::size_t> bytes =
                fused_feedback<Codec, E>::encode_with_loco(lc.inner(), e, step, out, s.fused, key)) {
          state.steps = reset ? 1 : state.steps + 1;
          ++state.total_steps;
          return *bytes;
        }
      }
    }
    // docs/feedback.md §8, step by step.
    const std::size_t group = lc.params().error_group;
    const T* const g = grad.data();
    const std::int8_t* const codes = state.codes.data();
    const R* const scales = state.scales.data();
    R* const h = s.compensated.data();

    // NaN or ±Inf in g makes h NaN or ±Inf too, so testing h alone also catches an overflow of g + e.
    std::size_t non_finite = 0;
    for (std::size_t i = 0; i < n; ++i) {
      h[i] = widen(g[i]) + (reset ? R{0} : dequant(codes[i], scales[i / group]));
      non_finite += static_cast<std::size_t>(!is_finite(h[i]));
    }
    detail::require(non_finite == 0, errc::non_finite_input, [&] {
      return std::to_string(non_finite) + " of " + std::to_string(n) +
             " values of gradient + error are NaN or Inf; the state is unchanged";
    });

    // The inner codec codes h and decodes its own message, as every receiver will.
    const std::size_t bytes = detail::reference::encode_compensated(lc.inner(), e, std::span<const R>(h, n), s.rounded,
                                                                    out, s.decoded, s.inner, key);

    // v = β·dequant8(e) + (1 − β)·(h − ĥ), written over ĥ.
    const auto beta = static_cast<R>(lc.params().beta);
    const R keep = R{1} - beta;
    R* const v = s.decoded.data();
    for (std::size_t i = 0; i < n; ++i) {
      const R old = reset ? R{0} : dequant(codes[i], scales[i / group]);
      v[i] = loco_blend(old, h[i], v[i], beta, keep);
      non_finite += static_cast<std::size_t>(!is_finite(v[i]));
    }
    // The inner message is already in `out`; do not leave it passing for a sent step.
    if (non_finite != 0) std::memset(out.data(), 0, envelope::size);
    detail::require(non_finite == 0, errc::non_finite_input, [&] {
      return std::to_string(non_finite) + " of " + std::to_string(n) +
             " values of the new compensation error are NaN or Inf; the state is unchanged";
    });

    quantize_error(lc, std::span<const R>(v, n), state);
    state.steps = reset ? 1 : state.steps + 1;
    ++state.total_steps;
    return bytes;
  }

  static std::size_t save_state(const loco_type& lc, const E&, const state_type& state, std::span<std::byte> bytes) {
    const std::uint64_t n = state.codes.size();
    lc.require_state_shape(state, static_cast<std::size_t>(n), "state");
    return lc.write_saved_state(n, state.steps, state.total_steps, bytes, [&](std::byte* codes, std::byte* scales) {
      std::ranges::copy(std::as_bytes(std::span<const std::int8_t>(state.codes)), codes);
      std::ranges::copy(std::as_bytes(std::span<const R>(state.scales)), scales);
    });
  }

  static void load_state(const loco_type& lc, const E&, std::span<const std::byte> bytes, state_type& state) {
    const auto saved = lc.check_saved_state(bytes, state.codes.size(), state.scales.size());
    std::ranges::copy(saved.codes, std::as_writable_bytes(std::span<std::int8_t>(state.codes)).begin());
    std::ranges::copy(saved.scales, std::as_writable_bytes(std::span<R>(state.scales)).begin());
    state.steps = saved.steps;
    state.total_steps = saved.total_steps;
  }

  static void carried_error(const loco_type& lc, const E&, const state_type& state, std::span<R> out) {
    lc.require_state_shape(state, out.size(), "output");
    const std::size_t group = lc.params().error_group;
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = dequant(state.codes[i], state.scales[i / group]);
  }

  static void set_carried_error(const loco_type& lc, const E&, std::span<const R> error, state_type& state) {
    lc.require_state_shape(state, error.size(), "error");
    const auto non_finite =
        static_cast<std::size_t>(std::count_if(error.begin(), error.end(), [](R x) { return !is_finite(x); }));
    detail::require(non_finite == 0, errc::non_finite_input, [&] {
      return std::to_string(non_finite) + " values of the new carried error are NaN or Inf; the state is unchanged";
    });
    quantize_error(lc, error, state);
  }

 private:
  /// Whether the inner codec's backend fuses this step with these parameters.
  static bool fused(const loco_type& lc, const E& e) {
    if constexpr (fuses_loco<Codec, E>)
      return fused_feedback<Codec, E>::fuses_loco(lc.inner(), e, lc.params().error_group);
    else
      return false;
  }

  /// quant8 of the new error `v`, group by group, straight into the state's codes and scales.
  static void quantize_error(const loco_type& lc, std::span<const R> v, state_type& state) noexcept {
    const std::size_t n = v.size(), group = lc.params().error_group;
    std::int8_t* const new_codes = state.codes.data();
    R* const new_scales = state.scales.data();
    for (std::size_t begin = 0, j = 0; begin < n; begin += group, ++j) {
      const std::size_t end = std::min(n, begin + group);
      typename float_traits<R>::bits_type largest = 0;
      for (std::size_t i = begin; i < end; ++i) largest = std::max(largest, magnitude_key(v[i]));
      const R step = uniform_step(from_bits<R>(largest), error_bits);
      new_scales[j] = step;
      for (std::size_t i = begin; i < end; ++i) new_codes[i] = loco_error_code(v[i], step);
    }
  }

  /// dequant8 of one element.
  [[nodiscard]] static R dequant(std::int8_t code, R scale) noexcept { return mul_rn(static_cast<R>(code), scale); }
};

}  // namespace gradcomp
