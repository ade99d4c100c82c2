#pragma once
/// @file
/// Lossless homomorphic compression's encoding side on the GPU (sketch/lossless_homomorphic.hpp
/// has the scheme): `encode_index`, `plan` and `encode_sketch`, giving the CPU reference's bytes.
/// Decoding (the peeling) has no GPU backend yet: docs/cuda.md §8 says what it needs.
///
/// - `encode_index`: one thread per index byte, whose 8, 2 or 1 elements it codes; NaN or ±Inf is
///   recorded, and the index is then rewritten to mark every element before the error is thrown,
///   as on the CPU.
/// - `plan`: the padding byte is checked on the host, every field against the rank limit and the
///   union counted on the device (a warp sum, one atomic per warp); the host applies the sizing
///   rule.
/// - `encode_sketch`: the checks of the CPU (finite, every non-zero element in the index, the
///   union's size) in one pass over 64-element words; then, for a sketched plan, the layout of
///   every block, the 3·G (row, 3·b + j) pairs sorted stably by row (CUB's radix sort), each row's
///   first pair by a scan of the row counts, and one thread per cell adding its contributors in
///   that order with `lhc_cell_from_row`, which is the CPU's ascending element order (checked on
///   the CPU in tests/sketch/test_lossless_homomorphic.cpp); no atomics touch the values. A failed
///   check fills the sketch with quiet NaN, as the CPU does.
///
/// These calls take no workspace argument: their scratch comes from the stream-ordered pool
/// (`stream_scratch`), about 40 bytes per block plus 36 per (block, hash) pair for a sketch. Each
/// waits for the device once (the checks decide what is thrown).

#include <gradcomp/cuda/config.cuh>

#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>
#include <cuda_runtime.h>

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>

#include <gradcomp/core/backend.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/float_bits.hpp>
#include <gradcomp/core/workspace.hpp>
#include <gradcomp/cuda/executor.cuh>
#include <gradcomp/cuda/grid.cuh>
#include <gradcomp/cuda/operation.cuh>
#include <gradcomp/cuda/warp.cuh>
#include <gradcomp/sketch/lossless_homomorphic.hpp>

namespace gradcomp {

namespace cuda_detail {

/// Sum of a value over the warp (every lane gets it); the whole warp must call it.
__device__ inline unsigned long long warp_sum(unsigned long long value) {
  for (int offset = 16; offset > 0; offset /= 2) value += __shfl_xor_sync(0xFFFFFFFFu, value, offset);
  return value;
}

/// Writes every index byte: an element is a member when non-zero (−0 counts as zero), or always
/// with `all`; NaN or ±Inf is recorded.
template <class T>
__global__ void lhc_index_kernel(const T* x, std::uint64_t n, lhc_index_coding coding, std::uint64_t bytes, bool all,
                                 unsigned char* index, device_status* status) {
  const unsigned per = detail::lhc_elements_per_byte(coding);
  const unsigned width = 8 / per;
  for (std::uint64_t q = thread_id(); q < bytes; q += thread_count()) {
    unsigned byte = 0;
    for (unsigned k = 0; k < per; ++k) {
      const std::uint64_t i = q * per + k;
      if (i >= n) break;
      if (!all && !is_finite(x[i])) record_failure(status, errc::non_finite_input, i);
      const bool member = all || magnitude_key(x[i]) != 0;
      byte |= (member ? 1u : 0u) << (k * width);
    }
    index[q] = static_cast<unsigned char>(byte);
  }
}

/// Counts the union's members of an aggregated index into *members, recording the first byte
/// with a field above `limit` (sum4 and sum8).
template <class = void>
__global__ void lhc_union_kernel(const unsigned char* index, std::uint64_t bytes, lhc_index_coding coding, std::uint64_t limit,
                                 unsigned long long* members, device_status* status) {
  unsigned long long mine = 0;
  const unsigned per = detail::lhc_elements_per_byte(coding);
  const unsigned width = 8 / per;
  const unsigned mask = (1u << width) - 1;
  for (std::uint64_t q = thread_id(); q < bytes; q += thread_count()) {
    const unsigned byte = index[q];
    if (coding == lhc_index_coding::bitmap) {
      mine += static_cast<unsigned>(__popc(byte));
      continue;
    }
    for (unsigned k = 0; k < 8; k += width) {
      const unsigned field = (byte >> k) & mask;
      if (field > limit) record_failure(status, errc::malformed_payload, q);
      mine += field != 0 ? 1u : 0u;
    }
  }
  mine = warp_sum(mine);
  if (lane_id() == 0 && mine != 0) atomicAdd(members, mine);
}

/// What `encode_sketch`'s checks found: NaN or ±Inf, the first non-zero element outside the
/// index (UINT64_MAX: none), and the index's members.
struct lhc_sketch_checks {
  unsigned long long members;
  unsigned long long first_outside;
  unsigned int non_finite;
};

/// The checks of `encode_sketch`, one thread per 64-element word.
template <class T>
__global__ void lhc_sketch_check_kernel(const T* x, std::uint64_t n, const unsigned char* index, lhc_index_coding coding,
                                        lhc_sketch_checks* checks) {
  const unsigned per = detail::lhc_elements_per_byte(coding);
  const unsigned width = 8 / per;
  const unsigned mask = (1u << width) - 1;
  unsigned long long members = 0;
  for (std::uint64_t w = thread_id(); w * 64 < n; w += thread_count()) {
    const std::uint64_t first = w * 64;
    const std::uint64_t count = n - first < 64 ? n - first : 64;
    bool finite = true;
    for (std::uint64_t k = 0; k < count; ++k) {
      const std::uint64_t i = first + k;
      const bool member = ((index[i / per] >> ((i % per) * width)) & mask) != 0;
      const bool nonzero = magnitude_key(x[i]) != 0;
      finite = finite && is_finite(x[i]);
      members += member ? 1u : 0u;
      if (nonzero && !member) atomicMin(&checks->first_outside, static_cast<unsigned long long>(i));
    }
    if (!finite) atomicOr(&checks->non_finite, 1u);
  }
  members = warp_sum(members);
  if (lane_id() == 0 && members != 0) atomicAdd(&checks->members, members);
}

/// Block b's layout, and its three (row, 3·b + j) pairs counted into their rows.
template <class = void>
__global__ void lhc_layout_kernel(std::uint64_t blocks, std::uint64_t rows, std::uint32_t block, std::uint32_t seed,
                                  bool reference, lhc_block_layout* layouts, std::uint32_t* pair_rows,
                                  std::uint64_t* pairs, unsigned long long* row_counts) {
  for (std::uint64_t b = thread_id(); b < blocks; b += thread_count()) {
    const lhc_block_layout layout = lhc_layout_of_block(b, rows, block, seed, reference);
    layouts[b] = layout;
    for (unsigned j = 0; j < 3; ++j) {
      const auto row = static_cast<std::uint32_t>(layout.row_offset[j] / block);
      pair_rows[3 * b + j] = row;
      pairs[3 * b + j] = 3 * b + j;
      atomicAdd(&row_counts[row], 1ull);
    }
  }
}

/// One cell per thread, from its row's sorted pairs (`lhc_cell_from_row`).
template <class T>
__global__ void lhc_cell_kernel(const T* x, std::uint64_t n, const std::uint64_t* pairs, const unsigned long long* row_begin,
                                const lhc_block_layout* layouts, std::uint32_t block, std::uint64_t cells, T* sketch) {
  for (std::uint64_t c = thread_id(); c < cells; c += thread_count()) {
    const std::uint64_t row = c / block;
    sketch[c] = lhc_cell_from_row<T>(x, n, pairs, row_begin[row], row_begin[row + 1], c % block, layouts, block);
  }
}

/// values[i] = v for every i < count.
template <class T>
struct fill_value {
  T* values;
  T v;

  __device__ void operator()(std::uint64_t i) const { values[i] = v; }
};

/// The scratch of a sketched `encode_sketch`: the layouts, the pairs and their rows (unsorted and
/// sorted), the row counts and first pairs (r + 1 each), and CUB's sort and scan scratch.
struct lhc_sketch_scratch {
  std::span<lhc_block_layout> layouts;
  std::span<std::uint32_t> pair_rows;
  std::span<std::uint32_t> sorted_rows;
  std::span<std::uint64_t> pairs;
  std::span<std::uint64_t> sorted_pairs;
  std::span<unsigned long long> row_counts;
  std::span<unsigned long long> row_begin;
  std::span<std::byte> sort_temp;
  std::span<std::byte> scan_temp;

  static lhc_sketch_scratch carve(workspace_arena& arena, std::uint64_t blocks, std::uint64_t rows) {
    const std::uint64_t count = 3 * blocks;
    std::size_t sort_bytes = 0;
    std::size_t scan_bytes = 0;
    GRADCOMP_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, static_cast<const std::uint32_t*>(nullptr),
                                                        static_cast<std::uint32_t*>(nullptr),
                                                        static_cast<const std::uint64_t*>(nullptr),
                                                        static_cast<std::uint64_t*>(nullptr), count));
    GRADCOMP_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(nullptr, scan_bytes, static_cast<const unsigned long long*>(nullptr),
                                                      static_cast<unsigned long long*>(nullptr), rows + 1));
    lhc_sketch_scratch s;
    s.layouts = arena.take<lhc_block_layout>(static_cast<std::size_t>(blocks));
    s.pair_rows = arena.take<std::uint32_t>(static_cast<std::size_t>(count));
    s.sorted_rows = arena.take<std::uint32_t>(static_cast<std::size_t>(count));
    s.pairs = arena.take<std::uint64_t>(static_cast<std::size_t>(count));
    s.sorted_pairs = arena.take<std::uint64_t>(static_cast<std::size_t>(count));
    s.row_counts = arena.take<unsigned long long>(static_cast<std::size_t>(rows + 1));
    s.row_begin = arena.take<unsigned long long>(static_cast<std::size_t>(rows + 1));
    s.sort_temp = arena.take<std::byte>(sort_bytes);
    s.scan_temp = arena.take<std::byte>(scan_bytes);
    return s;
  }
};

}  // namespace cuda_detail

/// Lossless homomorphic compression's encoding side on the GPU (no `decode` yet).
template <gradient_value T>
struct backend<lossless_homomorphic<T>, cuda_executor> {
  using codec_type = lossless_homomorphic<T>;

  static void encode_index(const codec_type& codec, const cuda_executor& exec, std::span<const T> grad,
                           std::span<std::byte> index) {
    namespace cd = cuda_detail;
    const std::uint64_t n = grad.size();
    require_size(index.size(), codec.index_bytes(n), "index bytes");
    const cd::stream_scratch scratch(exec, cd::operation::workspace_bytes([](workspace_arena&) {}));
    workspace_arena arena(scratch.span());
    const cd::operation op(exec, arena);
    const std::uint64_t bytes = index.size();
    auto* const out = reinterpret_cast<unsigned char*>(index.data());
    const lhc_index_coding coding = codec.params().index;
    if (bytes == 0) return;
    cd::launch(exec, cd::grid_for(bytes), cd::block_threads, cd::lhc_index_kernel<T>, grad.data(), n, coding, bytes, false, out,
               op.status());
    try {
      op.finish([](errc, std::uint64_t, std::uint32_t) { return std::string("the gradient holds NaN or Inf"); });
    } catch (const error&) {  // poison: every element a member, then the error
      cd::launch(exec, cd::grid_for(bytes), cd::block_threads, cd::lhc_index_kernel<T>, grad.data(), n, coding, bytes, true, out,
                 op.status());
      exec.synchronize();
      throw;
    }
  }

  static lhc_plan plan(const codec_type& codec, const cuda_executor& exec, std::span<const std::byte> global_index,
                       std::uint64_t n, std::uint64_t contributors) {
    namespace cd = cuda_detail;
    detail::require(contributors >= 1 && contributors <= codec.max_contributors(), errc::invalid_argument, [&] {
      return std::to_string(contributors) + " contributors: the index coding aggregates 1 to " +
             std::to_string(codec.max_contributors()) + " ranks exactly";
    });
    require_size(global_index.size(), codec.index_bytes(n), "index bytes");
    require_padding(codec, exec, global_index, n);
    const cd::stream_scratch scratch(
        exec, cd::operation::workspace_bytes([](workspace_arena& arena) { (void)arena.take<unsigned long long>(1); }));
    workspace_arena arena(scratch.span());
    const cd::operation op(exec, arena);
    unsigned long long* const members = arena.take<unsigned long long>(1).data();
    GRADCOMP_CUDA_CHECK(cudaMemsetAsync(members, 0, sizeof *members, exec.native_stream()));
    const std::uint64_t bytes = global_index.size();
    if (bytes > 0)
      cd::launch(exec, cd::streaming_grid_for(bytes), cd::block_threads, cd::lhc_union_kernel<>,
                 reinterpret_cast<const unsigned char*>(global_index.data()), bytes, codec.params().index, contributors, members,
                 op.status());
    unsigned long long count = 0;
    GRADCOMP_CUDA_CHECK(cudaMemcpyAsync(&count, members, sizeof count, cudaMemcpyDeviceToHost, exec.native_stream()));
    op.finish([contributors](errc, std::uint64_t q, std::uint32_t) {
      return "index byte " + std::to_string(q) + " holds a field above " + std::to_string(contributors) + " contributors";
    });
    return codec.plan_for(n, count);
  }

  static void encode_sketch(const codec_type& codec, const cuda_executor& exec, std::span<const T> grad,
                            std::span<const std::byte> global_index, const lhc_plan& plan, std::span<T> sketch) {
    namespace cd = cuda_detail;
    const std::uint64_t n = grad.size();
    require_size(n, plan.n, "elements");
    require_size(global_index.size(), codec.index_bytes(n), "index bytes");
    require_size(sketch.size(), plan.sketch_values(), "sketch values");
    require_padding(codec, exec, global_index, n);
    detail::require(plan == codec.plan_for(n, plan.union_nonzeros), errc::invalid_argument,
                    "the plan does not follow the sizing rule");
    const std::uint32_t block = codec.params().block;
    const std::uint64_t blocks = codec.block_count(n);
    const bool sketched = !plan.dense && plan.cells > 0;
    const auto carve = [&](workspace_arena& arena) {
      (void)arena.take<cd::lhc_sketch_checks>(1);
      if (sketched) (void)cd::lhc_sketch_scratch::carve(arena, blocks, plan.rows);
    };
    workspace_arena measure = workspace_arena::measure();
    carve(measure);
    const cd::stream_scratch scratch(exec, measure.bytes_needed());
    workspace_arena arena(scratch.span());
    cd::lhc_sketch_checks* const checks = arena.take<cd::lhc_sketch_checks>(1).data();
    const cd::lhc_sketch_checks start{0, std::numeric_limits<unsigned long long>::max(), 0};
    GRADCOMP_CUDA_CHECK(cudaMemcpyAsync(checks, &start, sizeof start, cudaMemcpyHostToDevice, exec.native_stream()));
    const auto* const index = reinterpret_cast<const unsigned char*>(global_index.data());
    if (n > 0)
      cd::launch(exec, cd::streaming_grid_for((n + 63) / 64), cd::block_threads, cd::lhc_sketch_check_kernel<T>, grad.data(), n,
                 index, codec.params().index, checks);
    if (plan.dense && n > 0) {
      GRADCOMP_CUDA_CHECK(
          cudaMemcpyAsync(sketch.data(), grad.data(), n * sizeof(T), cudaMemcpyDeviceToDevice, exec.native_stream()));
    } else if (sketched) {
      const cd::lhc_sketch_scratch s = cd::lhc_sketch_scratch::carve(arena, blocks, plan.rows);
      GRADCOMP_CUDA_CHECK(cudaMemsetAsync(s.row_counts.data(), 0, s.row_counts.size_bytes(), exec.native_stream()));
      cd::launch(exec, cd::grid_for(blocks), cd::block_threads, cd::lhc_layout_kernel<>, blocks, plan.rows, block,
                 codec.params().seed, codec.params().reference_layout, s.layouts.data(), s.pair_rows.data(), s.pairs.data(),
                 s.row_counts.data());
      std::size_t sort_bytes = s.sort_temp.size();
      const int row_bits = std::max(1, static_cast<int>(std::bit_width(plan.rows - 1)));  // rows < 2^32
      GRADCOMP_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(s.sort_temp.data(), sort_bytes, s.pair_rows.data(), s.sorted_rows.data(),
                                                          s.pairs.data(), s.sorted_pairs.data(), 3 * blocks, 0, row_bits,
                                                          exec.native_stream()));
      std::size_t scan_bytes = s.scan_temp.size();
      GRADCOMP_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(s.scan_temp.data(), scan_bytes, s.row_counts.data(), s.row_begin.data(),
                                                        plan.rows + 1, exec.native_stream()));
      cd::launch(exec, cd::grid_for(plan.cells), cd::block_threads, cd::lhc_cell_kernel<T>, grad.data(), n,
                 static_cast<const std::uint64_t*>(s.sorted_pairs.data()), static_cast<const unsigned long long*>(s.row_begin.data()),
                 static_cast<const lhc_block_layout*>(s.layouts.data()), block, plan.cells, sketch.data());
    }
    cd::lhc_sketch_checks found{};
    GRADCOMP_CUDA_CHECK(cudaMemcpyAsync(&found, checks, sizeof found, cudaMemcpyDeviceToHost, exec.native_stream()));
    exec.synchronize();
    if (found.non_finite == 0 && found.first_outside >= n && found.members == plan.union_nonzeros) return;
    cd::for_each_item(exec, sketch.size(), cd::fill_value<T>{sketch.data(), std::numeric_limits<T>::quiet_NaN()});
    exec.synchronize();
    detail::require(found.non_finite == 0, errc::non_finite_input, "the gradient holds NaN or Inf");
    detail::require(found.first_outside >= n, errc::invalid_argument, [&] {
      return "element " + std::to_string(found.first_outside) + " is non-zero but absent from the aggregated index";
    });
    detail::fail(errc::invalid_argument, "the plan is not the plan of this index: it counts " +
                                             std::to_string(plan.union_nonzeros) + " non-zeros, the index " +
                                             std::to_string(found.members));
  }

 private:
  static void require_size(std::uint64_t got, std::uint64_t want, const char* what) { detail::lhc_require_size(got, want, what); }

  /// The CPU's padding check, on the index's last byte copied to the host.
  static void require_padding(const codec_type& codec, const cuda_executor& exec, std::span<const std::byte> index,
                              std::uint64_t n) {
    detail::lhc_require_padding(codec.params().index, n, [&] {
      unsigned char last = 0;
      GRADCOMP_CUDA_CHECK(cudaMemcpyAsync(&last, index.data() + index.size() - 1, 1, cudaMemcpyDeviceToHost, exec.native_stream()));
      exec.synchronize();
      return last;
    });
  }
};

}  // namespace gradcomp
