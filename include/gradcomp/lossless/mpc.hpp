#pragma once
/// @file
/// MPC: lossless compression of float32 tensors (Yang, Mukka, Hesaaraki, Burtscher, "MPC: A
/// Massively Parallel Compression Algorithm for Scientific Data", Cluster 2015; the reference is
/// MPC_float_12.cu, pipeline "LnVs BIT LVs ZE"). docs/lossless.md §1.
///
/// The values are taken as their 32-bit patterns v[0..n) and cut into chunks of 1024 words
/// (the last one shorter). Within a chunk, with t the index in the chunk:
///
///  1. a[t] = v[t] − v[t − dim] for dim ≤ t < c (c = the chunk's length), a[t] = v[t] for t < dim,
///     and a[t] = 0 for the padding t ≥ c up to the next multiple of 32 (uint32, wrapping);
///  2. each group of 32 words is bit-transposed: w[32g + L] = Σᵢ ((a[32g + i] >> L) & 1) << i;
///  3. b[t] = w[t] − w[t − 1] for t ≥ 1, b[0] = w[0] (across the groups of the chunk);
///  4. zero elimination: per group a 32-bit bitmap, bit L set iff b[32g + L] ≠ 0, and the
///     non-zero words of the group in order.
///
/// Payload layout after the envelope (layout byte 0), little-endian uint32 words:
///
///     G = ⌈n/32⌉ bitmaps, group g of the tensor (elements [32g, 32g + 32)) at word g
///     K = Σ popcount(bitmap) non-zero words, group after group
///
/// so the payload holds 4·(G + K) bytes. A partial last group (n mod 32 = r ≠ 0) still carries
/// all 32 of its transposed words, which are in general not zero: the transpose spreads every
/// value's bits over the whole group. What the padding pins instead is that a[t] = 0 past n, so
/// every transposed word w of that group is below 2^r. Decoders check it. They do not check that
/// carried words are non-zero (the encoder never carries a zero word; a zero one decodes like a
/// clear bitmap bit), so a message the encoder would have written without that word is accepted
/// too and decodes to the same tensor.
///
/// Differences from the reference's layout: its magic word (0x63706d00 + dim − 1) and length word
/// are dropped, because the envelope carries the codec id, the parameter hash (which covers dim),
/// n and the payload length; and the reference also writes the non-zero word b[32G] that the
/// transform leaves after the last group of a partial chunk (no bitmap covers it, its decoder
/// ignores it), which this layout omits. Otherwise the bitmaps and words are the reference's.
///
/// The codec moves bit patterns, never arithmetic on floats: every float32 — NaN with any payload
/// (quiet or signalling), ±Inf, −0, subnormals — decodes to the identical bits. Nothing is rejected
/// as non-finite. `decode_accumulate` adds the decoded floats into the accumulator in float, so
/// there a NaN or Inf propagates as IEEE addition does (a NaN's payload and quiet bit then follow
/// the CPU's rules, not the message); into a 16-bit accumulator a sum that is not finite in its type
/// is `narrowing_overflow` instead (below).
///
/// A 16-bit gradient (`mpc_codec<bf16>`, `mpc_codec<fp16>`) is coded as the float32 tensor of its
/// exactly widened values: the payload is byte for byte that of `mpc_codec<float>` on them (the
/// envelope's dtype and the parameter hash name the 16-bit type). A bf16's low 16 bits, and an
/// fp16's low 13, are zero in every widened word, so their transposed words vanish in step 4: the
/// payload costs about what a 16-bit MPC would (docs/lossless.md §1.8). Decoders give back the 16-bit
/// patterns bit for bit (`exact_narrow`), or their float32 widenings; a message of a 16-bit
/// dtype whose decoded words are not all widened 16-bit values is `malformed_payload`, checked
/// before the output is touched.
///
/// Size: K ≤ 32·G, so a message takes at most 56 + 4·(G + 32·G) bytes (n + ⌈n/32⌉ words when n is
/// a multiple of 32, at most 31 more words otherwise), which `max_encoded_bytes` returns; `encode`
/// returns the actual size, which the envelope's payload length records.

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>

#include <gradcomp/core/codec_interface.hpp>
#include <gradcomp/core/cpu_executor.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/wire_envelope.hpp>

namespace gradcomp {

/// Parameters of the MPC codec.
struct mpc_params {
  /// Dimensionality: step 1 subtracts the value `dim` positions back (1..32). 1 suits a flat
  /// gradient or any 1-D signal; d suits data that interleaves d fields or is a d-wide row-major
  /// array whose rows are alike (for instance xyz triples: 3).
  std::uint32_t dim = 1;

  /// Throws `invalid_argument` unless 1 ≤ dim ≤ 32.
  void validate() const {
    detail::require(dim >= 1 && dim <= 32, errc::invalid_argument, "MPC dimensionality must lie in [1, 32]");
  }

  friend constexpr bool operator==(const mpc_params&, const mpc_params&) = default;
};

/// MPC lossless codec for float32 tensors, and for bf16 and fp16 ones through their float32
/// widening: exact round trip of every bit pattern.
template <gradient_value T = float>
class mpc_codec : public codec_interface<mpc_codec<T>, T> {
  static_assert(!std::is_same_v<T, double>,
                "MPC is defined on float32 bit patterns (and takes bf16 and fp16 "
                "through their float32 widening); docs/lossless.md §1");

 public:
  using value_type = T;                           ///< Element type: float32, bf16 or fp16.
  static constexpr codec_id id = codec_id::mpc;   ///< Wire identifier.
  static constexpr bool is_homomorphic = false;   ///< Encodings do not add.
  static constexpr bool is_lossless = true;       ///< Decoding gives back every input bit, NaN and Inf included.
  static constexpr bool takes_half_precision = true;  ///< bf16 and fp16: coded as their float32 widening.
  static constexpr std::uint64_t chunk = 1024;    ///< Words per chunk (steps 1 and 3 restart at each).
  static constexpr std::uint64_t group = 32;      ///< Words per transposed group and per bitmap.

  /// @throws error `invalid_argument` for invalid parameters.
  explicit mpc_codec(mpc_params params = {}, wire_options wire = {}) : params_(params), wire_(wire) {
    params_.validate();
  }

  /// The parameters.
  [[nodiscard]] const mpc_params& params() const noexcept { return params_; }
  /// Wire options used by `encode`.
  [[nodiscard]] const wire_options& wire() const noexcept { return wire_; }
  /// Number of groups (and bitmaps) of an n-element tensor: ⌈n/32⌉.
  [[nodiscard]] static constexpr std::uint64_t group_count(std::uint64_t n) noexcept {
    return n / group + (n % group != 0 ? 1 : 0);
  }
  /// Largest payload of an n-element tensor in bytes: G bitmaps and 32·G words.
  [[nodiscard]] static constexpr std::uint64_t max_payload_bytes(std::uint64_t n) noexcept {
    return group_count(n) * (group + 1) * 4;
  }
  /// Largest message for n elements (data with no zero word after the transform reaches it);
  /// `SIZE_MAX` when that does not fit in `std::size_t`.
  [[nodiscard]] std::size_t max_encoded_bytes(std::uint64_t n) const noexcept {
    constexpr std::uint64_t limit = std::numeric_limits<std::size_t>::max();
    if (group_count(n) > (limit - envelope::size) / ((group + 1) * 4)) return std::numeric_limits<std::size_t>::max();
    return static_cast<std::size_t>(envelope::size + max_payload_bytes(n));
  }
  /// A decoder's checks of an envelope already validated against this codec: layout 0, and a
  /// payload of whole words that holds the ⌈n/32⌉ bitmaps. @returns the kept words it carries
  /// after them. @throws error `malformed_payload`.
  static std::uint64_t carried_words(const envelope& e) {
    detail::require(e.layout == 0, errc::malformed_payload, "MPC messages have layout 0");
    const std::uint64_t groups = group_count(e.elements);
    detail::require(e.payload_bytes % 4 == 0 && e.payload_bytes / 4 >= groups, errc::malformed_payload, [&] {
      return "payload of " + std::to_string(e.payload_bytes) + " bytes does not hold the " + std::to_string(groups) +
             " bitmaps of " + std::to_string(e.elements) + " elements";
    });
    return e.payload_bytes / 4 - groups;
  }
  /// Hash of the parameters, carried in every message and checked by decoders.
  [[nodiscard]] std::uint64_t params_hash() const noexcept {
    return params_hasher{}.add(id).add(dtype_of<T>).add(params_.dim).value();
  }

 private:
  mpc_params params_;
  wire_options wire_;
};

}  // namespace gradcomp

#include <gradcomp/cpu/mpc.hpp>
#include <gradcomp/reference/mpc.hpp>
