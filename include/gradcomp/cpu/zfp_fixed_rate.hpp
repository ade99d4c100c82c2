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
///  - With AVX2 and R ≤ 16, groups of eight blocks are coded and decoded in lock step, one block
///    per 32-bit lane, one group-tested plane of every block per round, then the verbatim planes
///    all at once (`code_eight_blocks_avx2`, `parse_sixteen_blocks_avx2`); the rest of the stream
///    takes the four-block path.
///
/// `portable_kernels` are the scalar twins of `sse2_kernels` and compute the same bits (tested);
/// they run where SSE2 is missing. Nothing is allocated, and no workspace is used. A 16-bit
/// gradient is widened 512 values at a time into a stack buffer that the float32 coder codes; a
/// 16-bit output is decoded the same way, twice (`store_values`: every result checked, then
/// written).

#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <type_traits>

#include <gradcomp/core/backend.hpp>
#include <gradcomp/core/cpu_executor.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/half_float.hpp>
#include <gradcomp/core/wire_envelope.hpp>
#include <gradcomp/cpu/detail/half_conversion.hpp>
#include <gradcomp/cpu/detail/message.hpp>
#include <gradcomp/lossless/zfp_block.hpp>
#include <gradcomp/lossless/zfp_fixed_rate.hpp>

#if defined(__SSE2__)
#  include <emmintrin.h>
#endif
#if defined(GRADCOMP_HAVE_AVX2)
#  include <immintrin.h>
#endif

namespace gradcomp {

namespace detail::cpu::zfp_detail {

using namespace gradcomp::zfp_block;

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

static_assert(
    [] {
      for (unsigned n = 0; n <= 4; ++n)
        for (unsigned next = 0; next < 256; ++next)
          if (parse_plane(n, next, 32).length > 7 || code_plane(n, next & 15u).length > 7) return false;
      return true;
    }(),
    "a plane takes at most 7 bits");

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
    const auto low =
        static_cast<std::uint32_t>(_mm_movemask_epi8(_mm_mullo_epi16(bytes, _mm_set_epi16(2, 2, 2, 2, 1, 1, 1, 1))));
    const auto high =
        static_cast<std::uint32_t>(_mm_movemask_epi8(_mm_mullo_epi16(bytes, _mm_set_epi16(8, 8, 8, 8, 4, 4, 4, 4))));
    return low | high << 16;
  }
  /// As `four_plane_pairs`, with v's top bytes repeated four times.
  static std::uint32_t eight_planes(lanes v) noexcept {
    const __m128i tops = _mm_srli_epi32(v, 24);
    const __m128i bytes = _mm_packus_epi16(_mm_packs_epi32(tops, tops), _mm_packs_epi32(tops, tops));
    const auto low =
        static_cast<std::uint32_t>(_mm_movemask_epi8(_mm_mullo_epi16(bytes, _mm_set_epi16(8, 8, 4, 4, 2, 2, 1, 1))));
    const auto high = static_cast<std::uint32_t>(
        _mm_movemask_epi8(_mm_mullo_epi16(bytes, _mm_set_epi16(128, 128, 64, 64, 32, 32, 16, 16))));
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
    __m128i x, y, z, w, e;
    cast_four_components(values, x, y, z, w, e);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(biased), e);
    __m128 r0 = _mm_castsi128_ps(x), r1 = _mm_castsi128_ps(y), r2 = _mm_castsi128_ps(z), r3 = _mm_castsi128_ps(w);
    _MM_TRANSPOSE4_PS(r0, r1, r2, r3);  // back to one block per register
    _mm_storeu_ps(reinterpret_cast<float*>(u), r0);
    _mm_storeu_ps(reinterpret_cast<float*>(u + 4), r1);
    _mm_storeu_ps(reinterpret_cast<float*>(u + 8), r2);
    _mm_storeu_ps(reinterpret_cast<float*>(u + 12), r3);
  }
  /// `cast_four_blocks` given word by word: `x` gets word 0 of each block, …, `e` the e_b.
  static void cast_four_components(const float* values, __m128i& x, __m128i& y, __m128i& z, __m128i& w,
                                   __m128i& e) noexcept {
    __m128 c0 = _mm_loadu_ps(values), c1 = _mm_loadu_ps(values + 4), c2 = _mm_loadu_ps(values + 8),
           c3 = _mm_loadu_ps(values + 12);
    _MM_TRANSPOSE4_PS(c0, c1, c2, c3);  // c_j: value j of the four blocks
    const __m128 magnitude = _mm_castsi128_ps(_mm_set1_epi32(0x7fffffff));
    const __m128i largest =
        _mm_castps_si128(_mm_max_ps(_mm_max_ps(_mm_and_ps(c0, magnitude), _mm_and_ps(c1, magnitude)),
                                    _mm_max_ps(_mm_and_ps(c2, magnitude), _mm_and_ps(c3, magnitude))));
    e = _mm_add_epi32(_mm_add_epi32(_mm_srli_epi32(largest, 23), _mm_set1_epi32(1)),
                      _mm_cmpeq_epi32(largest, _mm_setzero_si128()));  // e_b, 0 for zeros
    // Exponent fields min(284 − e_b, 254) and max(157 − e_b, 127): 16-bit min and max suffice.
    const __m128 s1 =
        _mm_castsi128_ps(_mm_slli_epi32(_mm_min_epi16(_mm_sub_epi32(_mm_set1_epi32(284), e), _mm_set1_epi32(254)), 23));
    const __m128 s2 =
        _mm_castsi128_ps(_mm_slli_epi32(_mm_max_epi16(_mm_sub_epi32(_mm_set1_epi32(157), e), _mm_set1_epi32(127)), 23));
    x = _mm_cvttps_epi32(_mm_mul_ps(_mm_mul_ps(c0, s1), s2));
    y = _mm_cvttps_epi32(_mm_mul_ps(_mm_mul_ps(c1, s1), s2));
    z = _mm_cvttps_epi32(_mm_mul_ps(_mm_mul_ps(c2, s1), s2));
    w = _mm_cvttps_epi32(_mm_mul_ps(_mm_mul_ps(c3, s1), s2));
    // forward_lift
    x = _mm_srai_epi32(_mm_add_epi32(x, w), 1);
    w = _mm_sub_epi32(w, x);
    z = _mm_srai_epi32(_mm_add_epi32(z, y), 1);
    y = _mm_sub_epi32(y, z);
    x = _mm_srai_epi32(_mm_add_epi32(x, z), 1);
    z = _mm_sub_epi32(z, x);
    w = _mm_srai_epi32(_mm_add_epi32(w, y), 1);
    y = _mm_sub_epi32(y, w);
    w = _mm_add_epi32(w, _mm_srai_epi32(y, 1));
    y = _mm_sub_epi32(y, _mm_srai_epi32(w, 1));
    const __m128i mask = _mm_set1_epi32(static_cast<int>(negabinary_mask));
    x = _mm_xor_si128(_mm_add_epi32(x, mask), mask);
    y = _mm_xor_si128(_mm_add_epi32(y, mask), mask);
    z = _mm_xor_si128(_mm_add_epi32(z, mask), mask);
    w = _mm_xor_si128(_mm_add_epi32(w, mask), mask);
  }
  static void finish_four_blocks(const std::uint32_t* u, const std::uint32_t* headers, float* g) noexcept {
    __m128 r0 = _mm_loadu_ps(reinterpret_cast<const float*>(u)),
           r1 = _mm_loadu_ps(reinterpret_cast<const float*>(u + 4));
    __m128 r2 = _mm_loadu_ps(reinterpret_cast<const float*>(u + 8)),
           r3 = _mm_loadu_ps(reinterpret_cast<const float*>(u + 12));
    _MM_TRANSPOSE4_PS(r0, r1, r2, r3);
    finish_four_components(_mm_castps_si128(r0), _mm_castps_si128(r1), _mm_castps_si128(r2), _mm_castps_si128(r3),
                           headers, g);
  }
  /// `finish_four_blocks` of four blocks given word by word: `r0` holds word 0 of each block, …
  static void finish_four_components(__m128i r0, __m128i r1, __m128i r2, __m128i r3, const std::uint32_t* headers,
                                     float* g) noexcept {
    const __m128i mask = _mm_set1_epi32(static_cast<int>(negabinary_mask));
    __m128i x = _mm_sub_epi32(_mm_xor_si128(r0, mask), mask);
    __m128i y = _mm_sub_epi32(_mm_xor_si128(r1, mask), mask);
    __m128i z = _mm_sub_epi32(_mm_xor_si128(r2, mask), mask);
    __m128i w = _mm_sub_epi32(_mm_xor_si128(r3, mask), mask);
    // inverse_lift
    y = _mm_add_epi32(y, _mm_srai_epi32(w, 1));
    w = _mm_sub_epi32(w, _mm_srai_epi32(y, 1));
    y = _mm_add_epi32(y, w);
    w = _mm_sub_epi32(_mm_add_epi32(w, w), y);
    z = _mm_add_epi32(z, x);
    x = _mm_sub_epi32(_mm_add_epi32(x, x), z);
    y = _mm_add_epi32(y, z);
    z = _mm_sub_epi32(_mm_add_epi32(z, z), y);
    w = _mm_add_epi32(w, x);
    x = _mm_sub_epi32(_mm_add_epi32(x, x), w);
    // scale_block's factors per block
    const __m128i e = _mm_srli_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(headers)), 1);
    const __m128i direct = _mm_cmpgt_epi32(e, _mm_set1_epi32(30));
    const __m128i low = _mm_or_si128(_mm_slli_epi32(e, 23),
                                     _mm_and_si128(_mm_cmpeq_epi32(e, _mm_setzero_si128()), _mm_set1_epi32(1 << 22)));
    const __m128 first =
        _mm_castsi128_ps(_mm_or_si128(_mm_and_si128(direct, _mm_slli_epi32(_mm_sub_epi32(e, _mm_set1_epi32(30)), 23)),
                                      _mm_andnot_si128(direct, _mm_set1_epi32(97 << 23))));
    const __m128 second =
        _mm_castsi128_ps(_mm_or_si128(_mm_and_si128(direct, _mm_set1_epi32(127 << 23)), _mm_andnot_si128(direct, low)));
    __m128 f0 = _mm_mul_ps(_mm_mul_ps(_mm_cvtepi32_ps(x), first), second);
    __m128 f1 = _mm_mul_ps(_mm_mul_ps(_mm_cvtepi32_ps(y), first), second);
    __m128 f2 = _mm_mul_ps(_mm_mul_ps(_mm_cvtepi32_ps(z), first), second);
    __m128 f3 = _mm_mul_ps(_mm_mul_ps(_mm_cvtepi32_ps(w), first), second);
    _MM_TRANSPOSE4_PS(f0, f1, f2, f3);
    _mm_storeu_ps(g, f0);
    _mm_storeu_ps(g + 4, f1);
    _mm_storeu_ps(g + 8, f2);
    _mm_storeu_ps(g + 12, f3);
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
    const std::uint32_t pairs =
        Kernels::four_plane_pairs(Kernels::shift_left(lanes, shift), Kernels::shift_left(from, shift));
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
    coded |= static_cast<Word>(Kernels::eight_planes(Kernels::shift_left(lanes, static_cast<unsigned>(31 - k))))
             << length;
  return static_cast<Word>(2 * biased + 1) | coded << zfp_fixed_rate_codec<>::header_bits;
}

#if defined(GRADCOMP_HAVE_AVX2)
static_assert(sizeof(plane_code) == 4, "the AVX2 encoder gathers plane_codes as 32-bit words");

/// Each 32-bit lane's bits in reverse order.
GRADCOMP_TARGET_AVX2 inline __m256i reverse_bits(__m256i v) noexcept {
  const __m256i reversed_nibbles = _mm256_setr_epi8(0, 8, 4, 12, 2, 10, 6, 14, 1, 9, 5, 13, 3, 11, 7, 15, 0, 8, 4, 12,
                                                    2, 10, 6, 14, 1, 9, 5, 13, 3, 11, 7, 15);
  const __m256i nibble = _mm256_set1_epi8(0x0F);
  const __m256i bytes =
      _mm256_or_si256(_mm256_slli_epi16(_mm256_shuffle_epi8(reversed_nibbles, _mm256_and_si256(v, nibble)), 4),
                      _mm256_shuffle_epi8(reversed_nibbles, _mm256_and_si256(_mm256_srli_epi16(v, 4), nibble)));
  return _mm256_shuffle_epi8(bytes, _mm256_setr_epi8(3, 2, 1, 0, 7, 6, 5, 4, 11, 10, 9, 8, 15, 14, 13, 12, 3, 2, 1, 0,
                                                     7, 6, 5, 4, 11, 10, 9, 8, 15, 14, 13, 12));
}

/// Bit j of each lane's low 8 bits (the rest zero) moved to bit 4j.
GRADCOMP_TARGET_AVX2 inline __m256i spread_nibbles(__m256i t) noexcept {
  t = _mm256_and_si256(_mm256_or_si256(t, _mm256_slli_epi32(t, 12)), _mm256_set1_epi32(0x000F000F));
  t = _mm256_and_si256(_mm256_or_si256(t, _mm256_slli_epi32(t, 6)), _mm256_set1_epi32(0x03030303));
  return _mm256_and_si256(_mm256_or_si256(t, _mm256_slli_epi32(t, 3)), _mm256_set1_epi32(0x11111111));
}

/// `cast_block` and `code_planes` of eight whole blocks (32 values at `values`) for 4R ≤ 64, in
/// lock step, one block per 32-bit lane: block b's stream bits (header included; bits from 4R up
/// arbitrary) at streams[b]. The cast is `sse2_kernels::cast_four_components`, twice. Each
/// block's words are shifted so that its top set bit is at bit 31 (the planes above cost one 0
/// bit each); then each round codes the next plane of every block with one gather from
/// `plane_codes`, while some block with budget left has a value not yet significant; after that
/// every plane is its 4 bits, and the next 16 planes are appended at once.
GRADCOMP_TARGET_AVX2 inline void code_eight_blocks_avx2(const float* values, unsigned budget,
                                                        std::uint64_t* streams) noexcept {
  __m128i x0, y0, z0, w0, e0, x1, y1, z1, w1, e1;
  sse2_kernels::cast_four_components(values, x0, y0, z0, w0, e0);
  sse2_kernels::cast_four_components(values + 16, x1, y1, z1, w1, e1);
  __m256i x = _mm256_set_m128i(x1, x0), y = _mm256_set_m128i(y1, y0), z = _mm256_set_m128i(z1, z0),
          w = _mm256_set_m128i(w1, w0);
  const __m256i e = _mm256_set_m128i(e1, e0), zero = _mm256_setzero_si256(), one = _mm256_set1_epi32(1);
  // Planes above the top set bit: one 0 bit each.
  // Leading zeros of each block's OR: the float exponent of its top set bit alone; 32 for none.
  __m256i top = _mm256_or_si256(_mm256_or_si256(x, y), _mm256_or_si256(z, w));
  for (const int shift : {1, 2, 4, 8, 16}) top = _mm256_or_si256(top, _mm256_srli_epi32(top, shift));
  top = _mm256_andnot_si256(_mm256_srli_epi32(top, 1), top);
  const __m256i exponent =
      _mm256_and_si256(_mm256_srli_epi32(_mm256_castps_si256(_mm256_cvtepi32_ps(top)), 23), _mm256_set1_epi32(0xFF));
  __m256i length = _mm256_blendv_epi8(_mm256_sub_epi32(_mm256_set1_epi32(127 + 31), exponent), _mm256_set1_epi32(32),
                                      _mm256_cmpeq_epi32(top, zero));
  alignas(32) std::uint32_t biased[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(biased), e);
  x = _mm256_sllv_epi32(x, length);
  y = _mm256_sllv_epi32(y, length);
  z = _mm256_sllv_epi32(z, length);
  w = _mm256_sllv_epi32(w, length);
  __m256i planes = _mm256_sub_epi32(_mm256_set1_epi32(32), length), significant = zero, low = zero, high = zero;
  const __m256i limit = _mm256_set1_epi32(static_cast<int>(budget)), word = _mm256_set1_epi32(32),
                all = _mm256_set1_epi32(15);
  const auto* const table = reinterpret_cast<const int*>(plane_codes.data());
  // Group-tested planes, one a round, while a lane with planes and budget left has a value not yet
  // significant (fully significant lanes take their 4 bits from the table meanwhile).
  for (;;) {
    const __m256i active = _mm256_and_si256(_mm256_cmpgt_epi32(planes, zero), _mm256_cmpgt_epi32(limit, length));
    const __m256i grouped = _mm256_and_si256(active, _mm256_xor_si256(significant, all));
    if (_mm256_testz_si256(grouped, grouped) != 0) break;
    const __m256i plane =
        _mm256_or_si256(_mm256_or_si256(_mm256_srli_epi32(x, 31), _mm256_slli_epi32(_mm256_srli_epi32(y, 31), 1)),
                        _mm256_or_si256(_mm256_slli_epi32(_mm256_srli_epi32(z, 31), 2),
                                        _mm256_slli_epi32(_mm256_srli_epi32(w, 31), 3)));
    const __m256i code = _mm256_i32gather_epi32(table, _mm256_add_epi32(_mm256_slli_epi32(significant, 4), plane), 4);
    const __m256i suffix = _mm256_or_si256(_mm256_or_si256(plane, _mm256_srli_epi32(plane, 1)),
                                           _mm256_or_si256(_mm256_srli_epi32(plane, 2), _mm256_srli_epi32(plane, 3)));
    significant = _mm256_or_si256(significant, suffix);
    const __m256i bits = _mm256_and_si256(_mm256_and_si256(code, _mm256_set1_epi32(0xFFFF)), active);
    const __m256i count =
        _mm256_and_si256(_mm256_and_si256(_mm256_srli_epi32(code, 16), _mm256_set1_epi32(0xFF)), active);
    low = _mm256_or_si256(low, _mm256_sllv_epi32(bits, length));
    high = _mm256_or_si256(high, _mm256_or_si256(_mm256_sllv_epi32(bits, _mm256_sub_epi32(length, word)),
                                                 _mm256_srlv_epi32(bits, _mm256_sub_epi32(word, length))));
    length = _mm256_add_epi32(length, count);
    // Every lane moves on (an inactive lane's further bits are past its budget or zero), so the
    // next gather does not wait for this one.
    x = _mm256_slli_epi32(x, 1);
    y = _mm256_slli_epi32(y, 1);
    z = _mm256_slli_epi32(z, 1);
    w = _mm256_slli_epi32(w, 1);
    planes = _mm256_sub_epi32(planes, one);
  }
  // Then every plane is its 4 bits: the next 16 planes (64 bits, more than any budget leaves)
  // interleaved from the words' top bits at once; planes past a word's end are zero.
  __m256i chunk_low = zero, chunk_high = zero;
  const __m256i byte = _mm256_set1_epi32(0xFF);
  int value = 0;
  for (const __m256i v : {x, y, z, w}) {
    const __m256i planes_first = reverse_bits(v);  // bit j: plane j from the top
    chunk_low =
        _mm256_or_si256(chunk_low, _mm256_slli_epi32(spread_nibbles(_mm256_and_si256(planes_first, byte)), value));
    chunk_high =
        _mm256_or_si256(chunk_high,
                        _mm256_slli_epi32(spread_nibbles(_mm256_and_si256(_mm256_srli_epi32(planes_first, 8), byte)),
                                          value));
    ++value;
  }
  low = _mm256_or_si256(low, _mm256_sllv_epi32(chunk_low, length));
  high = _mm256_or_si256(high,
                         _mm256_or_si256(_mm256_or_si256(_mm256_sllv_epi32(chunk_high, length),
                                                         _mm256_srlv_epi32(chunk_low, _mm256_sub_epi32(word, length))),
                                         _mm256_sllv_epi32(chunk_low, _mm256_sub_epi32(length, word))));
  alignas(32) std::uint32_t lows[8], highs[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lows), low);
  _mm256_store_si256(reinterpret_cast<__m256i*>(highs), high);
  for (unsigned b = 0; b < 8; ++b)
    streams[b] = biased[b] == 0 ? 0
                                : (2 * std::uint64_t{biased[b]} + 1) | (std::uint64_t{highs[b]} << 32 | lows[b])
                                                                           << zfp_fixed_rate_codec<>::header_bits;
}
#endif

/// Encodes the blocks of `values` (count finite floats) into a stream at `out`, 4R bits a block;
/// `Word` holds 4R bits. Four blocks at a time, or, where `avx2` is set and 4R ≤ 64, eight in
/// lock step first.
template <class Kernels, class Word>
void encode_blocks(const float* values, std::size_t count, unsigned rate, bool avx2, std::byte* out) noexcept {
  const unsigned block_bits = 4 * rate;
  const unsigned budget = block_bits - zfp_fixed_rate_codec<>::header_bits;
  const Word mask = block_bits == 8 * sizeof(Word) ? ~Word{0} : (Word{1} << block_bits) - 1;
  bit_writer writer(out);
  std::uint32_t u[16], biased[4];
  std::size_t i = 0;
#if defined(GRADCOMP_HAVE_AVX2)
  if constexpr (sizeof(Word) == 8 && std::is_same_v<Kernels, sse2_kernels>) {
    if (avx2) {
      std::uint64_t streams[8];
      for (; i + 32 <= count; i += 32) {
        code_eight_blocks_avx2(values + i, budget, streams);
        for (const std::uint64_t stream : streams) writer.put(stream & mask, block_bits);
      }
    }
  }
#endif
  (void)avx2;
  for (; i + 16 <= count; i += 16) {
    Kernels::cast_four_blocks(values + i, u, biased);
    for (unsigned b = 0; b < 4; ++b)
      writer.put(code_planes<Kernels, Word>(u + 4 * b, biased[b], budget) & mask, block_bits);
  }
  for (; i < count; i += 4) {
    std::uint32_t f[4];
    gather_block(values + i, static_cast<unsigned>(std::min<std::size_t>(4, count - i)), f);
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
  stream >>= zfp_fixed_rate_codec<>::header_bits;
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

/// Reads a stream's blocks in order, 4R bits each: `next` gives the stream bits of the next block
/// (first bit lowest). The last blocks are read from a zero-padded copy of the stream's end, so
/// that no load reaches past it.
template <class Word>
class block_cursor {
 public:
  /// Starts at bit `first_bit` of the stream, a block's first bit.
  block_cursor(const std::byte* payload, const std::byte* end, unsigned block_bits,
               std::uint64_t first_bit = 0) noexcept
      : at_(payload + first_bit / 8),
        end_(end),
        block_bits_(block_bits),
        shift_(static_cast<unsigned>(first_bit % 8)) {}
  block_cursor(const block_cursor&) = delete;
  block_cursor& operator=(const block_cursor&) = delete;

  [[nodiscard]] Word next() noexcept {
    if (!in_tail_ && end_ - at_ < reach) {
      std::memcpy(tail_, at_, static_cast<std::size_t>(end_ - at_));
      at_ = tail_;
      in_tail_ = true;
    }
    const Word bits = stream_bits<Word>(at_, shift_);
    shift_ += block_bits_;
    at_ += shift_ / 8;
    shift_ %= 8;
    return bits;
  }

 private:
  static constexpr std::ptrdiff_t reach = 24;  // bytes a block's loads may touch from its first byte
  std::byte tail_[2 * reach] = {};
  const std::byte* at_;
  const std::byte* end_;
  unsigned block_bits_;
  unsigned shift_;
  bool in_tail_ = false;
};

#if defined(GRADCOMP_HAVE_AVX2)
static_assert(sizeof(plane_step) == 4, "the AVX2 decoder gathers plane_steps as 32-bit words");

/// The decoder state of eight blocks in lock step, one block per 32-bit lane: the unread stream
/// bits (low, high halves), the bits the budget leaves, the planes left, the `plane_steps` row
/// (1024 · the significant count), and the four words built so far.
struct eight_block_decoder {
  __m256i low, high, left, planes, row, words[4];

  /// Reads eight consecutive blocks, the first at bit `first_bit` of `payload` (at least 16
  /// readable bytes from each block's first byte), and takes their headers (to headers[0..8)) and
  /// the empty planes above each first set bit.
  GRADCOMP_TARGET_AVX2 void start(const std::byte* payload, std::uint64_t first_bit, unsigned block_bits,
                                  unsigned budget, std::uint32_t* headers) noexcept {
    const auto bits = static_cast<long long>(block_bits);
    const __m256i at0 = _mm256_add_epi64(_mm256_set1_epi64x(static_cast<long long>(first_bit)),
                                         _mm256_setr_epi64x(0, bits, 2 * bits, 3 * bits));
    const __m256i at1 = _mm256_add_epi64(at0, _mm256_set1_epi64x(4 * bits));
    const __m256i s0 = stream_bits(payload, at0), s1 = stream_bits(payload, at1);
    // Split into the low and high halves of the eight streams, block b in lane b.
    __m256i lo = _mm256_permute4x64_epi64(_mm256_castps_si256(_mm256_shuffle_ps(_mm256_castsi256_ps(s0),
                                                                                _mm256_castsi256_ps(s1), 0x88)),
                                          0xD8);
    __m256i hi = _mm256_permute4x64_epi64(_mm256_castps_si256(_mm256_shuffle_ps(_mm256_castsi256_ps(s0),
                                                                                _mm256_castsi256_ps(s1), 0xDD)),
                                          0xD8);
    const __m256i zero = _mm256_setzero_si256(), one = _mm256_set1_epi32(1), word = _mm256_set1_epi32(32);
    const __m256i coded = _mm256_cmpeq_epi32(_mm256_and_si256(lo, one), one);  // blocks that are not all zero
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(headers),
                        _mm256_and_si256(_mm256_and_si256(lo, _mm256_set1_epi32(0x1FF)), coded));
    lo = _mm256_or_si256(_mm256_srli_epi32(lo, zfp_fixed_rate_codec<>::header_bits),
                         _mm256_slli_epi32(hi, 32 - zfp_fixed_rate_codec<>::header_bits));
    hi = _mm256_srli_epi32(hi, zfp_fixed_rate_codec<>::header_bits);
    // Trailing zeros of the low half, from the float exponent of its lowest set bit; 32 for none.
    const __m256i lowest = _mm256_and_si256(lo, _mm256_sub_epi32(zero, lo));
    const __m256i exponent = _mm256_and_si256(_mm256_srli_epi32(_mm256_castps_si256(_mm256_cvtepi32_ps(lowest)), 23),
                                              _mm256_set1_epi32(0xFF));
    const __m256i none = _mm256_cmpeq_epi32(lo, zero);
    const __m256i zeros = _mm256_blendv_epi8(_mm256_sub_epi32(exponent, _mm256_set1_epi32(127)), word, none);
    const __m256i consumed =
        _mm256_blendv_epi8(word, _mm256_min_epu32(zeros, _mm256_set1_epi32(static_cast<int>(std::min(budget, 32u)))),
                           coded);
    low = _mm256_or_si256(_mm256_srlv_epi32(lo, consumed), _mm256_sllv_epi32(hi, _mm256_sub_epi32(word, consumed)));
    high = _mm256_srlv_epi32(hi, consumed);
    planes = _mm256_sub_epi32(word, consumed);
    left = _mm256_and_si256(_mm256_sub_epi32(_mm256_set1_epi32(static_cast<int>(budget)), consumed),
                            _mm256_cmpgt_epi32(planes, zero));
    row = zero;
    for (__m256i& w : words) w = zero;
  }

  /// The 64 stream bits from each bit position in `at` (four 64-bit lanes) on, first bit lowest:
  /// two gathers of 8 bytes from each position's byte.
  GRADCOMP_TARGET_AVX2 static __m256i stream_bits(const std::byte* payload, __m256i at) noexcept {
    const __m256i byte = _mm256_srli_epi64(at, 3), shift = _mm256_and_si256(at, _mm256_set1_epi64x(7));
    const __m256i first = _mm256_i64gather_epi64(reinterpret_cast<const long long*>(payload), byte, 1);
    const __m256i second = _mm256_i64gather_epi64(reinterpret_cast<const long long*>(payload + 8), byte, 1);
    return _mm256_or_si256(_mm256_srlv_epi64(first, shift),
                           _mm256_sllv_epi64(second, _mm256_sub_epi64(_mm256_set1_epi64x(64), shift)));
  }

  /// Non-zero in the lanes that still have budget and a value not yet significant.
  [[nodiscard]] GRADCOMP_TARGET_AVX2 __m256i grouped() const noexcept {
    return _mm256_andnot_si256(_mm256_cmpeq_epi32(row, _mm256_set1_epi32(4 * 1024)), left);
  }

  /// Decodes one plane of every block by `plane_steps` (empty where the budget is spent).
  GRADCOMP_TARGET_AVX2 void table_step() noexcept {
    const __m256i byte = _mm256_set1_epi32(0xFF);
    const __m256i index =
        _mm256_add_epi32(_mm256_add_epi32(row, _mm256_slli_epi32(_mm256_min_epu32(left, _mm256_set1_epi32(7)), 7)),
                         _mm256_and_si256(low, _mm256_set1_epi32(127)));
    const __m256i step = _mm256_i32gather_epi32(reinterpret_cast<const int*>(plane_steps.data()), index, 4);
    row = _mm256_srli_epi32(step, 16);
    take(_mm256_and_si256(step, byte), _mm256_and_si256(_mm256_srli_epi32(step, 8), byte));
  }

  /// Decodes the rest of every block, all of whose values are significant (or whose budget is
  /// spent): min(budget left, 4 · planes left) verbatim bits, 4 a plane, the last plane
  /// zero-filled where the budget ends. Word i takes bits i, i + 4, … of those, first plane highest.
  GRADCOMP_TARGET_AVX2 void verbatim_rest() noexcept {
    const __m256i zero = _mm256_setzero_si256(), one = _mm256_set1_epi32(1), word = _mm256_set1_epi32(32);
    const __m256i taken = _mm256_min_epu32(left, _mm256_slli_epi32(planes, 2));
    const __m256i count = _mm256_srli_epi32(_mm256_add_epi32(taken, _mm256_set1_epi32(3)), 2);  // planes decoded
    // Bits past `taken` are cleared where they share a plane with taken bits; whole planes past it
    // are shifted out below.
    const __m256i lo = _mm256_and_si256(low, _mm256_sub_epi32(_mm256_sllv_epi32(one, taken), one));
    const __m256i hi =
        _mm256_and_si256(high, _mm256_sub_epi32(_mm256_sllv_epi32(one, _mm256_sub_epi32(taken, word)), one));
    const __m256i drop = _mm256_sub_epi32(word, count);
    for (int i = 0; i < 4; ++i) {
      const __m256i bits = _mm256_or_si256(gather_nibble_bits(_mm256_srli_epi32(lo, i)),
                                           _mm256_slli_epi32(gather_nibble_bits(_mm256_srli_epi32(hi, i)), 8));
      words[i] = _mm256_or_si256(_mm256_sllv_epi32(words[i], count), _mm256_srlv_epi32(reverse_bits(bits), drop));
    }
    planes = _mm256_sub_epi32(planes, count);
    left = zero;
  }

  /// Bit 4j of each lane moved to bit j (j < 8); the rest zero.
  GRADCOMP_TARGET_AVX2 static __m256i gather_nibble_bits(__m256i t) noexcept {
    t = _mm256_and_si256(t, _mm256_set1_epi32(0x11111111));
    t = _mm256_and_si256(_mm256_or_si256(t, _mm256_srli_epi32(t, 3)), _mm256_set1_epi32(0x03030303));
    t = _mm256_and_si256(_mm256_or_si256(t, _mm256_srli_epi32(t, 6)), _mm256_set1_epi32(0x000F000F));
    return _mm256_and_si256(_mm256_or_si256(t, _mm256_srli_epi32(t, 12)), _mm256_set1_epi32(0xFF));
  }

  /// Pushes plane `bits` (value i at bit i) into the words of each block with planes left, and
  /// advances the stream by `length`; a block out of planes ends its budget.
  GRADCOMP_TARGET_AVX2 void take(__m256i bits, __m256i length) noexcept {
    const __m256i zero = _mm256_setzero_si256(), one = _mm256_set1_epi32(1);
    const __m256i push = _mm256_and_si256(_mm256_cmpgt_epi32(planes, zero), one);
    for (int i = 0; i < 4; ++i)
      words[i] = _mm256_or_si256(_mm256_sllv_epi32(words[i], push), _mm256_and_si256(_mm256_srli_epi32(bits, i), one));
    low = _mm256_or_si256(_mm256_srlv_epi32(low, length),
                          _mm256_sllv_epi32(high, _mm256_sub_epi32(_mm256_set1_epi32(32), length)));
    high = _mm256_srlv_epi32(high, length);
    planes = _mm256_sub_epi32(planes, push);
    left = _mm256_and_si256(_mm256_sub_epi32(left, length), _mm256_cmpgt_epi32(planes, zero));
  }

  /// Word i of block b at out[8i + b], the planes not decoded as zeros.
  GRADCOMP_TARGET_AVX2 void finish(std::uint32_t* out) const noexcept {
    for (int i = 0; i < 4; ++i)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 8 * i), _mm256_sllv_epi32(words[i], planes));
  }
};

/// `parse_block` of sixteen consecutive blocks of at most 64 stream bits each, the first at bit
/// `first_bit` of `payload`, as two groups of eight in lock step (two independent chains of
/// gathers): each round decodes one plane of every block by `plane_steps`, until every block is
/// fully significant or out of budget; then each block's verbatim rest is taken at once. A block
/// whose budget is spent takes empty steps, which push zero planes; one with no planes left stops
/// shifting. Word i of block 8g + b goes to words[32g + 8i + b], its header to headers[8g + b].
GRADCOMP_TARGET_AVX2 inline void parse_sixteen_blocks_avx2(const std::byte* payload, std::uint64_t first_bit,
                                                           unsigned block_bits, unsigned budget, std::uint32_t* words,
                                                           std::uint32_t* headers) noexcept {
  eight_block_decoder a, b;
  a.start(payload, first_bit, block_bits, budget, headers);
  b.start(payload, first_bit + 8 * std::uint64_t{block_bits}, block_bits, budget, headers + 8);
  for (;;) {
    const __m256i grouped = _mm256_or_si256(a.grouped(), b.grouped());
    if (_mm256_testz_si256(grouped, grouped) != 0) break;
    a.table_step();
    b.table_step();
  }
  a.verbatim_rest();
  b.verbatim_rest();
  a.finish(words);
  b.finish(words + 32);
}

/// Decodes whole groups of sixteen blocks (64 values) from the start of [0, n) with
/// `parse_sixteen_blocks_avx2` (4R ≤ 64), while every block's 16-byte reach stays inside the
/// `bytes`-byte stream at `payload`; returns how many values it decoded.
GRADCOMP_TARGET_AVX2 inline std::size_t decode_sixteens_avx2(const std::byte* payload, std::size_t bytes,
                                                             unsigned block_bits, unsigned budget, std::size_t n,
                                                             bool accumulate, float* out) noexcept {
  alignas(32) std::uint32_t words[64];
  std::uint32_t headers[16];
  float g[64];
  std::size_t first = 0;
  for (std::uint64_t bit = 0; first + 64 <= n && (bit + 15 * std::uint64_t{block_bits}) / 8 + 16 <= bytes;
       first += 64, bit += 16 * std::uint64_t{block_bits}) {
    parse_sixteen_blocks_avx2(payload, bit, block_bits, budget, words, headers);
    float* const to = accumulate ? g : out + first;
    for (unsigned quarter = 0; quarter < 4; ++quarter) {
      const auto word = [&](unsigned i) {
        return _mm_load_si128(reinterpret_cast<const __m128i*>(words + 32 * (quarter / 2) + 8 * i + 4 * (quarter % 2)));
      };
      sse2_kernels::finish_four_components(word(0), word(1), word(2), word(3), headers + 4 * quarter,
                                           to + 16 * quarter);
    }
    if (accumulate)
      for (unsigned i = 0; i < 64; ++i) out[first + i] += g[i];
  }
  return first;
}
#endif

/// Decodes the ⌈n/4⌉ blocks of the stream [payload, end) into (or, accumulating, onto) the n
/// values at `out`; `Word` holds 4R bits. Four blocks at a time, or, where `avx2` is set and
/// 4R ≤ 64, sixteen (two groups of eight in lock step) first.
template <class Kernels, class Word>
void decode_blocks(const std::byte* payload, const std::byte* end, std::size_t n, unsigned rate, bool accumulate,
                   bool avx2, float* out) noexcept {
  const unsigned block_bits = 4 * rate;
  const unsigned budget = block_bits - zfp_fixed_rate_codec<>::header_bits;
  std::size_t first = 0;
#if defined(GRADCOMP_HAVE_AVX2)
  if constexpr (sizeof(Word) == 8 && std::is_same_v<Kernels, sse2_kernels>)
    if (avx2)
      first = decode_sixteens_avx2(payload, static_cast<std::size_t>(end - payload), block_bits, budget, n, accumulate,
                                   out);
#endif
  (void)avx2;
  block_cursor<Word> cursor(payload, end, block_bits, first / 4 * std::uint64_t{block_bits});
  std::uint32_t u[16], headers[4];
  float g[16];
  for (; first < n; first += 16) {
    const std::size_t count = std::min<std::size_t>(16, n - first);
    for (unsigned b = 0; b < 4; ++b) {
      if (4 * b >= count) {  // past the last block
        std::fill(u + 4 * b, u + 4 * b + 4, 0u);
        headers[b] = 0;
        continue;
      }
      headers[b] = parse_block<Kernels, Word>(cursor.next(), budget, u + 4 * b);
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

}  // namespace detail::cpu::zfp_detail

/// ZFP fixed rate on the CPU.
template <gradient_value T>
struct backend<zfp_fixed_rate_codec<T>, cpu_executor> {
  using codec_type = zfp_fixed_rate_codec<T>;

  static std::size_t workspace_bytes(const codec_type&, const cpu_executor&, std::uint64_t) noexcept { return 0; }

  static std::size_t encode(const codec_type& codec, const cpu_executor& exec, std::span<const T> grad,
                            std::span<std::byte> out, std::span<std::byte>, message_key key) {
    using namespace detail::cpu::zfp_detail;
    const std::uint64_t n = grad.size();
    const std::size_t size = codec.max_encoded_bytes(n);
    detail::require(out.size() >= size, errc::buffer_too_small, [&] {
      return "output of " + std::to_string(out.size()) + " bytes cannot hold the " + std::to_string(size) +
             "-byte message";
    });
    // NaN and Inf are reported before anything is written.
    (void)detail::cpu::max_magnitude(grad.data(), grad.data() + grad.size(), exec.avx2());
    detail::cpu::begin_message(out, size);

    const std::uint32_t rate = codec.params().rate_bits;
    std::byte* const payload = out.data() + envelope::size;
    if constexpr (half_precision<T>) {
      // A stage of values at a time, widened into a stack buffer: its blocks end on a byte
      // boundary of the stream (stage·R bits), where the next stage's coding continues.
      alignas(32) float wide[stage];
      for (std::uint64_t base = 0; base < n; base += stage) {
        const auto count = static_cast<std::size_t>(std::min<std::uint64_t>(stage, n - base));
        detail::cpu::widen_values(grad.data() + base, count, wide);
        encode_run(wide, count, rate, exec.avx2(), payload + base / 8 * rate);
      }
    } else {
      encode_run(grad.data(), grad.size(), rate, exec.avx2(), payload);
    }
    detail::cpu::seal_message(out,
                              {codec_id::zfp_fixed_rate, dtype_of<T>, 0, 0, key, n, codec.payload_bytes(n),
                               codec.params_hash(), 0},
                              codec.wire().payload_checksum);
    return size;
  }

  /// Into T, or (a 16-bit T) into float32.
  template <gradient_value O>
  static void decode(const codec_type& codec, const cpu_executor& exec, std::span<const std::byte> message,
                     std::span<O> out, std::span<std::byte>, const decode_limits& limits, bool accumulate) {
    using namespace detail::cpu::zfp_detail;
    const envelope e = parse_envelope(message);
    validate_envelope(e, {codec_id::zfp_fixed_rate, dtype_of<T>, out.size(), codec.params_hash()}, limits);
    codec.check_layout(e);
    const std::uint64_t n = e.elements;
    if (n == 0) return;
    const std::byte* const payload = message.data() + envelope::size;
    const std::byte* const end = payload + e.payload_bytes;
    const std::uint64_t blocks = codec_type::block_count(n);
    if (ends_mid_byte(blocks, codec.params().rate_bits))
      detail::require((static_cast<unsigned>(end[-1]) >> 4) == 0, errc::malformed_payload,
                      "the 4 bits after the last block are not zero");

    const std::uint32_t rate = codec.params().rate_bits;
    if constexpr (half_precision<O>) {
      // A stage at a time into a stack buffer, twice: every result checked to narrow to a finite
      // value, then each rounded into the output.
      alignas(32) float wide[stage];
      const auto for_each_result = [&](auto&& use) {
        for (std::uint64_t base = 0; base < n; base += stage) {
          const auto count = static_cast<std::size_t>(std::min<std::uint64_t>(stage, n - base));
          decode_run(payload + base / 8 * rate, end, count, rate, false, exec.avx2(), wide);
          for (std::size_t i = 0; i < count; ++i) use(base + i, accumulate ? widen(out[base + i]) + wide[i] : wide[i]);
        }
      };
      detail::cpu::store_values(for_each_result, out.data());
    } else {
      decode_run(payload, end, out.size(), rate, accumulate, exec.avx2(), out.data());
    }
  }

 private:
  /// Values a 16-bit gradient is widened in at a time: a multiple of 8 blocks, so that a stage
  /// takes a whole number of stream bytes (stage·R / 8).
  static constexpr std::size_t stage = 512;

  /// `encode_blocks` of `count` floats, with the stream word that holds 4R bits.
  static void encode_run(const float* values, std::size_t count, std::uint32_t rate, bool avx2, std::byte* at) {
    using namespace detail::cpu::zfp_detail;
    if (rate <= 16) encode_blocks<fast_kernels, std::uint64_t>(values, count, rate, avx2, at);
    else
      encode_blocks<fast_kernels, wide_word>(values, count, rate, avx2, at);
  }

  /// `decode_blocks` of `count` values from the stream bytes at `at` (the stream ends at `end`).
  static void decode_run(const std::byte* at, const std::byte* end, std::size_t count, std::uint32_t rate,
                         bool accumulate, bool avx2, float* out) {
    using namespace detail::cpu::zfp_detail;
    if (rate <= 16) decode_blocks<fast_kernels, std::uint64_t>(at, end, count, rate, accumulate, avx2, out);
    else
      decode_blocks<fast_kernels, wide_word>(at, end, count, rate, accumulate, avx2, out);
  }
};

}  // namespace gradcomp
