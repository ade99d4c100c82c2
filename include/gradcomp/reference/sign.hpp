#pragma once
/// @file
/// Reference backend of the sign quantizer (docs/quantizers.md §11): the specification the
/// `cpu_executor` and `cuda_executor` backends are checked against, byte for byte.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include <gradcomp/core/backend.hpp>
#include <gradcomp/core/bit_packing.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/float_bits.hpp>
#include <gradcomp/core/reference_executor.hpp>
#include <gradcomp/core/wire_envelope.hpp>
#include <gradcomp/quantize/sign.hpp>
#include <gradcomp/quantize/sign_math.hpp>
#include <gradcomp/reference/values.hpp>

namespace gradcomp {

/// The sign quantizer, written to be read.
template <gradient_value T>
struct backend<sign_quantizer<T>, reference_executor> {
  static std::size_t workspace_bytes(const sign_quantizer<T>&, const reference_executor&, std::uint64_t) noexcept {
    return 0;
  }

  static std::size_t encode(const sign_quantizer<T>& codec, const reference_executor&, std::span<const T> grad,
                            std::span<std::byte> out, std::span<std::byte>, message_key key) {
    namespace ref = detail::reference;
    const std::uint64_t n = grad.size();
    const std::uint64_t block = codec.params().block;
    const std::size_t size = codec.max_encoded_bytes(n);
    detail::begin_host_message(out, size);
    std::byte* const scales = out.data() + envelope::size;
    auto* const bits = reinterpret_cast<std::uint8_t*>(scales + codec.block_count(n) * sizeof(C));

    // docs/quantizers.md §11.5: a gradient holding NaN or ±Inf is rejected; the envelope stays zero.
    ref::require_finite(grad);

    // docs/quantizers.md §11.2: each block's scale, its mean magnitude summed in index order, clamped to its maximum.
    for (std::uint64_t j = 0; j < codec.block_count(n); ++j) {
      const std::uint64_t begin = j * block;
      const std::uint64_t end = std::min(n, begin + block);
      ref::store_value(scales, j,
                       sign_block_scale(grad.data() + begin, end - begin, ref::max_magnitude(grad, begin, end)));
    }

    // docs/quantizers.md §11.3: bit i is the IEEE sign bit of x_i, LSB first; a block of scale 0 keeps bits 0 (docs/quantizers.md §11.4).
    std::memset(bits, 0, static_cast<std::size_t>(packed_bytes(n, 1)));
    for (std::uint64_t i = 0; i < n; ++i)
      if (ref::load_value<C>(scales, i / block) != C{0})
        bits[i / 8] = static_cast<std::uint8_t>(bits[i / 8] | sign_bit_of(grad[i]) << (i % 8));

    // The envelope last (docs/wire-format.md).
    detail::seal_host_message(out,
                              {codec_id::sign, dtype_of<T>, 0, 0, key, n, codec.payload_bytes(n), codec.params_hash(),
                               0},
                              codec.wire().payload_checksum);
    return size;
  }

  /// Decodes into `out` of T, or (a 16-bit T) of float32; with `accumulate` adds instead.
  template <gradient_value O>
  static void decode(const sign_quantizer<T>& codec, const reference_executor&, std::span<const std::byte> message,
                     std::span<O> out, std::span<std::byte>, const decode_limits& limits, bool accumulate) {
    namespace ref = detail::reference;
    // docs/quantizers.md §11.4: the envelope and the payload size.
    const envelope e = parse_envelope(message);
    validate_envelope(e, {codec_id::sign, dtype_of<T>, out.size(), codec.params_hash()}, limits);
    codec.validate_payload_size(e);
    const std::uint64_t n = e.elements;
    const std::uint64_t block = codec.params().block;
    const std::byte* const scales = message.data() + envelope::size;
    const auto* const bits = reinterpret_cast<const std::uint8_t*>(scales + codec.block_count(n) * sizeof(C));

    // docs/quantizers.md §11.4: every scale finite with its sign bit clear.
    for (std::uint64_t j = 0; j < codec.block_count(n); ++j) {
      const C s = ref::load_value<C>(scales, j);
      detail::require(sign_bit_of(s) == 0 && is_finite(s), errc::malformed_payload,
                      [&] { return "scale of block " + std::to_string(j) + " is negative or not finite"; });
    }
    // docs/quantizers.md §11.4: no set bit in a block of scale 0, and the padding bits zero.
    for (std::uint64_t i = 0; i < n; ++i)
      detail::require(ref::load_value<C>(scales, i / block) != C{0} || packed_code(bits, i, 1) == 0,
                      errc::malformed_payload,
                      [&] { return "block " + std::to_string(i / block) + " has scale 0 but a set sign bit"; });
    if (n % 8 != 0)
      detail::require((bits[n / 8] >> (n % 8)) == 0, errc::malformed_payload,
                      "non-zero padding bits after the last sign bit");

    // docs/quantizers.md §11.3: ±scale, written or added (in C; a 16-bit output narrowed after
    // every result is checked to fit, docs/half-precision.md §3).
    std::vector<C> results(static_cast<std::size_t>(n));
    for (std::uint64_t i = 0; i < n; ++i) {
      const C value = sign_decoded(packed_code(bits, i, 1), ref::load_value<C>(scales, i / block));
      results[i] = accumulate ? widen(out[i]) + value : value;
    }
    ref::store_results(results, out);
  }

 private:
  using C = compute_type<T>;  ///< The scales' and the arithmetic's type: float32 for a 16-bit T.
};

}  // namespace gradcomp
