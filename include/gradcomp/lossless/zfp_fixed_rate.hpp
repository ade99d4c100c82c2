#pragma once
/// @file
/// ZFP fixed-rate mode for 1-D float32 tensors (Lindstrom, "Fixed-Rate Compressed Floating-Point
/// Arrays", IEEE TVCG 2014), bit for bit the stream of the zfp library (zfp 1.0) in fixed-rate
/// mode with an unaligned stream: `zfp_stream_set_rate(zfp, R, zfp_type_float, 1, zfp_false)`.
/// docs/lossless.md §2.
///
/// The n values are cut into blocks of 4 (a partial last block of m values is padded as zfp pads
/// it: f1 = f0, f2 = f1, f3 = f0 for what is missing). Each block takes exactly 4R bits of the
/// stream (bit j of the stream is bit j mod 8 of payload byte ⌊j/8⌋):
///
///  1. emax: the frexp exponent of the block's largest magnitude (e with 2^(e−1) ≤ max < 2^e,
///     clamped to at least −126 for subnormals); e_b = emax + 127, or e_b = 0 when every value
///     is ±0. A block with e_b = 0 is one 0 bit; otherwise the 9 bits 2·e_b + 1 (the low bit
///     flags a non-zero block);
///  2. block-floating-point cast: i_k = trunc(f_k · 2^(30 − emax)) as int32 (|i_k| < 2^30);
///  3. zfp's forward lifting transform of (i0, i1, i2, i3) (non-orthogonal, integer, arithmetic
///     shifts);
///  4. negabinary: u = (i + 0xaaaaaaaa) ^ 0xaaaaaaaa as uint32;
///  5. embedded coding of the bit planes of u from plane 31 down: per plane the bits of the values
///     already significant verbatim, then group tests and a unary scan for the next significant
///     value, until the 4R − 9 bits after the header are spent or every plane is coded;
///  6. zero bits up to 4R.
///
/// The decoder inverts each step (the planes not coded are zero) and computes each value as
/// float(i) · 2^(emax − 30), with one rounding, as the zfp library does.
///
/// Payload layout after the envelope (layout byte 0): the stream's ⌈⌈n/4⌉·4R / 8⌉ bytes, bit j of
/// the stream being bit j mod 8 of byte ⌊j/8⌋. That is exactly what libzfp's `zfp_compress`
/// writes when built with 8-bit stream words (Debian's libzfp-dev); a libzfp built with 64-bit
/// words (zfp's default) writes the same bytes followed by zero bytes up to a multiple of 8.
/// When n/4 rounded up and R are both odd the last byte's high 4 bits follow the last block:
/// they are zero, and decoders check them. The size depends only on n and R: `encode` always
/// returns `max_encoded_bytes(n)`, so receives can be posted before the data exists.
///
/// One deliberate difference from libzfp: for a block whose largest magnitude is below 2^−98
/// (emax < −97), libzfp computes the cast's scale 2^(30 − emax) in float, where it overflows to
/// +Inf (zfp issue #119), and writes garbage; this codec computes the intended cast exactly (in
/// double, or as two exact float products), so such blocks round-trip like any other. Its decoder likewise computes
/// float(i) · 2^(emax − 30) with one rounding where 2^(emax − 30) is below the float range, where
/// libzfp's decoder gives 0 (emax < −119). Everywhere else the bit streams and the decoded floats
/// are identical.
///
/// A 16-bit gradient (`zfp_fixed_rate_codec<bf16>`, `<fp16>`) is coded as the float32 tensor of its
/// exactly widened values: the payload is byte for byte that of `zfp_fixed_rate_codec<float>` on
/// them (the envelope's dtype and the parameter hash name the 16-bit type), so R counts bits per
/// 16-bit value and the codec's error is the float32 codec's. Decoders write float32, or round each
/// value once into a 16-bit output (an accumulation: the float32 sum), after every result is
/// checked to narrow to a finite value (`narrowing_overflow` otherwise, the output untouched).
///
/// NaN and ±Inf cannot be represented: the encoder reports them (`non_finite_input`) and writes
/// nothing. A decoded value is at most 2^(emax + 1) in magnitude, so it is finite in every block
/// whose largest magnitude is below 2^126; a block from 2^126 up (emax ≥ 127) can decode to ±Inf
/// where the reconstruction error carries it past `FLT_MAX`, as in libzfp, and so can a block
/// whose exponent field was corrupted. Never NaN.

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>

#include <gradcomp/core/codec_interface.hpp>
#include <gradcomp/core/cpu_executor.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/wire_envelope.hpp>
#include <gradcomp/lossless/zfp_block.hpp>

namespace gradcomp {

/// Parameters of the ZFP fixed-rate codec.
struct zfp_params {
  /// Rate R: bits per value (3..32); every block of 4 values takes exactly 4R bits.
  std::uint32_t rate_bits = 8;

  /// Throws `invalid_argument` unless 3 ≤ rate_bits ≤ 32. zfp gives a float block at least 9
  /// bits (the header), so at R = 1 and 2 a block would not take 4R bits.
  void validate() const {
    detail::require(rate_bits >= 3 && rate_bits <= 32, errc::invalid_argument,
                    "ZFP rate must lie in [3, 32] bits per value: below 3 the 9-bit block header does not fit "
                    "the 4R bits of a block");
  }

  friend constexpr bool operator==(const zfp_params&, const zfp_params&) = default;
};

/// ZFP fixed-rate lossy codec for float32 tensors, and for bf16 and fp16 ones through their
/// float32 widening: exactly R bits per value, libzfp's bit stream.
template <gradient_value T = float>
class zfp_fixed_rate_codec : public codec_interface<zfp_fixed_rate_codec<T>, T> {
  static_assert(!std::is_same_v<T, double>,
                "ZFP's fixed-rate stream is defined on float32 (and takes bf16 and "
                "fp16 through their float32 widening); docs/lossless.md §2");

 public:
  using value_type = T;                                   ///< Element type: float32, bf16 or fp16.
  static constexpr codec_id id = codec_id::zfp_fixed_rate;  ///< Wire identifier.
  static constexpr bool is_homomorphic = false;           ///< Encodings do not add.
  static constexpr bool is_lossless = false;              ///< Decoding gives back R bits' worth of each block.
  /// Decoded values can be ±Inf (never NaN): in blocks whose largest magnitude is at least 2^126,
  /// as in libzfp, or whose exponent field was corrupted.
  static constexpr bool may_decode_infinity = true;
  static constexpr bool takes_half_precision = true;      ///< bf16 and fp16: coded as their float32 widening.
  static constexpr std::uint64_t block = 4;               ///< Values per block.
  static constexpr std::uint32_t header_bits = zfp_block::header_bits;  ///< Bits of a non-zero block's header.

  /// @throws error `invalid_argument` for invalid parameters.
  explicit zfp_fixed_rate_codec(zfp_params params = {}, wire_options wire = {}) : params_(params), wire_(wire) {
    params_.validate();
  }

  /// The parameters.
  [[nodiscard]] const zfp_params& params() const noexcept { return params_; }
  /// Wire options used by `encode`.
  [[nodiscard]] const wire_options& wire() const noexcept { return wire_; }
  /// Bits of every block: 4R.
  [[nodiscard]] std::uint32_t block_bits() const noexcept { return 4 * params_.rate_bits; }
  /// Number of blocks of an n-element tensor: ⌈n/4⌉.
  [[nodiscard]] static constexpr std::uint64_t block_count(std::uint64_t n) noexcept {
    return n / block + (n % block != 0 ? 1 : 0);
  }
  /// Payload bytes of an n-element tensor: ⌈⌈n/4⌉·4R / 8⌉ (a message's payload has exactly this
  /// size); `UINT64_MAX` where that does not fit in 64 bits.
  [[nodiscard]] std::uint64_t payload_bytes(std::uint64_t n) const noexcept {
    const std::uint64_t blocks = block_count(n);
    const std::uint64_t pairs = blocks / 2;  // two blocks take R bytes
    if (pairs > (std::numeric_limits<std::uint64_t>::max() - 16) / params_.rate_bits)
      return std::numeric_limits<std::uint64_t>::max();
    return pairs * params_.rate_bits + ((blocks % 2) * params_.rate_bits + 1) / 2;
  }
  /// Size of every message for n elements (it depends on n and R only); `SIZE_MAX` when that does
  /// not fit in `std::size_t`.
  [[nodiscard]] std::size_t max_encoded_bytes(std::uint64_t n) const noexcept {
    constexpr std::uint64_t limit = std::numeric_limits<std::size_t>::max();
    if (payload_bytes(n) > limit - envelope::size) return std::numeric_limits<std::size_t>::max();
    return static_cast<std::size_t>(envelope::size + payload_bytes(n));
  }
  /// A decoder's checks of an envelope already validated against this codec: layout 0, and the
  /// payload size of its element count. @throws error `malformed_payload`.
  void check_layout(const envelope& e) const {
    detail::require(e.layout == 0, errc::malformed_payload, "ZFP messages have layout 0");
    detail::require(e.payload_bytes == payload_bytes(e.elements), errc::malformed_payload, [&] {
      return "payload of " + std::to_string(e.payload_bytes) + " bytes, " + std::to_string(e.elements) +
             " elements at " + std::to_string(params_.rate_bits) + " bits per value take " +
             std::to_string(payload_bytes(e.elements));
    });
  }
  /// Hash of the parameters, carried in every message and checked by decoders.
  [[nodiscard]] std::uint64_t params_hash() const noexcept {
    return params_hasher{}.add(id).add(dtype_of<T>).add(params_.rate_bits).value();
  }

 private:
  zfp_params params_;
  wire_options wire_;
};

}  // namespace gradcomp

#include <gradcomp/cpu/zfp_fixed_rate.hpp>
#include <gradcomp/reference/zfp_fixed_rate.hpp>
