#pragma once
/// @file
/// The optional customisation point through which a codec's backend offers a fused step of error
/// feedback or LoCo: the compensated gradient, the codec's message and the new error in fewer
/// passes over memory than the wrappers' plain steps (encode h = g + e, decode the message, form
/// the error). The wrappers (feedback/error_feedback.hpp, feedback/loco.hpp) detect it with the
/// concepts below, call it when it exists and accepts the codec's parameters, and otherwise run
/// their plain steps; a fused step writes the same bytes and the same new state, bit for bit.
///
/// A codec backend opts in by specialising `fused_feedback<Codec, E>` next to its own backend
/// (for example cpu/uniform_feedback.hpp for the float32 uniform quantizer on the CPU).

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include <gradcomp/core/error.hpp>
#include <gradcomp/core/float_bits.hpp>
#include <gradcomp/core/wire_envelope.hpp>

namespace gradcomp {

/// The operands of one error-feedback step (feedback/error_feedback.hpp): the message is C(a) with
/// a = g + e, and the new residual fl(β·(a − D(C(a)))) goes to `next`, never to `residual`.
template <class T>
struct error_feedback_operands {
  std::span<const T> grad;      ///< g, n values.
  std::span<const T> residual;  ///< e, n values; read only.
  std::span<T> next;            ///< Receives the new residual, n values.
  T decay;                      ///< β in (0, 1].
};

/// The operands of one LoCo step (feedback/loco.hpp), its 8-bit error read and rewritten in place.
template <class T>
struct loco_operands {
  std::span<const T> grad;     ///< g, n values.
  std::span<std::int8_t> codes;  ///< The error's codes, n values: old in, new out.
  std::span<T> scales;         ///< The error's steps, one per error group: old in, new out.
  bool reset;                  ///< The old error reads as zero (a reset is due at this step).
  T beta;                      ///< β in [0, 1).
};

/// Specialised by a codec backend that fuses error feedback or LoCo into its encode on executor
/// E. The primary template is never defined; see the concepts for what a specialisation offers.
template <class Codec, class E>
struct fused_feedback;

/// `fused_feedback<Codec, E>` fuses an error-feedback step:
/// - `fuses_error_feedback(codec, e)`: whether it handles these parameters (otherwise the plain
///   step runs);
/// - `error_feedback_workspace_bytes(codec, e, n)`: its workspace;
/// - `encode_with_error_feedback(codec, e, step, out, ws, key)`: the message's size. It throws
///   `non_finite_input` when a = g + e holds NaN or ±Inf, and whatever it throws, `step.residual`
///   is unchanged.
template <class Codec, class E>
concept fuses_error_feedback = requires(const Codec& codec, const E& e, std::uint64_t n,
                                        const error_feedback_operands<typename Codec::value_type>& step,
                                        std::span<std::byte> bytes, message_key key) {
  { fused_feedback<Codec, E>::fuses_error_feedback(codec, e) } -> std::same_as<bool>;
  { fused_feedback<Codec, E>::error_feedback_workspace_bytes(codec, e, n) } -> std::same_as<std::size_t>;
  {
    fused_feedback<Codec, E>::encode_with_error_feedback(codec, e, step, bytes, bytes, key)
  } -> std::same_as<std::size_t>;
};

/// `fused_feedback<Codec, E>` fuses a LoCo step:
/// - `fuses_loco(codec, e, error_group)`: whether it handles these parameters;
/// - `loco_workspace_bytes(codec, e, n)`: its workspace;
/// - `encode_with_loco(codec, e, step, out, ws, key)`: the message's size, or nothing when the
///   values call for the plain step (it may decline, for example, where a fused pass could
///   overflow, or where g holds NaN or ±Inf, which the plain step then reports); then it has
///   written nothing to the state.
template <class Codec, class E>
concept fuses_loco =
    requires(const Codec& codec, const E& e, std::uint64_t n, std::size_t error_group,
             const loco_operands<typename Codec::value_type>& step, std::span<std::byte> bytes, message_key key) {
      { fused_feedback<Codec, E>::fuses_loco(codec, e, error_group) } -> std::same_as<bool>;
      { fused_feedback<Codec, E>::loco_workspace_bytes(codec, e, n) } -> std::same_as<std::size_t>;
      {
        fused_feedback<Codec, E>::encode_with_loco(codec, e, step, bytes, bytes, key)
      } -> std::same_as<std::optional<std::size_t>>;
    };

namespace detail {

/// Throws `non_finite_input` with the number of values of g + e that are NaN or ±Inf (NaN or ±Inf
/// in g, or a finite g whose sum with e overflows): error feedback's report, from any of its paths.
template <class T>
[[noreturn]] void fail_compensated_non_finite(std::span<const T> grad, std::span<const compute_type<T>> residual) {
  std::size_t non_finite = 0;
  for (std::size_t i = 0; i < grad.size(); ++i)
    non_finite += static_cast<std::size_t>(!is_finite(widen(grad[i]) + residual[i]));
  fail(errc::non_finite_input, std::to_string(non_finite) + " of " + std::to_string(grad.size()) +
                                   " values of gradient + residual are NaN or Inf; the state is unchanged");
}

}  // namespace detail

}  // namespace gradcomp
