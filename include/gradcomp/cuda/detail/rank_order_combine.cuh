#pragma once
/// @file
/// Step 2 of the rank-ordered reductions (transport/rank_ordered.hpp) on the device, for the NCCL
/// adapter: P blocks of m values, block p received from rank p, combined in rank order into block
/// 0, ((b₀ ⊕ b₁) ⊕ b₂) ⊕ …, one thread per element. The operations are rank_ordered.hpp's own
/// (`sum_op`, `max_op`), so every element gets the host combine's bits (IEEE additions in the same
/// order, no contraction: nothing is multiplied).

#include <gradcomp/cuda/config.cuh>

#include <cstddef>
#include <cstdint>
#include <span>

#include <gradcomp/cuda/executor.cuh>
#include <gradcomp/cuda/detail/grid.cuh>

namespace gradcomp::detail::cuda {

/// blocks[i] = ((blocks[i] ⊕ blocks[m + i]) ⊕ blocks[2m + i]) ⊕ … over `parts` blocks.
template <class V, class Op>
struct combine_blocks {
  V* blocks;
  std::uint64_t m;
  int parts;
  Op op;

  __device__ void operator()(std::uint64_t i) const {
    V acc = blocks[i];
    for (int p = 1; p < parts; ++p) acc = op(acc, blocks[static_cast<std::uint64_t>(p) * m + i]);
    blocks[i] = acc;
  }
};

/// Queues the combine of `parts` equal blocks of `blocks` (device memory) into block 0 on `e`'s
/// stream. @throws error `device_failed`.
template <class V, class Op>
void combine_in_rank_order(const cuda_executor& e, std::span<V> blocks, int parts, Op op) {
  const std::uint64_t m = blocks.size() / static_cast<std::size_t>(parts);
  for_each_item(e, m, combine_blocks<V, Op>{blocks.data(), m, parts, op});
}

}  // namespace gradcomp::detail::cuda
