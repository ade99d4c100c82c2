#pragma once
/// @file
/// The sign quantizer on the GPU, byte-identical to the CPU reference: a warp per block finds its
/// largest magnitude and lane 0 sums its mean magnitude in the documented left-to-right order
/// (quantize/sign_math.hpp, the very function the CPU calls); then one thread per 32-bit word
/// writes 32 sign bits (0 under a zero scale). Decoding checks every scale and bit first, then
/// writes ±scale (cuda/block_codes.cuh).

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
#include <gradcomp/core/wire_envelope.hpp>
#include <gradcomp/core/workspace.hpp>
#include <gradcomp/cuda/block_codes.cuh>
#include <gradcomp/cuda/executor.cuh>
#include <gradcomp/cuda/grid.cuh>
#include <gradcomp/cuda/message.cuh>
#include <gradcomp/cuda/operation.cuh>
#include <gradcomp/quantize/sign.hpp>
#include <gradcomp/quantize/sign_math.hpp>

namespace gradcomp {

namespace cuda_detail {

/// A block's mean-magnitude scale into the message.
template <class T>
struct sign_block_scale_stat {
  T* scales;

  __device__ void operator()(std::uint64_t j, const T* x, std::uint64_t count, T m, device_status*) const {
    scales[j] = sign_block_scale(x, count, m);
  }
};

/// The per-value rule of the sign quantizer.
template <class T>
struct sign_rule {
  const T* scales;  ///< Per-block scales (the encoder only).

  __device__ std::uint8_t code(T x, std::uint64_t, std::uint64_t j, philox_cache&) const {
    return scales[j] == T{0} ? std::uint8_t{0} : sign_bit_of(x);
  }
  __device__ bool valid_scale(T s) const { return sign_bit_of(s) == 0 && is_finite(s); }
  __device__ bool valid_code(std::uint8_t bit, T s) const { return s != T{0} || bit == 0; }
  __device__ T value(std::uint8_t bit, T s) const { return sign_decoded(bit, s); }
};

}  // namespace cuda_detail

/// Sign quantization on the GPU.
template <gradient_value T>
struct backend<sign_quantizer<T>, cuda_executor> {
  using rule = cuda_detail::sign_rule<T>;

  static std::size_t workspace_bytes(const sign_quantizer<T>& codec, const cuda_executor&, std::uint64_t) {
    workspace_arena encode_arena = workspace_arena::measure();
    cuda_detail::operation::reserve(encode_arena);
    (void)cuda_detail::carve_seal(encode_arena, codec.wire().payload_checksum);
    workspace_arena decode_arena = workspace_arena::measure();
    cuda_detail::operation::reserve(decode_arena);
    (void)cuda_detail::crc_scratch::carve(decode_arena);
    return std::max(encode_arena.bytes_needed(), decode_arena.bytes_needed());
  }

  static std::size_t encode(const sign_quantizer<T>& codec, const cuda_executor& exec, std::span<const T> grad,
                            std::span<std::byte> out, std::span<std::byte> ws, message_key key) {
    const std::uint64_t n = grad.size();
    const std::size_t size = codec.max_encoded_bytes(n);
    workspace_arena arena(ws);
    const cuda_detail::operation op(exec, arena);
    const cuda_detail::crc_scratch crc = cuda_detail::carve_seal(arena, codec.wire().payload_checksum);
    cuda_detail::begin_message(exec, out, size);  // after the workspace is carved: a refused call writes nothing
    const cuda_detail::block_layout layout = layout_of(codec, n);
    auto* const scales = reinterpret_cast<T*>(out.data() + envelope::size);
    std::byte* const bits = out.data() + envelope::size + layout.blocks() * sizeof(T);
    cuda_detail::for_each_block(exec, layout.blocks(),
                                cuda_detail::block_statistics<T, cuda_detail::sign_block_scale_stat<T>>{
                                    grad.data(), layout, {scales}, op.status()});
    cuda_detail::for_each_item(exec, layout.words(), cuda_detail::encode_words<T, rule>{grad.data(), layout, {scales}, bits});
    cuda_detail::seal_message(exec, out.data(),
                              {codec_id::sign, dtype_of<T>, 0, 0, key, n, codec.payload_bytes(n), codec.params_hash(), 0},
                              crc, op);
    op.finish_encode([](errc, std::uint64_t i, std::uint32_t) {
      return "gradient value " + std::to_string(i) + " is NaN or Inf; no message was written";
    });
    return size;
  }

  static void decode(const sign_quantizer<T>& codec, const cuda_executor& exec, std::span<const std::byte> message,
                     std::span<T> out, std::span<std::byte> ws, const decode_limits& limits, bool accumulate) {
    workspace_arena arena(ws);
    const cuda_detail::operation op(exec, arena);
    const cuda_detail::crc_scratch crc = cuda_detail::crc_scratch::carve(arena);
    const envelope e =
        cuda_detail::read_envelope(exec, message, {codec_id::sign, dtype_of<T>, out.size(), codec.params_hash()}, limits, crc);
    codec.validate_payload_size(e);
    const cuda_detail::block_layout layout = layout_of(codec, e.elements);
    const auto* const scales = reinterpret_cast<const T*>(message.data() + envelope::size);
    const std::byte* const bits = message.data() + envelope::size + layout.blocks() * sizeof(T);
    const cuda_detail::check_codes<T, rule> check{layout, {nullptr}, scales, bits, op.status()};
    cuda_detail::for_each_item(exec, check.items(), check);
    op.finish([](errc, std::uint64_t position, std::uint32_t reason) {
      return cuda_detail::describe_block_code_failure(position, reason, "scale");
    });
    cuda_detail::for_each_item(exec, layout.words(),
                               cuda_detail::decode_words<T, rule>{layout, {nullptr}, scales, bits, out.data(), accumulate});
  }

 private:
  static cuda_detail::block_layout layout_of(const sign_quantizer<T>& codec, std::uint64_t n) {
    return {n, codec.params().block, 1, packed_bytes(n, 1)};
  }
};

}  // namespace gradcomp
