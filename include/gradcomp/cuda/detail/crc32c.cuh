#pragma once
/// @file
/// CRC-32C of a buffer in device memory, in parallel and without a host round trip: the CRC of
/// the payload behind the envelope's optional checksum (core/crc32c.hpp gives the same value on
/// the host).
///
/// CRC arithmetic is linear over GF(2). Write raw(B) for the register after the bytes B starting
/// from 0 (no initial or final XOR); then raw(A‖B) = M_|B|·raw(A) ⊕ raw(B), where M_L is the
/// 32×32 bit matrix that advances a register over L zero bytes, and CRC(B) = raw(B) ⊕
/// M_|B|·0xFFFFFFFF ⊕ 0xFFFFFFFF. So: one thread per chunk (a power of two of at least 512 bytes,
/// at most 2^16 chunks, so the scratch has a fixed size) computes its raw CRC (chunks are cut from
/// the end, the short one first, since leading zero bytes do not change a raw CRC);
/// blocks of 256 combine 256 neighbours in a tree with the matrices M_(2^j) (computed first by one
/// thread, by squaring); the tree repeats until one value is left; one thread applies the initial
/// and final XOR.

#include <gradcomp/cuda/config.cuh>

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <span>

#include <gradcomp/core/crc32c.hpp>
#include <gradcomp/core/workspace.hpp>
#include <gradcomp/cuda/executor.cuh>
#include <gradcomp/cuda/detail/grid.cuh>
#include <gradcomp/cuda/detail/operation.cuh>

namespace gradcomp::detail::cuda {

/// log2 of the smallest chunk of the first pass (512 bytes).
inline constexpr int crc_min_chunk_log2 = 9;
/// Most chunks of the first pass (larger buffers take larger chunks).
inline constexpr std::uint64_t crc_max_chunks = std::uint64_t{1} << 16;
/// Values combined per block of the tree passes (2^8).
inline constexpr unsigned crc_fan_in = 256;
/// Largest buffer handled: 2^48 bytes (the matrices cover lengths 2^0 … 2^47).
inline constexpr int crc_powers = 48;

/// A 32×32 matrix over GF(2) as its 32 columns: the image of a register is the XOR of the columns
/// of its set bits.
struct gf2_matrix {
  std::uint32_t column[32];  ///< Image of each single-bit register.
};

__device__ inline std::uint32_t gf2_apply(const gf2_matrix& m, std::uint32_t v) {
  std::uint32_t out = 0;
  for (int k = 0; k < 32; ++k) out ^= (0u - ((v >> k) & 1u)) & m.column[k];
  return out;
}

/// powers[j] = M_(2^j): the advance over 2^j zero bytes, by squaring; one warp, lane k computing
/// column k of each power from the previous one.
template <class = void>
__global__ void crc_powers_kernel(gf2_matrix* powers) {
  if (blockIdx.x != 0 || threadIdx.x >= 32) return;
  const unsigned k = threadIdx.x;
  powers[0].column[k] = crc32c_step(1u << k, std::byte{0});
  for (int j = 1; j < crc_powers; ++j) {
    __syncwarp();
    powers[j].column[k] = gf2_apply(powers[j - 1], powers[j - 1].column[k]);
  }
}

/// log2 of the chunk size for a buffer of `size` bytes.
[[nodiscard]] inline int crc_chunk_log2(std::uint64_t size) noexcept {
  int log2 = crc_min_chunk_log2;
  while (((size - 1) >> log2) + 1 > crc_max_chunks) ++log2;
  return log2;
}

/// One thread per chunk: the raw CRC of chunk i of `chunks` chunks of `chunk_bytes` (cut from the
/// end; chunk 0 may be short).
struct crc_chunk {
  const std::byte* data;
  std::uint64_t size;
  std::uint64_t chunks;
  std::uint64_t chunk_bytes;
  std::uint32_t* raw;

  __device__ void operator()(std::uint64_t i) const {
    const std::uint64_t end = size - (chunks - 1 - i) * chunk_bytes;
    const std::uint64_t begin = end >= chunk_bytes ? end - chunk_bytes : 0;
    std::uint32_t crc = 0;
    for (std::uint64_t b = begin; b < end; ++b) crc = crc32c_step(crc, data[b]);
    raw[i] = crc;
  }
};

/// Combines groups of 256 consecutive raw CRCs, each covering 2^span_log2 bytes (the first group
/// front-padded with zeros), into one per group.
template <class = void>
__global__ void crc_tree_kernel(const std::uint32_t* in, std::uint64_t count, int span_log2, const gf2_matrix* powers,
                                std::uint32_t* out) {
  __shared__ std::uint32_t value[crc_fan_in];
  const std::uint64_t groups = (count + crc_fan_in - 1) / crc_fan_in;
  const std::uint64_t pad = groups * crc_fan_in - count;
  for (std::uint64_t g = blockIdx.x; g < groups; g += gridDim.x) {
    const std::uint64_t slot = g * crc_fan_in + threadIdx.x;  // position in the padded sequence
    value[threadIdx.x] = slot >= pad ? in[slot - pad] : 0u;
    __syncthreads();
    for (unsigned stride = 1, level = 0; stride < crc_fan_in; stride *= 2, ++level) {
      std::uint32_t combined = 0;
      const bool combines = (threadIdx.x + 1) % (2 * stride) == 0;
      if (combines)
        combined =
            gf2_apply(powers[span_log2 + static_cast<int>(level)], value[threadIdx.x - stride]) ^ value[threadIdx.x];
      __syncthreads();
      if (combines) value[threadIdx.x] = combined;
      __syncthreads();
    }
    if (threadIdx.x == crc_fan_in - 1) out[g] = value[threadIdx.x];
    __syncthreads();
  }
}

/// CRC-32C from the raw CRC of `size` bytes (one thread).
template <class = void>
__global__ void crc_finish_kernel(const std::uint32_t* raw, std::uint64_t size, const gf2_matrix* powers,
                                  std::uint32_t* crc) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  std::uint32_t seed = 0xFFFFFFFFu;
  for (int j = 0; j < crc_powers; ++j)
    if (((size >> j) & 1u) != 0) seed = gf2_apply(powers[j], seed);
  *crc = (size == 0 ? 0u : *raw) ^ seed ^ 0xFFFFFFFFu;
}

/// Scratch of a device CRC (the same for every buffer size).
struct crc_scratch {
  std::span<gf2_matrix> powers;      ///< M_(2^j), j < crc_powers.
  std::span<std::uint32_t> raw;      ///< Chunk CRCs, then every other tree level.
  std::span<std::uint32_t> reduced;  ///< The other tree levels.
  std::span<std::uint32_t> result;   ///< The CRC (one word).

  /// Carves the scratch.
  static crc_scratch carve(workspace_arena& arena) {
    crc_scratch s;
    s.powers = arena.take<gf2_matrix>(crc_powers);
    s.raw = arena.take<std::uint32_t>(static_cast<std::size_t>(crc_max_chunks));
    s.reduced = arena.take<std::uint32_t>(static_cast<std::size_t>(crc_max_chunks / crc_fan_in));
    s.result = arena.take<std::uint32_t>(1);
    return s;
  }
};

/// Queues the CRC-32C of the `size` device bytes at `data`; the result is `s.result[0]`
/// (device memory) once the queued work has run. @throws error `device_failed`.
inline void crc32c_device(const cuda_executor& exec, const std::byte* data, std::uint64_t size, const crc_scratch& s) {
  launch(exec, 1, 32, crc_powers_kernel<>, s.powers.data());
  const int chunk_log2 = size == 0 ? crc_min_chunk_log2 : crc_chunk_log2(size);
  const std::uint64_t chunk_bytes = std::uint64_t{1} << chunk_log2;
  std::uint64_t count = (size + chunk_bytes - 1) / chunk_bytes;
  for_each_item(exec, count, crc_chunk{data, size, count, chunk_bytes, s.raw.data()});
  std::uint32_t* in = s.raw.data();
  std::uint32_t* out = s.reduced.data();
  int span_log2 = chunk_log2;
  while (count > 1) {
    const std::uint64_t groups = (count + crc_fan_in - 1) / crc_fan_in;
    launch(exec, grid_for(groups, 1), crc_fan_in, crc_tree_kernel<>, static_cast<const std::uint32_t*>(in), count,
           span_log2, static_cast<const gf2_matrix*>(s.powers.data()), out);
    std::swap(in, out);
    count = groups;
    span_log2 += 8;
  }
  launch(exec, 1, 32, crc_finish_kernel<>, static_cast<const std::uint32_t*>(in), size,
         static_cast<const gf2_matrix*>(s.powers.data()), s.result.data());
}

}  // namespace gradcomp::detail::cuda
