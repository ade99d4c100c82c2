#pragma once
/// @file
/// Error feedback (feedback/error_feedback.hpp, docs/feedback.md §1) on a host executor: the
/// reference backend on `reference_executor`, whose inner codec runs its own reference backend,
/// and the CPU backend on `cpu_executor`, the same steps with the inner codec's CPU backend. A
/// step writes a = g + e into the state's `next` buffer and checks it; the inner codec encodes a
/// and decodes its own message; a last loop turns `next` into the new residual fl(β·(a − decoded))
/// (a − decoded when β = 1) and checks it; the two buffers are exchanged only then. Where the
/// inner codec's backend fuses the step (`fuses_error_feedback`, feedback/fused_step.hpp: the
/// float32 uniform quantizer on the CPU) and accepts its parameters, the fused step runs instead
/// and writes the same bytes and residual. A bf16 or fp16 gradient's step computes a in float32
/// (the residual's type R), rounds it to the 16-bit type for the inner codec in the workspace, and
/// decodes the message into float32.

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <gradcomp/core/backend.hpp>
#include <gradcomp/core/cpu_executor.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/float_bits.hpp>
#include <gradcomp/core/reference_executor.hpp>
#include <gradcomp/core/wire_envelope.hpp>
#include <gradcomp/core/workspace.hpp>
#include <gradcomp/feedback/error_feedback.hpp>
#include <gradcomp/feedback/fused_step.hpp>
#include <gradcomp/reference/values.hpp>

namespace gradcomp {

/// Error feedback around `Codec` on a host executor E (the reference, or the CPU).
template <class Codec, class E>
  requires(std::same_as<E, reference_executor> || std::same_as<E, cpu_executor>)
struct backend<error_feedback<Codec>, E> {
  using T = typename Codec::value_type;
  using R = compute_type<T>;  ///< The residual's type: float32 for a 16-bit gradient.
  using ef_type = error_feedback<Codec>;
  using state_type = error_feedback_state<R>;

  static std::size_t workspace_bytes(const ef_type& ef, const E& e, std::uint64_t n) {
    if constexpr (fuses_error_feedback<Codec, E>)
      if (fused(ef, e)) return fused_feedback<Codec, E>::error_feedback_workspace_bytes(ef.inner(), e, n);
    workspace_arena arena = workspace_arena::measure();
    (void)carve(arena, ef, e, n);
    return arena.bytes_needed();
  }

  static state_type make_state(const ef_type&, const E&, std::uint64_t n) {
    const auto size = static_cast<std::size_t>(n);
    return state_type{std::vector<R>(size, R{0}), std::vector<R>(size, R{0}), 0};
  }

  static std::size_t encode(const ef_type& ef, const E& e, std::span<const T> grad, state_type& state,
                            std::span<std::byte> out, std::span<std::byte> ws, message_key key) {
    const std::size_t n = grad.size();
    ef_type::require_state_size(state, n, "gradient");
    const std::size_t bytes =
        fused(ef, e) ? encode_fused(ef, e, grad, state, out, ws, key) : encode_plain(ef, e, grad, state, out, ws, key);
    std::swap(state.residual, state.next);
    ++state.steps;
    return bytes;
  }

  static std::size_t save_state(const ef_type& ef, const E&, const state_type& state, std::span<std::byte> bytes) {
    return ef.write_saved_state(state.residual.size(), state.steps, bytes, [&](std::byte* at) {
      std::ranges::copy(std::as_bytes(std::span<const R>(state.residual)), at);
    });
  }

  static void load_state(const ef_type& ef, const E&, std::span<const std::byte> bytes, state_type& state) {
    const auto saved = ef.check_saved_state(bytes, state.residual.size());
    std::ranges::copy(saved.residual, std::as_writable_bytes(std::span<R>(state.residual)).begin());
    state.steps = saved.steps;
  }

  static void carried_error(const ef_type&, const E&, const state_type& state, std::span<R> out) {
    ef_type::require_state_size(state, out.size(), "output");
    std::ranges::copy(state.residual, out.begin());
  }

  static void set_carried_error(const ef_type&, const E&, std::span<const R> error, state_type& state) {
    ef_type::require_state_size(state, error.size(), "error");
    const bool finite = std::ranges::all_of(error, [](R v) { return is_finite(v); });
    detail::require(finite, errc::non_finite_input, "the new carried error holds NaN or Inf; the state is unchanged");
    std::ranges::copy(error, state.residual.begin());
  }

 private:
  /// The plain step's workspace: the inner codec's decoding of its message, its workspace, and (a
  /// 16-bit gradient) a rounded to the gradient's type, the inner codec's input.
  struct scratch {
    std::span<R> decoded;
    std::span<std::byte> inner;
    std::span<T> rounded;
  };
  static scratch carve(workspace_arena& arena, const ef_type& ef, const E& e, std::uint64_t n) {
    scratch s;
    s.decoded = arena.take<R>(static_cast<std::size_t>(n));
    s.inner = arena.take<std::byte>(ef.inner().workspace_bytes(e, n));
    if constexpr (half_precision<T>) s.rounded = arena.take<T>(static_cast<std::size_t>(n));
    return s;
  }

  /// Whether the inner codec's backend fuses this step.
  static bool fused(const ef_type& ef, const E& e) {
    if constexpr (fuses_error_feedback<Codec, E>) return fused_feedback<Codec, E>::fuses_error_feedback(ef.inner(), e);
    else
      return false;
  }

  static std::size_t encode_fused(const ef_type& ef, const E& e, std::span<const T> grad, state_type& state,
                                  std::span<std::byte> out, std::span<std::byte> ws, message_key key) {
    if constexpr (fuses_error_feedback<Codec, E>) {
      const error_feedback_operands<T> step{grad, state.residual, state.next, ef.decay()};
      return fused_feedback<Codec, E>::encode_with_error_feedback(ef.inner(), e, step, out, ws, key);
    } else {
      return 0;  // not reached: `fused` is false
    }
  }

  /// docs/feedback.md §1, step by step.
  static std::size_t encode_plain(const ef_type& ef, const E& e, std::span<const T> grad, state_type& state,
                                  std::span<std::byte> out, std::span<std::byte> ws, message_key key) {
    const std::size_t n = grad.size();
    workspace_arena arena(ws);
    const scratch s = carve(arena, ef, e, n);
    // a = g + e, into `next` (in R: a 16-bit g widened); NaN or ±Inf in g, or an overflowing sum,
    // rejects the step.
    R* const a = state.next.data();
    bool finite = true;
    for (std::size_t i = 0; i < n; ++i) {
      a[i] = widen(grad[i]) + state.residual[i];
      finite = finite && is_finite(a[i]);
    }
    if (!finite) detail::fail_compensated_non_finite(grad, std::span<const R>(state.residual));

    // The message C(a), and its decoding D(C(a)) as every receiver will see it.
    const std::size_t bytes = detail::reference::encode_compensated(ef.inner(), e, std::span<const R>(a, n), s.rounded,
                                                                    out, s.decoded, s.inner, key);

    // The new residual fl(β·(a − D(C(a)))) over a; a − D(C(a)) when β = 1 (a loop of its own, so
    // that the compiler vectorises the subtraction).
    const R beta = ef.decay();
    std::size_t overflowed = 0;
    const auto new_residual = [&](auto residual_of) {
      for (std::size_t i = 0; i < n; ++i) {
        a[i] = residual_of(a[i], s.decoded[i]);
        overflowed += static_cast<std::size_t>(!is_finite(a[i]));
      }
    };
    if (beta == R{1}) new_residual([](R x, R d) { return x - d; });
    else
      new_residual([beta](R x, R d) { return decayed_residual(beta, x, d); });
    // The inner message is already in `out`; do not leave it passing for a sent step.
    if (overflowed != 0) std::memset(out.data(), 0, envelope::size);
    detail::require(overflowed == 0, errc::non_finite_input, [&] {
      return std::to_string(overflowed) + " of " + std::to_string(n) +
             " values of the new residual (g + e minus its decoding) are NaN or Inf; the state is unchanged";
    });
    return bytes;
  }
};

}  // namespace gradcomp
