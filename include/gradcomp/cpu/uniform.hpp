#pragma once
/// @file
/// CPU backend of the uniform quantizer (its specification is reference/uniform.hpp): per block,
/// one pass for the maximum magnitude (which also finds NaN and Inf), then codes computed a chunk
/// at a time and packed whole bytes at a time. float32 in the common layouts (8-bit codes, or 4-bit
/// round-to-nearest, blocks a multiple of 32) takes the vectorised kernels of
/// cpu/detail/uniform_kernels.hpp: the encoder reads the blocks front to back (the hardware prefetcher
/// follows) and writes the codes through a staged_writer, the decoder validates every code first
/// and then writes values directly; large outputs are written with non-temporal stores
/// (cpu_executor). Every path computes the codes and values of quantize/uniform_math.hpp.

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
#include <gradcomp/core/rounded_product.hpp>
#include <gradcomp/core/wire_envelope.hpp>
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
    if constexpr (std::is_same_v<T, float>) {
      if (detail::cpu::uniform_vectorised(codec)) return encode_vectorised(codec, exec, grad, out, key);
    }
    const std::uint64_t n = grad.size();
    const std::size_t size = codec.max_encoded_bytes(n);
    detail::cpu::begin_message(out, size);
    std::byte* const scales = out.data() + envelope::size;
    auto* const codes = reinterpret_cast<std::uint8_t*>(scales + codec.block_count(n) * sizeof(T));
    encode_generic(codec, exec, grad, key, scales, codes);
    detail::cpu::seal_uniform_message(codec, out, key, n);
    return size;
  }

  static void decode(const uniform_quantizer<T>& codec, const cpu_executor& exec, std::span<const std::byte> message,
                     std::span<T> out, std::span<std::byte>, const decode_limits& limits, bool accumulate) {
    const envelope e = parse_envelope(message);
    validate_envelope(e, {codec_id::uniform, dtype_of<T>, out.size(), codec.params_hash()}, limits);
    codec.validate_payload_size(e);
    const int bits = codec.bits();
    const std::uint64_t n = e.elements;
    const std::byte* const scales = message.data() + envelope::size;
    const auto* const codes = reinterpret_cast<const std::uint8_t*>(scales + codec.block_count(n) * sizeof(T));
    const auto levels = static_cast<T>(uniform_levels(bits));
    for (std::uint64_t j = 0; j < codec.block_count(n); ++j) {
      const T s = scale_at(scales, j);
      detail::require((to_bits(s) >> (sizeof(T) * 8 - 1)) == 0 && is_finite(s * levels), errc::malformed_payload,
                      [&] { return "scale of block " + std::to_string(j) + " is negative or too large"; });
    }
    validate_codes(codes, n, bits, exec.avx2());

    const std::uint64_t block = codec.params().block;
    T* const dense = out.data();
    if constexpr (std::is_same_v<T, float>) {
      if (block % detail::cpu::kernel_width == 0 && (bits == 8 || bits == 4)) {
        decode_vectorised(exec, codes, scales, n, block, bits, dense, accumulate);
        return;
      }
    }
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
  /// Values coded together within a block: codes and random words are staged in arrays this long.
  static constexpr std::uint64_t chunk = 512;

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
    for (std::uint64_t begin = 0, j = 0; begin < n; begin += block, ++j) {
      const std::uint64_t end = std::min(n, begin + block);
      const T m = detail::cpu::max_magnitude(grad.data() + begin, grad.data() + end, exec.avx2());
      const T s = uniform_step(m, bits);
      std::memcpy(scales + j * sizeof(T), &s, sizeof s);
      for (std::uint64_t first = begin; first < end; first += chunk) {
        const std::uint64_t count = std::min<std::uint64_t>(chunk, end - first);
        const std::uint16_t* const halves =
            mode == rounding::stochastic
                ? detail::philox_stream_halves(stream, first, count, random_halves, exec.simd())
                : nullptr;
        detail::cpu::uniform_scalar_codes(grad.data() + first, count, m, s, bits, mode, halves, chunk_codes);
        store_codes(chunk_codes, count, first, bits, codes);
      }
    }
  }

  /// The vectorised float32 encoder: the blocks in order, each coded by `uniform_block_encoder`.
  static std::size_t encode_vectorised(const uniform_quantizer<float>& codec, const cpu_executor& exec,
                                       std::span<const float> grad, std::span<std::byte> out, message_key key) {
    const std::uint64_t n = grad.size();
    const std::uint64_t block = codec.params().block;
    const float* const g = grad.data();
    detail::cpu::uniform_block_encoder encoder(codec, exec, out, n, key);
    for (std::uint64_t begin = 0; begin < n; begin += block) {
      const std::uint64_t end = std::min(n, begin + block);
      encoder.next(g + begin, end - begin);
    }
    return encoder.finish();
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

  [[nodiscard]] static T scale_at(const std::byte* scales, std::uint64_t j) noexcept {
    T s;
    std::memcpy(&s, scales + j * sizeof(T), sizeof s);
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
  static void decode_block(const std::uint8_t* codes, std::uint64_t begin, std::uint64_t end, T s, T* dense,
                           bool accumulate) {
    if constexpr (Bits <= 4) {
      T value_of[1 << Bits];
      for (unsigned c = 0; c < (1u << Bits); ++c)
        value_of[c] = mul_rn(static_cast<T>(uniform_code_level(static_cast<std::uint8_t>(c), Bits)), s);
      if (accumulate)
        for (std::uint64_t i = begin; i < end; ++i) dense[i] += value_of[packed_code(codes, i, Bits)];
      else
        for (std::uint64_t i = begin; i < end; ++i) dense[i] = value_of[packed_code(codes, i, Bits)];
    } else {
      const auto level = [codes](std::uint64_t i) { return static_cast<T>(uniform_code_level(codes[i], Bits)); };
      if (accumulate)
        for (std::uint64_t i = begin; i < end; ++i) dense[i] += mul_rn(level(i), s);
      else
        for (std::uint64_t i = begin; i < end; ++i) dense[i] = level(i) * s;
    }
  }
};

}  // namespace gradcomp
