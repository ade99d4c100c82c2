#pragma once
/// @file
/// CPU backend of the sign quantizer (its specification is reference/sign.hpp): per block, one pass
/// for the maximum magnitude (which also finds NaN and Inf), one for the mean magnitude in the
/// documented order, one for the sign bits.

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
#include <gradcomp/core/wire_envelope.hpp>
#include <gradcomp/cpu/detail/half_conversion.hpp>
#include <gradcomp/cpu/detail/message.hpp>
#include <gradcomp/quantize/sign.hpp>

namespace gradcomp {

/// Sign quantization on the CPU.
template <gradient_value T>
struct backend<sign_quantizer<T>, cpu_executor> {
  static std::size_t workspace_bytes(const sign_quantizer<T>&, const cpu_executor&, std::uint64_t) noexcept {
    return 0;
  }

  static std::size_t encode(const sign_quantizer<T>& codec, const cpu_executor&, std::span<const T> grad,
                            std::span<std::byte> out, std::span<std::byte>, message_key key) {
    const std::uint64_t n = grad.size();
    const std::size_t size = codec.max_encoded_bytes(n);
    detail::cpu::begin_message(out, size);
    const std::uint64_t block = codec.params().block;
    std::byte* const scales = out.data() + envelope::size;
    auto* const bits = reinterpret_cast<std::uint8_t*>(scales + codec.block_count(n) * sizeof(C));
    std::memset(bits, 0, static_cast<std::size_t>(packed_bytes(n, 1)));

    for (std::uint64_t begin = 0, j = 0; begin < n; begin += block, ++j) {
      const std::uint64_t end = std::min(n, begin + block);
      const C m = widen(detail::cpu::max_magnitude(grad.data() + begin, grad.data() + end));
      const C s = sign_block_scale(grad.data() + begin, end - begin, m);
      std::memcpy(scales + j * sizeof(C), &s, sizeof s);
      if (s == C{0}) continue;  // a zero-scale block keeps its bits 0
      for (std::uint64_t i = begin; i < end; ++i)
        bits[i / 8] = static_cast<std::uint8_t>(bits[i / 8] | (sign_bit_of(grad[i]) << (i % 8)));
    }

    detail::cpu::seal_message(out,
                              {codec_id::sign, dtype_of<T>, 0, 0, key, n, size - envelope::size, codec.params_hash(),
                               0},
                              codec.wire().payload_checksum);
    return size;
  }

  /// Decodes into `out` of T, or (a 16-bit T) of float32; with `accumulate` adds instead.
  template <gradient_value O>
  static void decode(const sign_quantizer<T>& codec, const cpu_executor&, std::span<const std::byte> message,
                     std::span<O> out, std::span<std::byte>, const decode_limits& limits, bool accumulate) {
    const envelope e = parse_envelope(message);
    validate_envelope(e, {codec_id::sign, dtype_of<T>, out.size(), codec.params_hash()}, limits);
    const std::uint64_t n = e.elements;
    codec.validate_payload_size(e);
    const std::byte* const scales = message.data() + envelope::size;
    const auto* const bits = reinterpret_cast<const std::uint8_t*>(scales + codec.block_count(n) * sizeof(C));
    const std::uint64_t block = codec.params().block;
    for (std::uint64_t begin = 0, j = 0; begin < n; begin += block, ++j) {
      const C s = scale_at(scales, j);
      detail::require(sign_bit_of(s) == 0 && is_finite(s), errc::malformed_payload,
                      [&] { return "scale of block " + std::to_string(j) + " is negative or not finite"; });
      if (s == C{0}) {
        bool clear = true;
        for (std::uint64_t i = begin; i < std::min(n, begin + block); ++i) clear &= packed_code(bits, i, 1) == 0;
        detail::require(clear, errc::malformed_payload,
                        [&] { return "block " + std::to_string(j) + " has scale 0 but a set sign bit"; });
      }
    }
    if (n % 8 != 0)
      detail::require((bits[n / 8] >> (n % 8)) == 0, errc::malformed_payload,
                      "non-zero padding bits after the last sign bit");

    // ±scale in C, written or added; into a 16-bit output narrowed, every result checked to fit
    // first (docs/half-precision.md §3): a plain decode's results are the scales, an accumulation's
    // each sum.
    O* const dense = out.data();
    const auto for_each_value = [&](auto&& use) {
      for (std::uint64_t begin = 0, j = 0; begin < n; begin += block, ++j) {
        const std::uint64_t end = std::min(n, begin + block);
        const C s = scale_at(scales, j);
        for (std::uint64_t i = begin; i < end; ++i) {
          const C v = sign_decoded(packed_code(bits, i, 1), s);
          use(i, accumulate ? widen(dense[i]) + v : v);
        }
      }
    };
    detail::cpu::store_values(for_each_value, dense);
  }

 private:
  using C = compute_type<T>;  ///< The scales' and the arithmetic's type: float32 for a 16-bit T.

  [[nodiscard]] static C scale_at(const std::byte* scales, std::uint64_t j) noexcept {
    C s;
    std::memcpy(&s, scales + j * sizeof(C), sizeof s);
    return s;
  }
};

}  // namespace gradcomp
