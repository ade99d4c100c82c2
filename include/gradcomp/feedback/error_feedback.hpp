#pragma once
/// @file
/// Classic error feedback (EF) around any codec.
///
/// State: a residual e of n values (zeros at first) and a step counter. One step sends
/// C(g + e) and keeps what the codec dropped: with a = g + e, the message is C(a) and
/// e ← a − D(C(a)). Summed over steps, Σ_t D(C(a_t)) + e_T = Σ_t g_t up to rounding, so nothing
/// the codec drops is lost, only delayed. The messages are the inner codec's own (same codec id,
/// envelope and parameter hash), so any rank decodes them with the inner codec.
///
/// Special values: a step whose gradient, or compensated gradient a (g + e may overflow), holds
/// NaN or ±Inf is rejected with `errc::non_finite_input` before the inner codec runs. A failed
/// step, whatever the reason, leaves the state bit-identical.
///
/// Saved state (`save_state`, `load_state`; integers little-endian, no padding):
///
/// | Offset | Size | Field |
/// |---:|---:|---|
/// | 0 | 4 | magic "GCEF" |
/// | 4 | 2 | format version (1) |
/// | 6 | 2 | inner `codec_id` |
/// | 8 | 1 | `value_dtype` |
/// | 9 | 8 | element count n |
/// | 17 | 8 | steps taken |
/// | 25 | 8 | inner `params_hash()` |
/// | 33 | 4 | CRC-32C of bytes 0..32 |
/// | 37 | n·sizeof(T) | residual values |
/// | 37 + n·sizeof(T) | 4 | CRC-32C of the residual values |
///
/// `load_state` checks, in this order, and throws the named `errc` before touching the state:
/// length of the header (`truncated`), magic (`bad_magic`), version (`unsupported_version`),
/// header CRC (`header_checksum`), codec (`codec_mismatch`), dtype (`dtype_mismatch`), n against
/// the state's size (`size_mismatch`), parameter hash (`parameter_mismatch`), total length
/// (`truncated`, `trailing_bytes`), values CRC (`payload_checksum`).

#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include <gradcomp/core/backend.hpp>
#include <gradcomp/core/concepts.hpp>
#include <gradcomp/core/float_bits.hpp>
#include <gradcomp/core/wire_envelope.hpp>

namespace gradcomp {

/// State of error feedback for one tensor, in host memory.
template <gradient_value T>
struct error_feedback_state {
  std::vector<T> residual;  ///< What the codec has not sent yet, one value per element.
  std::uint64_t steps = 0;  ///< Steps completed.
};

/// Layout constants of a saved error-feedback state (see the table in this file's comment).
struct error_feedback_saved_format {
  static constexpr std::uint32_t magic = 0x46454347u;   ///< "GCEF" as a little-endian word.
  static constexpr std::uint16_t version = 1;           ///< The version this build writes and reads.
  static constexpr std::size_t header_crc_offset = 33;  ///< Where the header CRC lies; it covers bytes before.
  static constexpr std::size_t header_bytes = 37;       ///< Header size, its CRC included.
  static constexpr std::size_t checksum_bytes = 4;      ///< Size of the trailing CRC of the values.
};

/// Error feedback around `Codec`: encodes the gradient plus the carried residual, and carries what
/// the codec dropped into the next step.
template <class Codec>
class error_feedback {
  static_assert(codec<Codec>, "error_feedback<Codec> wraps a gradcomp codec: Codec must model gradcomp::codec");

 public:
  using value_type = typename Codec::value_type;          ///< Element type of the gradient.
  using state_type = error_feedback_state<value_type>;    ///< The residual and step counter.
  static constexpr codec_id id = Codec::id;               ///< Messages are the inner codec's.

  /// Error feedback around `inner`.
  explicit error_feedback(Codec inner = Codec{}) : inner_(std::move(inner)) {}

  /// The wrapped codec; it decodes this wrapper's messages.
  [[nodiscard]] const Codec& inner() const noexcept { return inner_; }

  /// Largest message `encode` writes for n elements: the inner codec's bound.
  [[nodiscard]] std::size_t max_encoded_bytes(std::uint64_t n) const noexcept { return inner_.max_encoded_bytes(n); }
  /// The inner codec's parameter hash, carried in every message and in the saved state.
  [[nodiscard]] std::uint64_t params_hash() const noexcept { return inner_.params_hash(); }

  /// Workspace bytes that `encode` and `decode` need on executor `e` for n elements: the
  /// compensated gradient and its decoded message, plus the inner codec's workspace.
  template <executor E>
  [[nodiscard]] std::size_t workspace_bytes(const E& e, std::uint64_t n) const {
    return backend<error_feedback, E>::workspace_bytes(*this, e, n);
  }

  /// A fresh state for n elements: zero residual, zero steps.
  template <executor E>
  [[nodiscard]] state_type make_state(const E& e, std::uint64_t n) const {
    return backend<error_feedback, E>::make_state(*this, e, n);
  }

  /// One EF step: encodes a = `grad` + residual into `out` (at least `max_encoded_bytes(n)` bytes)
  /// with the inner codec, then sets the residual to a − decode(message) and counts the step.
  /// `ws` holds at least `workspace_bytes(e, n)` bytes. On error the state is unchanged.
  /// @returns bytes written.
  /// @throws error `size_mismatch` (grad and state differ in size), `non_finite_input` (NaN or ±Inf
  ///         in grad or in grad + residual), `workspace_too_small`, or whatever the inner codec throws.
  template <executor E>
  std::size_t encode(const E& e, std::span<const value_type> grad, state_type& state, std::span<std::byte> out,
                     std::span<std::byte> ws, message_key key = {}) const {
    return backend<error_feedback, E>::encode(*this, e, grad, state, out, ws, key);
  }

  /// Decodes a message (the inner codec's) into `out`; on error `out` is untouched.
  /// @throws error naming what is wrong with the message.
  template <executor E>
  void decode(const E& e, std::span<const std::byte> message, std::span<value_type> out, std::span<std::byte> ws,
              decode_limits limits = {}) const {
    inner_.decode(e, message, out, ws, limits);
  }

  /// Adds a decoded message (the inner codec's) into `acc`; on error `acc` is untouched.
  /// @throws error naming what is wrong with the message.
  template <executor E>
  void decode_accumulate(const E& e, std::span<const std::byte> message, std::span<value_type> acc,
                         std::span<std::byte> ws, decode_limits limits = {}) const {
    inner_.decode_accumulate(e, message, acc, ws, limits);
  }

  /// Size of a saved state of n elements.
  [[nodiscard]] static constexpr std::size_t saved_state_bytes(std::uint64_t n) noexcept {
    return error_feedback_saved_format::header_bytes + static_cast<std::size_t>(n) * sizeof(value_type) +
           error_feedback_saved_format::checksum_bytes;
  }

  /// Writes `state` into `bytes` (at least `saved_state_bytes(n)` of them) in the format above.
  /// @returns bytes written. @throws error `buffer_too_small`.
  template <executor E>
  std::size_t save_state(const E& e, const state_type& state, std::span<std::byte> bytes) const {
    return backend<error_feedback, E>::save_state(*this, e, state, bytes);
  }

  /// Restores `state` (made by `make_state` for the saved n) from exactly the bytes `save_state`
  /// wrote. Everything is validated first; on error `state` is untouched.
  /// @throws error `truncated`, `trailing_bytes`, `bad_magic`, `unsupported_version`,
  ///         `header_checksum`, `codec_mismatch`, `dtype_mismatch`, `size_mismatch`,
  ///         `parameter_mismatch`, `payload_checksum`, in the order of this file's comment.
  template <executor E>
  void load_state(const E& e, std::span<const std::byte> bytes, state_type& state) const {
    backend<error_feedback, E>::load_state(*this, e, bytes, state);
  }

 private:
  Codec inner_;
};

}  // namespace gradcomp

#include <gradcomp/cpu/error_feedback.hpp>
