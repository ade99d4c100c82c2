#pragma once
/// @file
/// QSGD (Alistarh et al., NeurIPS 2017): s levels of |x_i|/‖x‖₂ per bucket, rounded
/// stochastically so that the decoded gradient is unbiased (docs/quantizers.md §12).
///
/// Payload layout after the envelope (layout byte 0):
///
///     ⌈n/d⌉ norms (value dtype: float32 or float64), bucket j covering elements [jd, jd + d)
///     ⌈n·w/8⌉ bytes of packed w-bit codes (core/bit_packing.hpp order), unused high bits zero
///
/// Code width w = 1 + bit_width(s) rounded up to 2, 4 or 8 bits: s = 1 → 2 bits, 2 ≤ s ≤ 7 → 4
/// bits, 8 ≤ s ≤ 127 → 8 bits (so the default s = 15 uses 8-bit codes; s = 7 is the largest with
/// 4-bit codes). A code holds the level (0 … s) in its low w − 1 bits and the sign in its top bit.
/// Norms, levels and decoded values follow quantize/qsgd_math.hpp: the norm is summed in double in
/// index order; element i draws its uniform from word i of the Philox stream keyed by (seed, step,
/// tensor id) with purpose `stochastic_rounding`; decoding gives ±norm·fl(level/s). The message
/// size depends only on n.
///
/// Special values: a bucket of zeros (either sign) has norm 0 and all codes 0, and decodes to
/// exact +0; level 0 always has sign 0 and decodes to +0. A gradient holding NaN or ±Inf, or a
/// bucket whose ‖x‖₂ exceeds the largest finite T, is rejected with `errc::non_finite_input` and
/// no valid message is left in the output. Decoders reject norms that are negative (sign bit set,
/// −0 included) or not finite, levels above s, a set sign bit on level 0, a non-zero code in a
/// bucket of norm 0, and non-zero padding bits; every accepted message decodes to finite values
/// (|value| ≤ norm).

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
#include <gradcomp/quantize/qsgd_math.hpp>

namespace gradcomp {

/// Parameters of the QSGD quantizer.
struct qsgd_params {
  std::uint32_t levels = 15;   ///< Levels s of |x|/‖x‖ (1 … 127); default 15 (8-bit codes).
  std::uint32_t bucket = 256;  ///< Values per norm (≥ 1); default 256.
  std::uint64_t seed = 0;      ///< Keys the stochastic rounding with step, tensor id and index.

  /// Throws `invalid_argument` for levels outside 1 … 127 or an empty bucket.
  void validate() const {
    detail::require(levels >= 1 && levels <= qsgd_max_levels, errc::invalid_argument,
                    [&] { return "levels must be in 1 … 127, got " + std::to_string(levels); });
    detail::require(bucket >= 1, errc::invalid_argument, "bucket must hold at least one value");
  }

  friend constexpr bool operator==(const qsgd_params&, const qsgd_params&) = default;
};

/// QSGD quantizer with per-bucket L2 norms for `float` or `double` gradients.
template <gradient_value T = float>
class qsgd_quantizer : public codec_interface<qsgd_quantizer<T>, T> {
 public:
  using value_type = T;                           ///< Element type of the gradient.
  static constexpr codec_id id = codec_id::qsgd;  ///< Wire identifier.
  static constexpr bool is_homomorphic = false;   ///< Bucket norms differ between ranks.
  using scale_type = compute_type<T>;              ///< Type of the norms: float32 for bf16 and fp16.
  static constexpr bool takes_half_precision = true;  ///< bf16 and fp16: levels of the widened values, float32 norms.

  /// @throws error `invalid_argument` for invalid parameters.
  explicit qsgd_quantizer(qsgd_params params = {}, wire_options wire = {}) : params_(params), wire_(wire) {
    params_.validate();
  }

  /// The parameters.
  [[nodiscard]] const qsgd_params& params() const noexcept { return params_; }
  /// Levels s.
  [[nodiscard]] std::uint32_t levels() const noexcept { return params_.levels; }
  /// Bits per stored code (2, 4 or 8).
  [[nodiscard]] int bits() const noexcept { return qsgd_code_bits(params_.levels); }
  /// Wire options used by `encode`.
  [[nodiscard]] const wire_options& wire() const noexcept { return wire_; }
  /// Number of buckets (and norms) of an n-element tensor.
  [[nodiscard]] std::uint64_t bucket_count(std::uint64_t n) const noexcept {
    return n / params_.bucket + (n % params_.bucket != 0 ? 1 : 0);
  }
  /// Payload bytes of an n-element tensor (norms, then packed codes).
  [[nodiscard]] std::uint64_t payload_bytes(std::uint64_t n) const noexcept {
    return bucket_count(n) * sizeof(scale_type) + packed_bytes(n, bits());
  }
  /// Exact size of every message for n elements.
  [[nodiscard]] std::size_t max_encoded_bytes(std::uint64_t n) const noexcept {
    return static_cast<std::size_t>(envelope::size + payload_bytes(n));
  }
  /// Checks the layout byte and payload size of a message whose envelope `e` matched this
  /// quantizer (every backend's decoder calls it). @throws error `malformed_payload`.
  void validate_payload_size(const envelope& e) const {
    validate_fixed_payload(e, "QSGD", e.payload_bytes * 8 / static_cast<std::uint64_t>(bits()),
                           [this](std::uint64_t n) { return payload_bytes(n); });
  }
  /// Hash of the parameters, carried in every message and checked by decoders.
  [[nodiscard]] std::uint64_t params_hash() const noexcept {
    return params_hasher{}.add(id).add(dtype_of<T>).add(params_.levels).add(params_.bucket).add(params_.seed).value();
  }

 private:
  qsgd_params params_;
  wire_options wire_;
};

}  // namespace gradcomp

#include <gradcomp/cpu/qsgd.hpp>
#include <gradcomp/reference/qsgd.hpp>
