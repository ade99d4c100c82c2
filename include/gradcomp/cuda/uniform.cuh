#pragma once
/// @file
/// The uniform quantizer on the GPU, byte-identical to the CPU reference (quantize/uniform_math.hpp
/// is the arithmetic of both).
///
/// Encode. When a block's codes fill whole 32-bit words (B·b a multiple of 32, as for the default
/// B = 256), one kernel gives each block one warp: the lanes read the block for its largest
/// magnitude (which also finds NaN and Inf), lane 0 writes the scale, and each lane then codes
/// whole words of 32/b consecutive values (the second read of the block hits L1). Otherwise the
/// shared block-code kernels run (cuda/block_codes.cuh): scales and largest magnitudes first, then
/// word by word. The payload is sealed on the device once the codes are written.
///
/// Decode. The envelope is read and checked on the host; a kernel checks every scale and code
/// (the all-ones code, padding bits), the host reads its verdict, and only then code·s is written
/// (or added) for each value.

#include <gradcomp/cuda/config.cuh>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include <gradcomp/core/backend.hpp>
#include <gradcomp/core/bit_packing.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/float_bits.hpp>
#include <gradcomp/core/philox.hpp>
#include <gradcomp/core/rounded_product.hpp>
#include <gradcomp/core/wire_envelope.hpp>
#include <gradcomp/core/workspace.hpp>
#include <gradcomp/cuda/block_codes.cuh>
#include <gradcomp/cuda/executor.cuh>
#include <gradcomp/cuda/grid.cuh>
#include <gradcomp/cuda/message.cuh>
#include <gradcomp/cuda/operation.cuh>
#include <gradcomp/cuda/warp.cuh>
#include <gradcomp/quantize/sign_math.hpp>
#include <gradcomp/quantize/uniform.hpp>
#include <gradcomp/quantize/uniform_math.hpp>

namespace gradcomp {

namespace cuda_detail {

/// The coding of one block: its largest magnitude m, step s, and L/m when that is finite.
template <class T>
struct uniform_block_coding {
  T s;
  T inv;
  bool multiply;

  __device__ uniform_block_coding(T m, T step, int bits) : s(step) {
    const auto levels = static_cast<T>(uniform_levels(bits));
    inv = m > T{0} ? levels / m : T{0};
    multiply = m > T{0} && is_finite(inv);
  }
};

/// The per-value rule of the uniform quantizer: codes as the CPU's uniform_scalar_codes computes
/// them (stochastic rounding draws half i mod 2 of stream word ⌊i/2⌋), values code·s, and the
/// checks of the CPU decoder.
template <class T>
struct uniform_rule {
  int bits;
  rounding mode;
  random_stream stream;
  const T* maxima;  ///< Per-block largest magnitudes (the word-by-word encoder only).
  const T* scales;  ///< Per-block steps (the word-by-word encoder only).

  __device__ std::uint8_t code(T x, std::uint64_t i, const uniform_block_coding<T>& b, philox_cache& random) const {
    T u = T{0};
    if (mode == rounding::stochastic) {
      const std::uint32_t w = random.word(stream, i / 2);
      u = static_cast<T>(i % 2 == 0 ? (w & 0xFFFFu) : (w >> 16)) * static_cast<T>(1.0 / 65536.0);
    }
    const T t = b.s == T{0} ? T{0} : (b.multiply ? mul_rn(x, b.inv) : x / b.s);
    return uniform_code(uniform_level(t, bits, mode, u), bits);
  }
  __device__ std::uint8_t code(T x, std::uint64_t i, std::uint64_t j, philox_cache& random) const {
    return code(x, i, uniform_block_coding<T>(maxima[j], scales[j], bits), random);
  }
  __device__ bool valid_scale(T s) const { return sign_bit_of(s) == 0 && is_finite(s * static_cast<T>(uniform_levels(bits))); }
  __device__ bool valid_code(std::uint8_t c, T) const { return bits == 1 || c != (1u << bits) - 1u; }
  __device__ T value(std::uint8_t c, T s) const { return mul_rn(static_cast<T>(uniform_code_level(c, bits)), s); }
};

/// One warp per block whose codes fill whole words: largest magnitude of the block's values
/// (recording the first NaN or Inf), scale, then the codes of whole words of consecutive values,
/// lane by lane (the second read of the block hits L1).
template <class T, class Values>
struct uniform_encode_blocks {
  Values values;
  block_layout layout;
  uniform_rule<T> rule;
  T* scales;
  std::byte* codes;
  device_status* status;

  __device__ void operator()(std::uint64_t j) const {
    const std::uint64_t begin = j * layout.block;
    const std::uint64_t end = begin + layout.count(j);
    const auto largest = warp_max_key(values, begin, end);
    if (largest >= float_traits<T>::infinity_key) {
      record_non_finite(values, begin, end, status);
      return;
    }
    const T m = from_bits<T>(largest);
    const uniform_block_coding<T> coding(m, uniform_step(m, layout.bits), layout.bits);
    if (lane_id() == 0) scales[j] = coding.s;
    const std::uint64_t per_word = layout.per_word();
    for (std::uint64_t first = begin + lane_id() * per_word; first < end; first += 32 * per_word) {
      const std::uint64_t last = first + per_word < end ? first + per_word : end;
      std::uint32_t word = 0;
      philox_cache random;
      for (std::uint64_t i = first; i < last; ++i) {
        const T x = values(i);
        const std::uint8_t c = rule.code(x, i, coding, random);
        word |= std::uint32_t{c} << ((i - first) * static_cast<unsigned>(layout.bits));
        values.coded(i, x, rule.value(c, coding.s));
      }
      store_code_word(codes, first / per_word, word, layout.code_bytes);
    }
  }
};

/// A block's step into the message and its largest magnitude into `maxima` (the word-by-word
/// encoder reads both).
template <class T>
struct uniform_block_step {
  int bits;
  T* scales;
  T* maxima;

  __device__ void operator()(std::uint64_t j, const T*, std::uint64_t, T m, device_status*) const {
    maxima[j] = m;
    scales[j] = uniform_step(m, bits);
  }
};

}  // namespace cuda_detail

/// Uniform quantization on the GPU.
template <gradient_value T>
struct backend<uniform_quantizer<T>, cuda_executor> {
  static std::size_t workspace_bytes(const uniform_quantizer<T>& codec, const cuda_executor&, std::uint64_t n) {
    const std::size_t encoder = cuda_detail::operation::workspace_bytes([&](workspace_arena& arena) {
      (void)cuda_detail::carve_seal(arena, codec.wire().payload_checksum);
      if (!layout_of(codec, n).whole_words()) (void)arena.take<T>(static_cast<std::size_t>(codec.block_count(n)));
    });
    return std::max(encoder, cuda_detail::status_and_crc_bytes());
  }

  static std::size_t encode(const uniform_quantizer<T>& codec, const cuda_executor& exec, std::span<const T> grad,
                            std::span<std::byte> out, std::span<std::byte> ws, message_key key) {
    const std::uint64_t n = grad.size();
    const cuda_detail::block_layout layout = layout_of(codec, n);
    if (!layout.whole_words())
      return cuda_detail::encode_block_coded(
          codec, exec, grad, out, ws, key, layout,
          [&](workspace_arena& arena, T* scales) {
            return cuda_detail::uniform_block_step<T>{layout.bits, scales,
                                                      arena.take<T>(static_cast<std::size_t>(layout.blocks())).data()};
          },
          [&](const cuda_detail::uniform_block_step<T>& stat) { return rule_of(codec, key, stat.maxima, stat.scales); },
          describe_encode_failure);
    const std::size_t size = codec.max_encoded_bytes(n);
    workspace_arena arena(ws);
    const cuda_detail::operation op(exec, arena);
    const cuda_detail::crc_scratch crc = cuda_detail::carve_seal(arena, codec.wire().payload_checksum);
    cuda_detail::begin_message(exec, out, size);  // after the workspace is carved: a refused call writes nothing
    cuda_detail::for_each_block(exec, layout.blocks(),
                                cuda_detail::uniform_encode_blocks<T, cuda_detail::plain_values<T>>{
                                    {grad.data()}, layout, rule_of(codec, key), cuda_detail::scales_of<T>(out.data()),
                                    cuda_detail::codes_of<T>(out.data(), layout), op.status()});
    cuda_detail::seal_message(exec, out.data(),
                              {codec_id::uniform, dtype_of<T>, 0, 0, key, n, codec.payload_bytes(n), codec.params_hash(), 0},
                              crc, op);
    op.finish_encode(describe_encode_failure);
    return size;
  }

  static void decode(const uniform_quantizer<T>& codec, const cuda_executor& exec, std::span<const std::byte> message,
                     std::span<T> out, std::span<std::byte> ws, const decode_limits& limits, bool accumulate) {
    cuda_detail::decode_block_coded(
        codec, exec, message, out, ws, limits, accumulate, [&](std::uint64_t n) { return layout_of(codec, n); },
        [&](message_key key) { return rule_of(codec, key); }, "scale");
  }

  /// The layout of an n-element message.
  static cuda_detail::block_layout layout_of(const uniform_quantizer<T>& codec, std::uint64_t n) {
    return {n, codec.params().block, codec.bits(), packed_bytes(n, codec.bits())};
  }
  /// The per-value rule for `key` (with the per-block maxima and steps the word-by-word encoder reads).
  static cuda_detail::uniform_rule<T> rule_of(const uniform_quantizer<T>& codec, message_key key, const T* maxima = nullptr,
                                              const T* scales = nullptr) {
    const uniform_params& p = codec.params();
    return {p.bits, p.round, random_stream{p.seed, key.step, key.tensor_id, random_purpose::stochastic_rounding}, maxima, scales};
  }

 private:
  static std::string describe_encode_failure(errc, std::uint64_t i, std::uint32_t) {
    return "gradient value " + std::to_string(i) + " is NaN or Inf; no message was written";
  }
};

}  // namespace gradcomp
