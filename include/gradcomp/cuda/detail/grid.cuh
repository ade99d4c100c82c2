#pragma once
/// @file
/// The shapes of work of the CUDA backend's kernels, written once: one warp per block of values (a
/// quantization block or bucket: the lanes share its reductions), one thread per item (a code
/// word, an index, a value), and batches of items per thread whose loads go out together. A codec
/// supplies a functor with a `__device__` `operator()` taking the block or item index (or, for the
/// batches, `load` and `handle`); the kernels stride over the grid, so any count runs in a launch
/// of at most `max_grid` blocks.

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

/// Calls f.handle(i, f.load(i)) for each item i < items, `Batch` items per thread and round
/// (items first, first + S, …, S the grid's threads): the round's loads are all issued before any
/// item is handled.
template <class F, unsigned Batch>
__global__ void batched_item_kernel(F f, std::uint64_t items) {
  const std::uint64_t stride = thread_count();
  for (std::uint64_t first = thread_id(); first < items; first += Batch * stride) {
    typename F::loaded value[Batch]{};
#pragma unroll
    for (unsigned q = 0; q < Batch; ++q)
      if (first + q * stride < items) value[q] = f.load(first + q * stride);
#pragma unroll
    for (unsigned q = 0; q < Batch; ++q)
      if (first + q * stride < items) f.handle(first + q * stride, value[q]);
  }
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

/// Queues f.handle(i, f.load(i)) for each item i < items, 4 items per thread and round in a grid
/// of the device's resident threads (batched_item_kernel). For items that each wait on one small
/// load (a code word, a float): one item per thread keeps one load in flight per thread, and the
/// GPU's resident threads then cover too few bytes to hide the memory's latency (on the H200 such
/// kernels ran at 7–9 ns per item whatever they did, docs/cuda.md §8.8). F supplies `loaded`
/// (what `load` reads), `load(i)` (reads only) and `handle(i, loaded)`.
/// @throws error `device_failed`.
template <class F>
void for_each_item_batched(const cuda_executor& exec, std::uint64_t items, const F& f) {
  constexpr unsigned batch = 4;
  if (items == 0) return;
  launch(exec, streaming_grid_for((items + batch - 1) / batch), block_threads, batched_item_kernel<F, batch>, f, items);
}

}  // namespace gradcomp::detail::cuda
