#pragma once
/// @file
/// CPU backend of the ZFP fixed-rate codec (lossless/zfp_fixed_rate.hpp). It writes and reads
/// the same bits as zfp's coder, but not one bit at a time: a block's 4R stream bits are built in
/// (encoder) or loaded into (decoder) one 64-bit word for R ≤ 16, two for R > 16, and each bit
/// plane is coded or decoded with one table lookup.
///
///  - Encoder: four blocks are cast, lifted and mapped to negabinary at once (SSE2, one block per
///    lane). A plane's code depends only on its 4 bits and on which values are significant before
///    it, which the bit planes of the words' suffix ORs give directly, so the first four planes of
///    a block are coded without a chain; once all four values are significant the planes are 4
///    verbatim bits each, eight taken at a time.
///  - Decoder: the empty planes above the first set bit are counted with one trailing-zero count,
///    the group-tested planes decoded by `plane_steps` (indexed by the significant count, the bits
///    the budget leaves and the next 7 stream bits), the verbatim planes eight at a time; four
///    blocks' inverse transforms and scales run at once. Each block is read with unaligned 64-bit
///    loads, the last ones from a zero-padded copy of the stream's end, so no load reaches past
///    the message.
///
/// `portable_kernels` are the scalar twins of `sse2_kernels` and compute the same bits (tested);
/// they run where SSE2 is missing. Nothing is allocated, and no workspace is used.

#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>

#include <gradcomp/core/backend.hpp>
#include <gradcomp/core/cpu_executor.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/wire_envelope.hpp>
#include <gradcomp/cpu/message.hpp>
#include <gradcomp/lossless/zfp_fixed_rate.hpp>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace gradcomp {

namespace cpu::zfp_detail {

/// The negabinary offset: u = (i + mask) ^ mask maps int32 i to its base −2 digits.
inline constexpr std::uint32_t negabinary_mask = 0xaaaaaaaau;

/// Arithmetic right shift by one of the int32 whose bits are x (C++20 defines both conversions).
[[nodiscard]] constexpr std::uint32_t half(std::uint32_t x) noexcept {
  return static_cast<std::uint32_t>(static_cast<std::int32_t>(x) >> 1);
}

/// zfp's forward lifting transform of one 1-D block, on the int32 values' bits (wrapping, so
/// that no input is undefined behaviour; valid blocks never wrap, |i| < 2^30).
constexpr void forward_lift(std::uint32_t* p) noexcept {
  std::uint32_t x = p[0], y = p[1], z = p[2], w = p[3];
  x += w; x = half(x); w -= x;
  z += y; z = half(z); y -= z;
  x += z; x = half(x); z -= x;
  w += y; w = half(w); y -= w;
  w += half(y); y -= half(w);
  p[0] = x; p[1] = y; p[2] = z; p[3] = w;
}

/// zfp's inverse lifting transform of one 1-D block (wrapping: decoded coefficients are untrusted).
constexpr void inverse_lift(std::uint32_t* p) noexcept {
  std::uint32_t x = p[0], y = p[1], z = p[2], w = p[3];
  y += half(w); w -= half(y);
  y += w; w <<= 1; w -= y;
  z += x; x <<= 1; x -= z;
  y += z; z <<= 1; z -= y;
  w += x; x <<= 1; x -= w;
  p[0] = x; p[1] = y; p[2] = z; p[3] = w;
}

/// Stream bits of a block up to 4R = 64 (R ≤ 16) and up to 128 (R ≤ 32).
__extension__ using wide_word = unsigned __int128;

/// How the encoder codes one bit plane: `length` bits (`bits`, first bit lowest), given the
/// number n of values significant before it and the plane's bits x (value i at bit i).
struct plane_code {
  std::uint16_t bits;
  std::uint8_t length;
};

/// zfp's `encode_few_ints` for one plane with an unlimited budget: the n significant values'
/// bits verbatim, then group tests ("is any further bit set?") each followed by a unary scan to
/// the next set bit; the last value's bit is implied by a positive test. At n = 4 the plane is
/// its 4 bits.
constexpr plane_code code_plane(unsigned n, unsigned x) noexcept {
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

/// One step of the decoder: a plane's bits, the stream bits it takes, and the row of
/// `plane_steps` for the next plane (1024 · the significant count after it).
struct plane_step {
  std::uint8_t bits;
  std::uint8_t length;
  std::uint16_t row;
};

/// zfp's `decode_few_ints` for one plane, given n, the next stream bits (from bit 0) and how many
/// of them the block's budget still allows. A budget that ends inside the plane ends it as zfp
/// does: missing verbatim bits are 0, a missing group test ends the plane, and a scan cut short
/// takes the value it reached as the significant one.
constexpr plane_step parse_plane(unsigned n, unsigned stream, unsigned budget) noexcept {
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

/// `code_plane` indexed by 16·mask + x, where mask has bit i set for each value significant
/// before the plane: significance is prefix-closed, so mask is 0, 1, 3, 7 or 15 (n = 0 … 4 set
/// bits); the other rows are never read.
inline constexpr std::array<plane_code, 256> plane_codes = [] {
  std::array<plane_code, 256> t{};
  for (unsigned mask = 0; mask < 16; ++mask)
    for (unsigned x = 0; x < 16; ++x) t[16 * mask + x] = code_plane(static_cast<unsigned>(std::popcount(mask)), x);
  return t;
}();

/// `parse_plane` for n = 0..4, min(bits the budget leaves, 7) and the next 7 stream bits (no
/// plane takes more than 7), indexed by 1024·n + 128·min(left, 7) + next. A budget of 0 gives the
/// empty step: no bits, the same row.
inline constexpr std::array<plane_step, 5120> plane_steps = [] {
  std::array<plane_step, 5120> t{};
  for (unsigned n = 0; n <= 4; ++n)
    for (unsigned left = 0; left < 8; ++left)
      for (unsigned next = 0; next < 128; ++next) t[1024 * n + 128 * left + next] = parse_plane(n, next, left);
  return t;
}();

static_assert([] {
  for (unsigned n = 0; n <= 4; ++n)
    for (unsigned next = 0; next < 256; ++next)
      if (parse_plane(n, next, 32).length > 7 || code_plane(n, next & 15u).length > 7) return false;
  return true;
}(), "a plane takes at most 7 bits");

[[nodiscard]] inline std::uint64_t load_word(const std::byte* p) noexcept {
  std::uint64_t w;
  std::memcpy(&w, p, sizeof w);
  return w;
}

/// Appends bits to a stream, bit j at bit j mod 8 of byte ⌊j/8⌋, keeping the 64 bits being
/// filled in a register. Writes only whole 64-bit words until `finish`, which writes the bytes
/// of the last word that hold stream bits: nothing past ⌈bits / 8⌉ bytes.
class bit_writer {
 public:
  explicit bit_writer(std::byte* out) noexcept : out_(out) {}

  /// Appends the `count` low bits of `bits` (1 ≤ count ≤ 64; bits above `count` must be zero).
  void put(std::uint64_t bits, unsigned count) noexcept {
    buffer_ |= bits << fill_;
    fill_ += count;
    if (fill_ >= 64) {
      std::memcpy(out_, &buffer_, sizeof buffer_);
      out_ += sizeof buffer_;
      fill_ -= 64;
      buffer_ = fill_ == 0 ? 0 : bits >> (count - fill_);
    }
  }

  /// Appends the `count` low bits of `bits` (1 ≤ count ≤ 128; bits above `count` must be zero).
  void put(wide_word bits, unsigned count) noexcept {
    if (count > 64) {
      put(static_cast<std::uint64_t>(bits), 64);
      put(static_cast<std::uint64_t>(bits >> 64), count - 64);
    } else {
      put(static_cast<std::uint64_t>(bits), count);
    }
  }

  /// Writes the bytes of the word being filled that hold stream bits, zero-padded to a whole
  /// byte (libzfp's `stream_flush` with 8-bit stream words).
  void finish() noexcept { std::memcpy(out_, &buffer_, (fill_ + 7) / 8); }

 private:
  std::byte* out_;
  std::uint64_t buffer_ = 0;
  unsigned fill_ = 0;
};

/// Lane i of entry x is bit i of x.
struct alignas(16) spread_entry {
  std::uint32_t lane[4];
};
inline constexpr std::array<spread_entry, 16> spread = [] {
  std::array<spread_entry, 16> t{};
  for (unsigned x = 0; x < 16; ++x)
    for (unsigned i = 0; i < 4; ++i) t[x].lane[i] = (x >> i) & 1u;
  return t;
}();

/// The `count` (1 ≤ count ≤ 4) values at `values` as a block of float bits, padded as zfp's
/// `pad_block` pads a partial block: m = 1 → f1 = f2 = f3 = f0; m = 2 → f2 = f1, f3 = f0;
/// m = 3 → f3 = f0.
inline void gather_block(const float* values, std::size_t count, std::uint32_t* f) noexcept {
  std::memcpy(f, values, 4 * count);
  switch (count) {
    case 1: f[1] = f[0]; [[fallthrough]];
    case 2: f[2] = f[1]; [[fallthrough]];
    case 3: f[3] = f[0]; break;
    default: break;
  }
}

/// Block-floating-point cast, lift and negabinary of one block of four finite floats (as bits):
/// the negabinary words in `u`. Returns the biased exponent e_b (0: a block of zeros; `u` is
/// then all 0).
inline std::uint32_t cast_block(const std::uint32_t* f, std::uint32_t* u) noexcept {
  std::uint32_t largest = 0;
  for (unsigned i = 0; i < 4; ++i) largest = std::max(largest, f[i] & 0x7fffffffu);
  // frexp exponent of the largest magnitude, biased by 127: (its exponent field) + 1, which for a
  // subnormal (field 0) is the clamped 1 − 127; 0 for a block of zeros.
  const std::uint32_t biased = (largest >> 23) + (largest != 0 ? 1u : 0u);
  // i = trunc(f · 2^(30 − emax)), exact in double for every exponent (libzfp's float scale
  // overflows below emax = −97).
  const double scale = std::bit_cast<double>(std::uint64_t{1023 + 157 - biased} << 52);
  for (unsigned i = 0; i < 4; ++i)
    u[i] = static_cast<std::uint32_t>(static_cast<std::int32_t>(static_cast<double>(std::bit_cast<float>(f[i])) * scale));
  forward_lift(u);
  for (unsigned i = 0; i < 4; ++i) u[i] = (u[i] + negabinary_mask) ^ negabinary_mask;
  return biased;
}

/// float(i) · 2^(e_b − 157) for the four decoded int32 `values` (bits) of a block of biased
/// exponent e_b (0..255), each with one rounding: libzfp's `(float)i * ldexpf(1, emax − 30)`
/// where that power of two is a float (e_b ≥ 8), and without its flush to zero below. For
/// e_b ≥ 31 the scale is a normal float; below, 2^−30 is applied first (exactly), then 2^(e_b −
/// 127), normal or, for e_b = 0 (a header the encoder never writes), the subnormal 2^−127.
inline void scale_block(const std::uint32_t* values, std::uint32_t biased, float* g) noexcept {
  const bool direct = biased >= 31;
  const float first = std::bit_cast<float>((direct ? biased - 30 : 97u) << 23);
  const float second = direct ? 1.0f : std::bit_cast<float>(biased != 0 ? biased << 23 : 1u << 22);
  for (unsigned i = 0; i < 4; ++i) g[i] = static_cast<float>(static_cast<std::int32_t>(values[i])) * first * second;
}

/// Index of the highest set bit of x, −1 for 0.
[[nodiscard]] inline int top_bit(std::uint32_t x) noexcept { return 31 - std::countl_zero(x); }

// ---- kernels ------------------------------------------------------------------------------------
// The operations on a block's four 32-bit words (lanes) and on groups of four blocks. The portable
// kernels are plain scalar code; the SSE2 kernels (x86-64's baseline) compute the same bits.

/// Scalar kernels.
struct portable_kernels {
  /// A block's four words.
  struct lanes {
    std::uint32_t v[4];
  };
  static lanes load(const std::uint32_t* u) noexcept {
    lanes a;
    std::memcpy(a.v, u, sizeof a.v);
    return a;
  }
  static lanes zero() noexcept { return {{0, 0, 0, 0}}; }
  static void store(const lanes& a, std::uint32_t* u) noexcept { std::memcpy(u, a.v, sizeof a.v); }
  /// Lane i: the OR of lanes i … 3.
  static lanes suffix_or(lanes a) noexcept {
    for (int i = 2; i >= 0; --i) a.v[i] |= a.v[i + 1];
    return a;
  }
  static std::uint32_t first(const lanes& a) noexcept { return a.v[0]; }
  /// Every lane shifted left by `count` (≤ 32).
  static lanes shift_left(lanes a, unsigned count) noexcept {
    for (std::uint32_t& v : a.v) v = count < 32 ? v << count : 0;
    return a;
  }
  /// Bit k of each lane, lane i at bit i.
  static unsigned plane(const lanes& a, unsigned k) noexcept {
    unsigned x = 0;
    for (unsigned i = 0; i < 4; ++i) x |= ((a.v[i] >> k) & 1u) << i;
    return x;
  }
  /// Byte j (0..3): plane 31 − j of `f` in the high nibble, of `v` in the low one.
  static std::uint32_t four_plane_pairs(const lanes& v, const lanes& f) noexcept {
    std::uint32_t pairs = 0;
    for (unsigned j = 0; j < 4; ++j) pairs |= (plane(f, 31 - j) << 4 | plane(v, 31 - j)) << (8 * j);
    return pairs;
  }
  /// Nibble j (0..7): plane 31 − j.
  static std::uint32_t eight_planes(const lanes& v) noexcept {
    std::uint32_t planes = 0;
    for (unsigned j = 0; j < 8; ++j) planes |= plane(v, 31 - j) << (4 * j);
    return planes;
  }
  /// Every lane shifted left by one, bit i of x entering lane i.
  static lanes push(lanes a, unsigned x) noexcept {
    for (unsigned i = 0; i < 4; ++i) a.v[i] = (a.v[i] << 1) | spread[x].lane[i];
    return a;
  }
  /// Eight `push`es, of nibbles 0, 1, …, 7 of `planes` in that order.
  static lanes push_eight(lanes a, std::uint32_t planes) noexcept {
    for (unsigned j = 0; j < 8; ++j) a = push(a, (planes >> (4 * j)) & 15u);
    return a;
  }
  /// `cast_block` of four whole blocks at `values`: block b's words at u[4b…], e_b at biased[b].
  static void cast_four_blocks(const float* values, std::uint32_t* u, std::uint32_t* biased) noexcept {
    for (unsigned b = 0; b < 4; ++b) {
      std::uint32_t f[4];
      std::memcpy(f, values + 4 * b, sizeof f);
      biased[b] = cast_block(f, u + 4 * b);
    }
  }
  /// The floats of four decoded blocks: block b's negabinary words at u[4b…] (all 0 for a block
  /// of zeros) and its header at headers[b]; values at g[4b…].
  static void finish_four_blocks(const std::uint32_t* u, const std::uint32_t* headers, float* g) noexcept {
    for (unsigned b = 0; b < 4; ++b) {
      std::uint32_t values[4];
      for (unsigned i = 0; i < 4; ++i) values[i] = (u[4 * b + i] ^ negabinary_mask) - negabinary_mask;
      inverse_lift(values);
      scale_block(values, headers[b] >> 1, g + 4 * b);
    }
  }
};

#if defined(__SSE2__)
/// SSE2 kernels: a block's words in one register; four blocks' casts and inverse transforms
/// with one block per lane.
struct sse2_kernels {
  using lanes = __m128i;
  static lanes load(const std::uint32_t* u) noexcept { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(u)); }
  static lanes zero() noexcept { return _mm_setzero_si128(); }
  static void store(lanes a, std::uint32_t* u) noexcept { _mm_storeu_si128(reinterpret_cast<__m128i*>(u), a); }
  static lanes suffix_or(lanes a) noexcept {
    a = _mm_or_si128(a, _mm_srli_si128(a, 4));
    return _mm_or_si128(a, _mm_srli_si128(a, 8));
  }
  static std::uint32_t first(lanes a) noexcept { return static_cast<std::uint32_t>(_mm_cvtsi128_si32(a)); }
  static lanes shift_left(lanes a, unsigned count) noexcept {
    return _mm_sll_epi32(a, _mm_cvtsi32_si128(static_cast<int>(count)));
  }
  static unsigned plane(lanes a, unsigned k) noexcept {
    return static_cast<unsigned>(_mm_movemask_ps(_mm_castsi128_ps(shift_left(a, 31 - k))));
  }
  /// The top bytes of v's and f's lanes, packed [v0 v1 v2 v3 f0 f1 f2 f3] twice; 16-bit lanes
  /// multiplied by 2^j move bit 7 − j of each byte to its top bit, which `pmovmskb` collects.
  static std::uint32_t four_plane_pairs(lanes v, lanes f) noexcept {
    const __m128i tops = _mm_packs_epi32(_mm_srli_epi32(v, 24), _mm_srli_epi32(f, 24));
    const __m128i bytes = _mm_packus_epi16(tops, tops);
    const auto low = static_cast<std::uint32_t>(_mm_movemask_epi8(_mm_mullo_epi16(bytes, _mm_set_epi16(2, 2, 2, 2, 1, 1, 1, 1))));
    const auto high = static_cast<std::uint32_t>(_mm_movemask_epi8(_mm_mullo_epi16(bytes, _mm_set_epi16(8, 8, 8, 8, 4, 4, 4, 4))));
    return low | high << 16;
  }
  /// As `four_plane_pairs`, with v's top bytes repeated four times.
  static std::uint32_t eight_planes(lanes v) noexcept {
    const __m128i tops = _mm_srli_epi32(v, 24);
    const __m128i bytes = _mm_packus_epi16(_mm_packs_epi32(tops, tops), _mm_packs_epi32(tops, tops));
    const auto low = static_cast<std::uint32_t>(_mm_movemask_epi8(_mm_mullo_epi16(bytes, _mm_set_epi16(8, 8, 4, 4, 2, 2, 1, 1))));
    const auto high =
        static_cast<std::uint32_t>(_mm_movemask_epi8(_mm_mullo_epi16(bytes, _mm_set_epi16(128, 128, 64, 64, 32, 32, 16, 16))));
    return low | high << 16;
  }
  static lanes push(lanes a, unsigned x) noexcept {
    return _mm_or_si128(_mm_add_epi32(a, a), _mm_load_si128(reinterpret_cast<const __m128i*>(spread[x].lane)));
  }
  /// Lane i gets bit i of each nibble, nibble 0 highest: with the nibbles reversed, the bits
  /// 4j + i of lane i are moved to 4j + 3 in each 16-bit half (·2^(3 − i)), gathered to bits
  /// 12 … 15 (·0x249, no two partial products meeting), and the two halves joined.
  static lanes push_eight(lanes a, std::uint32_t planes) noexcept {
    std::uint32_t reversed = (planes >> 24) | ((planes >> 8) & 0xFF00u) | ((planes << 8) & 0xFF0000u) | (planes << 24);
    reversed = ((reversed >> 4) & 0x0F0F0F0Fu) | ((reversed & 0x0F0F0F0Fu) << 4);
    __m128i v = _mm_and_si128(_mm_set1_epi32(static_cast<int>(reversed)),
                              _mm_set_epi32(static_cast<int>(0x88888888u), 0x44444444, 0x22222222, 0x11111111));
    v = _mm_mullo_epi16(v, _mm_set_epi16(1, 1, 2, 2, 4, 4, 8, 8));
    v = _mm_srli_epi16(_mm_mullo_epi16(v, _mm_set1_epi16(0x249)), 12);
    v = _mm_or_si128(_mm_and_si128(v, _mm_set1_epi32(15)), _mm_srli_epi32(v, 12));
    return _mm_or_si128(_mm_slli_epi32(a, 8), v);
  }
  /// The cast is f · s1 · s2 in float, both products exact: s1 = 2^(30 − emax) and s2 = 1 where
  /// that is a float (e_b ≥ 30), else s1 = 2^127 and s2 = 2^(30 − emax − 127).
  static void cast_four_blocks(const float* values, std::uint32_t* u, std::uint32_t* biased) noexcept {
    __m128 c0 = _mm_loadu_ps(values), c1 = _mm_loadu_ps(values + 4), c2 = _mm_loadu_ps(values + 8), c3 = _mm_loadu_ps(values + 12);
    _MM_TRANSPOSE4_PS(c0, c1, c2, c3);  // c_j: value j of the four blocks
    const __m128 magnitude = _mm_castsi128_ps(_mm_set1_epi32(0x7fffffff));
    const __m128i largest = _mm_castps_si128(_mm_max_ps(_mm_max_ps(_mm_and_ps(c0, magnitude), _mm_and_ps(c1, magnitude)),
                                                        _mm_max_ps(_mm_and_ps(c2, magnitude), _mm_and_ps(c3, magnitude))));
    const __m128i e = _mm_add_epi32(_mm_add_epi32(_mm_srli_epi32(largest, 23), _mm_set1_epi32(1)),
                                    _mm_cmpeq_epi32(largest, _mm_setzero_si128()));  // e_b, 0 for zeros
    _mm_storeu_si128(reinterpret_cast<__m128i*>(biased), e);
    // Exponent fields min(284 − e_b, 254) and max(157 − e_b, 127): 16-bit min and max suffice.
    const __m128 s1 = _mm_castsi128_ps(_mm_slli_epi32(_mm_min_epi16(_mm_sub_epi32(_mm_set1_epi32(284), e), _mm_set1_epi32(254)), 23));
    const __m128 s2 = _mm_castsi128_ps(_mm_slli_epi32(_mm_max_epi16(_mm_sub_epi32(_mm_set1_epi32(157), e), _mm_set1_epi32(127)), 23));
    __m128i x = _mm_cvttps_epi32(_mm_mul_ps(_mm_mul_ps(c0, s1), s2));
    __m128i y = _mm_cvttps_epi32(_mm_mul_ps(_mm_mul_ps(c1, s1), s2));
    __m128i z = _mm_cvttps_epi32(_mm_mul_ps(_mm_mul_ps(c2, s1), s2));
    __m128i w = _mm_cvttps_epi32(_mm_mul_ps(_mm_mul_ps(c3, s1), s2));
    // forward_lift
    x = _mm_srai_epi32(_mm_add_epi32(x, w), 1); w = _mm_sub_epi32(w, x);
    z = _mm_srai_epi32(_mm_add_epi32(z, y), 1); y = _mm_sub_epi32(y, z);
    x = _mm_srai_epi32(_mm_add_epi32(x, z), 1); z = _mm_sub_epi32(z, x);
    w = _mm_srai_epi32(_mm_add_epi32(w, y), 1); y = _mm_sub_epi32(y, w);
    w = _mm_add_epi32(w, _mm_srai_epi32(y, 1)); y = _mm_sub_epi32(y, _mm_srai_epi32(w, 1));
    const __m128i mask = _mm_set1_epi32(static_cast<int>(negabinary_mask));
    __m128 r0 = _mm_castsi128_ps(_mm_xor_si128(_mm_add_epi32(x, mask), mask));
    __m128 r1 = _mm_castsi128_ps(_mm_xor_si128(_mm_add_epi32(y, mask), mask));
    __m128 r2 = _mm_castsi128_ps(_mm_xor_si128(_mm_add_epi32(z, mask), mask));
    __m128 r3 = _mm_castsi128_ps(_mm_xor_si128(_mm_add_epi32(w, mask), mask));
    _MM_TRANSPOSE4_PS(r0, r1, r2, r3);  // back to one block per register
    _mm_storeu_ps(reinterpret_cast<float*>(u), r0);
    _mm_storeu_ps(reinterpret_cast<float*>(u + 4), r1);
    _mm_storeu_ps(reinterpret_cast<float*>(u + 8), r2);
    _mm_storeu_ps(reinterpret_cast<float*>(u + 12), r3);
  }
  static void finish_four_blocks(const std::uint32_t* u, const std::uint32_t* headers, float* g) noexcept {
    __m128 r0 = _mm_loadu_ps(reinterpret_cast<const float*>(u)), r1 = _mm_loadu_ps(reinterpret_cast<const float*>(u + 4));
    __m128 r2 = _mm_loadu_ps(reinterpret_cast<const float*>(u + 8)), r3 = _mm_loadu_ps(reinterpret_cast<const float*>(u + 12));
    _MM_TRANSPOSE4_PS(r0, r1, r2, r3);
    const __m128i mask = _mm_set1_epi32(static_cast<int>(negabinary_mask));
    __m128i x = _mm_sub_epi32(_mm_xor_si128(_mm_castps_si128(r0), mask), mask);
    __m128i y = _mm_sub_epi32(_mm_xor_si128(_mm_castps_si128(r1), mask), mask);
    __m128i z = _mm_sub_epi32(_mm_xor_si128(_mm_castps_si128(r2), mask), mask);
    __m128i w = _mm_sub_epi32(_mm_xor_si128(_mm_castps_si128(r3), mask), mask);
    // inverse_lift
    y = _mm_add_epi32(y, _mm_srai_epi32(w, 1)); w = _mm_sub_epi32(w, _mm_srai_epi32(y, 1));
    y = _mm_add_epi32(y, w); w = _mm_sub_epi32(_mm_add_epi32(w, w), y);
    z = _mm_add_epi32(z, x); x = _mm_sub_epi32(_mm_add_epi32(x, x), z);
    y = _mm_add_epi32(y, z); z = _mm_sub_epi32(_mm_add_epi32(z, z), y);
    w = _mm_add_epi32(w, x); x = _mm_sub_epi32(_mm_add_epi32(x, x), w);
    // scale_block's factors per block
    const __m128i e = _mm_srli_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(headers)), 1);
    const __m128i direct = _mm_cmpgt_epi32(e, _mm_set1_epi32(30));
    const __m128i low = _mm_or_si128(_mm_slli_epi32(e, 23), _mm_and_si128(_mm_cmpeq_epi32(e, _mm_setzero_si128()), _mm_set1_epi32(1 << 22)));
    const __m128 first = _mm_castsi128_ps(_mm_or_si128(_mm_and_si128(direct, _mm_slli_epi32(_mm_sub_epi32(e, _mm_set1_epi32(30)), 23)),
                                                       _mm_andnot_si128(direct, _mm_set1_epi32(97 << 23))));
    const __m128 second = _mm_castsi128_ps(_mm_or_si128(_mm_and_si128(direct, _mm_set1_epi32(127 << 23)), _mm_andnot_si128(direct, low)));
    r0 = _mm_mul_ps(_mm_mul_ps(_mm_cvtepi32_ps(x), first), second);
    r1 = _mm_mul_ps(_mm_mul_ps(_mm_cvtepi32_ps(y), first), second);
    r2 = _mm_mul_ps(_mm_mul_ps(_mm_cvtepi32_ps(z), first), second);
    r3 = _mm_mul_ps(_mm_mul_ps(_mm_cvtepi32_ps(w), first), second);
    _MM_TRANSPOSE4_PS(r0, r1, r2, r3);
    _mm_storeu_ps(g, r0);
    _mm_storeu_ps(g + 4, r1);
    _mm_storeu_ps(g + 8, r2);
    _mm_storeu_ps(g + 12, r3);
  }
};
/// The kernels the codec runs: SSE2 where the target has it.
using fast_kernels = sse2_kernels;
#else
/// The kernels the codec runs: SSE2 where the target has it.
using fast_kernels = portable_kernels;
#endif

// ---- encoder ------------------------------------------------------------------------------------

/// The stream bits of one block whose negabinary words are `u` and biased exponent e_b: the
/// header, then the planes coded until `budget` = 4R − 9 bits are spent, then zeros; bits from 4R
/// up are arbitrary (the caller masks them).
///
/// A plane's code depends on its 4 bits and on which values are significant before it, and value
/// i is significant below the highest set bit among values i … 3: a prefix-closed mask that the
/// bit planes of the suffix ORs give without decoding anything. So the planes are coded
/// independently: above the top set bit each is one 0 bit, the next four are looked up from
/// their bits at once, and once all four values are significant each plane is its 4 bits, eight
/// planes at a time. Blocks with fewer than four planes at or below the top set bit, or not all
/// significant after four planes, continue plane by plane.
template <class Kernels, class Word>
[[gnu::always_inline]] inline Word code_planes(const std::uint32_t* u, std::uint32_t biased, unsigned budget) noexcept {
  if (biased == 0) return 0;
  const auto lanes = Kernels::load(u);
  const auto from = Kernels::suffix_or(lanes);
  const int top = top_bit(Kernels::first(from));
  Word coded = 0;
  unsigned length = 0, significant = 0;  // bits written; mask of significant values before plane k
  int k = 31;
  if (top >= 3) {
    const auto shift = static_cast<unsigned>(31 - top);
    length = shift;  // planes above the top set bit: one 0 bit each
    const std::uint32_t pairs = Kernels::four_plane_pairs(Kernels::shift_left(lanes, shift), Kernels::shift_left(from, shift));
    const std::uint32_t sets = pairs & 0xF0F0F0F0u;  // each plane's significance-setting bits, high nibbles
    const std::uint32_t index = (pairs & 0x0F0F0F0Fu) | sets << 8 | sets << 16 | sets << 24;
    for (unsigned j = 0; j < 4; ++j) {  // bits past the budget are masked by the caller
      const plane_code c = plane_codes[(index >> (8 * j)) & 0xFFu];
      coded |= static_cast<Word>(c.bits) << length;
      length += c.length;
    }
    significant = ((sets | sets >> 8 | sets >> 16 | sets >> 24) >> 4) & 15u;
    k = top - 4;
  }
  for (; k >= 0 && length < budget && significant != 15; --k) {  // plane by plane while n < 4
    const plane_code c = plane_codes[16 * significant + Kernels::plane(lanes, static_cast<unsigned>(k))];
    coded |= static_cast<Word>(c.bits) << length;
    length += c.length;
    significant |= Kernels::plane(from, static_cast<unsigned>(k));
  }
  for (; k >= 0 && length < budget; k -= 8, length += 32)  // n = 4: each plane its 4 bits
    coded |= static_cast<Word>(Kernels::eight_planes(Kernels::shift_left(lanes, static_cast<unsigned>(31 - k)))) << length;
  return static_cast<Word>(2 * biased + 1) | coded << zfp_fixed_rate_codec::header_bits;
}

/// Encodes the blocks of `values` (count finite floats) into a stream at `out`, 4R bits a block;
/// `Word` holds 4R bits.
template <class Kernels, class Word>
void encode_blocks(const float* values, std::size_t count, unsigned rate, std::byte* out) noexcept {
  const unsigned block_bits = 4 * rate;
  const unsigned budget = block_bits - zfp_fixed_rate_codec::header_bits;
  const Word mask = block_bits == 8 * sizeof(Word) ? ~Word{0} : (Word{1} << block_bits) - 1;
  bit_writer writer(out);
  std::uint32_t u[16], biased[4];
  std::size_t i = 0;
  for (; i + 16 <= count; i += 16) {
    Kernels::cast_four_blocks(values + i, u, biased);
    for (unsigned b = 0; b < 4; ++b)
      writer.put(code_planes<Kernels, Word>(u + 4 * b, biased[b], budget) & mask, block_bits);
  }
  for (; i < count; i += 4) {
    std::uint32_t f[4];
    gather_block(values + i, std::min<std::size_t>(4, count - i), f);
    biased[0] = cast_block(f, u);
    writer.put(code_planes<Kernels, Word>(u, biased[0], budget) & mask, block_bits);
  }
  writer.finish();
}

// ---- decoder ------------------------------------------------------------------------------------

/// The 64 (`std::uint64_t`) or 128 (`wide_word`) stream bits from bit `shift` (0..7) of `at`
/// on, first bit lowest: loads 16 or 24 bytes from `at`.
template <class Word>
[[nodiscard]] inline Word stream_bits(const std::byte* at, unsigned shift) noexcept {
  const auto join = [shift](std::uint64_t low, std::uint64_t high) {
    return low >> shift | (high << 1) << (63 - shift);  // two shifts: shift 0 takes nothing of high
  };
  const std::uint64_t w0 = load_word(at), w1 = load_word(at + 8);
  if constexpr (sizeof(Word) == 8) {
    return join(w0, w1);
  } else {
    return static_cast<Word>(join(w0, w1)) | static_cast<Word>(join(w1, load_word(at + 16))) << 64;
  }
}

/// Trailing zero bits of x (its width for 0).
template <class Word>
[[nodiscard]] inline unsigned trailing_zeros(Word x) noexcept {
  if constexpr (sizeof(Word) == 8) {
    return static_cast<unsigned>(std::countr_zero(x));
  } else {
    const auto low = static_cast<std::uint64_t>(x);
    return low != 0 ? static_cast<unsigned>(std::countr_zero(low))
                    : 64 + static_cast<unsigned>(std::countr_zero(static_cast<std::uint64_t>(x >> 64)));
  }
}

/// Decodes one block from its stream bits (`stream`, first bit lowest; bits past the block are
/// ignored) into its four negabinary words `u` (0 for a block of zeros). Returns the header: 0
/// for a block of zeros, else 2·e_b + 1.
///
/// After the empty planes above the first set bit (one 0 bit each, counted at once), planes are
/// decoded by `plane_steps`: four unconditionally (a step past the budget is empty), more while a
/// value is not yet significant; then, all four significant, each plane is 4 verbatim bits, eight
/// planes at a time (a last plane cut short by the budget is zero-filled).
template <class Kernels, class Word>
[[gnu::always_inline]] inline std::uint32_t parse_block(Word stream, unsigned budget, std::uint32_t* u) noexcept {
  auto lanes = Kernels::zero();
  if ((stream & 1u) == 0) {
    Kernels::store(lanes, u);
    return 0;
  }
  const auto header = static_cast<std::uint32_t>(stream & 0x1FFu);
  stream >>= zfp_fixed_rate_codec::header_bits;
  // Empty planes push zero bits, which the final shift supplies.
  unsigned consumed = std::min({trailing_zeros(stream), budget, 32u});
  stream >>= consumed;
  unsigned planes = 32 - consumed, row = 0;
  const auto step = [&] {
    const unsigned left_row = 128 * std::min(budget - consumed, 7u);
    const plane_step next = plane_steps[row + left_row + (static_cast<unsigned>(stream) & 127u)];
    lanes = Kernels::push(lanes, next.bits);
    stream >>= next.length;
    consumed += next.length;
    row = next.row;
    --planes;
  };
  if (planes >= 4) {
    step();
    step();
    step();
    step();
  }
  while (consumed < budget && planes != 0 && row != 4 * 1024) step();
  for (unsigned verbatim = std::min(budget - consumed, 4 * planes); verbatim != 0;) {
    const unsigned count = std::min(verbatim, 32u);
    const auto chunk = static_cast<std::uint32_t>(stream) & static_cast<std::uint32_t>((std::uint64_t{1} << count) - 1);
    if (planes >= 8) {
      lanes = Kernels::push_eight(lanes, chunk);
      planes -= 8;
    } else {
      for (unsigned j = 0; j < (count + 3) / 4; ++j, --planes) lanes = Kernels::push(lanes, (chunk >> (4 * j)) & 15u);
    }
    stream >>= count;
    verbatim -= count;
  }
  Kernels::store(Kernels::shift_left(lanes, planes), u);
  return header;
}

/// Decodes the ⌈n/4⌉ blocks of the stream [payload, end) into (or, accumulating, onto) the n
/// values at `out`, four blocks at a time; `Word` holds 4R bits. The last blocks are read from a
/// zero-padded copy of the stream's end, so that no load reaches past it.
template <class Kernels, class Word>
void decode_blocks(const std::byte* payload, const std::byte* end, std::size_t n, unsigned rate, bool accumulate,
                   float* out) noexcept {
  const unsigned block_bits = 4 * rate;
  const unsigned budget = block_bits - zfp_fixed_rate_codec::header_bits;
  constexpr std::ptrdiff_t reach = 24;  // bytes a block's loads may touch from its first byte
  std::byte tail[2 * reach] = {};
  const std::byte* at = payload;
  unsigned shift = 0;
  bool in_tail = false;
  std::uint32_t u[16], headers[4];
  float g[16];
  for (std::size_t first = 0; first < n; first += 16) {
    const std::size_t count = std::min<std::size_t>(16, n - first);
    for (unsigned b = 0; b < 4; ++b) {
      if (4 * b >= count) {  // past the last block
        std::fill(u + 4 * b, u + 4 * b + 4, 0u);
        headers[b] = 0;
        continue;
      }
      if (!in_tail && end - at < reach) {
        std::memcpy(tail, at, static_cast<std::size_t>(end - at));
        at = tail;
        in_tail = true;
      }
      headers[b] = parse_block<Kernels, Word>(stream_bits<Word>(at, shift), budget, u + 4 * b);
      shift += block_bits;
      at += shift / 8;
      shift %= 8;
    }
    if (!accumulate && count == 16) {
      Kernels::finish_four_blocks(u, headers, out + first);
      continue;
    }
    Kernels::finish_four_blocks(u, headers, g);
    if (accumulate)
      for (std::size_t i = 0; i < count; ++i) out[first + i] += g[i];
    else
      std::memcpy(out + first, g, 4 * count);
  }
}

/// Whether the stream ends inside its last byte, with 4 padding bits after it: ⌈n/4⌉·4R is an
/// odd multiple of 4 when ⌈n/4⌉ and R are both odd.
[[nodiscard]] inline bool ends_mid_byte(std::uint64_t blocks, std::uint32_t rate) noexcept {
  return (blocks % 2) * (rate % 2) != 0;
}

}  // namespace cpu::zfp_detail

/// ZFP fixed rate on the CPU.
template <>
struct backend<zfp_fixed_rate_codec, cpu_executor> {
  static std::size_t workspace_bytes(const zfp_fixed_rate_codec&, const cpu_executor&, std::uint64_t) noexcept { return 0; }

  static std::size_t encode(const zfp_fixed_rate_codec& codec, const cpu_executor& exec, std::span<const float> grad,
                            std::span<std::byte> out, std::span<std::byte>, message_key key) {
    using namespace cpu::zfp_detail;
    const std::uint64_t n = grad.size();
    const std::size_t size = codec.max_encoded_bytes(n);
    detail::require(out.size() >= size, errc::buffer_too_small, [&] {
      return "output of " + std::to_string(out.size()) + " bytes cannot hold the " + std::to_string(size) + "-byte message";
    });
    // NaN and Inf are reported before anything is written.
    (void)cpu::max_magnitude(grad.data(), grad.data() + grad.size(), exec.avx2());
    cpu::begin_message(out, size);

    const std::uint32_t rate = codec.params().rate_bits;
    std::byte* const payload = out.data() + envelope::size;
    if (rate <= 16) encode_blocks<fast_kernels, std::uint64_t>(grad.data(), grad.size(), rate, payload);
    else encode_blocks<fast_kernels, wide_word>(grad.data(), grad.size(), rate, payload);
    cpu::seal_message(out, {codec_id::zfp_fixed_rate, value_dtype::float32, 0, 0, key, n, codec.payload_bytes(n),
                            codec.params_hash(), 0},
                      codec.wire().payload_checksum);
    return size;
  }

  static void decode(const zfp_fixed_rate_codec& codec, const cpu_executor&, std::span<const std::byte> message,
                     std::span<float> out, std::span<std::byte>, const decode_limits& limits, bool accumulate) {
    using namespace cpu::zfp_detail;
    const envelope e = parse_envelope(message);
    validate_envelope(e, {codec_id::zfp_fixed_rate, value_dtype::float32, out.size(), codec.params_hash()}, limits);
    detail::require(e.layout == 0, errc::malformed_payload, "ZFP messages have layout 0");
    const std::uint64_t n = e.elements;
    detail::require(e.payload_bytes == codec.payload_bytes(n), errc::malformed_payload, [&] {
      return "payload of " + std::to_string(e.payload_bytes) + " bytes, " + std::to_string(n) + " elements at " +
             std::to_string(codec.params().rate_bits) + " bits per value take " + std::to_string(codec.payload_bytes(n));
    });
    if (n == 0) return;
    const std::byte* const payload = message.data() + envelope::size;
    const std::byte* const end = payload + e.payload_bytes;
    const std::uint64_t blocks = zfp_fixed_rate_codec::block_count(n);
    if (ends_mid_byte(blocks, codec.params().rate_bits))
      detail::require((static_cast<unsigned>(end[-1]) >> 4) == 0, errc::malformed_payload,
                      "the 4 bits after the last block are not zero");

    const std::uint32_t rate = codec.params().rate_bits;
    if (rate <= 16) decode_blocks<fast_kernels, std::uint64_t>(payload, end, out.size(), rate, accumulate, out.data());
    else decode_blocks<fast_kernels, wide_word>(payload, end, out.size(), rate, accumulate, out.data());
  }
};

}  // namespace gradcomp
