#pragma once
/// @file
/// Error feedback (EF) around any codec, with an optional decay of the residual.
///
/// State: a residual e of n values (zeros at first) and a step counter. One step sends
/// C(g + e) and keeps what the codec dropped, scaled by the decay β ∈ (0, 1]: with a = g + e, the
/// message is C(a) and e ← fl(β · (a − D(C(a)))), the product rounded on its own (no compiler flag
/// fuses it, core/rounded_product.hpp); β = 1 (the default) is classic error feedback,
/// e ← a − D(C(a)), and skips the multiply. With β = 1, Σ_t D(C(a_t)) + e_T = Σ_t g_t up to
/// rounding, so nothing the codec drops is lost, only delayed; with β < 1 the residual forgets
/// (1 − β) of itself each step, which helps sparsifiers under Adam (docs/feedback.md §1, §7, §10).
/// The messages are the inner codec's own (same codec id, envelope and parameter hash, whatever β),
/// so any rank decodes them with the inner codec.
///
/// Special values: a step whose gradient, or compensated gradient a (g + e may overflow), holds
/// NaN or ±Inf is rejected with `errc::non_finite_input`, and so is a step whose new residual
/// would not be finite. A failed step, whatever the reason, leaves the state bit-identical.
///
/// Saved state (`save_state`, `load_state`; integers little-endian, no padding):
///
/// | Offset | Size | Field |
/// |---:|---:|---|
/// | 0 | 4 | magic "GCEF" |
/// | 4 | 2 | format version (1) |
/// | 6 | 2 | inner `codec_id` |
/// | 8 | 1 | `value_dtype` of the gradient |
/// | 9 | 8 | element count n |
/// | 17 | 8 | steps taken |
/// | 25 | 8 | state hash: the inner `params_hash()`; with β ≠ 1, `params_hasher` of that hash and β as R |
/// | 33 | 4 | CRC-32C of bytes 0..32 |
/// | 37 | n·sizeof(R) | residual values |
/// | 37 + n·sizeof(R) | 4 | CRC-32C of the residual values |
///
/// R is the residual's type, `compute_type<T>`: the gradient's type for float and double, float32
/// for a bf16 or fp16 gradient, whose residual is mostly below the 16-bit type's resolution
/// (docs/half-precision.md §5); the dtype byte names the gradient's type.
///
/// `load_state` checks, in this order, and throws the named `errc` before touching the state:
/// length of the header (`truncated`), magic (`bad_magic`), version (`unsupported_version`),
/// header CRC (`header_checksum`), codec (`codec_mismatch`), dtype (`dtype_mismatch`), n against
/// the state's size (`size_mismatch`), state hash: parameters or decay (`parameter_mismatch`), total
/// length (`truncated`, `trailing_bytes`), values CRC (`payload_checksum`), every residual value
/// finite (`malformed_payload`: a NaN or ±Inf residual would make every later step of the tensor
/// fail). A state saved with β = 1 has the bytes of the format before the decay existed.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <gradcomp/core/backend.hpp>
#include <gradcomp/feedback/feedback_interface.hpp>
#include <gradcomp/feedback/step_rollback.hpp>
#include <gradcomp/core/concepts.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/config.hpp>
#include <gradcomp/core/float_bits.hpp>
#include <gradcomp/core/rounded_product.hpp>
#include <gradcomp/core/saved_state.hpp>
#include <gradcomp/core/wire_envelope.hpp>

namespace gradcomp {

/// Parameters of error feedback (docs/feedback.md §1, §7).
struct error_feedback_params {
  /// β: the new residual is β·(a − D(C(a))), rounded to the value type once. In (0, 1]; 1 (the
  /// default) is classic error feedback. 0.9 beat 1 for top-k under Adam (docs/feedback.md §10).
  double decay = 1.0;

  friend constexpr bool operator==(const error_feedback_params&, const error_feedback_params&) = default;
};

/// Error feedback's new residual of one element, a = g + e and d its decoding: fl(β·(a − d)), the
/// product rounded on its own under any compiler flags, or a − d when β = 1 (host and device).
template <class T>
GRADCOMP_HOST_DEVICE inline T decayed_residual(T beta, T a, T d) noexcept {
  const T r = a - d;
  return beta == T{1} ? r : mul_rn(beta, r);
}

/// State of error feedback for one tensor, in host memory. A step writes the new residual into
/// `next` and exchanges the two vectors when it succeeds, so a step that fails part-way leaves
/// `residual` as it was without a pass that checks the gradient first (the CUDA state does the
/// same).
template <gradient_value T>
struct error_feedback_state {
  std::vector<T> residual;  ///< What the codec has not sent yet, one value per element.
  std::vector<T> next;      ///< Where a step writes the new residual (n values; contents unspecified).
  std::uint64_t steps = 0;  ///< Steps completed.
};

/// Undoes a step of error feedback without a copy: a step that succeeds leaves the previous
/// residual in `next` and adds one to `steps`, and a step that fails changes neither.
template <gradient_value T>
class step_rollback<error_feedback_state<T>> : public exchanging_rollback<error_feedback_state<T>> {
 public:
  using exchanging_rollback<error_feedback_state<T>>::exchanging_rollback;
};

/// The header of a saved error-feedback state, field by field (the table in this file's comment),
/// after the frame's (core/saved_state.hpp).
struct error_feedback_saved_format : detail::saved_state_frame {
  static constexpr std::uint32_t magic = 0x46454347u;  ///< "GCEF" as a little-endian word.
  static constexpr std::uint16_t version = 1;          ///< The version this build writes and reads.
  static constexpr detail::state_field<std::uint64_t> steps = count.then<std::uint64_t>();  ///< Steps taken.
  static constexpr detail::state_field<std::uint64_t> state_hash =
      steps.then<std::uint64_t>();  ///< See `state_hash()`.
  static constexpr std::size_t header_crc_offset = state_hash.end();  ///< The header CRC; it covers bytes before.
  static constexpr std::size_t header_bytes = header_crc_offset + checksum_bytes;  ///< Header size, its CRC included.
};
static_assert(error_feedback_saved_format::header_bytes == 37, "the table in this file's comment");

/// Error feedback around `Codec`: encodes the gradient plus the carried residual, and carries what
/// the codec dropped, times the decay β, into the next step. Entry points: see
/// feedback/feedback_interface.hpp; `encode` sends C(g + e) and sets e ← fl(β·(g + e − D(C(g + e)))),
/// and throws `non_finite_input` for NaN or ±Inf in g or g + e with the state unchanged.
///
/// A bf16 or fp16 gradient keeps its residual in float32 (`error_type`): a = widen(g) + e in float32,
/// rounded to the 16-bit type (nearest even) for the inner codec, whose message is decoded into
/// float32; the new residual a − D(C(round(a))) keeps the rounding too, so nothing is lost.
template <class Codec>
class error_feedback : public feedback_interface<error_feedback<Codec>, Codec,
                                                 error_feedback_state<compute_type<typename Codec::value_type>>> {
  using base =
      feedback_interface<error_feedback<Codec>, Codec, error_feedback_state<compute_type<typename Codec::value_type>>>;

 public:
  using typename base::error_type;
  using typename base::value_type;

  /// Error feedback around `inner` with decay `params.decay`.
  /// @throws error `invalid_argument` unless 0 < decay ≤ 1 (NaN included) and decay rounded to
  /// `error_type` is still positive.
  explicit error_feedback(Codec inner = Codec{}, error_feedback_params params = {})
      : base(std::move(inner)), params_(params), decay_(checked_decay(params)) {}

  /// The parameters.
  [[nodiscard]] const error_feedback_params& params() const noexcept { return params_; }
  /// β rounded to `error_type`: what a step multiplies the new residual by.
  [[nodiscard]] error_type decay() const noexcept { return decay_; }

  /// What a saved state carries at offset 25 and `load_state` compares: the inner codec's
  /// `params_hash()` when β = 1 (the bytes of states saved before the decay existed), otherwise
  /// the `params_hasher` of that hash and β (as `error_type`). Messages keep the inner hash.
  [[nodiscard]] std::uint64_t state_hash() const noexcept {
    if (decay_ == error_type{1}) return this->params_hash();
    return params_hasher{}.add(this->params_hash()).add(decay_).value();
  }

  /// Checks that both residual buffers of `state` (on any executor) hold n values: `what` (the
  /// gradient, an output) has n elements. @throws error `size_mismatch`.
  template <class State>
  static void require_state_size(const State& state, std::uint64_t n, const char* what) {
    detail::require(state.residual.size() == n && state.next.size() == n, errc::size_mismatch, [&] {
      return std::string(what) + " has " + std::to_string(n) + " elements, the state " +
             std::to_string(state.residual.size()) + " (and " + std::to_string(state.next.size()) + " in next)";
    });
  }

  /// Size of a saved state of n elements (format in this file's comment; `load_state` checks it in
  /// the order given there).
  [[nodiscard]] static constexpr std::size_t saved_state_bytes(std::uint64_t n) noexcept {
    return error_feedback_saved_format::header_bytes + static_cast<std::size_t>(n) * sizeof(error_type) +
           error_feedback_saved_format::checksum_bytes;
  }

  /// Writes a saved state of n elements and `steps` steps into `bytes` (every backend's
  /// `save_state`): the header, then `copy_residual(at)` copies the n residual values to `at`, then
  /// the CRCs. @returns bytes written. @throws error `buffer_too_small`.
  template <class CopyResidual>
  std::size_t write_saved_state(std::uint64_t n, std::uint64_t steps, std::span<std::byte> bytes,
                                CopyResidual&& copy_residual) const {
    using format = error_feedback_saved_format;
    const std::size_t size = saved_state_bytes(n);
    detail::require_state_room(bytes, size);
    std::byte* const p = bytes.data();
    detail::write_state_head<format>(p, Codec::id, dtype_of<value_type>, n);
    format::steps.store(p, steps);
    format::state_hash.store(p, state_hash());
    copy_residual(p + format::header_bytes);
    detail::seal_state<format>(p, static_cast<std::size_t>(n) * sizeof(error_type));
    return size;
  }

  /// A saved state checked for a state of n elements.
  struct saved_state_view {
    std::uint64_t steps;  ///< Steps taken.
    std::span<const std::byte> residual;  ///< The n residual values' bytes.
  };
  /// Checks saved bytes for a state of n elements in the order of this file's comment (every
  /// backend's `load_state`, before it touches the state). @throws error as listed there.
  [[nodiscard]] saved_state_view check_saved_state(std::span<const std::byte> bytes, std::uint64_t n) const {
    using format = error_feedback_saved_format;
    const std::uint64_t saved_n = detail::check_state_head<format>(bytes, Codec::id, dtype_of<value_type>, "GCEF");
    detail::require(saved_n == n, errc::size_mismatch, [&] {
      return "saved state has " + std::to_string(saved_n) + " elements, the state " + std::to_string(n);
    });
    const std::byte* const p = bytes.data();
    detail::require(format::state_hash.load(p) == state_hash(), errc::parameter_mismatch,
                    "codec parameters or decay (state hash) differ between the saved state and this wrapper");
    const std::span<const std::byte> values =
        detail::check_state_body<format>(bytes, static_cast<std::size_t>(n) * sizeof(error_type));
    typename float_traits<error_type>::bits_type largest = 0;
    for (std::size_t i = 0; i < values.size(); i += sizeof(error_type)) {
      error_type v;
      std::memcpy(&v, values.data() + i, sizeof v);
      largest = std::max(largest, magnitude_key(v));
    }
    detail::require(largest < float_traits<error_type>::infinity_key, errc::malformed_payload,
                    "a saved residual value is NaN or Inf");
    return {format::steps.load(p), values};
  }

 private:
  /// β rounded to `error_type`. @throws error `invalid_argument` as the constructor says.
  static error_type checked_decay(const error_feedback_params& params) {
    detail::require(params.decay > 0.0 && params.decay <= 1.0, errc::invalid_argument,
                    [&] { return "error feedback's decay must lie in (0, 1], got " + std::to_string(params.decay); });
    const auto beta = static_cast<error_type>(params.decay);
    detail::require(beta > error_type{0}, errc::invalid_argument,
                    [&] { return "error feedback's decay " + std::to_string(params.decay) + " rounds to 0"; });
    return beta;
  }

  error_feedback_params params_;
  error_type decay_;
};

}  // namespace gradcomp

#include <gradcomp/reference/error_feedback.hpp>
