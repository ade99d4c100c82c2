#pragma once
/// @file
/// CPU backend of the MPC codec (lossless/mpc.hpp). Each 1024-word chunk is transformed in a
/// stack buffer that stays in L1: the encoder subtracts, transposes each group (cpu/detail/bit_transpose.hpp,
/// AVX2 where the executor allows it) and writes bitmaps and non-zero words branch-free; the
/// decoder first checks the bitmaps against the payload length and
/// the padding of the last group (decoding the last chunk first), and only then writes the output.
/// A 16-bit gradient is widened a chunk at a time into the stack buffer the encoder codes; its
/// decoder runs over the chunks twice: first to check every word (a widened 16-bit value) and each
/// sum of an accumulation into a 16-bit output (finite when rounded), then to write.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>

#include <gradcomp/core/backend.hpp>
#include <gradcomp/core/cpu_executor.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/half_float.hpp>
#include <gradcomp/core/narrowing.hpp>
#include <gradcomp/core/wire_envelope.hpp>
#include <gradcomp/cpu/detail/bit_transpose.hpp>
#include <gradcomp/cpu/detail/half_conversion.hpp>
#include <gradcomp/cpu/detail/message.hpp>
#include <gradcomp/cpu/detail/staged_writer.hpp>
#include <gradcomp/lossless/mpc.hpp>

#if defined(GRADCOMP_HAVE_AVX2)
#  include <immintrin.h>
#endif

namespace gradcomp {

namespace detail::cpu::mpc_detail {

inline constexpr std::size_t chunk = mpc_codec<>::chunk;
inline constexpr std::size_t group = mpc_codec<>::group;
/// Words before a chunk buffer's first word: w[−1] = 0 lets step 3 read w[t − 1] at t = 0, and the
/// AVX2 kernels load eight words from there.
inline constexpr std::size_t lead = 8;

[[nodiscard]] inline std::uint32_t load_word(const std::byte* p) noexcept {
  std::uint32_t w;
  std::memcpy(&w, p, sizeof w);
  return w;
}

inline void store_word(std::byte* p, std::uint32_t w) noexcept { std::memcpy(p, &w, sizeof w); }

/// For each 8-bit lane mask m: the lanes of its set bits in order (compaction), the number of set
/// bits below each lane (expansion), 0xFF for each set lane (selection), one byte per lane; and
/// its popcount.
struct lane_tables {
  std::uint64_t compact[256];
  std::uint64_t expand[256];
  std::uint64_t select[256];
  std::uint8_t count[256];
};

inline constexpr lane_tables lanes = [] {
  lane_tables t{};
  for (unsigned m = 0; m < 256; ++m) {
    unsigned set = 0;
    for (unsigned lane = 0; lane < 8; ++lane) {
      t.expand[m] |= std::uint64_t{set} << (8 * lane);
      if (((m >> lane) & 1u) == 0) continue;
      t.select[m] |= std::uint64_t{0xFF} << (8 * lane);
      t.compact[m] |= std::uint64_t{lane} << (8 * set++);
    }
    t.count[m] = static_cast<std::uint8_t>(set);
  }
  return t;
}();

/// Set bits of a word (by table: the baseline target has no popcount instruction).
[[nodiscard]] inline std::size_t popcount32(std::uint32_t x) noexcept {
  return std::size_t{lanes.count[x & 0xFFu]} + lanes.count[(x >> 8) & 0xFFu] + lanes.count[(x >> 16) & 0xFFu] +
         lanes.count[x >> 24];
}

// ---- baseline kernels (portable; the AVX2 twins below write the same words) --------------------

/// Step 1: w[t] = v[t] − v[t − dim] for `from` ≤ t < count (from ≥ dim).
inline void subtract_back(const std::byte* v, std::size_t from, std::size_t count, std::size_t dim,
                          std::uint32_t* w) noexcept {
  for (std::size_t t = from; t < count; ++t) w[t] = load_word(v + 4 * t) - load_word(v + 4 * (t - dim));
}

/// Steps 3–4 of `groups` groups of transposed words at w (w[−1] = 0): one bitmap per group at
/// `bitmaps`, the non-zero differences at `words`. Differences are stored whether or not they are
/// kept (the next one overwrites them), so stores may reach past the last kept word, never past
/// the worst case. @returns the end of the kept words.
inline std::byte* eliminate_zeros(const std::uint32_t* w, std::size_t groups, std::byte* bitmaps,
                                  std::byte* words) noexcept {
  for (std::size_t g = 0; g < groups; ++g) {
    std::uint32_t bitmap = 0;
    for (std::size_t lane = 0; lane < group; ++lane) {
      const std::size_t t = g * group + lane;
      const std::uint32_t d = w[t] - (w + t)[-1];  // w[-1] is the zero word before the chunk
      const std::uint32_t keep = d != 0 ? 1u : 0u;
      bitmap |= keep << lane;
      store_word(words, d);
      words += 4 * keep;
    }
    store_word(bitmaps + 4 * g, bitmap);
  }
  return words;
}

/// Inverse of steps 4 and 3 for one group: v[lane] = sum + the carried words of the lanes up to
/// it, word k of `src` read for every lane (masked off where the bit is clear), so `src` must
/// hold 32 words. @returns the running sum after the group.
inline std::uint32_t expand_group(std::uint32_t bitmap, const std::byte* src, std::uint32_t sum,
                                  std::uint32_t* v) noexcept {
  std::size_t k = 0;
  for (std::size_t lane = 0; lane < group; ++lane) {
    const std::uint32_t bit = (bitmap >> lane) & 1u;
    sum += load_word(src + 4 * k) & (0u - bit);
    v[lane] = sum;
    k += bit;
  }
  return sum;
}

/// v[t] += v[t − dim] for dim ≤ t < count, in index order (the inverse of step 1).
inline void undo_subtract(std::uint32_t* v, std::size_t count, std::size_t dim) noexcept {
  if (dim == 1) {
    std::uint32_t sum = 0;
    for (std::size_t t = 0; t < count; ++t) v[t] = sum += v[t];
    return;
  }
  std::size_t t = dim;
  if (dim >= 8) {  // eight words at a time: their sources lie at least 8 back, already final
    for (; t + 8 <= count; t += 8) {
      std::uint32_t back[8];
      std::memcpy(back, v + t - dim, sizeof back);
      for (std::size_t j = 0; j < 8; ++j) v[t + j] += back[j];
    }
  }
  for (; t < count; ++t) v[t] += v[t - dim];
}

// ---- AVX2 twins --------------------------------------------------------------------------------

#if defined(GRADCOMP_HAVE_AVX2)
GRADCOMP_TARGET_AVX2 inline __m256i load8(const void* p) noexcept {
  return _mm256_loadu_si256(static_cast<const __m256i*>(p));
}

/// Lane indices from a table entry (one byte per lane).
GRADCOMP_TARGET_AVX2 inline __m256i lane_indices(std::uint64_t entry) noexcept {
  return _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<long long>(entry)));
}

/// All-ones lanes from a selection entry (0xFF or 0 per lane).
GRADCOMP_TARGET_AVX2 inline __m256i lane_select(std::uint64_t entry) noexcept {
  return _mm256_cvtepi8_epi32(_mm_cvtsi64_si128(static_cast<long long>(entry)));
}

/// Inclusive prefix sum of the eight lanes of x plus `carry` (broadcast); `carry` becomes lane 7.
GRADCOMP_TARGET_AVX2 inline __m256i prefix8(__m256i x, __m256i& carry) noexcept {
  x = _mm256_add_epi32(x, _mm256_slli_si256(x, 4));
  x = _mm256_add_epi32(x, _mm256_slli_si256(x, 8));
  x = _mm256_add_epi32(x, _mm256_permute2x128_si256(_mm256_shuffle_epi32(x, 0xFF), x,
                                                    0x08));  // low lane's total into the high lane
  x = _mm256_add_epi32(x, carry);
  carry = _mm256_permutevar8x32_epi32(x, _mm256_set1_epi32(7));
  return x;
}

GRADCOMP_TARGET_AVX2 inline void subtract_back_avx2(const std::byte* v, std::size_t from, std::size_t count,
                                                    std::size_t dim, std::uint32_t* w) noexcept {
  std::size_t t = from;
  for (; t + 8 <= count; t += 8)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(w + t),
                        _mm256_sub_epi32(load8(v + 4 * t), load8(v + 4 * (t - dim))));
  subtract_back(v, t, count, dim, w);
}

GRADCOMP_TARGET_AVX2 inline std::byte* eliminate_zeros_avx2(const std::uint32_t* w, std::size_t groups,
                                                            std::byte* bitmaps, std::byte* words) noexcept {
  for (std::size_t g = 0; g < groups; ++g) {
    std::uint32_t bitmap = 0;
    for (std::size_t q = 0; q < group / 8; ++q) {
      const std::size_t t = g * group + 8 * q;
      const __m256i d = _mm256_sub_epi32(load8(w + t), load8(w + t - 1));
      const auto zero =
          static_cast<unsigned>(_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(d, _mm256_setzero_si256()))));
      const unsigned keep = ~zero & 0xFFu;
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(words),
                          _mm256_permutevar8x32_epi32(d, lane_indices(lanes.compact[keep])));
      words += 4 * lanes.count[keep];
      bitmap |= keep << (8 * q);
    }
    store_word(bitmaps + 4 * g, bitmap);
  }
  return words;
}

GRADCOMP_TARGET_AVX2 inline std::uint32_t expand_group_avx2(std::uint32_t bitmap, const std::byte* src,
                                                            std::uint32_t sum, std::uint32_t* v) noexcept {
  __m256i carry = _mm256_set1_epi32(static_cast<int>(sum));
  for (std::size_t q = 0; q < group / 8; ++q) {
    const unsigned m = (bitmap >> (8 * q)) & 0xFFu;
    const __m256i x = _mm256_and_si256(_mm256_permutevar8x32_epi32(load8(src), lane_indices(lanes.expand[m])),
                                       lane_select(lanes.select[m]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(v + 8 * q), prefix8(x, carry));
    src += 4 * lanes.count[m];
  }
  return static_cast<std::uint32_t>(_mm256_cvtsi256_si32(carry));
}

/// Stores eight words at `out`, non-temporally when `streaming` (then `out` is 32-byte aligned).
GRADCOMP_TARGET_AVX2 inline void store8(std::byte* out, __m256i x, bool streaming) noexcept {
  if (streaming) _mm256_stream_si256(reinterpret_cast<__m256i*>(out), x);
  else
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), x);
}

/// `undo_subtract` for dim = 1, the result written to `out` (which may be v; 32-byte aligned when
/// `streaming`). A whole chunk runs as two independent carry chains over its halves, the second
/// half's sums (kept in v) shifted by the first half's total afterwards.
GRADCOMP_TARGET_AVX2 inline void undo_subtract_avx2(std::uint32_t* v, std::size_t count, std::byte* out,
                                                    bool streaming) noexcept {
  __m256i carry = _mm256_setzero_si256();
  std::size_t t = 0;
  if (count == chunk) {
    constexpr std::size_t half = chunk / 2;
    __m256i second = _mm256_setzero_si256();
    for (; t < half; t += 8) {
      store8(out + 4 * t, prefix8(load8(v + t), carry), streaming);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(v + half + t), prefix8(load8(v + half + t), second));
    }
    for (; t < chunk; t += 8) store8(out + 4 * t, _mm256_add_epi32(load8(v + t), carry), streaming);
    return;
  }
  for (; t + 8 <= count; t += 8) store8(out + 4 * t, prefix8(load8(v + t), carry), streaming);
  auto sum = static_cast<std::uint32_t>(_mm256_cvtsi256_si32(carry));
  for (std::size_t j = 0; j < count % 8; ++j) store_word(out + 4 * (t + j), sum += v[t + j]);
}
#endif

// ---- chunk transforms ----------------------------------------------------------------------------

/// Steps 1–2 of a chunk of `count` words at `v` (1 ≤ count ≤ 1024): w[0, ⌈count/32⌉·32) in `w`.
inline void forward_chunk(const std::byte* v, std::size_t count, std::size_t dim, bool avx2,
                          std::uint32_t* w) noexcept {
  const std::size_t head = std::min(dim, count);
  for (std::size_t t = 0; t < head; ++t) w[t] = load_word(v + 4 * t);
#if defined(GRADCOMP_HAVE_AVX2)
  if (avx2) subtract_back_avx2(v, head, count, dim, w);
  else
#endif
    subtract_back(v, head, count, dim, w);
  const std::size_t padded = (count + group - 1) / group * group;
  std::fill(w + count, w + padded, std::uint32_t{0});
  for (std::size_t g = 0; g < padded; g += group) transpose32(w + g, avx2);
}

/// Steps 3–4 of a chunk (see `eliminate_zeros`).
inline std::byte* finish_chunk(const std::uint32_t* w, std::size_t groups, bool avx2, std::byte* bitmaps,
                               std::byte* words) noexcept {
#if defined(GRADCOMP_HAVE_AVX2)
  if (avx2) return eliminate_zeros_avx2(w, groups, bitmaps, words);
#endif
  (void)avx2;
  return eliminate_zeros(w, groups, bitmaps, words);
}

/// Where a decoded chunk's words end, and whether its padding (a[t] for t ≥ count) is zero.
struct chunk_result {
  const std::byte* next;  ///< First carried word of the following chunk.
  bool padding_clear;     ///< Every transposed word of a partial last group is below 2^(count mod 32).
};

/// The baseline kernels of the decoder.
struct baseline_kernels {
  static std::uint32_t expand(std::uint32_t bitmap, const std::byte* src, std::uint32_t sum,
                              std::uint32_t* v) noexcept {
    return expand_group(bitmap, src, sum, v);
  }
  static void transpose(std::uint32_t* v) noexcept { transpose_detail::transpose32_baseline(v); }
  static void undo(std::uint32_t* v, std::size_t count, std::size_t dim, std::byte* out, bool) noexcept {
    undo_subtract(v, count, dim);
    std::memcpy(out, v, 4 * count);
  }
};

/// Inverse of steps 4, 3, 2 and 1 for a chunk of `count` words whose bitmaps and carried words
/// (validated: as many as the bitmaps mark, ending at `words_end`) start at `bitmaps` and
/// `words`: v[0, count) as bytes at `out` (which may be `v`), using `v` (⌈count/32⌉·32 words) as
/// scratch; with `streaming` (AVX2 only; a whole chunk, `out` 32-byte aligned and not `v`) the
/// output is written with non-temporal stores. Always inlined, so that in the AVX2 instantiation the AVX2 kernels
/// inline into it.
template <class Kernels>
[[gnu::always_inline]] inline chunk_result inverse_chunk_with(const std::byte* bitmaps, const std::byte* words,
                                                              const std::byte* words_end, std::size_t count,
                                                              std::size_t dim, std::uint32_t* v, std::byte* out,
                                                              bool streaming) noexcept {
  const std::size_t groups = (count + group - 1) / group;
  std::uint32_t near_end[group] = {};
  std::uint32_t sum = 0;
  for (std::size_t g = 0; g < groups; ++g) {
    const std::uint32_t bitmap = load_word(bitmaps + 4 * g);
    const std::size_t kept = popcount32(bitmap);
    // The expansion reads 32 words from `src`: near the end of the message the group's words
    // are copied out first.
    const std::byte* src = words;
    if (words_end - words < static_cast<std::ptrdiff_t>(4 * group)) {
      std::memcpy(near_end, words, 4 * kept);
      src = reinterpret_cast<const std::byte*>(near_end);
    }
    sum = Kernels::expand(bitmap, src, sum, v + g * group);
    words += 4 * kept;
  }
  bool padding_clear = true;
  if (const std::size_t r = count % group; r != 0) {
    std::uint32_t high = 0;
    for (std::size_t lane = 0; lane < group; ++lane) high |= v[(groups - 1) * group + lane] >> r;
    padding_clear = high == 0;
  }
  for (std::size_t g = 0; g < groups; ++g) Kernels::transpose(v + g * group);
  Kernels::undo(v, count, dim, out, streaming);
  return {words, padding_clear};
}

#if defined(GRADCOMP_HAVE_AVX2)
/// The AVX2 kernels of the decoder.
struct avx2_kernels {
  GRADCOMP_TARGET_AVX2 static std::uint32_t expand(std::uint32_t bitmap, const std::byte* src, std::uint32_t sum,
                                                   std::uint32_t* v) noexcept {
    return expand_group_avx2(bitmap, src, sum, v);
  }
  GRADCOMP_TARGET_AVX2 static void transpose(std::uint32_t* v) noexcept { transpose_detail::transpose32_avx2(v); }
  GRADCOMP_TARGET_AVX2 static void undo(std::uint32_t* v, std::size_t count, std::size_t dim, std::byte* out,
                                        bool streaming) noexcept {
    if (dim == 1) {
      undo_subtract_avx2(v, count, out, streaming);
      return;
    }
    undo_subtract(v, count, dim);
    if (!streaming) {
      std::memcpy(out, v, 4 * count);
      return;
    }
    for (std::size_t t = 0; t < count; t += 8) store8(out + 4 * t, load8(v + t), true);  // whole chunks only
  }
};

GRADCOMP_TARGET_AVX2 inline chunk_result inverse_chunk_avx2(const std::byte* bitmaps, const std::byte* words,
                                                            const std::byte* words_end, std::size_t count,
                                                            std::size_t dim, std::uint32_t* v, std::byte* out,
                                                            bool streaming) noexcept {
  return inverse_chunk_with<avx2_kernels>(bitmaps, words, words_end, count, dim, v, out, streaming);
}
#endif

/// `inverse_chunk_with` on the kernels the executor allows (`streaming` only with AVX2).
inline chunk_result inverse_chunk(const std::byte* bitmaps, const std::byte* words, const std::byte* words_end,
                                  std::size_t count, std::size_t dim, bool avx2, std::uint32_t* v, std::byte* out,
                                  bool streaming = false) noexcept {
#if defined(GRADCOMP_HAVE_AVX2)
  if (avx2) return inverse_chunk_avx2(bitmaps, words, words_end, count, dim, v, out, streaming);
#endif
  (void)avx2;
  (void)streaming;
  return inverse_chunk_with<baseline_kernels>(bitmaps, words, words_end, count, dim, v, out, false);
}

/// out[0, count) += the floats whose bits are v[0, count).
inline void add_values(const std::uint32_t* v, std::size_t count, float* out) noexcept {
  for (std::size_t t = 0; t < count; ++t) {
    float x;
    std::memcpy(&x, v + t, sizeof x);
    out[t] += x;
  }
}

}  // namespace detail::cpu::mpc_detail

/// MPC on the CPU.
template <gradient_value T>
struct backend<mpc_codec<T>, cpu_executor> {
  using codec_type = mpc_codec<T>;

  static std::size_t workspace_bytes(const codec_type&, const cpu_executor&, std::uint64_t) noexcept { return 0; }

  static std::size_t encode(const codec_type& codec, const cpu_executor& exec, std::span<const T> grad,
                            std::span<std::byte> out, std::span<std::byte>, message_key key) {
    using namespace detail::cpu::mpc_detail;
    const std::uint64_t n = grad.size();
    detail::cpu::begin_message(out, codec.max_encoded_bytes(n));
    const bool avx2 = exec.avx2();
    const std::size_t dim = codec.params().dim;
    std::byte* const bitmaps = out.data() + envelope::size;
    std::byte* const words = bitmaps + 4 * codec_type::group_count(n);
    std::byte* end = words;
    alignas(32) std::uint32_t buffer[lead + chunk] = {};
    std::uint32_t* const w = buffer + lead;
    alignas(32) float wide[half_precision<T> ? chunk : 1];  // a 16-bit chunk's widened values
    for (std::uint64_t base = 0; base < n; base += chunk) {
      const auto count = static_cast<std::size_t>(std::min<std::uint64_t>(chunk, n - base));
      const float* const values = detail::cpu::widened_run(grad.data() + base, count, wide);
      forward_chunk(reinterpret_cast<const std::byte*>(values), count, dim, avx2, w);
      end = finish_chunk(w, (count + group - 1) / group, avx2, bitmaps + 4 * (base / group), end);
    }
    const auto payload = static_cast<std::uint64_t>(end - bitmaps);
    detail::cpu::seal_message(out, {codec_id::mpc, dtype_of<T>, 0, 0, key, n, payload, codec.params_hash(), 0},
                              codec.wire().payload_checksum);
    return static_cast<std::size_t>(envelope::size + payload);
  }

  /// Into T, or (a 16-bit T) into float32.
  template <gradient_value O>
  static void decode(const codec_type& codec, const cpu_executor& exec, std::span<const std::byte> message,
                     std::span<O> out, std::span<std::byte>, const decode_limits& limits, bool accumulate) {
    using namespace detail::cpu::mpc_detail;
    const envelope e = parse_envelope(message);
    validate_envelope(e, {codec_id::mpc, dtype_of<T>, out.size(), codec.params_hash()}, limits);
    const std::uint64_t carried = codec_type::carried_words(e);
    const std::uint64_t n = e.elements;
    const std::uint64_t groups = codec_type::group_count(n);
    const std::byte* const bitmaps = message.data() + envelope::size;
    const std::byte* const words = bitmaps + 4 * groups;
    const std::byte* const words_end = words + 4 * carried;

    // Everything is checked before the output is touched: the word count and the
    // padding of the last group, which needs the last chunk decoded.
    const std::uint64_t last_base = n == 0 ? 0 : (n - 1) / chunk * chunk;
    std::uint64_t marked = 0, before_last = 0;
    for (std::uint64_t g = 0; g < groups; ++g) {
      if (g == last_base / group) before_last = marked;
      marked += popcount32(load_word(bitmaps + 4 * g));
    }
    detail::require(marked == carried, errc::malformed_payload, [&] {
      return "bitmaps mark " + std::to_string(marked) + " words, the payload carries " + std::to_string(carried);
    });
    if (n == 0) return;

    const bool avx2 = exec.avx2();
    const std::size_t dim = codec.params().dim;
    const auto last_count = static_cast<std::size_t>(n - last_base);
    alignas(32) std::uint32_t last[chunk];
    const chunk_result tail = inverse_chunk(bitmaps + 4 * (last_base / group), words + 4 * before_last, words_end,
                                            last_count, dim, avx2, last, reinterpret_cast<std::byte*>(last));
    detail::require(tail.padding_clear, errc::malformed_payload,
                    "the last group's transposed words have bits set for elements past the tensor's end");
    if constexpr (half_precision<T>) {
      decode_widened(bitmaps, words, words_end, n, dim, avx2, out.data(), accumulate);
    } else {
      decode_words(bitmaps, words, words_end, n, dim, avx2, exec, last, out.data(), accumulate);
    }
  }

 private:
  /// The float32 decoder's writes, chunk by chunk, the last chunk (already decoded) from `last`.
  static void decode_words(const std::byte* bitmaps, const std::byte* words, const std::byte* words_end,
                           std::uint64_t n, std::size_t dim, bool avx2, const cpu_executor& exec,
                           const std::uint32_t* last, float* dense, bool accumulate) {
    using namespace detail::cpu::mpc_detail;
    const std::uint64_t last_base = (n - 1) / chunk * chunk;
    const auto last_count = static_cast<std::size_t>(n - last_base);

    // Decoding writes the values' bits straight into `out` (a large plain decode into 32-byte
    // aligned memory with non-temporal stores, as the uniform decoder does); accumulating goes
    // through `values`.
    const bool streaming =
        avx2 && !accumulate && exec.streams(n * sizeof(float)) && reinterpret_cast<std::uintptr_t>(dense) % 32 == 0;
    alignas(32) std::uint32_t scratch[chunk], values[chunk];
    const std::byte* next = words;
    for (std::uint64_t base = 0; base < last_base; base += chunk) {
      std::byte* const target =
          accumulate ? reinterpret_cast<std::byte*>(values) : reinterpret_cast<std::byte*>(dense + base);
      next = inverse_chunk(bitmaps + 4 * (base / group), next, words_end, chunk, dim, avx2, scratch, target, streaming)
                 .next;
      if (accumulate) add_values(values, chunk, dense + base);
    }
    if (streaming) detail::cpu::streaming_fence();
    if (accumulate) add_values(last, last_count, dense + last_base);
    else
      std::memcpy(dense + last_base, last, 4 * last_count);
  }

  /// The 16-bit decoder: a first run over the chunks checks that every word is a widened T (and,
  /// accumulating into a 16-bit output, that every sum narrows to a finite value), a second writes
  /// the values (the 16-bit patterns themselves, or their widenings) or adds them.
  template <gradient_value O>
  static void decode_widened(const std::byte* bitmaps, const std::byte* words, const std::byte* words_end,
                             std::uint64_t n, std::size_t dim, bool avx2, O* out, bool accumulate) {
    using namespace detail::cpu::mpc_detail;
    alignas(32) std::uint32_t scratch[chunk], values[chunk];
    const auto for_each_chunk = [&](auto&& use) {
      const std::byte* next = words;
      for (std::uint64_t base = 0; base < n; base += chunk) {
        const auto count = static_cast<std::size_t>(std::min<std::uint64_t>(chunk, n - base));
        next = inverse_chunk(bitmaps + 4 * (base / group), next, words_end, count, dim, avx2, scratch,
                             reinterpret_cast<std::byte*>(values))
                   .next;
        use(base, count);
      }
    };
    const auto value = [&](std::size_t t) { return detail::float_of_bits(values[t]); };
    // Element by element, as the reference: the word, then (accumulating into 16 bits) the sum.
    for_each_chunk([&](std::uint64_t base, std::size_t count) {
      for (std::size_t t = 0; t < count; ++t) {
        detail::require(narrows_exactly<T>(value(t)), errc::malformed_payload,
                        [&] { return "decoded word " + std::to_string(base + t) + " is not a widened 16-bit value"; });
        if constexpr (half_precision<O>)
          if (accumulate) detail::require_narrows<O>(base + t, widen(out[base + t]) + value(t));
      }
    });
    for_each_chunk([&](std::uint64_t base, std::size_t count) {
      O* const to = out + base;
      if constexpr (half_precision<O>) {
        if (accumulate)
          for (std::size_t t = 0; t < count; ++t) to[t] = narrow<O>(widen(to[t]) + value(t));
        else
          for (std::size_t t = 0; t < count; ++t) to[t] = exact_narrow<O>(value(t));
      } else if (accumulate) {
        add_values(values, count, to);
      } else {
        std::memcpy(to, values, 4 * count);
      }
    });
  }
};

}  // namespace gradcomp
