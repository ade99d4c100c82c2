#pragma once
/// @file
/// ZFP fixed rate on the GPU, byte for byte the CPU backend's stream (lossless/zfp_fixed_rate.hpp
/// has the format). Every block takes exactly 4R bits at bit 4R·b of the payload, so blocks code
/// and decode independently: one thread per block runs the shared scalar coder
/// (lossless/zfp_block.hpp, checked against the codec's stream on the CPU in
/// tests/lossless/test_zfp_fixed_rate.cpp).
///
/// Encoding zeroes the payload, then writes the even blocks and, in a second launch, the odd ones,
/// each ORing its bytes in: for odd R two neighbouring blocks share a byte, while blocks two apart
/// never do, so no byte is written by two threads at once and nothing needs atomics. NaN or ±Inf
/// is recorded and leaves the message unsealed. Decoding checks the envelope on the host and the
/// 4 padding bits after an odd last block on the device, then one thread per block reads its 4R
/// bits (bytes inside the payload only) and writes or adds its values.

#include <gradcomp/cuda/config.cuh>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include <gradcomp/core/backend.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/float_bits.hpp>
#include <gradcomp/core/wire_envelope.hpp>
#include <gradcomp/core/workspace.hpp>
#include <gradcomp/cuda/executor.cuh>
#include <gradcomp/cuda/detail/message.cuh>
#include <gradcomp/cuda/detail/operation.cuh>
#include <gradcomp/cuda/detail/warp.cuh>
#include <gradcomp/lossless/zfp_block.hpp>
#include <gradcomp/lossless/zfp_fixed_rate.hpp>

namespace gradcomp {

namespace detail::cuda {

/// The geometry of a stream: n values, ⌈n/4⌉ blocks of 4R bits, and the budget 4R − 9.
struct zfp_geometry {
  std::uint64_t n;
  std::uint64_t blocks;
  unsigned block_bits;
  unsigned budget;

  static zfp_geometry of(const zfp_fixed_rate_codec<float>& codec, std::uint64_t n) noexcept {
    return {n, zfp_fixed_rate_codec<float>::block_count(n), codec.block_bits(),
            codec.block_bits() - zfp_block::header_bits};
  }
  /// Values of block b (4, or fewer for the last).
  __device__ unsigned values_of(std::uint64_t b) const { return static_cast<unsigned>(n - 4 * b < 4 ? n - 4 * b : 4); }
};

/// Codes the blocks b ≡ parity (mod 2) of `x` into the zeroed `payload`; NaN or ±Inf is recorded.
template <class = void>
__global__ void zfp_encode_kernel(const float* x, zfp_geometry geometry, unsigned parity, std::byte* payload,
                                  device_status* status) {
  for (std::uint64_t b = 2 * thread_id() + parity; b < geometry.blocks; b += 2 * thread_count()) {
    const float* const values = x + 4 * b;
    const unsigned count = geometry.values_of(b);
    bool finite = true;
    for (unsigned i = 0; i < count; ++i)
      if (!is_finite(values[i])) {
        record_failure(status, errc::non_finite_input, 4 * b + i);
        finite = false;
      }
    if (!finite) continue;
    const zfp_block::wide_word bits = zfp_block::encode_block(values, count, geometry.budget, geometry.block_bits);
    const std::uint64_t first = b * geometry.block_bits;
    const unsigned shift = static_cast<unsigned>(first % 8);  // 0, or 4 for odd R
    const zfp_block::wide_word placed = bits << shift;          // 4R + 4 ≤ 128 bits when shift is 4
    const unsigned bytes = (shift + geometry.block_bits + 7) / 8;
    auto* const at = reinterpret_cast<unsigned char*>(payload + first / 8);
    for (unsigned j = 0; j < bytes; ++j) at[j] |= static_cast<unsigned char>(placed >> (8 * j));
  }
}

/// Records `malformed_payload` unless the 4 bits after the last block (in the payload's last
/// byte, `last`) are zero.
template <class = void>
__global__ void zfp_padding_kernel(const std::byte* last, device_status* status) {
  if (blockIdx.x == 0 && threadIdx.x == 0 && (static_cast<unsigned>(*last) >> 4) != 0)
    record_failure(status, errc::malformed_payload, 0);
}

/// Decodes every block of the validated payload (`payload_bytes` bytes) into (or onto) `out`.
template <class = void>
__global__ void zfp_decode_kernel(const std::byte* payload, std::uint64_t payload_bytes, zfp_geometry geometry,
                                  float* out, bool accumulate) {
  for (std::uint64_t b = thread_id(); b < geometry.blocks; b += thread_count()) {
    const std::uint64_t first = b * geometry.block_bits;
    const unsigned shift = static_cast<unsigned>(first % 8);
    const std::uint64_t begin = first / 8;
    const std::uint64_t last = (first + geometry.block_bits + 7) / 8;
    const std::uint64_t end = last < payload_bytes ? last : payload_bytes;
    zfp_block::wide_word bits = 0;
    for (std::uint64_t k = begin; k < end; ++k)
      bits |= static_cast<zfp_block::wide_word>(static_cast<unsigned>(payload[k])) << (8 * (k - begin));
    float values[4];
    zfp_block::decode_block(bits >> shift, geometry.budget, values);
    const unsigned count = geometry.values_of(b);
    float* const o = out + 4 * b;
    for (unsigned i = 0; i < count; ++i) o[i] = accumulate ? o[i] + values[i] : values[i];
  }
}

}  // namespace detail::cuda

/// ZFP fixed rate on the GPU.
template <>
struct backend<zfp_fixed_rate_codec<float>, cuda_executor> {
  /// The status and, for checksummed messages and every decode, the CRC scratch (about 270 KB,
  /// whatever n is).
  static std::size_t workspace_bytes(const zfp_fixed_rate_codec<float>&, const cuda_executor&, std::uint64_t) {
    return detail::cuda::status_and_crc_bytes();
  }

  static std::size_t encode(const zfp_fixed_rate_codec<float>& codec, const cuda_executor& exec,
                            std::span<const float> grad, std::span<std::byte> out, std::span<std::byte> ws,
                            message_key key) {
    namespace cd = detail::cuda;
    const std::uint64_t n = grad.size();
    const std::size_t size = codec.max_encoded_bytes(n);
    workspace_arena arena(ws);
    const cd::operation op(exec, arena);
    const cd::crc_scratch crc = cd::carve_seal(arena, codec.wire().payload_checksum);
    cd::begin_message(exec, out, size);
    std::byte* const payload = out.data() + envelope::size;
    const std::uint64_t payload_bytes = codec.payload_bytes(n);
    GRADCOMP_CUDA_CHECK(cudaMemsetAsync(payload, 0, payload_bytes, exec.native_stream()));
    const cd::zfp_geometry geometry = cd::zfp_geometry::of(codec, n);
    for (unsigned parity = 0; parity < 2 && parity < geometry.blocks; ++parity)
      cd::launch(exec, cd::grid_for((geometry.blocks + 1) / 2), cd::block_threads, cd::zfp_encode_kernel<>, grad.data(),
                 geometry, parity, payload, op.status());
    cd::seal_message(exec, out.data(),
                     {codec_id::zfp_fixed_rate, value_dtype::float32, 0, 0, key, n, payload_bytes, codec.params_hash(),
                      0},
                     crc, op);
    op.finish_encode([n](errc, std::uint64_t position, std::uint32_t) {
      return "value " + std::to_string(position) + " of the " + std::to_string(n) +
             "-value gradient is NaN or Inf (ZFP cannot represent it)";
    });
    return size;
  }

  static void decode(const zfp_fixed_rate_codec<float>& codec, const cuda_executor& exec,
                     std::span<const std::byte> message, std::span<float> out, std::span<std::byte> ws,
                     const decode_limits& limits, bool accumulate) {
    namespace cd = detail::cuda;
    workspace_arena arena(ws);
    const cd::operation op(exec, arena);
    const cd::crc_scratch crc = cd::crc_scratch::carve(arena);
    const envelope e =
        cd::read_envelope(exec, message,
                          {codec_id::zfp_fixed_rate, value_dtype::float32, out.size(), codec.params_hash()}, limits,
                          crc);
    codec.check_layout(e);
    const std::uint64_t n = e.elements;
    if (n == 0) return;
    const std::byte* const payload = message.data() + envelope::size;
    const cd::zfp_geometry geometry = cd::zfp_geometry::of(codec, n);
    if (geometry.blocks % 2 == 1 && codec.params().rate_bits % 2 == 1) {
      cd::launch(exec, 1, 32, cd::zfp_padding_kernel<>, payload + e.payload_bytes - 1, op.status());
      op.finish([](errc, std::uint64_t, std::uint32_t) {
        return std::string("the 4 bits after the last block are not zero");
      });
    }
    cd::launch(exec, cd::grid_for(geometry.blocks), cd::block_threads, cd::zfp_decode_kernel<>, payload,
               e.payload_bytes, geometry, out.data(), accumulate);
  }
};

}  // namespace gradcomp
