#pragma once
/// @file
/// Sign quantization with one mean-magnitude scale per block: EF-signSGD / 1-bit Adam
/// (docs/quantizers.md §11). Biased on its own; meant to run under `error_feedback`.
///
/// Payload layout after the envelope (layout byte 0):
///
///     ⌈n/B⌉ scales (value dtype: float32 or float64), block j covering elements [jB, jB + B)
///     ⌈n/8⌉ bytes of sign bits, bit i of the tensor at bit i mod 8 of byte ⌊i/8⌋ (LSB first,
///     core/bit_packing.hpp order), unused high bits of the last byte zero
///
/// Scales and bits follow quantize/sign_math.hpp: the scale of a block is its mean magnitude
/// ‖x‖₁/c (c its length, B or the shorter last block), summed left to right in index order (in
/// double for float gradients), clamped to the block's largest magnitude; bit i is the IEEE sign
/// bit of x_i, so −0 decodes to −scale and +0 to +scale; decoding gives ±scale. The message size
/// depends only on n.
///
/// Special values: a block whose scale is 0 (all zeros of either sign, or subnormals whose mean
/// underflows) stores only 0 bits and decodes to exact +0. A gradient holding NaN or ±Inf is
/// rejected with `errc::non_finite_input` and no valid message is left in the output. Decoders
/// reject scales that are negative (sign bit set, −0 included) or not finite, a set bit in a block
/// of scale 0, and non-zero padding bits.

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
#include <gradcomp/quantize/sign_math.hpp>

namespace gradcomp {

/// Parameters of the sign quantizer.
struct sign_params {
  std::uint32_t block = 256;  ///< Values per scale (≥ 1); default 256.

  /// Throws `invalid_argument` for an empty block.
  void validate() const { detail::require(block >= 1, errc::invalid_argument, "block must hold at least one value"); }

  friend constexpr bool operator==(const sign_params&, const sign_params&) = default;
};

/// Sign quantizer (1 bit per value, one mean-magnitude scale per block) for `float` or `double`.
template <gradient_value T = float>
class sign_quantizer : public codec_interface<sign_quantizer<T>, T> {
 public:
  using value_type = T;                           ///< Element type of the gradient.
  static constexpr codec_id id = codec_id::sign;  ///< Wire identifier.
  static constexpr bool is_homomorphic = false;   ///< Block scales differ between ranks.
  using scale_type = compute_type<T>;              ///< Type of the scales: float32 for bf16 and fp16.
  static constexpr bool takes_half_precision = true;  ///< bf16 and fp16: signs and float32 mean magnitudes.

  /// @throws error `invalid_argument` for invalid parameters.
  explicit sign_quantizer(sign_params params = {}, wire_options wire = {}) : params_(params), wire_(wire) {
    params_.validate();
  }

  /// The parameters.
  [[nodiscard]] const sign_params& params() const noexcept { return params_; }
  /// Wire options used by `encode`.
  [[nodiscard]] const wire_options& wire() const noexcept { return wire_; }
  /// Number of blocks (and scales) of an n-element tensor.
  [[nodiscard]] std::uint64_t block_count(std::uint64_t n) const noexcept {
    return n / params_.block + (n % params_.block != 0 ? 1 : 0);
  }
  /// Payload bytes of an n-element tensor (scales, then packed sign bits).
  [[nodiscard]] std::uint64_t payload_bytes(std::uint64_t n) const noexcept {
    return block_count(n) * sizeof(scale_type) + packed_bytes(n, 1);
  }
  /// Exact size of every message for n elements.
  [[nodiscard]] std::size_t max_encoded_bytes(std::uint64_t n) const noexcept {
    return static_cast<std::size_t>(envelope::size + payload_bytes(n));
  }
  /// Checks the layout byte and payload size of a message whose envelope `e` matched this
  /// quantizer (every backend's decoder calls it). @throws error `malformed_payload`.
  void validate_payload_size(const envelope& e) const {
    validate_fixed_payload(e, "sign", e.payload_bytes * 8, [this](std::uint64_t n) { return payload_bytes(n); });
  }
  /// Hash of the parameters, carried in every message and checked by decoders.
  [[nodiscard]] std::uint64_t params_hash() const noexcept {
    return params_hasher{}.add(id).add(dtype_of<T>).add(params_.block).value();
  }

 private:
  sign_params params_;
  wire_options wire_;
};

}  // namespace gradcomp

#include <gradcomp/cpu/sign.hpp>
#include <gradcomp/reference/sign.hpp>
