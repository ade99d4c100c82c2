#pragma once
/// @file
/// CPU backend of the uniform quantizer (its specification is reference/uniform.hpp): per block,
/// one pass for the maximum magnitude (which also finds NaN and Inf), then codes computed a chunk
/// at a time and packed whole bytes at a time. float32 in the common layouts (8-bit codes, or 4-bit
/// round-to-nearest, blocks a multiple of 32) takes the vectorised kernels of
/// cpu/detail/uniform_kernels.hpp: the encoder reads the blocks front to back (the hardware prefetcher
/// follows) and writes the codes through a staged_writer, the decoder validates every code first
/// and then writes values directly; large outputs are written with non-temporal stores
/// (cpu_executor). Every path computes the codes and values of quantize/uniform_math.hpp. bf16 and
/// fp16 gradients take the same paths with their values widened to float32 in cache-resident
/// chunks (bf16's 8-bit round-to-nearest kernel widens in its registers), never as a float32 copy
/// of the gradient; their decoder writes float32, or decodes a stage of `widened_stage` values at
/// a time and narrows it (cpu/detail/half_conversion.hpp): docs/half-precision.md §2–§3.

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
#include <gradcomp/core/narrowing.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/philox.hpp>
#include <gradcomp/core/rounded_product.hpp>
#include <gradcomp/core/wire_envelope.hpp>
#include <gradcomp/cpu/detail/half_conversion.hpp>
#include <gradcomp/cpu/detail/message.hpp>
#include <gradcomp/cpu/detail/philox_simd.hpp>
#include <gradcomp/cpu/detail/uniform_block_encoder.hpp>
#include <gradcomp/cpu/detail/uniform_kernels.hpp>
#include <gradcomp/quantize/uniform.hpp>

namespace gradcomp {

/// Uniform quantization on the CPU.
template <gradient_value T>
struct backend<uniform_quantizer<T>, cpu_executor> {
  static std::size_t workspace_bytes(const uniform_quantizer<T>&, const cpu_executor&, std::uint64_t) noexcept {
    return 0;
  }

  static std::size_t encode(const uniform_quantizer<T>& codec, const cpu_executor& exec, std::span<const T> grad,
                            std::span<std::byte> out, std::span<std::byte>, message_key key) {
    if constexpr (std::is_same_v<C, float>) {
      if (detail::cpu::uniform_vectorised(codec)) return encode_vectorised(codec, exec, grad, out, key);
    }
    const std::uint64_t n = grad.size();
    const std::size_t size = codec.max_encoded_bytes(n);
    detail::cpu::begin_message(out, size);
    std::byte* const scales = out.data() + envelope::size;
    auto* const codes = reinterpret_cast<std::uint8_t*>(scales + codec.block_count(n) * sizeof(C));
    encode_generic(codec, exec, grad, key, scales, codes);
    detail::cpu::seal_uniform_message(codec, out, key, n);
    return size;
  }

  /// Decodes into `out` of T, or (a 16-bit T) of float32; with `accumulate` adds instead.
  template <gradient_value O>
  static void decode(const uniform_quantizer<T>& codec, const cpu_executor& exec, std::span<const std::byte> message,
                     std::span<O> out, std::span<std::byte>, const decode_limits& limits, bool accumulate) {
    const envelope e = parse_envelope(message);
    validate_envelope(e, {codec_id::uniform, dtype_of<T>, out.size(), codec.params_hash()}, limits);
    codec.validate_payload_size(e);
    const int bits = codec.bits();
    const std::uint64_t n = e.elements;
    const std::byte* const scales = message.data() + envelope::size;
    const auto* const codes = reinterpret_cast<const std::uint8_t*>(scales + codec.block_count(n) * sizeof(C));
    const auto levels = static_cast<C>(uniform_levels(bits));
    for (std::uint64_t j = 0; j < codec.block_count(n); ++j) {
      const C s = scale_at(scales, j);
      detail::require((to_bits(s) >> (sizeof(C) * 8 - 1)) == 0 && is_finite(s * levels), errc::malformed_payload,
                      [&] { return "scale of block " + std::to_string(j) + " is negative or too large"; });
    }
    validate_codes(codes, n, bits, exec.avx2());

    const std::uint64_t block = codec.params().block;
    if constexpr (half_precision<O>) {
      decode_narrowed(exec, codes, scales, n, block, bits, out.data(), accumulate);
    } else {
      C* const dense = out.data();
      if constexpr (std::is_same_v<C, float>) {
        if (block % detail::cpu::kernel_width == 0 && (bits == 8 || bits == 4)) {
          decode_vectorised(exec, codes, scales, n, block, bits, dense, accumulate);
          return;
        }
      }
      for (std::uint64_t begin = 0, j = 0; begin < n; begin += block, ++j) {
        const std::uint64_t end = std::min(n, begin + block);
        const C s = scale_at(scales, j);
        switch (bits) {
          case 1: decode_block<1>(codes, begin, end, s, dense, accumulate); break;
          case 2: decode_block<2>(codes, begin, end, s, dense, accumulate); break;
          case 4: decode_block<4>(codes, begin, end, s, dense, accumulate); break;
          default: decode_block<8>(codes, begin, end, s, dense, accumulate); break;
        }
      }
    }
  }

 private:
  using C = compute_type<T>;  ///< The arithmetic's type: float32 for a 16-bit T.

  /// Values coded together within a block: codes and random words are staged in arrays this long.
  static constexpr std::uint64_t chunk = 512;
  /// 16-bit values decoded per stage before narrowing (the generic encoder widens its chunks of
  /// `chunk`), in a float32 buffer on the stack (16 KiB).
  static constexpr std::uint64_t widened_stage = 4096;

  /// Writes `count` codes of `bits` bits for elements starting at `first` into the packed array
  /// (zeroed beforehand when bits < 8).
  static void store_codes(const std::uint8_t* chunk_codes, std::uint64_t count, std::uint64_t first, int bits,
                          std::uint8_t* codes) {
    if (first * static_cast<std::uint64_t>(bits) % 8 == 0) {
      detail::cpu::pack_codes_aligned(chunk_codes, count, bits, codes + first * static_cast<std::uint64_t>(bits) / 8);
      return;
    }
    for (std::uint64_t c = 0; c < count; ++c) {
      const std::uint64_t bit = (first + c) * static_cast<std::uint64_t>(bits);
      codes[bit / 8] |= static_cast<std::uint8_t>(chunk_codes[c] << (bit % 8));
    }
  }

  /// The reference encoder for every layout: per block the maximum, then codes a chunk at a time,
  /// value by value, packed into the zeroed code array.
  static void encode_generic(const uniform_quantizer<T>& codec, const cpu_executor& exec, std::span<const T> grad,
                             message_key key, std::byte* scales, std::uint8_t* codes) {
    const std::uint64_t n = grad.size();
    const int bits = codec.bits();
    const std::uint64_t block = codec.params().block;
    const rounding mode = codec.params().round;
    const random_stream stream{codec.params().seed, key.step, key.tensor_id, random_purpose::stochastic_rounding};
    if (bits != 8) std::memset(codes, 0, static_cast<std::size_t>(packed_bytes(n, bits)));
    std::uint8_t chunk_codes[chunk];
    alignas(16) std::uint16_t random_halves[chunk + detail::philox_halves_slack];
    alignas(64) C wide[half_precision<T> ? chunk : 1];
    for (std::uint64_t begin = 0, j = 0; begin < n; begin += block, ++j) {
      const std::uint64_t end = std::min(n, begin + block);
      const C m = widen(detail::cpu::max_magnitude(grad.data() + begin, grad.data() + end, exec.avx2()));
      const C s = uniform_step(m, bits);
      std::memcpy(scales + j * sizeof(C), &s, sizeof s);
      for (std::uint64_t first = begin; first < end; first += chunk) {
        const std::uint64_t count = std::min<std::uint64_t>(chunk, end - first);
        const std::uint16_t* const halves =
            mode == rounding::stochastic
                ? detail::philox_stream_halves(stream, first, count, random_halves, exec.simd())
                : nullptr;
        const C* const x = detail::cpu::widened_run(grad.data() + first, count, wide);
        detail::cpu::uniform_scalar_codes(x, count, m, s, bits, mode, halves, chunk_codes);
        store_codes(chunk_codes, count, first, bits, codes);
      }
    }
  }

  /// The vectorised encoder of float32 scales: the blocks in order, each coded by
  /// `uniform_block_encoder` (which widens a 16-bit gradient as it codes it).
  static std::size_t encode_vectorised(const uniform_quantizer<T>& codec, const cpu_executor& exec,
                                       std::span<const T> grad, std::span<std::byte> out, message_key key) {
    const std::uint64_t n = grad.size();
    const std::uint64_t block = codec.params().block;
    const T* const g = grad.data();
    detail::cpu::uniform_block_encoder encoder(codec, exec, out, n, key);
    // Each block's largest magnitude is found a block ahead, so that the latency of the maximum and
    // of the step's divisions overlaps the previous block's coding.
    const auto largest = [&](std::uint64_t begin) {
      return widen(detail::cpu::max_magnitude(g + begin, g + std::min(n, begin + block), exec.avx2()));
    };
    float next_m = n > 0 ? largest(0) : 0.0f;
    for (std::uint64_t begin = 0; begin < n; begin += block) {
      const std::uint64_t end = std::min(n, begin + block);
      const float m = next_m;
      if (end < n) next_m = largest(end);
      encoder.next(g + begin, end - begin, m);
    }
    return encoder.finish();
  }

  /// Decodes into (or, with `accumulate`, adds to) a 16-bit output a stage at a time: the stage's
  /// values in float32 (the output's values widened first when accumulating), then narrowed. A
  /// first pass checks that no value overflows the 16-bit type, so that an error leaves `out`
  /// untouched: for a plain decode the largest magnitude of each block, L·s; when accumulating,
  /// every sum.
  template <gradient_value O>
  static void decode_narrowed(const cpu_executor& exec, const std::uint8_t* codes, const std::byte* scales,
                              std::uint64_t n, std::uint64_t block, int bits, O* out, bool accumulate) {
    const bool vectorised = block % detail::cpu::kernel_width == 0 && (bits == 8 || bits == 4);
    alignas(64) float wide[widened_stage];
    const auto for_each_stage = [&](auto&& use) {
      for (std::uint64_t begin = 0, j = 0; begin < n; begin += block, ++j) {
        const std::uint64_t end = std::min(n, begin + block);
        const float s = scale_at(scales, j);
        for (std::uint64_t first = begin; first < end; first += widened_stage) {
          const std::uint64_t count = std::min(widened_stage, end - first);
          if (accumulate) detail::cpu::widen_values(out + first, count, wide);
          if (vectorised) {
            detail::cpu::uniform_decode_block(codes + first * static_cast<std::uint64_t>(bits) / 8, count, bits, s,
                                              wide, accumulate, false, exec.avx2());
          } else {
            for (std::uint64_t c = 0; c < count; ++c) {
              const float value =
                  mul_rn(static_cast<float>(uniform_code_level(packed_code(codes, first + c, bits), bits)), s);
              wide[c] = accumulate ? wide[c] + value : value;
            }
          }
          use(first, count);
        }
      }
    };
    if (accumulate) {
      for_each_stage([&](std::uint64_t first, std::uint64_t count) {
        for (std::uint64_t c = 0; c < count; ++c) detail::require_narrows<O>(first + c, wide[c]);
      });
    } else {
      const auto largest = static_cast<float>(uniform_levels(bits));
      for (std::uint64_t begin = 0, j = 0; begin < n; begin += block, ++j) {
        const float m = mul_rn(largest, scale_at(scales, j));
        detail::require(narrows_finite<O>(m), errc::narrowing_overflow, [&] {
          return "block " + std::to_string(j) + "'s largest result (" + std::to_string(m) +
                 ") is beyond the 16-bit output's range";
        });
      }
    }
    for_each_stage(
        [&](std::uint64_t first, std::uint64_t count) { detail::cpu::narrow_values(wide, count, out + first); });
  }

  /// The vectorised float32 decoder of 8-bit and 4-bit codes in blocks of a multiple of 32 values.
  /// A large plain decode (not an accumulation) into 32-byte aligned memory uses non-temporal stores.
  static void decode_vectorised(const cpu_executor& exec, const std::uint8_t* codes, const std::byte* scales,
                                std::uint64_t n, std::uint64_t block, int bits, float* dense, bool accumulate) {
    const bool avx2 = exec.avx2();
    const bool streaming =
        !accumulate && exec.streams(n * sizeof(float)) && reinterpret_cast<std::uintptr_t>(dense) % 32 == 0;
    for (std::uint64_t begin = 0, j = 0; begin < n; begin += block, ++j) {
      const std::uint64_t end = std::min(n, begin + block);
      const float s = scale_at(scales, j);
      detail::cpu::uniform_decode_block(codes + begin * static_cast<std::uint64_t>(bits) / 8, end - begin, bits, s,
                                        dense + begin, accumulate, streaming, avx2);
    }
    if (streaming) detail::cpu::streaming_fence();
  }

  [[nodiscard]] static C scale_at(const std::byte* scales, std::uint64_t j) noexcept {
    C s;
    std::memcpy(&s, scales + j * sizeof(C), sizeof s);
    return s;
  }

  /// Every code at most 2L (for b ≥ 2) and the padding bits of the last byte zero. With 2L = 2^b − 2
  /// the only code too large is all ones.
  static void validate_codes(const std::uint8_t* codes, std::uint64_t n, int bits, bool avx2) {
    const std::uint64_t used_bits = n * static_cast<std::uint64_t>(bits);
    const std::uint64_t bytes = used_bits / 8 + (used_bits % 8 != 0 ? 1 : 0);
    bool all_ones = false;
    if (bits == 8) all_ones = detail::cpu::any_code_all_ones<8>(codes, bytes, avx2);
    if (bits == 4) all_ones = detail::cpu::any_code_all_ones<4>(codes, bytes, avx2);
    if (bits == 2) {
      unsigned found = 0;
      for (std::uint64_t b = 0; b < bytes; ++b) found |= codes[b] & (codes[b] >> 1) & 0x55u;  // bit 2k: field k is 0b11
      all_ones = found != 0;
    }
    detail::require(!all_ones, errc::malformed_payload, "a code exceeds the largest level");
    if (used_bits % 8 != 0)
      detail::require((codes[used_bits / 8] >> (used_bits % 8)) == 0, errc::malformed_payload,
                      "non-zero padding bits after the last code");
  }

  /// Decodes elements [begin, end) of step s value by value, with the code width a compile-time
  /// constant. An accumulation adds each value level·s, so the product is rounded on its own
  /// (`mul_rn`); up to 4 bits the values are looked up in a table of the 2^b codes' values, built
  /// once per block, which is faster than a product per element.
  template <int Bits>
  static void decode_block(const std::uint8_t* codes, std::uint64_t begin, std::uint64_t end, C s, C* dense,
                           bool accumulate) {
    if constexpr (Bits <= 4) {
      C value_of[1 << Bits];
      for (unsigned c = 0; c < (1u << Bits); ++c)
        value_of[c] = mul_rn(static_cast<C>(uniform_code_level(static_cast<std::uint8_t>(c), Bits)), s);
      if (accumulate)
        for (std::uint64_t i = begin; i < end; ++i) dense[i] += value_of[packed_code(codes, i, Bits)];
      else
        for (std::uint64_t i = begin; i < end; ++i) dense[i] = value_of[packed_code(codes, i, Bits)];
    } else {
      const auto level = [codes](std::uint64_t i) { return static_cast<C>(uniform_code_level(codes[i], Bits)); };
      if (accumulate)
        for (std::uint64_t i = begin; i < end; ++i) dense[i] += mul_rn(level(i), s);
      else
        for (std::uint64_t i = begin; i < end; ++i) dense[i] = level(i) * s;
    }
  }
};

}  // namespace gradcomp
