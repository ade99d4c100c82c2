#pragma once
/// @file
/// The two shapes of work of the CUDA backend's kernels, written once: one warp per block of
/// values (a quantization block or bucket: the lanes share its reductions), and one thread per
/// item (a code word, an index, a value). A codec supplies a functor with a `__device__`
/// `operator()` taking the block or item index; the kernels stride over the grid, so any count
/// runs in a launch of at most `max_grid` blocks.

#include <gradcomp/cuda/config.cuh>

#include <cstdint>

#include <gradcomp/cuda/executor.cuh>
#include <gradcomp/cuda/detail/operation.cuh>
#include <gradcomp/cuda/detail/warp.cuh>

namespace gradcomp::detail::cuda {

/// Calls f(j) on every lane of one warp for each block j < blocks.
template <class F>
__global__ void warp_per_block_kernel(F f, std::uint64_t blocks) {
  for (std::uint64_t j = warp_id(); j < blocks; j += warp_count()) f(j);
}

/// Calls f(i) on one thread for each item i < items.
template <class F>
__global__ void thread_per_item_kernel(F f, std::uint64_t items) {
  for (std::uint64_t i = thread_id(); i < items; i += thread_count()) f(i);
}

/// Queues f(j) on one warp for each block j < blocks (nothing when there are none).
/// @throws error `device_failed`.
template <class F>
void for_each_block(const cuda_executor& exec, std::uint64_t blocks, const F& f) {
  if (blocks == 0) return;
  launch(exec, grid_for(blocks, block_warps), block_threads, warp_per_block_kernel<F>, f, blocks);
}

/// Queues f(i) on one thread for each item i < items (nothing when there are none).
/// @throws error `device_failed`.
template <class F>
void for_each_item(const cuda_executor& exec, std::uint64_t items, const F& f) {
  if (items == 0) return;
  launch(exec, grid_for(items), block_threads, thread_per_item_kernel<F>, f, items);
}

}  // namespace gradcomp::detail::cuda
