#pragma once
/// @file
/// LoCo (Xie et al. 2024): low-bit communication with a moving average of compensation errors,
/// around any codec (docs/feedback.md §8).
///
/// State: the compensation error e, stored 8-bit (one int8 code per element and one scale per
/// group of `error_group` elements, about one byte per element), and the step count t since the
/// last reset. One step, with β = `beta` and T = `reset_period`:
///
///     if t ≥ T: e ← 0, t ← 0
///     h = g + dequant8(e);   q = C(h) (the inner codec's message);   ĥ = D(q)
///     e ← quant8( β·dequant8(e) + (1 − β)·(h − ĥ) );   t ← t + 1;   send q
///
/// β weighs the old error (the reference's convention, DeepSpeed `err_beta`). quant8 is the
/// symmetric 8-bit arithmetic of quantize/uniform_math.hpp: per group, s = max|v| / 127
/// (`uniform_step`), code = clamp(round_half_even(v / s), −127, 127) (`uniform_level`), s = 0 and
/// codes 0 for a group of zeros; dequant8 is code·s. The messages are the inner codec's own
/// (same codec id, envelope and parameter hash), so any rank decodes them with the inner codec.
///
/// Summed over steps, (1 − β)·Σ_t (D(q_t) − g_t) = −(e_T − e_0) up to the 8-bit rounding of e, so
/// the decoded messages track the gradients within a bounded error, like error feedback.
///
/// Special values: a step whose gradient, compensated gradient h (g + e may overflow) or new error
/// holds NaN or ±Inf is rejected with `errc::non_finite_input`. A failed step, whatever the
/// reason, leaves the state (e, t, total) bit-identical; a reset due at that step is not done.
///
/// Saved state (`save_state`, `load_state`; integers little-endian, no padding; G = error_group,
/// m = ⌈n/G⌉):
///
/// | Offset | Size | Field |
/// |---:|---:|---|
/// | 0 | 4 | magic "GCLC" |
/// | 4 | 2 | format version (1) |
/// | 6 | 2 | inner `codec_id` |
/// | 8 | 1 | `value_dtype` |
/// | 9 | 8 | element count n |
/// | 17 | 8 | steps since the last reset t |
/// | 25 | 8 | steps taken in all |
/// | 33 | 8 | inner `params_hash()` |
/// | 41 | 4 | β (float32) |
/// | 45 | 4 | reset period T |
/// | 49 | 4 | error group G |
/// | 53 | 4 | CRC-32C of bytes 0..52 |
/// | 57 | n | error codes (int8) |
/// | 57 + n | m·sizeof(R) | error scales (R = `compute_type<T>`: float32 for a bf16 or fp16 gradient) |
/// | 57 + n + m·sizeof(R) | 4 | CRC-32C of the codes and scales |
///
/// `load_state` checks, in this order, and throws the named `errc` before touching the state:
/// length of the header (`truncated`), magic (`bad_magic`), version (`unsupported_version`),
/// header CRC (`header_checksum`), codec (`codec_mismatch`), dtype (`dtype_mismatch`), n against
/// the state's size (`size_mismatch`), inner parameter hash and β, T, G (`parameter_mismatch`),
/// the state's scale count (`size_mismatch`), total length (`truncated`, `trailing_bytes`), payload
/// CRC (`payload_checksum`), codes in [−127, 127] and scales finite and ≥ 0 (`malformed_payload`).

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <gradcomp/core/backend.hpp>
#include <gradcomp/feedback/feedback_interface.hpp>
#include <gradcomp/core/concepts.hpp>
#include <gradcomp/core/config.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/float_bits.hpp>
#include <gradcomp/core/saved_state.hpp>
#include <gradcomp/core/rounded_product.hpp>
#include <gradcomp/core/wire_envelope.hpp>
#include <gradcomp/quantize/uniform_math.hpp>

namespace gradcomp {

/// Parameters of LoCo (defaults: the reference's).
struct loco_params {
  float beta = 0.8f;                 ///< Weight of the old error in the moving average, in [0, 1).
  std::uint32_t reset_period = 1024; ///< The error is zeroed before the step once t reaches this (≥ 1).
  std::uint32_t error_group = 256;   ///< Elements per scale of the stored 8-bit error (≥ 1).

  /// Throws `invalid_argument` for β outside [0, 1) (NaN included), a zero period or group.
  void validate() const {
    detail::require(beta >= 0.0f && beta < 1.0f, errc::invalid_argument,
                    [&] { return "beta must lie in [0, 1), got " + std::to_string(beta); });
    detail::require(reset_period >= 1, errc::invalid_argument, "reset_period must be at least 1");
    detail::require(error_group >= 1, errc::invalid_argument, "error_group must hold at least one value");
  }

  friend constexpr bool operator==(const loco_params&, const loco_params&) = default;
};

/// LoCo's new error of one element before quantization, v = β·old + (1 − β)·(h − ĥ) with
/// keep = 1 − β, each product rounded on its own under any compiler flags (host and device).
template <class T>
GRADCOMP_HOST_DEVICE inline T loco_blend(T old, T h, T decoded, T beta, T keep) noexcept {
  return mul_rn(beta, old) + mul_rn(keep, h - decoded);
}

/// quant8's code of one error value v under its group's step s: round_half_even(v / s) clamped to
/// [−127, 127], and 0 when s = 0 (a group of zeros), host and device.
template <class T>
GRADCOMP_HOST_DEVICE inline std::int8_t loco_error_code(T v, T s) noexcept {
  return s == T{0} ? std::int8_t{0} : static_cast<std::int8_t>(uniform_level(v / s, 8, rounding::nearest_even, T{0}));
}

/// State of LoCo for one tensor, in host memory: the 8-bit compensation error and step counters.
template <gradient_value T>
struct loco_state {
  std::vector<std::int8_t> codes;  ///< Error codes in [−127, 127], one per element.
  std::vector<T> scales;           ///< Error scales, one per group of `error_group` elements.
  std::uint64_t steps = 0;         ///< Steps since the last reset (t).
  std::uint64_t total_steps = 0;   ///< Steps completed in all.
};

/// The header of a saved LoCo state, field by field (the table in this file's comment), after the
/// frame's (core/saved_state.hpp).
struct loco_saved_format : detail::saved_state_frame {
  static constexpr std::uint32_t magic = 0x434C4347u;  ///< "GCLC" as a little-endian word.
  static constexpr std::uint16_t version = 1;          ///< The version this build writes and reads.
  static constexpr detail::state_field<std::uint64_t> steps =
      count.then<std::uint64_t>();  ///< t, since the last reset.
  static constexpr detail::state_field<std::uint64_t> total_steps = steps.then<std::uint64_t>();  ///< Steps in all.
  static constexpr detail::state_field<std::uint64_t> inner_hash =
      total_steps.then<std::uint64_t>();  ///< Inner codec's.
  static constexpr detail::state_field<std::uint32_t> beta = inner_hash.then<std::uint32_t>();  ///< β's float32 bits.
  static constexpr detail::state_field<std::uint32_t> reset_period = beta.then<std::uint32_t>();  ///< T.
  static constexpr detail::state_field<std::uint32_t> error_group = reset_period.then<std::uint32_t>();  ///< G.
  static constexpr std::size_t header_crc_offset = error_group.end();  ///< The header CRC; it covers bytes before.
  static constexpr std::size_t header_bytes = header_crc_offset + checksum_bytes;  ///< Header size, its CRC included.
};
static_assert(loco_saved_format::header_bytes == 57, "the table in this file's comment");

/// LoCo around `Codec`: encodes the gradient plus the stored compensation error, and folds what
/// the codec dropped into that error as a moving average.
template <class Codec>
class loco : public feedback_interface<loco<Codec>, Codec, loco_state<compute_type<typename Codec::value_type>>> {
  using base = feedback_interface<loco<Codec>, Codec, loco_state<compute_type<typename Codec::value_type>>>;

 public:
  using typename base::error_type;
  using typename base::value_type;

  /// LoCo around `inner`. @throws error `invalid_argument` for invalid parameters.
  explicit loco(Codec inner = Codec{}, loco_params params = {}) : base(std::move(inner)), params_(params) {
    params_.validate();
  }
  /// The parameters.
  [[nodiscard]] const loco_params& params() const noexcept { return params_; }
  /// Number of error groups (and scales) of an n-element tensor.
  [[nodiscard]] std::uint64_t group_count(std::uint64_t n) const noexcept {
    return n / params_.error_group + (n % params_.error_group != 0 ? 1 : 0);
  }
  /// Bytes of state per element: (n + ⌈n/G⌉·sizeof(R)) / n, 0 for n = 0 (R = `error_type`).
  [[nodiscard]] double state_bytes_per_element(std::uint64_t n) const noexcept {
    if (n == 0) return 0.0;
    return static_cast<double>(n + group_count(n) * sizeof(error_type)) / static_cast<double>(n);
  }
  /// Size of a saved state of n elements (format in this file's comment; `load_state` checks it in
  /// the order given there).
  [[nodiscard]] std::size_t saved_state_bytes(std::uint64_t n) const noexcept {
    return loco_saved_format::header_bytes + static_cast<std::size_t>(n + group_count(n) * sizeof(error_type)) +
           loco_saved_format::checksum_bytes;
  }

  /// Writes a saved state of n elements into `bytes` (every backend's `save_state`): the header
  /// with `steps` (t) and `total_steps`, then `copy_error(codes_at, scales_at)` copies the n error
  /// codes and ⌈n/G⌉ scales, then the CRCs. @returns bytes written. @throws error `buffer_too_small`.
  template <class CopyError>
  std::size_t write_saved_state(std::uint64_t n, std::uint64_t steps, std::uint64_t total_steps,
                                std::span<std::byte> bytes, CopyError&& copy_error) const {
    using format = loco_saved_format;
    const std::size_t size = saved_state_bytes(n);
    detail::require_state_room(bytes, size);
    std::byte* const p = bytes.data();
    detail::write_state_head<format>(p, Codec::id, dtype_of<value_type>, n);
    format::steps.store(p, steps);
    format::total_steps.store(p, total_steps);
    format::inner_hash.store(p, this->params_hash());
    format::beta.store(p, std::bit_cast<std::uint32_t>(params_.beta));
    format::reset_period.store(p, params_.reset_period);
    format::error_group.store(p, params_.error_group);
    std::byte* const codes = p + format::header_bytes;
    copy_error(codes, codes + n);
    detail::seal_state<format>(p, static_cast<std::size_t>(n + group_count(n) * sizeof(error_type)));
    return size;
  }

  /// Checks that `state` (on any executor) holds n error codes and ⌈n/G⌉ error scales: `what` (the
  /// gradient, an output, the state itself) has n elements. @throws error `size_mismatch`.
  template <class State>
  void require_state_shape(const State& state, std::uint64_t n, const char* what) const {
    detail::require(state.codes.size() == n, errc::size_mismatch, [&] {
      return std::string(what) + " has " + std::to_string(n) + " elements, the state " +
             std::to_string(state.codes.size());
    });
    detail::require(state.scales.size() == group_count(n), errc::size_mismatch, [&] {
      return "state holds " + std::to_string(state.scales.size()) + " error scales, " + std::to_string(n) +
             " elements in groups of " + std::to_string(params_.error_group) + " need " +
             std::to_string(group_count(n));
    });
  }

  /// A saved state checked for a state of n elements.
  struct saved_state_view {
    std::uint64_t steps;  ///< Steps since the last reset (t).
    std::uint64_t total_steps;  ///< Steps taken in all.
    std::span<const std::byte> codes;  ///< The n error codes.
    std::span<const std::byte> scales;  ///< The ⌈n/G⌉ error scales' bytes.
  };
  /// Checks saved bytes for a state of n elements holding `state_scales` error scales, in the order
  /// of this file's comment, codes and scales included (every backend's `load_state`, before it
  /// touches the state). @throws error as listed there.
  [[nodiscard]] saved_state_view check_saved_state(std::span<const std::byte> bytes, std::uint64_t n,
                                                   std::uint64_t state_scales) const {
    using format = loco_saved_format;
    const std::uint64_t saved_n = detail::check_state_head<format>(bytes, Codec::id, dtype_of<value_type>, "GCLC");
    const std::byte* const p = bytes.data();
    detail::require(saved_n == n, errc::size_mismatch, [&] {
      return "saved state has " + std::to_string(saved_n) + " elements, the state " + std::to_string(n);
    });
    detail::require(format::inner_hash.load(p) == this->params_hash(), errc::parameter_mismatch,
                    "inner codec parameters (hash) differ between the saved state and this codec");
    const loco_params saved{std::bit_cast<float>(format::beta.load(p)), format::reset_period.load(p),
                            format::error_group.load(p)};
    detail::require(std::bit_cast<std::uint32_t>(saved.beta) == std::bit_cast<std::uint32_t>(params_.beta) &&
                        saved.reset_period == params_.reset_period && saved.error_group == params_.error_group,
                    errc::parameter_mismatch, [&] {
                      return "state saved with beta " + std::to_string(saved.beta) + ", reset_period " +
                             std::to_string(saved.reset_period) + ", error_group " + std::to_string(saved.error_group) +
                             "; this wrapper has beta " + std::to_string(params_.beta) + ", reset_period " +
                             std::to_string(params_.reset_period) + ", error_group " +
                             std::to_string(params_.error_group);
                    });
    detail::require(state_scales == group_count(n), errc::size_mismatch, [&] {
      return "state holds " + std::to_string(state_scales) + " error scales, " + std::to_string(n) +
             " elements in groups of " + std::to_string(params_.error_group) + " need " +
             std::to_string(group_count(n));
    });
    const std::size_t code_bytes = static_cast<std::size_t>(n);
    const std::size_t scale_count = static_cast<std::size_t>(group_count(n));
    const std::span<const std::byte> payload =
        detail::check_state_body<format>(bytes, code_bytes + scale_count * sizeof(error_type));
    bool valid = true;
    for (std::size_t i = 0; i < code_bytes; ++i)
      valid &= static_cast<std::int8_t>(std::to_integer<std::uint8_t>(payload[i])) != std::int8_t{-128};
    detail::require(valid, errc::malformed_payload, "a saved error code is -128, outside [-127, 127]");
    const std::span<const std::byte> scales = payload.subspan(code_bytes);
    for (std::size_t j = 0; j < scale_count; ++j) {
      error_type scale;
      std::memcpy(&scale, scales.data() + j * sizeof(error_type), sizeof scale);
      valid &= (to_bits(scale) >> (sizeof(error_type) * 8 - 1)) == 0 && is_finite(scale * error_type{127});
    }
    detail::require(valid, errc::malformed_payload, "a saved error scale is negative, NaN, Inf or too large");
    return {format::steps.load(p), format::total_steps.load(p), payload.first(code_bytes), scales};
  }

 private:
  loco_params params_;
};

}  // namespace gradcomp

#include <gradcomp/reference/loco.hpp>
