#pragma once
/// @file
/// Reference backend of the ZFP fixed-rate codec (docs/lossless.md §2): the specification the
/// `cpu_executor` and `cuda_executor` backends are checked against, byte for byte. Each block of
/// four values is coded by `zfp_block::encode_block` (the steps of docs/lossless.md §2.2, one
/// block at a time) and its 4R bits are placed in the stream one by one; the decoder takes each
/// block's 4R bits out of the stream one by one and hands them to `zfp_block::decode_block`. A
/// 16-bit gradient's blocks are widened as they are coded; a 16-bit output is written after every
/// decoded result is checked to narrow to a finite value.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

#include <gradcomp/core/backend.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/half_float.hpp>
#include <gradcomp/core/narrowing.hpp>
#include <gradcomp/core/reference_executor.hpp>
#include <gradcomp/core/wire_envelope.hpp>
#include <gradcomp/lossless/zfp_block.hpp>
#include <gradcomp/lossless/zfp_fixed_rate.hpp>
#include <gradcomp/reference/values.hpp>

namespace gradcomp {

/// ZFP fixed rate, written to be read.
template <gradient_value T>
struct backend<zfp_fixed_rate_codec<T>, reference_executor> {
  using codec_type = zfp_fixed_rate_codec<T>;
  static constexpr std::uint64_t block = codec_type::block;

  static std::size_t workspace_bytes(const codec_type&, const reference_executor&, std::uint64_t) noexcept { return 0; }

  static std::size_t encode(const codec_type& codec, const reference_executor&, std::span<const T> grad,
                            std::span<std::byte> out, std::span<std::byte>, message_key key) {
    const std::uint64_t n = grad.size();
    const std::size_t size = codec.max_encoded_bytes(n);
    detail::begin_host_message(out, size);
    // docs/lossless.md §2.4: NaN and ±Inf cannot be represented; the envelope stays zero.
    detail::reference::require_finite(grad);

    // docs/lossless.md §2.2 and §2.5: block b takes stream bits [b·4R, (b + 1)·4R); bit j of the
    // stream is bit j mod 8 of payload byte ⌊j/8⌋; the bits after the last block are zero.
    auto* const stream = reinterpret_cast<std::uint8_t*>(out.data() + envelope::size);
    std::memset(stream, 0, size - envelope::size);
    const std::uint32_t block_bits = codec.block_bits();
    for (std::uint64_t b = 0; b < codec_type::block_count(n); ++b) {
      const std::uint64_t first = b * block;
      const auto count = static_cast<unsigned>(std::min<std::uint64_t>(block, n - first));
      float values[block];  // the block's values (a 16-bit value widened exactly)
      for (unsigned i = 0; i < count; ++i) values[i] = widen(grad[first + i]);
      const zfp_block::wide_word bits =
          zfp_block::encode_block(values, count, block_bits - zfp_block::header_bits, block_bits);
      for (std::uint32_t k = 0; k < block_bits; ++k) {
        const std::uint64_t j = b * block_bits + k;
        stream[j / 8] = static_cast<std::uint8_t>(stream[j / 8] | static_cast<unsigned>((bits >> k) & 1u) << (j % 8));
      }
    }

    detail::seal_host_message(out,
                              {codec_id::zfp_fixed_rate, dtype_of<T>, 0, 0, key, n, codec.payload_bytes(n),
                               codec.params_hash(), 0},
                              codec.wire().payload_checksum);
    return size;
  }

  /// Into T, or (a 16-bit T) into float32.
  template <gradient_value O>
  static void decode(const codec_type& codec, const reference_executor&, std::span<const std::byte> message,
                     std::span<O> out, std::span<std::byte>, const decode_limits& limits, bool accumulate) {
    // docs/lossless.md §2.5: the envelope, the layout and the exact payload size, then the zero
    // bits after the last block, all before the output is touched.
    const envelope e = parse_envelope(message);
    validate_envelope(e, {codec_id::zfp_fixed_rate, dtype_of<T>, out.size(), codec.params_hash()}, limits);
    codec.check_layout(e);
    const std::uint64_t n = e.elements;
    const auto* const stream = reinterpret_cast<const std::uint8_t*>(message.data() + envelope::size);
    const std::uint32_t block_bits = codec.block_bits();
    const std::uint64_t blocks = codec_type::block_count(n);
    for (std::uint64_t j = blocks * block_bits; j < e.payload_bytes * 8; ++j)
      detail::require(((stream[j / 8] >> (j % 8)) & 1u) == 0, errc::malformed_payload,
                      "the 4 bits after the last block are not zero");

    // docs/lossless.md §2.2, inverted block by block; a partial last block's padding is dropped.
    // Result i is the decoded value, or its sum with out[i] in float32.
    const auto for_each_result = [&](auto&& use) {
      for (std::uint64_t b = 0; b < blocks; ++b) {
        zfp_block::wide_word bits = 0;
        for (std::uint32_t k = 0; k < block_bits; ++k) {
          const std::uint64_t j = b * block_bits + k;
          bits |= static_cast<zfp_block::wide_word>((stream[j / 8] >> (j % 8)) & 1u) << k;
        }
        float values[block];
        zfp_block::decode_block(bits, block_bits - zfp_block::header_bits, values);
        const std::uint64_t first = b * block;
        for (std::uint64_t i = first; i < std::min(n, first + block); ++i)
          use(i, accumulate ? widen(out[i]) + values[i - first] : values[i - first]);
      }
    };
    // A 16-bit output: every result checked to narrow to a finite value before the first is written.
    if constexpr (half_precision<O>)
      for_each_result([](std::uint64_t i, float v) { detail::require_narrows<O>(i, v); });
    for_each_result([&](std::uint64_t i, float v) { out[i] = narrow<O>(v); });
  }
};

}  // namespace gradcomp
