#pragma once
/// @file
/// The shared-scale (homomorphic) mode of the uniform quantizer (docs/quantizers.md §14, as in
/// THC and TernGrad): the ranks first agree on every block's maximum (a MAX
/// all-reduce of `block_maxima`), so that all of them quantize with the same scales; then their
/// integer codes, stored in fields with k headroom bits, add up under a plain uint64 SUM collective
/// for up to 2^k ranks without carrying into the next field.
///
/// Payload layout after the envelope (layout byte 0):
///
///     ⌈n/B⌉ scales s (float64 for double gradients, float32 for float, bf16 and fp16 ones), block
///     j covering elements [jB, jB + B); identical on every rank, never summed
///     zero bytes up to the next multiple of 8 of the message offset
///     the summable region, u64 words: the contribution count P (1 in a fresh encoding), then
///     ⌈n/F⌉ field words, F = ⌊64/w⌋ fields of w = b + k bits each, element i in bits
///     [(i mod F)·w, (i mod F)·w + w) of word ⌊i/F⌋; unused high bits zero
///
/// Levels, steps and rounding are those of quantize/uniform_math.hpp with the agreed maximum M of
/// each block in place of the local one: s = uniform_step(M, b), t = h·(L/M) (h/s when L/M
/// overflows), q = uniform_level(t), code c = uniform_code(q) ∈ [0, 2L] (b ≥ 2) or {0, 1} (b = 1).
/// A field holding the sum of P ≤ 2^k codes is at most 2^k·(2^b − 2) (b ≥ 2) or 2^k (b = 1),
/// below 2^w, so words can be summed as unsigned integers. A message decodes to the sum over its
/// contributors of q·s: the exact integer Σq (field − P·L for b ≥ 2, 2·field − P for b = 1),
/// converted to the scales' type and multiplied by s. Divide by P for the mean. The message size
/// depends only on n. The single-stage `encode` uses this rank's own maxima (a workspace of ⌈n/B⌉
/// values) and rank 0: a valid message on its own, summable only with messages of the same scales.
///
/// A bf16 or fp16 gradient is coded from its exact float32 widening, value by value inside the
/// kernels (no float32 copy of the gradient): its block maxima, scales and codes are those of
/// `shared_scale_quantizer<float>` on the widened values (the maxima are float32, and so is the MAX
/// all-reduce that agrees them), and only the envelope's dtype and the parameter hash differ. The
/// summed fields are integers, so a sum of 16-bit gradients' messages is exact whatever P; its
/// decoder writes float32, or narrows to the 16-bit type (round to nearest even; a value beyond the
/// type's range is `narrowing_overflow`, nothing written): docs/half-precision.md.
///
/// Stochastic rounding of rank r draws u for element i as the uniform quantizer does (16-bit half i
/// of the stream), from the stream keyed by (shared_scale_stream_seed(seed, r), step, tensor id),
/// so ranks round with independent noise; rank 0 draws exactly the uniform quantizer's numbers for
/// the same seed.
///
/// Payload checksums are not supported (a SUM of the summable region would leave the CRC stale):
/// the constructor rejects `wire_options::payload_checksum`.
///
/// Special values: a block whose agreed maximum is 0 (zeros of either sign on every rank) has s = 0
/// and decodes to exact zeros (+0, or −0 where a 1-bit stochastic level sum is negative); a
/// subnormal block whose step underflows decodes to zeros too. A gradient holding NaN or ±Inf is
/// rejected with `errc::non_finite_input` before anything is written, and so is an agreed maximum
/// so large that 2^k·L·s overflows the value type. Decoders reject scales that are negative,
/// non-finite or too large for 2^k·L·s to be finite, a contribution count outside [1, 2^k], a field
/// above P·(largest code), and non-zero padding or unused bits. Indices and sizes are 64-bit, so
/// n > 2^32 is supported.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include <gradcomp/core/bit_packing.hpp>
#include <gradcomp/core/codec_interface.hpp>
#include <gradcomp/core/config.hpp>
#include <gradcomp/core/cpu_executor.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/float_bits.hpp>
#include <gradcomp/core/wire_envelope.hpp>
#include <gradcomp/quantize/uniform.hpp>
#include <gradcomp/quantize/sign_math.hpp>
#include <gradcomp/quantize/uniform_math.hpp>

namespace gradcomp {

/// Largest number of headroom bits: up to 2^24 contributions, fields of at most 8 + 24 = 32 bits.
inline constexpr int shared_scale_max_headroom = 24;

/// Parameters of the shared-scale quantizer.
struct shared_scale_params {
  int bits = 8;  ///< Bits per code: 1, 2, 4 or 8.
  std::uint32_t block = 256;  ///< Values per scale (≥ 1); default 256.
  rounding round = rounding::nearest_even;  ///< Rounding of scaled values to levels.
  std::uint64_t seed = 0;  ///< Keys stochastic rounding with rank, step, tensor id and index.
  int headroom_bits = 3;  ///< k: fields of bits + k bits hold the sum of up to 2^k codes.

  /// Throws `invalid_argument` for a width other than 1, 2, 4, 8, an empty block, or headroom
  /// outside [0, 24] (which keeps a field within 32 bits).
  void validate() const {
    detail::require(is_packable_width(bits), errc::invalid_argument,
                    [&] { return "bits must be 1, 2, 4 or 8, got " + std::to_string(bits); });
    detail::require(block >= 1, errc::invalid_argument, "block must hold at least one value");
    detail::require(headroom_bits >= 0 && headroom_bits <= shared_scale_max_headroom, errc::invalid_argument,
                    [&] { return "headroom_bits must be in [0, 24], got " + std::to_string(headroom_bits); });
  }

  friend constexpr bool operator==(const shared_scale_params&, const shared_scale_params&) = default;
};

/// Seed of rank `rank`'s stochastic-rounding stream: seed XOR (rank · 0x9E3779B97F4A7C15) mod 2^64.
/// The multiplier is odd, so distinct ranks get distinct seeds (both Philox key words change), and
/// rank 0 keeps `seed`.
GRADCOMP_HOST_DEVICE constexpr std::uint64_t shared_scale_stream_seed(std::uint64_t seed, std::uint32_t rank) noexcept {
  return seed ^ (std::uint64_t{rank} * 0x9E3779B97F4A7C15ull);
}

/// Σq of `contributions` codes that add up to `field`: field − P·L (b ≥ 2) or 2·field − P (b = 1).
/// For P = 1 it is uniform_code_level.
GRADCOMP_HOST_DEVICE constexpr std::int64_t shared_scale_level_sum(std::uint64_t field, std::uint64_t contributions,
                                                                   int bits) noexcept {
  const auto f = static_cast<std::int64_t>(field);
  const auto p = static_cast<std::int64_t>(contributions);
  return bits == 1 ? 2 * f - p : f - p * uniform_levels(bits);
}

/// Uniform b-bit quantizer whose encodings of several ranks add up (homomorphic), once the ranks
/// have agreed on the block maxima. For `float`, `double`, `bf16` or `fp16` gradients.
///
/// Protocol per tensor: `block_maxima` → MAX all-reduce of the maxima → `encode_shared` (with the
/// rank) → SUM all-reduce of bytes [summable_offset(n), summable_offset(n) + summable_bytes(n)) as
/// uint64 (or `accumulate_encoded`) → `decode` (the sum; divide by P for the mean).
template <gradient_value T = float>
class shared_scale_quantizer : public codec_interface<shared_scale_quantizer<T>, T> {
 public:
  using value_type = T;  ///< Element type of the gradient.
  using scale_type = compute_type<T>;  ///< Type of the maxima, the scales and the arithmetic.
  static constexpr codec_id id = codec_id::uniform_shared;  ///< Wire identifier.
  static constexpr bool is_homomorphic = true;  ///< Summed field words decode to the sum.
  static constexpr bool takes_half_precision = true;  ///< bf16 and fp16 gradients are coded natively.

  /// @throws error `invalid_argument` for invalid parameters, or when `wire` asks for a payload
  ///         checksum (the SUM collective would leave it stale).
  explicit shared_scale_quantizer(shared_scale_params params = {}, wire_options wire = {}) : params_(params) {
    params_.validate();
    detail::require(!wire.payload_checksum, errc::invalid_argument,
                    "shared-scale messages carry no payload checksum: summing their field words would leave it stale");
  }

  /// The parameters.
  [[nodiscard]] const shared_scale_params& params() const noexcept { return params_; }
  /// Bits per code.
  [[nodiscard]] int bits() const noexcept { return params_.bits; }
  /// w = bits + headroom_bits: the width of a summable field.
  [[nodiscard]] int field_bits() const noexcept { return params_.bits + params_.headroom_bits; }
  /// F = ⌊64/w⌋: fields per u64 word.
  [[nodiscard]] std::uint64_t fields_per_word() const noexcept { return static_cast<std::uint64_t>(64 / field_bits()); }
  /// 2^k: the most encodings whose sum a message can hold.
  [[nodiscard]] std::uint64_t max_contributions() const noexcept { return std::uint64_t{1} << params_.headroom_bits; }
  /// Number of blocks (and scales) of an n-element tensor.
  [[nodiscard]] std::uint64_t block_count(std::uint64_t n) const noexcept {
    return n / params_.block + (n % params_.block != 0 ? 1 : 0);
  }
  /// Number of field words of an n-element tensor: ⌈n/F⌉.
  [[nodiscard]] std::uint64_t field_words(std::uint64_t n) const noexcept {
    return n / fields_per_word() + (n % fields_per_word() != 0 ? 1 : 0);
  }
  /// Offset from the start of the message of its summable region (a multiple of 8): 56 plus the
  /// scales rounded up to 8 bytes.
  [[nodiscard]] std::size_t summable_offset(std::uint64_t n) const noexcept {
    return static_cast<std::size_t>(envelope::size + (block_count(n) * sizeof(scale_type) + 7) / 8 * 8);
  }
  /// Bytes of the summable region, which ends the message: the contribution count and the field
  /// words, 8·(1 + ⌈n/F⌉). A SUM collective adds these bytes as uint64 and nothing else.
  [[nodiscard]] std::size_t summable_bytes(std::uint64_t n) const noexcept {
    return static_cast<std::size_t>(8 * (1 + field_words(n)));
  }
  /// Payload bytes of an n-element tensor (scales, padding, summable region).
  [[nodiscard]] std::uint64_t payload_bytes(std::uint64_t n) const noexcept {
    return summable_offset(n) - envelope::size + summable_bytes(n);
  }
  /// Exact size of every message for n elements.
  [[nodiscard]] std::size_t max_encoded_bytes(std::uint64_t n) const noexcept {
    return static_cast<std::size_t>(envelope::size + payload_bytes(n));
  }
  /// Checks the layout byte and payload size of a message whose envelope `e` matched this
  /// quantizer (every backend's decoder calls it). @throws error `malformed_payload`.
  void validate_payload_size(const envelope& e) const {
    validate_fixed_payload(e, "shared-scale", e.payload_bytes / 8 * fields_per_word(),
                           [this](std::uint64_t n) { return payload_bytes(n); });
  }
  /// Largest level sum a message may decode, 2^k·L (exact in the scales' type): a scale s is valid
  /// when s·2^k·L is finite.
  [[nodiscard]] scale_type largest_level_sum() const noexcept {
    return static_cast<scale_type>(max_contributions() * static_cast<std::uint64_t>(uniform_levels(params_.bits)));
  }
  /// Largest value of one field of a sum of P codes: P·(the largest code).
  [[nodiscard]] std::uint64_t largest_field(std::uint64_t contributions) const noexcept {
    return contributions * uniform_code(uniform_levels(params_.bits), params_.bits);
  }
  /// Checks agreed maxima before they set scales (every host backend's encoder calls it): one per
  /// block, finite, non-negative, and small enough that a sum of 2^k contributions decodes
  /// finitely. @throws error `size_mismatch`, `non_finite_input`, `invalid_argument`.
  void validate_agreed_maxima(std::uint64_t n, std::span<const scale_type> maxima) const {
    detail::require(maxima.size() == block_count(n), errc::size_mismatch, [&] {
      return "agreed maxima hold " + std::to_string(maxima.size()) + " values, the gradient has " +
             std::to_string(block_count(n)) + " blocks";
    });
    const scale_type largest = largest_level_sum();
    for (std::uint64_t j = 0; j < maxima.size(); ++j) {
      const scale_type m = maxima[j];
      detail::require(is_finite(m), errc::non_finite_input, [&] {
        return "agreed maximum of block " + std::to_string(j) + " is NaN or Inf (a rank's gradient held NaN or Inf)";
      });
      detail::require(sign_bit_of(m) == 0, errc::invalid_argument,
                      [&] { return "agreed maximum of block " + std::to_string(j) + " is negative"; });
      detail::require(is_finite(uniform_step(m, bits()) * largest), errc::non_finite_input, [&] {
        return "agreed maximum of block " + std::to_string(j) + " is so large that a sum of " +
               std::to_string(max_contributions()) + " contributions overflows the value type";
      });
    }
  }
  /// Hash of the parameters, carried in every message and checked by decoders: the id, the hash of
  /// the uniform quantizer with the same levels (bits, block, rounding, seed and dtype), and the
  /// headroom.
  [[nodiscard]] std::uint64_t params_hash() const noexcept {
    const uniform_quantizer<T> levels(
        {.bits = params_.bits, .block = params_.block, .round = params_.round, .seed = params_.seed});
    return params_hasher{}
        .add(id)
        .add(levels.params_hash())
        .add(static_cast<std::uint8_t>(params_.headroom_bits))
        .value();
  }

  /// Writes this rank's largest magnitude of each block of `grad` into `maxima` (block_count(n)
  /// values; a 16-bit gradient's maxima widened to float32, exactly), the input of the MAX
  /// all-reduce that agrees the scales. Non-negative floats order like their bits read as unsigned
  /// integers, so a transport without a float MAX can reduce the maxima as uint32 (float32) or
  /// uint64 (double).
  /// @throws error `size_mismatch` when `maxima` does not hold block_count(n) values (nothing is
  ///         written); `non_finite_input` on NaN or ±Inf in `grad`: every maximum is then set to
  ///         +Inf, so that a rank which still joins the all-reduce makes `encode_shared` fail on
  ///         every rank instead of encoding with a wrong scale.
  template <executor E>
  void block_maxima(const E& e, std::span<const T> grad, std::span<scale_type> maxima) const {
    this->template require_value_type<E>();
    backend<shared_scale_quantizer, E>::block_maxima(*this, e, grad, maxima);
  }

  /// Encodes `grad` with the agreed block maxima (the MAX over all ranks of their `block_maxima`)
  /// into `out` (at least `max_encoded_bytes(n)` bytes); `rank` mixes the stochastic-rounding
  /// seed. Everything is checked before `out` is written, so on error it is unchanged.
  /// @returns bytes written.
  /// @throws error `size_mismatch` (maxima count), `non_finite_input` (NaN/±Inf in `grad` or in a
  ///         maximum, or a maximum so large that 2^k·L·s overflows), `invalid_argument` (a negative
  ///         maximum), `parameter_mismatch` (a maximum below this rank's own block maximum),
  ///         `buffer_too_small`.
  template <executor E>
  std::size_t encode_shared(const E& e, std::span<const T> grad, std::span<const scale_type> agreed_maxima,
                            std::span<std::byte> out, std::span<std::byte> ws, message_key key = {},
                            std::uint32_t rank = 0) const {
    this->template require_value_type<E>();
    return backend<shared_scale_quantizer, E>::encode_shared(*this, e, grad, agreed_maxima, out, ws, key, rank);
  }

  /// Turns message `acc` into the encoding of the sum of `acc` and `other` (same parameters, n,
  /// step, tensor and scales), as a SUM collective over the summable region would.
  /// @throws error on a malformed message, `step_mismatch` when the keys differ,
  ///         `parameter_mismatch` when the scales differ (the ranks did not agree the maxima), or
  ///         `invalid_argument` when the sum would hold more than 2^k contributions; `acc` is
  ///         untouched then.
  template <executor E>
  void accumulate_encoded(const E& e, std::span<std::byte> acc, std::span<const std::byte> other) const {
    this->template require_value_type<E>();
    backend<shared_scale_quantizer, E>::accumulate_encoded(*this, e, acc, other);
  }

 private:
  shared_scale_params params_;
};

}  // namespace gradcomp

#include <gradcomp/cpu/shared_scale.hpp>
#include <gradcomp/reference/shared_scale.hpp>
