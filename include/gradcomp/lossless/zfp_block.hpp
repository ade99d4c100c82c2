#pragma once
/// @file
/// One ZFP fixed-rate block, scalar and on any backend (`GRADCOMP_HOST_DEVICE`): the steps of
/// lossless/zfp_fixed_rate.hpp's format for four values, which the CPU's vectorised coder
/// (cpu/zfp_fixed_rate.hpp) builds its tables and casts from, and which the CUDA backend runs one
/// block per thread (cuda/zfp_fixed_rate.cuh): cast, lift and negabinary; the embedded coding of
/// one bit plane and its parse; `encode_block` and `decode_block` for a whole block's 4R bits.

#include <cstdint>

#include <gradcomp/core/config.hpp>
#include <gradcomp/core/float_bits.hpp>
#include <gradcomp/core/rounded_product.hpp>

namespace gradcomp::zfp_block {

/// Stream bits of a block up to 4R = 128 (R ≤ 32), first bit lowest.
__extension__ using wide_word = unsigned __int128;

/// Bits of a non-zero block's header.
inline constexpr unsigned header_bits = 9;

/// The negabinary offset: u = (i + mask) ^ mask maps int32 i to its base −2 digits.
inline constexpr std::uint32_t negabinary_mask = 0xaaaaaaaau;

/// Arithmetic right shift by one of the int32 whose bits are x (C++20 defines both conversions).
[[nodiscard]] GRADCOMP_HOST_DEVICE constexpr std::uint32_t half(std::uint32_t x) noexcept {
  return static_cast<std::uint32_t>(static_cast<std::int32_t>(x) >> 1);
}

// clang-format off: the lifting steps in zfp's own grouping, one line per step
/// zfp's forward lifting transform of one 1-D block, on the int32 values' bits (wrapping, so
/// that no input is undefined behaviour; valid blocks never wrap, |i| < 2^30).
GRADCOMP_HOST_DEVICE constexpr void forward_lift(std::uint32_t* p) noexcept {
  std::uint32_t x = p[0], y = p[1], z = p[2], w = p[3];
  x += w;
  x = half(x);
  w -= x;
  z += y;
  z = half(z);
  y -= z;
  x += z;
  x = half(x);
  z -= x;
  w += y;
  w = half(w);
  y -= w;
  w += half(y);
  y -= half(w);
  p[0] = x;
  p[1] = y;
  p[2] = z;
  p[3] = w;
}
// clang-format on

// clang-format off: the lifting steps in zfp's own grouping, one line per step
/// zfp's inverse lifting transform of one 1-D block (wrapping: decoded coefficients are untrusted).
GRADCOMP_HOST_DEVICE constexpr void inverse_lift(std::uint32_t* p) noexcept {
  std::uint32_t x = p[0], y = p[1], z = p[2], w = p[3];
  y += half(w);
  w -= half(y);
  y += w;
  w <<= 1;
  w -= y;
  z += x;
  x <<= 1;
  x -= z;
  y += z;
  z <<= 1;
  z -= y;
  w += x;
  x <<= 1;
  x -= w;
  p[0] = x;
  p[1] = y;
  p[2] = z;
  p[3] = w;
}
// clang-format on

/// How the encoder codes one bit plane: `length` bits (`bits`, first bit lowest), given the
/// number n of values significant before it and the plane's bits x (value i at bit i).
struct plane_code {
  std::uint16_t bits;
  std::uint8_t length;
};

/// zfp's `encode_few_ints` for one plane with an unlimited budget: the n significant values'
/// bits verbatim, then group tests ("is any further bit set?") each followed by a unary scan to
/// the next set bit; the last value's bit is implied by a positive test. At n = 4 the plane is
/// its 4 bits. Afterwards max(n, bit width of x) values are significant.
GRADCOMP_HOST_DEVICE constexpr plane_code code_plane(unsigned n, unsigned x) noexcept {
  unsigned bits = 0, length = 0;
  const auto emit = [&](unsigned bit) {
    bits |= bit << length++;
    return bit != 0;
  };
  for (unsigned i = 0; i < n; ++i) emit((x >> i) & 1u);
  x >>= n;
  for (; n < 4; x >>= 1, ++n) {
    if (!emit(x != 0 ? 1u : 0u)) break;
    for (; n < 3; x >>= 1, ++n)
      if (emit(x & 1u)) break;
  }
  return {static_cast<std::uint16_t>(bits), static_cast<std::uint8_t>(length)};
}

/// One step of the decoder: a plane's bits, the stream bits it takes, and 1024 · the number of
/// values significant after it (the row of the CPU's `plane_steps` table for the next plane).
struct plane_step {
  std::uint8_t bits;
  std::uint8_t length;
  std::uint16_t row;
};

/// zfp's `decode_few_ints` for one plane, given n, the next stream bits (from bit 0; a plane takes
/// at most 8) and how many of them the block's budget still allows. A budget that ends inside
/// the plane ends it as zfp does: missing verbatim bits are 0, a missing group test ends the
/// plane, and a scan cut short takes the value it reached as the significant one.
GRADCOMP_HOST_DEVICE constexpr plane_step parse_plane(unsigned n, unsigned stream, unsigned budget) noexcept {
  unsigned position = 0, x = 0, bits = budget;
  const auto read = [&] {
    --bits;
    return ((stream >> position++) & 1u) != 0;
  };
  const unsigned verbatim = n < bits ? n : bits;
  for (unsigned i = 0; i < verbatim; ++i) x |= (read() ? 1u : 0u) << i;
  for (; bits != 0 && n < 4; ++n) {
    if (!read()) break;
    for (; bits != 0 && n < 3; ++n)
      if (read()) break;
    x += 1u << n;
  }
  return {static_cast<std::uint8_t>(x), static_cast<std::uint8_t>(position), static_cast<std::uint16_t>(1024 * n)};
}

/// The `count` (1 ≤ count ≤ 4) values at `values` as a block of float bits, padded as zfp's
/// `pad_block` pads a partial block: m = 1 → f1 = f2 = f3 = f0; m = 2 → f2 = f1, f3 = f0;
/// m = 3 → f3 = f0.
GRADCOMP_HOST_DEVICE inline void gather_block(const float* values, unsigned count, std::uint32_t* f) noexcept {
  for (unsigned i = 0; i < count; ++i) f[i] = to_bits(values[i]);
  if (count == 1) f[1] = f[0];
  if (count <= 2) f[2] = f[1];
  if (count <= 3) f[3] = f[0];
}

/// Block-floating-point cast, lift and negabinary of one block of four finite floats (as bits):
/// the negabinary words in `u`. Returns the biased exponent e_b (0: a block of zeros; `u` is
/// then all 0).
GRADCOMP_HOST_DEVICE inline std::uint32_t cast_block(const std::uint32_t* f, std::uint32_t* u) noexcept {
  std::uint32_t largest = 0;
  for (unsigned i = 0; i < 4; ++i) largest = (f[i] & 0x7fffffffu) > largest ? f[i] & 0x7fffffffu : largest;
  // frexp exponent of the largest magnitude, biased by 127: (its exponent field) + 1, which for a
  // subnormal (field 0) is the clamped 1 − 127; 0 for a block of zeros.
  const std::uint32_t biased = (largest >> 23) + (largest != 0 ? 1u : 0u);
  // i = trunc(f · 2^(30 − emax)), exact in double for every exponent (libzfp's float scale
  // overflows below emax = −97).
  const double scale = from_bits<double>(std::uint64_t{1023 + 157 - biased} << 52);
  for (unsigned i = 0; i < 4; ++i)
    u[i] = static_cast<std::uint32_t>(static_cast<std::int32_t>(static_cast<double>(from_bits<float>(f[i])) * scale));
  forward_lift(u);
  for (unsigned i = 0; i < 4; ++i) u[i] = (u[i] + negabinary_mask) ^ negabinary_mask;
  return biased;
}

/// float(i) · 2^(e_b − 157) for the four decoded int32 `values` (bits) of a block of biased
/// exponent e_b (0..255), each with one rounding: libzfp's `(float)i * ldexpf(1, emax − 30)`
/// where that power of two is a float (e_b ≥ 8), and without its flush to zero below. For
/// e_b ≥ 31 the scale is a normal float; below, 2^−30 is applied first (exactly), then 2^(e_b −
/// 127), normal or, for e_b = 0 (a header the encoder never writes), the subnormal 2^−127.
GRADCOMP_HOST_DEVICE inline void scale_block(const std::uint32_t* values, std::uint32_t biased, float* g) noexcept {
  const bool direct = biased >= 31;
  const float first = from_bits<float>((direct ? biased - 30 : 97u) << 23);
  const float second = direct ? 1.0f : from_bits<float>(biased != 0 ? biased << 23 : 1u << 22);
  for (unsigned i = 0; i < 4; ++i) {
    // Each product rounded on its own, as on the CPU: `mul_rn`, so that nvcc fuses neither with
    // the other nor with the addition of decode_accumulate.
    g[i] = mul_rn(mul_rn(static_cast<float>(static_cast<std::int32_t>(values[i])), first), second);
  }
}

/// The 4R stream bits of one block of `count` (1 ≤ count ≤ 4) finite values, first bit lowest,
/// zero past the block (`budget` = 4R − 9, `block_bits` = 4R): the header, then the planes from
/// 31 down, `code_plane` each, until the budget is spent. The reference coder the GPU runs per
/// block; the CPU's table-driven coder writes the same bits.
GRADCOMP_HOST_DEVICE inline wide_word encode_block(const float* values, unsigned count, unsigned budget,
                                                   unsigned block_bits) noexcept {
  std::uint32_t f[4] = {0, 0, 0, 0};  // gather_block writes all four; zeroed so that compilers see it
  std::uint32_t u[4];
  gather_block(values, count, f);
  const std::uint32_t biased = cast_block(f, u);
  if (biased == 0) return 0;  // one 0 bit, then zeros
  wide_word coded = 0;
  unsigned length = 0;
  unsigned significant = 0;
  for (int k = 31; k >= 0 && length < budget; --k) {
    unsigned x = 0;
    for (unsigned i = 0; i < 4; ++i) x |= ((u[i] >> k) & 1u) << i;
    const plane_code c = code_plane(significant, x);
    coded |= static_cast<wide_word>(c.bits) << length;
    length += c.length;
    while (significant < 4 && (x >> significant) != 0) ++significant;
  }
  const wide_word block = static_cast<wide_word>(2 * biased + 1) | coded << header_bits;
  return block_bits == 128 ? block : block & ((wide_word{1} << block_bits) - 1);
}

/// Decodes one block's stream bits (first bit lowest; bits past the block are ignored) into its
/// four values `g`: a block of zeros (first bit 0) gives +0s; otherwise the planes from 31 down,
/// `parse_plane` each, until the budget is spent (the rest zero), then the inverse negabinary,
/// the inverse lift and `scale_block`.
GRADCOMP_HOST_DEVICE inline void decode_block(wide_word stream, unsigned budget, float* g) noexcept {
  std::uint32_t u[4] = {0, 0, 0, 0};
  if ((stream & 1u) == 0) {
    for (unsigned i = 0; i < 4; ++i) g[i] = 0.0f;
    return;
  }
  const auto header = static_cast<std::uint32_t>(stream & 0x1FFu);
  stream >>= header_bits;
  unsigned consumed = 0;
  unsigned significant = 0;
  for (int k = 31; k >= 0 && consumed < budget; --k) {
    const plane_step step = parse_plane(significant, static_cast<unsigned>(stream) & 0xFFu, budget - consumed);
    for (unsigned i = 0; i < 4; ++i) u[i] |= ((static_cast<std::uint32_t>(step.bits) >> i) & 1u) << k;
    stream >>= step.length;
    consumed += step.length;
    significant = step.row / 1024u;
  }
  for (unsigned i = 0; i < 4; ++i) u[i] = (u[i] ^ negabinary_mask) - negabinary_mask;
  inverse_lift(u);
  scale_block(u, header >> 1, g);
}

}  // namespace gradcomp::zfp_block
