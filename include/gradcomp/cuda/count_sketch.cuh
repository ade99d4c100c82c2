#pragma once
/// @file
/// The count sketch on the GPU (sketch/count_sketch.hpp has the format).
///
/// Encoding: one thread per element computes its r hashes on the fly (`count_sketch_hash`, never
/// a stored table) and adds σ_j(i)·x_i to its cell of every row with a float atomic add; a table
/// of 3 rows of 2^20 float cells (12 MiB) stays in the L2 cache of an H100. A second kernel checks
/// every cell for an overflowed sum. The atomics add each cell's elements in whatever order they
/// arrive, so a cell's rounding can differ from the CPU backend's, which adds them in ascending
/// index order: this is the one encoding whose bytes are not the CPU's (docs/cuda.md §4). Each
/// cell sum is within the recursive-summation bound of the exact sum either way (for float, less
/// what the atomics' flushing of subnormals to zero loses), and inputs whose sums are exact and
/// normal (integers times a power of two, say) give the CPU's bytes.
///
/// Decoding is the CPU's arithmetic, bit for bit: the estimate kernel takes every row's signed
/// cell and the shared median (`count_sketch_median`); the heavy hitters are top-k's exact
/// selection over the estimates' magnitudes (ties to the lower index, cuda/topk.cuh); the decoded
/// tensor is zeros with the estimates written (or added) at the heavy hitters. Decoders check the
/// envelope on the host and every cell (NaN or Inf is `malformed_payload`) on the device before
/// they write anything, and wait for the stream once more at the end.

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
#include <gradcomp/cuda/detail/finite_check.cuh>
#include <gradcomp/cuda/detail/grid.cuh>
#include <gradcomp/cuda/detail/message.cuh>
#include <gradcomp/cuda/detail/operation.cuh>
#include <gradcomp/cuda/topk.cuh>
#include <gradcomp/sketch/count_sketch.hpp>

namespace gradcomp {

namespace detail::cuda {

/// What the kernels need to hash an element into every row: the row seeds s_j, r and c.
struct count_sketch_rows {
  std::uint32_t seeds[count_sketch_max_rows];
  std::uint32_t count;
  std::uint64_t columns;

  /// The rows of `params`.
  static count_sketch_rows of(const count_sketch_params& params) noexcept {
    count_sketch_rows rows{};
    for (std::uint32_t j = 0; j < params.rows; ++j) rows.seeds[j] = count_sketch_row_seed(params.seed, j);
    rows.count = params.rows;
    rows.columns = params.columns;
    return rows;
  }

  /// Offset of element i's cell in row j (cells row-major), and its hash H_j(i) in `hash`.
  __device__ std::uint64_t cell(std::uint32_t j, std::uint64_t i, std::uint32_t& hash) const {
    hash = count_sketch_hash(seeds[j], i);
    return j * columns + count_sketch_bucket(hash, columns);
  }
};

/// Check reasons of the encoder: a NaN or Inf gradient value, a cell whose sum overflowed.
enum count_sketch_reason : std::uint32_t { non_finite_value = 0, overflowed_cell = 1 };

/// S[j][h_j(i)] += σ_j(i)·x_i for every element and row, by atomic adds into the zeroed cells; a
/// NaN or Inf value is recorded (and not added).
template <class T>
__global__ void count_sketch_encode_kernel(const T* x, std::uint64_t n, count_sketch_rows rows, T* cells,
                                           device_status* status) {
  for (std::uint64_t i = thread_id(); i < n; i += thread_count()) {
    const T value = x[i];
    if (!is_finite(value)) {
      record_failure(status, errc::non_finite_input, i, non_finite_value);
      continue;
    }
#pragma unroll 4
    for (std::uint32_t j = 0; j < rows.count; ++j) {
      std::uint32_t hash = 0;
      const std::uint64_t at = rows.cell(j, i, hash);
      atomicAdd(cells + at, count_sketch_signed(hash, value));
    }
  }
}

/// Records the first cell that is NaN or Inf, unless a failure was recorded before (the encoder's
/// overflow check, which a NaN gradient makes moot).
template <class T>
__global__ void count_sketch_overflow_kernel(const T* cells, std::uint64_t count, device_status* status) {
  if (failed(status)) return;
  for (std::uint64_t m = thread_id(); m < count; m += thread_count())
    if (!is_finite(cells[m])) record_failure(status, errc::non_finite_input, m, overflowed_cell);
}

/// out[i] = x̂_i: the median over rows of σ_j(i)·S[j][h_j(i)], as on the CPU.
template <class T>
__global__ void count_sketch_estimate_kernel(const T* cells, count_sketch_rows rows, T* out, std::uint64_t n) {
  for (std::uint64_t i = thread_id(); i < n; i += thread_count()) {
    const auto row_estimate = [&](std::uint32_t j) {
      std::uint32_t hash = 0;
      const std::uint64_t at = rows.cell(j, i, hash);
      return count_sketch_signed(hash, cells[at]);
    };
    if (rows.count == 3) {
      out[i] = count_sketch_median3(row_estimate(0), row_estimate(1), row_estimate(2));
    } else {
      T estimates[count_sketch_max_rows];
      for (std::uint32_t j = 0; j < rows.count; ++j) estimates[j] = row_estimate(j);
      out[i] = count_sketch_median(estimates, rows.count);
    }
  }
}

/// The decoded tensor's entries at the heavy hitters: out[i] = x̂_i (or out[i] + x̂_i), i = indices[m]
/// (an index at or past n, which the selection never leaves, is skipped).
template <class T>
struct place_estimates {
  const std::uint64_t* indices;
  const T* estimates;
  T* out;
  std::uint64_t n;
  bool accumulate;

  __device__ void operator()(std::uint64_t m) const {
    const std::uint64_t i = indices[m];
    if (i < n) out[i] = accumulate ? out[i] + estimates[i] : estimates[i];
  }
};

/// Records the first cell m at which a[m] + b[m] is NaN or Inf.
template <class T>
struct find_overflowing_sum {
  const T* a;
  const T* b;
  device_status* status;

  __device__ void operator()(std::uint64_t m) const {
    if (!is_finite(a[m] + b[m])) record_failure(status, errc::non_finite_input, m);
  }
};

/// a[m] += b[m].
template <class T>
struct add_cells {
  T* a;
  const T* b;

  __device__ void operator()(std::uint64_t m) const { a[m] = a[m] + b[m]; }
};

}  // namespace detail::cuda

/// The count sketch on the GPU.
template <gradient_value T>
struct backend<count_sketch<T>, cuda_executor> {
  using codec_type = count_sketch<T>;
  using selection = detail::cuda::largest_magnitudes<T>;

  /// Decoding's workspace after the status and the CRC scratch (which the message's checks use,
  /// so they are carved first): the n estimates and the selection of the heavy hitters.
  /// Encoding needs only the status.
  struct scratch {
    std::span<T> estimates;
    typename selection::scratch select;
  };

  static scratch carve_decode(workspace_arena& arena, const codec_type& codec, std::uint64_t n) {
    scratch s;
    if (n == 0) return s;
    s.estimates = arena.take<T>(static_cast<std::size_t>(n));
    s.select = selection::scratch::carve(arena, codec.heavy_hitter_count(n), n);
    return s;
  }

  /// Decoding's workspace (encoding's, the status alone, is smaller).
  static std::size_t workspace_bytes(const codec_type& codec, const cuda_executor&, std::uint64_t n) {
    return detail::cuda::operation::workspace_bytes([&](workspace_arena& arena) {
      (void)detail::cuda::crc_scratch::carve(arena);
      (void)carve_decode(arena, codec, n);
    });
  }

  static std::size_t encode(const codec_type& codec, const cuda_executor& exec, std::span<const T> grad,
                            std::span<std::byte> out, std::span<std::byte> ws, message_key key) {
    namespace cd = detail::cuda;
    const std::uint64_t n = grad.size();
    const std::size_t size = codec.max_encoded_bytes(n);
    workspace_arena arena(ws);
    const cd::operation op(exec, arena);
    cd::begin_message(exec, out, size);
    T* const cells = reinterpret_cast<T*>(out.data() + envelope::size);
    const std::uint64_t count = cell_count(codec);
    GRADCOMP_CUDA_CHECK(cudaMemsetAsync(cells, 0, codec.summable_bytes(n), exec.native_stream()));
    if (n > 0)
      cd::launch(exec, cd::grid_for(n), cd::block_threads, cd::count_sketch_encode_kernel<T>, grad.data(), n,
                 cd::count_sketch_rows::of(codec.params()), cells, op.status());
    cd::launch(exec, cd::grid_for(count), cd::block_threads, cd::count_sketch_overflow_kernel<T>,
               static_cast<const T*>(cells), count, op.status());
    cd::seal_message(exec, out.data(),
                     {codec_id::count_sketch, dtype_of<T>, 0, 0, key, n, size - envelope::size, codec.params_hash(), 0},
                     cd::crc_scratch{}, op);
    op.finish_encode([n](errc, std::uint64_t position, std::uint32_t reason) {
      if (reason == cd::non_finite_value)
        return "value " + std::to_string(position) + " of the " + std::to_string(n) + "-value gradient is NaN or Inf";
      return "cell " + std::to_string(position) +
             " overflows the value type (the gradient's magnitudes are too large to sketch)";
    });
    return size;
  }

  static void decode(const codec_type& codec, const cuda_executor& exec, std::span<const std::byte> message,
                     std::span<T> out, std::span<std::byte> ws, const decode_limits& limits, bool accumulate) {
    const std::uint64_t n = out.size();
    workspace_arena arena(ws);
    const detail::cuda::operation op(exec, arena);
    const detail::cuda::crc_scratch crc = detail::cuda::crc_scratch::carve(arena);
    (void)parse_checked(codec, exec, message, n, limits, op, crc);
    const scratch s = carve_decode(arena, codec, n);
    if (n == 0) return;
    if (!accumulate) GRADCOMP_CUDA_CHECK(cudaMemsetAsync(out.data(), 0, n * sizeof(T), exec.native_stream()));
    const std::uint64_t k = select_heavy_hitters(codec, exec, message, n, s, op);
    detail::cuda::for_each_item(exec, k,
                                detail::cuda::place_estimates<T>{s.select.sort.sorted.data(), s.estimates.data(),
                                                                 out.data(), n, accumulate});
    finish_internal(op);
  }

  static void estimate(const codec_type& codec, const cuda_executor& exec, std::span<const std::byte> message,
                       std::span<T> out, std::span<std::byte> ws, const decode_limits& limits) {
    workspace_arena arena(ws);
    const detail::cuda::operation op(exec, arena);
    const detail::cuda::crc_scratch crc = detail::cuda::crc_scratch::carve(arena);
    (void)parse_checked(codec, exec, message, out.size(), limits, op, crc);
    estimate_into(codec, exec, message, out.data(), out.size());
  }

  static std::size_t heavy_hitters(const codec_type& codec, const cuda_executor& exec,
                                   std::span<const std::byte> message, std::uint64_t n,
                                   std::span<std::uint64_t> indices, std::span<std::byte> ws,
                                   const decode_limits& limits) {
    workspace_arena arena(ws);
    const detail::cuda::operation op(exec, arena);
    const detail::cuda::crc_scratch crc = detail::cuda::crc_scratch::carve(arena);
    (void)parse_checked(codec, exec, message, n, limits, op, crc);
    const std::uint64_t k = codec.heavy_hitter_count(n);
    detail::require(indices.size() >= k, errc::buffer_too_small, [&] {
      return "room for " + std::to_string(indices.size()) + " indices, the sketch has " + std::to_string(k) +
             " heavy hitters";
    });
    if (n == 0) return 0;
    const scratch s = carve_decode(arena, codec, n);
    (void)select_heavy_hitters(codec, exec, message, n, s, op);
    GRADCOMP_CUDA_CHECK(cudaMemcpyAsync(indices.data(), s.select.sort.sorted.data(), k * sizeof(std::uint64_t),
                                        cudaMemcpyDeviceToDevice, exec.native_stream()));
    finish_internal(op);
    return static_cast<std::size_t>(k);
  }

  static void accumulate_encoded(const codec_type& codec, const cuda_executor& exec, std::span<std::byte> acc,
                                 std::span<const std::byte> other) {
    namespace cd = detail::cuda;
    const cd::pooled_status_and_crc scratch(exec);
    const std::span<const std::byte> mine_bytes(acc);
    const envelope mine =
        parse_checked(codec, exec, mine_bytes, cd::fetch_envelope(exec, mine_bytes, scratch.crc).elements, {},
                      scratch.op, scratch.crc);
    const envelope theirs = parse_checked(codec, exec, other, mine.elements, {}, scratch.op, scratch.crc);
    detail::require(mine.key == theirs.key, errc::step_mismatch,
                    "messages of different steps or tensors cannot be summed");
    T* const a = reinterpret_cast<T*>(acc.data() + envelope::size);
    const T* const b = reinterpret_cast<const T*>(other.data() + envelope::size);
    const std::uint64_t count = cell_count(codec);
    cd::for_each_item(exec, count, cd::find_overflowing_sum<T>{a, b, scratch.op.status()});
    scratch.op.finish([](errc, std::uint64_t m, std::uint32_t) {
      return "summed cell " + std::to_string(m) + " overflows the value type";
    });
    cd::for_each_item(exec, count, cd::add_cells<T>{a, b});
  }

 private:
  [[nodiscard]] static std::uint64_t cell_count(const codec_type& codec) noexcept {
    return codec.rows() * codec.columns();
  }

  /// Queues out[i] = x̂_i for i < n from the cells of the validated device `message`.
  static void estimate_into(const codec_type& codec, const cuda_executor& exec, std::span<const std::byte> message,
                            T* out, std::uint64_t n) {
    if (n == 0) return;
    detail::cuda::launch(exec, detail::cuda::grid_for(n), detail::cuda::block_threads,
                         detail::cuda::count_sketch_estimate_kernel<T>,
                         reinterpret_cast<const T*>(message.data() + envelope::size),
                         detail::cuda::count_sketch_rows::of(codec.params()), out, n);
  }

  /// Queues the estimates into s.estimates and the selection of the heavy hitters, whose indices
  /// end ascending in s.select.sort.sorted; returns how many there are (n ≥ 1).
  static std::uint64_t select_heavy_hitters(const codec_type& codec, const cuda_executor& exec,
                                            std::span<const std::byte> message, std::uint64_t n, const scratch& s,
                                            const detail::cuda::operation& op) {
    estimate_into(codec, exec, message, s.estimates.data(), n);
    const std::uint64_t k = codec.heavy_hitter_count(n);
    selection::select(exec, s.estimates.data(), n, k, s.select, op.status());
    return k;
  }

  /// Waits for the stream and reports a failure the selection recorded (none can occur for a
  /// validated message, whose estimates are finite).
  static void finish_internal(const detail::cuda::operation& op) {
    op.finish([](errc, std::uint64_t, std::uint32_t) {
      return std::string("internal error: the heavy-hitter selection failed on finite estimates");
    });
  }

  /// The CPU's checks of a whole message for an `elements`-element tensor (wire-format.md §16.2):
  /// the envelope on the host, then every cell finite on the device. Waits for the stream.
  static envelope parse_checked(const codec_type& codec, const cuda_executor& exec, std::span<const std::byte> message,
                                std::uint64_t elements, const decode_limits& limits, const detail::cuda::operation& op,
                                const detail::cuda::crc_scratch& crc) {
    const envelope e =
        detail::cuda::read_envelope(exec, message, {codec_id::count_sketch, dtype_of<T>, elements, codec.params_hash()},
                                    limits, crc);
    detail::require(e.layout == 0, errc::malformed_payload, "count-sketch messages have layout 0");
    detail::require(e.payload_bytes == codec.summable_bytes(e.elements), errc::malformed_payload, [&] {
      return "payload of " + std::to_string(e.payload_bytes) + " bytes, the sketch has " +
             std::to_string(codec.summable_bytes(e.elements)) + " bytes of cells";
    });
    detail::cuda::for_each_item(exec, cell_count(codec),
                                detail::cuda::find_non_finite<T>{reinterpret_cast<const T*>(message.data() +
                                                                                            envelope::size),
                                                                 op.status(), errc::malformed_payload});
    op.finish([](errc, std::uint64_t m, std::uint32_t) {
      return "cell " + std::to_string(m) + " is NaN or Inf (a sum of sketches overflowed)";
    });
    return e;
  }
};

}  // namespace gradcomp
