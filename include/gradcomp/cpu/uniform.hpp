#pragma once
/// @file
/// CPU reference of the uniform quantizer: per block, one pass for the maximum magnitude (which
/// also finds NaN and Inf), then codes computed 256 at a time and packed whole bytes at a time.
/// 8-bit round-to-nearest float chunks take an SSE2 path (with a scalar twin) that computes the
/// same codes as the arithmetic of quantize/uniform_math.hpp.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>

#include <gradcomp/core/backend.hpp>
#include <gradcomp/core/bit_packing.hpp>
#include <gradcomp/core/cpu_executor.hpp>
#include <gradcomp/core/crc32c.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/philox.hpp>
#include <gradcomp/core/wire_envelope.hpp>
#include <gradcomp/cpu/message.hpp>
#include <gradcomp/cpu/philox_simd.hpp>
#include <gradcomp/quantize/uniform.hpp>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace gradcomp {

/// Uniform quantization on the CPU.
template <gradient_value T>
struct backend<uniform_quantizer<T>, cpu_executor> {
  static std::size_t workspace_bytes(const uniform_quantizer<T>&, const cpu_executor&, std::uint64_t) noexcept {
    return 0;
  }

  static std::size_t encode(const uniform_quantizer<T>& codec, const cpu_executor&, std::span<const T> grad,
                            std::span<std::byte> out, std::span<std::byte>, message_key key) {
    const std::uint64_t n = grad.size();
    const std::size_t size = codec.max_encoded_bytes(n);
    cpu::begin_message(out, size);
    const int bits = codec.bits();
    const std::uint64_t block = codec.params().block;
    std::byte* const scales = out.data() + envelope::size;
    auto* const codes = reinterpret_cast<std::uint8_t*>(scales + codec.block_count(n) * sizeof(T));
    if (bits != 8) std::memset(codes, 0, static_cast<std::size_t>(packed_bytes(n, bits)));
    const random_stream stream{codec.params().seed, key.step, key.tensor_id, random_purpose::stochastic_rounding};

    const rounding mode = codec.params().round;
    const auto levels = static_cast<T>(uniform_levels(bits));
    std::uint8_t chunk_codes[chunk];
    T uniforms[chunk];
    std::uint32_t random_words[chunk + 8];
    for (std::uint64_t begin = 0, j = 0; begin < n; begin += block, ++j) {
      const std::uint64_t end = std::min(n, begin + block);
      const T m = cpu::max_magnitude(grad.data() + begin, grad.data() + end);
      const T s = uniform_step(m, bits);
      std::memcpy(scales + j * sizeof(T), &s, sizeof s);
      const T inv = m > T{0} ? levels / m : T{0};
      const bool multiply = m > T{0} && is_finite(inv);
      for (std::uint64_t first = begin; first < end; first += chunk) {
        const std::uint64_t count = std::min<std::uint64_t>(chunk, end - first);
        if constexpr (std::is_same_v<T, float>) {
          if (multiply && count % 16 == 0) {
            if (bits == 8 && mode == rounding::nearest_even) {
              encode8_rtn(grad.data() + first, count, inv, codes + first);
              continue;
            }
            if (bits == 4 && mode == rounding::nearest_even && first % 2 == 0) {
              encode4_rtn(grad.data() + first, count, inv, codes + first / 2);
              continue;
            }
            if (bits == 8 && mode == rounding::stochastic) {
              const std::uint32_t* const words = stream_words(stream, first, count, random_words);
              encode8_sr(grad.data() + first, count, inv, words, codes + first);
              continue;
            }
          }
        }
        if (mode == rounding::stochastic) {
          const std::uint32_t* const words = stream_words(stream, first, count, random_words);
          for (std::uint64_t c = 0; c < count; ++c)
            uniforms[c] = static_cast<T>(words[c] >> 8) * static_cast<T>(1.0 / 16777216.0);
        }
        for (std::uint64_t c = 0; c < count; ++c) {
          const T h = grad[first + c];
          const T t = s == T{0} ? T{0} : (multiply ? h * inv : h / s);
          chunk_codes[c] = uniform_code(uniform_level(t, bits, mode, mode == rounding::stochastic ? uniforms[c] : T{0}), bits);
        }
        store_codes(chunk_codes, count, first, bits, codes);
      }
    }

    cpu::seal_message(out, {codec_id::uniform, dtype_of<T>, 0, 0, key, n, size - envelope::size, codec.params_hash(), 0},
                      codec.wire().payload_checksum);
    return size;
  }

  static void decode(const uniform_quantizer<T>& codec, const cpu_executor&, std::span<const std::byte> message,
                     std::span<T> out, std::span<std::byte>, const decode_limits& limits, bool accumulate) {
    const envelope e = parse_envelope(message);
    validate_envelope(e, {codec_id::uniform, dtype_of<T>, out.size(), codec.params_hash()}, limits);
    const int bits = codec.bits();
    const std::uint64_t n = e.elements;
    detail::require(e.layout == 0, errc::malformed_payload, "uniform messages have layout 0");
    detail::require(n <= e.payload_bytes * 8 / static_cast<std::uint64_t>(bits) &&
                        e.payload_bytes == codec.payload_bytes(n),
                    errc::malformed_payload, [&] {
                      return "payload of " + std::to_string(e.payload_bytes) + " bytes does not hold " +
                             std::to_string(n) + " elements";
                    });
    const std::byte* const scales = message.data() + envelope::size;
    const auto* const codes = reinterpret_cast<const std::uint8_t*>(scales + codec.block_count(n) * sizeof(T));
    const auto levels = static_cast<T>(uniform_levels(bits));
    for (std::uint64_t j = 0; j < codec.block_count(n); ++j) {
      const T s = scale_at(scales, j);
      detail::require((to_bits(s) >> (sizeof(T) * 8 - 1)) == 0 && is_finite(s * levels), errc::malformed_payload,
                      [&] { return "scale of block " + std::to_string(j) + " is negative or too large"; });
    }
    validate_codes(codes, n, bits);

    const std::uint64_t block = codec.params().block;
    T* const dense = out.data();
    for (std::uint64_t begin = 0, j = 0; begin < n; begin += block, ++j) {
      const std::uint64_t end = std::min(n, begin + block);
      const T s = scale_at(scales, j);
      switch (bits) {
        case 1: decode_block<1>(codes, begin, end, s, dense, accumulate); break;
        case 2: decode_block<2>(codes, begin, end, s, dense, accumulate); break;
        case 4: decode_block<4>(codes, begin, end, s, dense, accumulate); break;
        default: decode_block<8>(codes, begin, end, s, dense, accumulate); break;
      }
    }
  }

 private:
  /// Values processed together within a block: codes and uniforms are staged in arrays this long.
  static constexpr std::uint64_t chunk = 256;

  /// Stream words of elements [first, first + count) (count ≤ chunk), computed whole blocks at a
  /// time into `buffer` (chunk + 8 words); returns where word `first` lies in it.
  static const std::uint32_t* stream_words(const random_stream& stream, std::uint64_t first, std::uint64_t count,
                                           std::uint32_t* buffer) noexcept {
    const std::uint64_t first_block = first / 4;
    const std::uint64_t end_block = (first + count + 3) / 4;
    detail::philox_stream_words(stream, first_block, end_block - first_block, buffer);
    return buffer + first % 4;
  }

  /// Writes `count` codes of `bits` bits for elements starting at `first` into the packed array
  /// (zeroed beforehand when bits < 8). Whole bytes at once when the run starts on a byte boundary.
  static void store_codes(const std::uint8_t* chunk_codes, std::uint64_t count, std::uint64_t first, int bits,
                          std::uint8_t* codes) {
    if (bits == 8) {
      std::memcpy(codes + first, chunk_codes, static_cast<std::size_t>(count));
      return;
    }
    const auto per_byte = static_cast<std::uint64_t>(8 / bits);
    std::uint64_t c = 0;
    if (first % per_byte == 0) {
      for (; c + per_byte <= count; c += per_byte)
        codes[(first + c) / per_byte] = pack_byte(chunk_codes + c, static_cast<int>(per_byte), bits);
    }
    for (; c < count; ++c) {
      const std::uint64_t bit = (first + c) * static_cast<std::uint64_t>(bits);
      codes[bit / 8] |= static_cast<std::uint8_t>(chunk_codes[c] << (bit % 8));
    }
  }

  [[nodiscard]] static T scale_at(const std::byte* scales, std::uint64_t j) noexcept {
    T s;
    std::memcpy(&s, scales + j * sizeof(T), sizeof s);
    return s;
  }

  /// Every code at most 2L (for b ≥ 2) and the padding bits of the last byte zero. With 2L = 2^b − 2
  /// the only code too large is all ones, which a byte-wise bit test finds for every width.
  static void validate_codes(const std::uint8_t* codes, std::uint64_t n, int bits) {
    const std::uint64_t used_bits = n * static_cast<std::uint64_t>(bits);
    const std::uint64_t bytes = used_bits / 8 + (used_bits % 8 != 0 ? 1 : 0);
    if (bits > 1) {
      unsigned all_ones = 0;
      std::uint64_t b = 0;
#if defined(__SSE2__)
      if (bits == 8 || bits == 4) {
        // A byte (8 bits) or either nibble (4 bits) all ones.
        const __m128i low = _mm_set1_epi8(static_cast<char>(bits == 8 ? 0xff : 0x0f));
        const __m128i high = _mm_set1_epi8(static_cast<char>(bits == 8 ? 0xff : 0xf0));
        __m128i found = _mm_setzero_si128();
        for (; b + 16 <= bytes; b += 16) {
          const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + b));
          found = _mm_or_si128(found, _mm_cmpeq_epi8(_mm_and_si128(v, low), low));
          found = _mm_or_si128(found, _mm_cmpeq_epi8(_mm_and_si128(v, high), high));
        }
        all_ones = _mm_movemask_epi8(found) != 0 ? 1u : 0u;
      }
#endif
      for (; b < bytes; ++b) {
        unsigned x = codes[b];
        if (bits == 2) x &= x >> 1;  // bit 2k set: field k is 0b11
        if (bits == 4) {
          x &= x >> 2;
          x &= x >> 1;
        }
        if (bits == 8) x = x == 0xFFu ? 1u : 0u;
        all_ones |= x & (bits == 2 ? 0x55u : bits == 4 ? 0x11u : 0x01u);
      }
      detail::require(all_ones == 0, errc::malformed_payload, "a code exceeds the largest level");
    }
    if (used_bits % 8 != 0)
      detail::require((codes[used_bits / 8] >> (used_bits % 8)) == 0, errc::malformed_payload,
                      "non-zero padding bits after the last code");
  }

  /// Decodes elements [begin, end) of step s, with the code width a compile-time constant.
  template <int Bits>
  static void decode_block(const std::uint8_t* codes, std::uint64_t begin, std::uint64_t end, T s, T* dense,
                           bool accumulate) {
    constexpr auto mask = static_cast<unsigned>((1 << Bits) - 1);
    const auto level = [codes](std::uint64_t i) {
      const unsigned code = (unsigned{codes[i * Bits / 8]} >> (i * Bits % 8)) & mask;
      return static_cast<T>(Bits == 1 ? 2 * static_cast<int>(code) - 1 : static_cast<int>(code) - uniform_levels(Bits));
    };
#if defined(__SSE2__)
    if constexpr (std::is_same_v<T, float> && (Bits == 8 || Bits == 4)) {
      // Whole 16-value groups from the first byte boundary on; the scalar loops do the rest.
      std::uint64_t i = begin;
      if constexpr (Bits == 4) {
        if (i % 2 != 0 && i < end) {
          dense[i] = accumulate ? dense[i] + level(i) * s : level(i) * s;
          ++i;
        }
      }
      const __m128 step = _mm_set1_ps(s);
      const __m128i offset = _mm_set1_epi32(uniform_levels(Bits));
      const __m128i zero = _mm_setzero_si128();
      for (; end - i >= 16; i += 16) {
        __m128i v;  // 16 codes, one per byte
        if constexpr (Bits == 8) {
          v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + i));
        } else {
          const __m128i packed = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + i / 2));
          const __m128i nibble = _mm_set1_epi8(0x0f);
          v = _mm_unpacklo_epi8(_mm_and_si128(packed, nibble), _mm_and_si128(_mm_srli_epi16(packed, 4), nibble));
        }
        const __m128i lo = _mm_unpacklo_epi8(v, zero);
        const __m128i hi = _mm_unpackhi_epi8(v, zero);
        const __m128i q[4] = {_mm_unpacklo_epi16(lo, zero), _mm_unpackhi_epi16(lo, zero), _mm_unpacklo_epi16(hi, zero),
                              _mm_unpackhi_epi16(hi, zero)};
        for (int k = 0; k < 4; ++k) {
          __m128 value = _mm_mul_ps(_mm_cvtepi32_ps(_mm_sub_epi32(q[k], offset)), step);
          if (accumulate) value = _mm_add_ps(_mm_loadu_ps(dense + i + 4 * k), value);
          _mm_storeu_ps(dense + i + 4 * k, value);
        }
      }
      begin = i;
    }
#endif
    if (accumulate)
      for (std::uint64_t i = begin; i < end; ++i) dense[i] += level(i) * s;
    else
      for (std::uint64_t i = begin; i < end; ++i) dense[i] = level(i) * s;
  }

#if defined(__SSE2__)
  /// Levels rne(x[j]·scale) of 16 values, four per register; cvtps2dq rounds half to even exactly
  /// as round_half_even does.
  static void round_scaled16(const float* x, __m128 scale, __m128i& q0, __m128i& q1, __m128i& q2, __m128i& q3) {
    q0 = _mm_cvtps_epi32(_mm_mul_ps(_mm_loadu_ps(x), scale));
    q1 = _mm_cvtps_epi32(_mm_mul_ps(_mm_loadu_ps(x + 4), scale));
    q2 = _mm_cvtps_epi32(_mm_mul_ps(_mm_loadu_ps(x + 8), scale));
    q3 = _mm_cvtps_epi32(_mm_mul_ps(_mm_loadu_ps(x + 12), scale));
  }
#endif

  /// 8-bit round-to-nearest codes of x[0, count) (count a multiple of 16) with t = x·inv, 16
  /// values at a time; cvtps2dq rounds half to even exactly as round_half_even does.
  static void encode8_rtn(const float* x, std::uint64_t count, float inv, std::uint8_t* codes) {
#if defined(__SSE2__)
    const __m128 scale = _mm_set1_ps(inv);
    const __m128i offset = _mm_set1_epi8(127);
    for (std::uint64_t i = 0; i < count; i += 16) {
      __m128i q0, q1, q2, q3;
      round_scaled16(x + i, scale, q0, q1, q2, q3);
      // |t| ≤ 127·(1 + 2^-23) rounds into [−127, 127]: the saturating packs are exact here.
      const __m128i q = _mm_packs_epi16(_mm_packs_epi32(q0, q1), _mm_packs_epi32(q2, q3));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + i), _mm_add_epi8(q, offset));
    }
#else
    for (std::uint64_t i = 0; i < count; ++i)
      codes[i] = uniform_code(uniform_level(x[i] * inv, 8, rounding::nearest_even, 0.0f), 8);
#endif
  }

  /// 4-bit round-to-nearest codes of x[0, count) (count a multiple of 16) with t = x·inv, packed
  /// two to a byte (the even element in the low nibble) into packed[0, count / 2).
  static void encode4_rtn(const float* x, std::uint64_t count, float inv, std::uint8_t* packed) {
#if defined(__SSE2__)
    const __m128 scale = _mm_set1_ps(inv);
    const __m128i top = _mm_set1_epi16(7);
    const __m128i bottom = _mm_set1_epi16(-7);
    const __m128i offset = _mm_set1_epi8(7);
    const __m128i low_byte = _mm_set1_epi16(0x00ff);
    for (std::uint64_t i = 0; i < count; i += 16) {
      __m128i q0, q1, q2, q3;
      round_scaled16(x + i, scale, q0, q1, q2, q3);
      const __m128i a = _mm_max_epi16(_mm_min_epi16(_mm_packs_epi32(q0, q1), top), bottom);
      const __m128i b = _mm_max_epi16(_mm_min_epi16(_mm_packs_epi32(q2, q3), top), bottom);
      const __m128i c = _mm_add_epi8(_mm_packs_epi16(a, b), offset);  // 16 codes in [0, 14]
      // Each 16-bit lane holds an even code (low byte) and the next odd one (high byte).
      const __m128i pairs = _mm_and_si128(_mm_or_si128(c, _mm_srli_epi16(c, 4)), low_byte);
      _mm_storel_epi64(reinterpret_cast<__m128i*>(packed + i / 2), _mm_packus_epi16(pairs, pairs));
    }
#else
    for (std::uint64_t i = 0; i < count; i += 2) {
      const unsigned even = uniform_code(uniform_level(x[i] * inv, 4, rounding::nearest_even, 0.0f), 4);
      const unsigned odd = uniform_code(uniform_level(x[i + 1] * inv, 4, rounding::nearest_even, 0.0f), 4);
      packed[i / 2] = static_cast<std::uint8_t>(even | odd << 4);
    }
#endif
  }

  /// 8-bit stochastic-rounding codes of x[0, count) (count a multiple of 16) with t = x·inv and
  /// u from words[0, count): q = ⌊t + u⌋ by truncation and correction, as floor_to_int does.
  static void encode8_sr(const float* x, std::uint64_t count, float inv, const std::uint32_t* words,
                         std::uint8_t* codes) {
#if defined(__SSE2__)
    const __m128 scale = _mm_set1_ps(inv);
    const __m128 unit = _mm_set1_ps(1.0f / 16777216.0f);
    const __m128i top = _mm_set1_epi16(127);
    const __m128i bottom = _mm_set1_epi16(-127);
    const __m128i offset = _mm_set1_epi8(127);
    for (std::uint64_t i = 0; i < count; i += 16) {
      __m128i q[4];
      for (int k = 0; k < 4; ++k) {
        const __m128i w = _mm_loadu_si128(reinterpret_cast<const __m128i*>(words + i + 4 * k));
        const __m128 u = _mm_mul_ps(_mm_cvtepi32_ps(_mm_srli_epi32(w, 8)), unit);
        const __m128 y = _mm_add_ps(_mm_mul_ps(_mm_loadu_ps(x + i + 4 * k), scale), u);
        const __m128i truncated = _mm_cvttps_epi32(y);
        // Subtract one where the truncation lies above y (all-ones mask = −1).
        q[k] = _mm_add_epi32(truncated, _mm_castps_si128(_mm_cmpgt_ps(_mm_cvtepi32_ps(truncated), y)));
      }
      const __m128i a = _mm_max_epi16(_mm_min_epi16(_mm_packs_epi32(q[0], q[1]), top), bottom);
      const __m128i b = _mm_max_epi16(_mm_min_epi16(_mm_packs_epi32(q[2], q[3]), top), bottom);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + i), _mm_add_epi8(_mm_packs_epi16(a, b), offset));
    }
#else
    for (std::uint64_t i = 0; i < count; ++i) {
      const float u = static_cast<float>(words[i] >> 8) * (1.0f / 16777216.0f);
      codes[i] = uniform_code(uniform_level(x[i] * inv, 8, rounding::stochastic, u), 8);
    }
#endif
  }
};

}  // namespace gradcomp
