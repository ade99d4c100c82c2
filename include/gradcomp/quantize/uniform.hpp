#pragma once
/// @file
/// Uniform b-bit quantization with one scale per block (docs/quantizers.md §1–§10).
///
/// Payload layout after the envelope (layout byte 0):
///
///     ⌈n/B⌉ scales s (float64 for double gradients, float32 for float, bf16 and fp16 ones), block j
///     covering elements [jB, jB + B)
///     ⌈n·b/8⌉ bytes of packed b-bit codes (core/bit_packing.hpp order), unused high bits zero
///
/// Codes and scales follow quantize/uniform_math.hpp; the message size depends only on n. A bf16 or
/// fp16 gradient is coded from its exact float32 widening, value by value inside the kernels (no
/// float32 copy of the gradient): its codes and scales are those of `uniform_quantizer<float>` on the
/// widened values, and only the envelope's dtype and the parameter hash differ. Its decoder writes
/// float32, or narrows to the 16-bit type (round to nearest even; a value beyond the type's range
/// is `narrowing_overflow`, nothing written): docs/half-precision.md. Policy
/// for special values: a block of zeros (either sign) has s = 0 and decodes to exact +0; a subnormal
/// block whose step s underflows to 0 decodes to zeros too (its values are below L·2^-149); a
/// gradient holding NaN or ±Inf is rejected with `errc::non_finite_input` and no valid message is
/// left in the output. Decoders reject scales that are negative, non-finite or too large to
/// decode finitely, codes above 2L, and non-zero padding bits.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include <gradcomp/core/bit_packing.hpp>
#include <gradcomp/core/codec_interface.hpp>
#include <gradcomp/core/cpu_executor.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/float_bits.hpp>
#include <gradcomp/core/wire_envelope.hpp>
#include <gradcomp/quantize/uniform_math.hpp>

namespace gradcomp {

/// Parameters of the uniform quantizer.
struct uniform_params {
  int bits = 8;                              ///< Bits per value: 1, 2, 4 or 8.
  std::uint32_t block = 256;                 ///< Values per scale (≥ 1); default 256.
  rounding round = rounding::nearest_even;   ///< Rounding of scaled values to levels.
  std::uint64_t seed = 0;                    ///< Keys stochastic rounding with step, tensor id and index.

  /// Throws `invalid_argument` for a width other than 1, 2, 4, 8 or an empty block.
  void validate() const {
    detail::require(is_packable_width(bits), errc::invalid_argument,
                    [&] { return "bits must be 1, 2, 4 or 8, got " + std::to_string(bits); });
    detail::require(block >= 1, errc::invalid_argument, "block must hold at least one value");
  }

  friend constexpr bool operator==(const uniform_params&, const uniform_params&) = default;
};

/// Uniform b-bit quantizer with per-block scales for `float`, `double`, `bf16` or `fp16` gradients.
template <gradient_value T = float>
class uniform_quantizer : public codec_interface<uniform_quantizer<T>, T> {
 public:
  using value_type = T;                              ///< Element type of the gradient.
  using scale_type = compute_type<T>;                ///< Type of the scales and the arithmetic.
  static constexpr codec_id id = codec_id::uniform;  ///< Wire identifier.
  static constexpr bool is_homomorphic = false;      ///< Block scales differ between ranks.
  static constexpr bool takes_half_precision = true;  ///< bf16 and fp16 gradients are coded natively.

  /// @throws error `invalid_argument` for invalid parameters.
  explicit uniform_quantizer(uniform_params params = {}, wire_options wire = {}) : params_(params), wire_(wire) {
    params_.validate();
  }

  /// The parameters.
  [[nodiscard]] const uniform_params& params() const noexcept { return params_; }
  /// Bits per value.
  [[nodiscard]] int bits() const noexcept { return params_.bits; }
  /// Wire options used by `encode`.
  [[nodiscard]] const wire_options& wire() const noexcept { return wire_; }
  /// Number of blocks (and scales) of an n-element tensor.
  [[nodiscard]] std::uint64_t block_count(std::uint64_t n) const noexcept {
    return n / params_.block + (n % params_.block != 0 ? 1 : 0);
  }
  /// Payload bytes of an n-element tensor (scales, then packed codes).
  [[nodiscard]] std::uint64_t payload_bytes(std::uint64_t n) const noexcept {
    return block_count(n) * sizeof(scale_type) + packed_bytes(n, params_.bits);
  }
  /// Exact size of every message for n elements.
  [[nodiscard]] std::size_t max_encoded_bytes(std::uint64_t n) const noexcept {
    return static_cast<std::size_t>(envelope::size + payload_bytes(n));
  }
  /// Checks the layout byte and payload size of a message whose envelope `e` matched this
  /// quantizer (every backend's decoder calls it). @throws error `malformed_payload`.
  void validate_payload_size(const envelope& e) const {
    validate_fixed_payload(e, "uniform", e.payload_bytes * 8 / static_cast<std::uint64_t>(params_.bits),
                           [this](std::uint64_t n) { return payload_bytes(n); });
  }
  /// Hash of the parameters, carried in every message and checked by decoders.
  [[nodiscard]] std::uint64_t params_hash() const noexcept {
    return params_hasher{}
        .add(id)
        .add(dtype_of<T>)
        .add(static_cast<std::uint8_t>(params_.bits))
        .add(params_.block)
        .add(params_.round)
        .add(params_.seed)
        .value();
  }

 private:
  uniform_params params_;
  wire_options wire_;
};

}  // namespace gradcomp

#include <gradcomp/cpu/uniform.hpp>
#include <gradcomp/cpu/uniform_feedback.hpp>
#include <gradcomp/reference/uniform.hpp>
