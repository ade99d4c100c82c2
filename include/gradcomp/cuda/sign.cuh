#pragma once
/// @file
/// The sign quantizer on the GPU, byte-identical to the CPU backend: a warp per 32 blocks stages
/// them in shared memory and lane b finds block b's largest magnitude and sums its mean magnitude
/// in the documented left-to-right order (quantize/sign_math.hpp, the sum the CPU forms; block
/// sums, cuda/detail/block_codes.cuh); then one thread per 32-bit word
/// writes 32 sign bits (0 under a zero scale). Decoding checks every scale and bit first, then
/// writes ±scale (cuda/detail/block_codes.cuh).

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
#include <gradcomp/cuda/detail/block_codes.cuh>
#include <gradcomp/cuda/executor.cuh>
#include <gradcomp/cuda/detail/grid.cuh>
#include <gradcomp/cuda/detail/message.cuh>
#include <gradcomp/cuda/detail/operation.cuh>
#include <gradcomp/quantize/sign.hpp>
#include <gradcomp/quantize/sign_math.hpp>

namespace gradcomp {

namespace detail::cuda {

/// A block's mean-magnitude scale into the message, from its sum in the documented order
/// (block_sums_kernel forms it).
template <class T>
struct sign_block_scale_stat {
  using sum_type = sign_magnitude_sum<T>;

  T* scales;

  __device__ void operator()(std::uint64_t j, const sum_type& sum, std::uint64_t count, T m, device_status*) const {
    scales[j] = sum.scale(count, m);
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

}  // namespace detail::cuda

/// Sign quantization on the GPU.
template <gradient_value T>
struct backend<sign_quantizer<T>, cuda_executor> {
  static std::size_t workspace_bytes(const sign_quantizer<T>&, const cuda_executor&, std::uint64_t) {
    return detail::cuda::status_and_crc_bytes();
  }

  static std::size_t encode(const sign_quantizer<T>& codec, const cuda_executor& exec, std::span<const T> grad,
                            std::span<std::byte> out, std::span<std::byte> ws, message_key key) {
    return detail::cuda::encode_block_coded(
        codec, exec, grad, out, ws, key, layout_of(codec, grad.size()),
        [](workspace_arena&, T* scales) { return detail::cuda::sign_block_scale_stat<T>{scales}; },
        [](const detail::cuda::sign_block_scale_stat<T>& stat) { return detail::cuda::sign_rule<T>{stat.scales}; },
        [](errc, std::uint64_t i, std::uint32_t) {
          return "gradient value " + std::to_string(i) + " is NaN or Inf; no message was written";
        });
  }

  static void decode(const sign_quantizer<T>& codec, const cuda_executor& exec, std::span<const std::byte> message,
                     std::span<T> out, std::span<std::byte> ws, const decode_limits& limits, bool accumulate) {
    detail::cuda::decode_block_coded(
        codec, exec, message, out, ws, limits, accumulate, [&](std::uint64_t n) { return layout_of(codec, n); },
        [](message_key) { return detail::cuda::sign_rule<T>{nullptr}; }, "scale");
  }

 private:
  static detail::cuda::block_layout layout_of(const sign_quantizer<T>& codec, std::uint64_t n) {
    return {n, codec.params().block, 1, packed_bytes(n, 1)};
  }
};

}  // namespace gradcomp
