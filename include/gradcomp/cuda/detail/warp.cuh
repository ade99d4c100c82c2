#pragma once
/// @file
/// Thread and warp indices of a launch (for kernels that stride over their work), and the largest
/// of a value over a warp (for the kernels that give each quantization block one warp).

#include <gradcomp/cuda/config.cuh>

#include <cstdint>

namespace gradcomp::detail::cuda {

/// This thread's lane in its warp.
__device__ inline unsigned lane_id() { return threadIdx.x % 32u; }
/// Global index of this thread's warp.
__device__ inline std::uint64_t warp_id() { return (blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x) / 32u; }
/// Number of warps of the launch.
__device__ inline std::uint64_t warp_count() { return std::uint64_t{gridDim.x} * blockDim.x / 32u; }

/// Largest of the 32 lanes' values (every lane gets it); the whole warp must call it.
template <class U>
__device__ U warp_max(U value) {
  for (int offset = 16; offset > 0; offset /= 2) {
    const U other = __shfl_xor_sync(0xFFFFFFFFu, value, offset);
    value = other > value ? other : value;
  }
  return value;
}

/// Global index of this thread.
__device__ inline std::uint64_t thread_id() { return blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x; }
/// Number of threads of the launch.
__device__ inline std::uint64_t thread_count() { return std::uint64_t{gridDim.x} * blockDim.x; }

}  // namespace gradcomp::detail::cuda
