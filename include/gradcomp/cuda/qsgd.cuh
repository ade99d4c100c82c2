#pragma once
/// @file
/// The QSGD quantizer on the GPU, byte-identical to the CPU backend: a warp per 32 buckets stages
/// them in shared memory and lane b finds bucket b's largest magnitude and sums its squares in the
/// documented left-to-right order (quantize/qsgd_math.hpp, the sum the CPU forms; block sums,
/// cuda/detail/block_codes.cuh); then one thread per 32-bit word
/// codes its values, drawing element i's uniform from word i of the Philox stream. Decoding
/// checks every norm and code first, then writes ±norm·level/s (cuda/detail/block_codes.cuh).

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
#include <gradcomp/core/wire_envelope.hpp>
#include <gradcomp/core/workspace.hpp>
#include <gradcomp/cuda/detail/block_codes.cuh>
#include <gradcomp/cuda/executor.cuh>
#include <gradcomp/cuda/detail/grid.cuh>
#include <gradcomp/cuda/detail/message.cuh>
#include <gradcomp/cuda/detail/operation.cuh>
#include <gradcomp/quantize/qsgd.hpp>
#include <gradcomp/quantize/qsgd_math.hpp>
#include <gradcomp/quantize/sign_math.hpp>

namespace gradcomp {

namespace detail::cuda {

/// Reason of a bucket whose L2 norm overflows the value type (after the block-code reasons).
inline constexpr std::uint32_t qsgd_norm_overflow = 4;

/// A bucket's L2 norm into the message, from its sum of squares in the documented order
/// (block_sums_kernel forms it; `non_finite_input` when the norm overflows the value type).
template <class T>
struct qsgd_bucket_norm_stat {
  using sum_type = qsgd_square_sum<T>;

  T* norms;

  __device__ void operator()(std::uint64_t j, const sum_type& sum, std::uint64_t, T m, device_status* status) const {
    T norm = T{0};
    if (!sum.norm(m, norm)) {
      record_failure(status, errc::non_finite_input, j, qsgd_norm_overflow);
      norm = T{0};
    }
    norms[j] = norm;
  }
};

/// The per-value rule of QSGD.
template <class T>
struct qsgd_rule {
  std::uint32_t levels;
  int bits;
  random_stream stream;
  const T* norms;  ///< Per-bucket norms (the encoder only).

  __device__ std::uint8_t code(T x, std::uint64_t i, std::uint64_t j, philox_cache& random) const {
    const T norm = norms[j];
    if (norm == T{0}) return 0;
    const T u = static_cast<T>(random.word(stream, i) >> 8) * static_cast<T>(1.0 / 16777216.0);
    return qsgd_code(qsgd_level(from_bits<T>(magnitude_key(x)), norm, levels, u), sign_bit_of(x), bits);
  }
  __device__ bool valid_scale(T norm) const { return sign_bit_of(norm) == 0 && is_finite(norm); }
  __device__ bool valid_code(std::uint8_t c, T norm) const {
    if (norm == T{0}) return c == 0;
    const int level = qsgd_code_level(c, bits);
    return level <= static_cast<int>(levels) && (level != 0 || c == 0);
  }
  __device__ T value(std::uint8_t c, T norm) const { return qsgd_decoded(c, norm, levels, bits); }
};

}  // namespace detail::cuda

/// QSGD quantization on the GPU.
template <gradient_value T>
struct backend<qsgd_quantizer<T>, cuda_executor> {
  using rule = detail::cuda::qsgd_rule<T>;

  static std::size_t workspace_bytes(const qsgd_quantizer<T>&, const cuda_executor&, std::uint64_t) {
    return detail::cuda::status_and_crc_bytes();
  }

  static std::size_t encode(const qsgd_quantizer<T>& codec, const cuda_executor& exec, std::span<const T> grad,
                            std::span<std::byte> out, std::span<std::byte> ws, message_key key) {
    return detail::cuda::encode_block_coded(
        codec, exec, grad, out, ws, key, layout_of(codec, grad.size()),
        [](workspace_arena&, T* norms) { return detail::cuda::qsgd_bucket_norm_stat<T>{norms}; },
        [&](const detail::cuda::qsgd_bucket_norm_stat<T>& stat) { return rule_of(codec, key, stat.norms); },
        [](errc, std::uint64_t position, std::uint32_t reason) {
          if (reason == detail::cuda::qsgd_norm_overflow)
            return "the L2 norm of bucket " + std::to_string(position) +
                   " overflows the value type; no message was written";
          return "gradient value " + std::to_string(position) + " is NaN or Inf; no message was written";
        });
  }

  static void decode(const qsgd_quantizer<T>& codec, const cuda_executor& exec, std::span<const std::byte> message,
                     std::span<T> out, std::span<std::byte> ws, const decode_limits& limits, bool accumulate) {
    detail::cuda::decode_block_coded(
        codec, exec, message, out, ws, limits, accumulate, [&](std::uint64_t n) { return layout_of(codec, n); },
        [&](message_key key) { return rule_of(codec, key, nullptr); }, "norm");
  }

 private:
  static detail::cuda::block_layout layout_of(const qsgd_quantizer<T>& codec, std::uint64_t n) {
    return {n, codec.params().bucket, codec.bits(), packed_bytes(n, codec.bits())};
  }
  static rule rule_of(const qsgd_quantizer<T>& codec, message_key key, const T* norms) {
    return {codec.levels(), codec.bits(),
            random_stream{codec.params().seed, key.step, key.tensor_id, random_purpose::stochastic_rounding}, norms};
  }
};

}  // namespace gradcomp
