#pragma once
/// @file
/// The index-carrying sparse payload (sparsify/sparse_format.hpp) on the GPU: written from an
/// ascending list of kept indices (values gathered from the gradient, NaN or Inf recorded), and
/// decoded after a device check of everything the CPU decoder checks (ascending indices below n,
/// the bitmap's count and its bits past n, zero padding, finite values). A bitmap is decoded with
/// the rank of every word's first bit, from CUB's exclusive scan of the words' popcounts.

#include <gradcomp/cuda/config.cuh>

#include <cub/device/device_scan.cuh>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include <gradcomp/core/error.hpp>
#include <gradcomp/core/float_bits.hpp>
#include <gradcomp/core/wire_envelope.hpp>
#include <gradcomp/core/workspace.hpp>
#include <gradcomp/cuda/executor.cuh>
#include <gradcomp/cuda/detail/grid.cuh>
#include <gradcomp/cuda/detail/message.cuh>
#include <gradcomp/cuda/detail/operation.cuh>
#include <gradcomp/sparsify/sparse_format.hpp>

namespace gradcomp::detail::cuda {

/// Reasons a sparse payload fails its check (the low byte of `device_status::detail`).
enum sparse_reason : std::uint32_t {
  sparse_bad_index = 1,    ///< An index at or above n, or not above its predecessor.
  sparse_bad_count = 2,    ///< The bitmap marks another number of elements than k.
  sparse_beyond_n = 3,     ///< The bitmap marks an element at or above n.
  sparse_bad_padding = 4,  ///< A non-zero padding byte in the index section.
  sparse_bad_value = 5,    ///< A NaN or Inf value.
};

/// Index j of an ascending list into the index section, and the value x[list[j]] after it (an
/// index at or above n, which only a failed selection can leave, is recorded and not read; a NaN
/// or Inf value is recorded when `check_values`).
template <class T>
struct sparse_write {
  const T* g;
  std::uint64_t n;
  const std::uint64_t* list;
  index_coding coding;
  std::byte* indices;
  T* values;
  bool check_values;
  device_status* status;

  __device__ void operator()(std::uint64_t j) const {
    const std::uint64_t i = list[j];
    if (i >= n) {
      record_failure(status, errc::invalid_argument, j, 0xFF);
      return;
    }
    if (coding == index_coding::list32) reinterpret_cast<std::uint32_t*>(indices)[j] = static_cast<std::uint32_t>(i);
    else if (coding == index_coding::list64)
      reinterpret_cast<std::uint64_t*>(indices)[j] = i;
    else
      atomicOr(reinterpret_cast<unsigned int*>(indices) + i / 32, 1u << (i % 32));
    const T v = g[i];
    if (check_values && !is_finite(v)) record_failure(status, errc::non_finite_input, i);
    values[j] = v;
  }
};

/// Queues the payload (at `payload`, 8-byte aligned) of the sparse message of the k elements of
/// the n-element gradient `g` listed in ascending order at `list`, in the encoder's coding; with
/// `check_values`, a kept NaN or Inf is recorded as `non_finite_input` at its index.
/// @returns the payload's size.
template <class T>
std::uint64_t write_sparse_payload(const cuda_executor& exec, std::byte* payload, std::uint64_t n, std::uint64_t k,
                                   const T* g, const std::uint64_t* list, bool check_values, device_status* status) {
  const index_coding coding = choose_index_coding(n, k);
  const std::uint64_t section = index_section_bytes(coding, n, k);
  if (section > 0) GRADCOMP_CUDA_CHECK(cudaMemsetAsync(payload + 8, 0, section, exec.native_stream()));
  launch(exec, 1, 32, store_word_kernel<>, payload, k);  // the count field
  for_each_item(exec, k,
                sparse_write<T>{g, n, list, coding, payload + 8, reinterpret_cast<T*>(payload + 8 + section),
                                check_values, status});
  return sparse_payload_bytes(coding, n, k, sizeof(T));
}

/// The index section of a checked sparse payload on the device.
struct sparse_section {
  index_coding coding;
  std::uint64_t n;
  std::uint64_t k;
  const std::byte* indices;

  /// Index j of a list coding.
  __device__ std::uint64_t list_index(std::uint64_t j) const {
    return coding == index_coding::list32 ? std::uint64_t{reinterpret_cast<const std::uint32_t*>(indices)[j]}
                                          : reinterpret_cast<const std::uint64_t*>(indices)[j];
  }
  /// Bitmap word w (bits 32w … 32w + 31), with the bits at and above n cleared.
  __device__ std::uint32_t bitmap_word(std::uint64_t w) const {
    const std::uint32_t word = reinterpret_cast<const std::uint32_t*>(indices)[w];
    const std::uint64_t first = 32 * w;
    return n - first >= 32 ? word : word & ((1u << (n - first)) - 1u);
  }
  /// 32-bit words covering the bitmap's n bits.
  [[nodiscard]] __host__ __device__ std::uint64_t bitmap_words() const { return (n + 31) / 32; }
  /// Bytes of the section the indices themselves use (the rest is padding).
  [[nodiscard]] __host__ __device__ std::uint64_t used_bytes() const {
    if (coding == index_coding::bitmap) return 4 * bitmap_words();
    return (coding == index_coding::list32 ? 4 : 8) * k;
  }
};

/// One thread per item: index j (ascending, below n) or bitmap word j (its popcount added to
/// `marked`, no bit at or above n), value j finite (unless `values` is null), and the padding
/// bytes zero.
template <class T>
struct sparse_check {
  sparse_section section;
  std::uint64_t section_bytes;
  const T* values;
  unsigned long long* marked;
  device_status* status;

  __device__ void operator()(std::uint64_t j) const {
    if (section.coding == index_coding::bitmap) {
      if (j < section.bitmap_words()) {
        const std::uint32_t raw = reinterpret_cast<const std::uint32_t*>(section.indices)[j];
        const std::uint32_t word = section.bitmap_word(j);
        if (raw != word) record_failure(status, errc::malformed_payload, section.n, sparse_beyond_n);
        if (word != 0) atomicAdd(marked, static_cast<unsigned long long>(__popc(word)));
      }
    } else if (j < section.k) {
      const std::uint64_t index = section.list_index(j);
      if (index >= section.n || (j > 0 && section.list_index(j - 1) >= index))
        record_failure(status, errc::malformed_payload, j, sparse_bad_index);
    }
    if (values != nullptr && j < section.k && !is_finite(values[j]))
      record_failure(status, errc::malformed_payload, j, sparse_bad_value);
    const std::uint64_t padding = section.used_bytes() + j;
    if (padding < section_bytes && section.indices[padding] != std::byte{0})
      record_failure(status, errc::malformed_payload, padding, sparse_bad_padding);
  }
};

/// Records a bitmap that marks another number of elements than k.
template <class = void>
__global__ void sparse_count_check_kernel(const unsigned long long* marked, std::uint64_t k, device_status* status) {
  if (blockIdx.x == 0 && threadIdx.x == 0 && *marked != k)
    record_failure(status, errc::malformed_payload, *marked, sparse_bad_count);
}

/// The popcount of each bitmap word (bits below n).
struct bitmap_popcounts {
  sparse_section section;
  unsigned long long* counts;

  __device__ void operator()(std::uint64_t w) const { counts[w] = __popc(section.bitmap_word(w)); }
};

/// out[i] = value (or += when accumulating) for each listed index.
template <class T>
struct sparse_scatter_list {
  sparse_section section;
  const T* values;
  T* out;
  bool accumulate;

  __device__ void operator()(std::uint64_t j) const {
    const std::uint64_t i = section.list_index(j);
    out[i] = accumulate ? out[i] + values[j] : values[j];
  }
};

/// The same for a bitmap: word w's set bits take values from `first[w]` on.
template <class T>
struct sparse_scatter_bitmap {
  sparse_section section;
  const unsigned long long* first;
  const T* values;
  T* out;
  bool accumulate;

  __device__ void operator()(std::uint64_t w) const {
    std::uint32_t word = section.bitmap_word(w);
    std::uint64_t j = first[w];
    while (word != 0) {
      const std::uint64_t i = 32 * w + static_cast<std::uint64_t>(__ffs(static_cast<int>(word)) - 1);
      out[i] = accumulate ? out[i] + values[j] : values[j];
      ++j;
      word &= word - 1;
    }
  }
};

/// Scratch of a sparse decoder for up to n elements.
struct sparse_decode_scratch {
  std::span<unsigned long long> marked;  ///< Bits the bitmap marks.
  std::span<unsigned long long> counts;  ///< Popcount per bitmap word.
  std::span<unsigned long long> first;   ///< Rank of each word's first set bit.
  std::span<std::byte> scan_temp;        ///< CUB's temporary storage for the scan.

  static sparse_decode_scratch carve(workspace_arena& arena, std::uint64_t n) {
    const std::uint64_t words = (n + 31) / 32;
    std::size_t temp_bytes = 0;
    GRADCOMP_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(nullptr, temp_bytes,
                                                      static_cast<const unsigned long long*>(nullptr),
                                                      static_cast<unsigned long long*>(nullptr), words));
    sparse_decode_scratch s;
    s.marked = arena.take<unsigned long long>(1);
    s.counts = arena.take<unsigned long long>(static_cast<std::size_t>(words));
    s.first = arena.take<unsigned long long>(static_cast<std::size_t>(words));
    s.scan_temp = arena.take<std::byte>(temp_bytes);
    return s;
  }
};

/// Checks the index section (and, unless null, the k values that follow it) on the device and
/// throws what is wrong. @throws error `malformed_payload`, `device_failed`.
template <class T>
void check_sparse_payload(const cuda_executor& exec, const sparse_section& section, const T* values,
                          const operation& op, const sparse_decode_scratch& s) {
  const std::uint64_t section_bytes = index_section_bytes(section.coding, section.n, section.k);
  GRADCOMP_CUDA_CHECK(cudaMemsetAsync(s.marked.data(), 0, sizeof(unsigned long long), exec.native_stream()));
  const std::uint64_t items =
      std::max({section.k, section.coding == index_coding::bitmap ? section.bitmap_words() : 0, std::uint64_t{8}});
  for_each_item(exec, items, sparse_check<T>{section, section_bytes, values, s.marked.data(), op.status()});
  if (section.coding == index_coding::bitmap)
    launch(exec, 1, 32, sparse_count_check_kernel<>, static_cast<const unsigned long long*>(s.marked.data()), section.k,
           op.status());
  op.finish([](errc, std::uint64_t position, std::uint32_t reason) -> std::string {
    switch (reason) {
      case sparse_bad_index:
        return "index at position " + std::to_string(position) + " is out of range or not ascending";
      case sparse_bad_count: return "bitmap marks " + std::to_string(position) + " elements, not k";
      case sparse_beyond_n: return "bitmap marks elements beyond n";
      case sparse_bad_padding: return "non-zero padding in the index section";
      default: return "non-finite value at position " + std::to_string(position);
    }
  });
}

/// Queues out[index_j] = values[j] for the checked section (zeros elsewhere), or adds them when
/// `accumulate`.
template <class T>
void scatter_sparse(const cuda_executor& exec, const sparse_section& section, const T* values, std::span<T> out,
                    bool accumulate, const sparse_decode_scratch& s) {
  if (!accumulate && !out.empty())
    GRADCOMP_CUDA_CHECK(cudaMemsetAsync(out.data(), 0, out.size_bytes(), exec.native_stream()));
  if (section.k == 0) return;
  if (section.coding != index_coding::bitmap) {
    for_each_item(exec, section.k, sparse_scatter_list<T>{section, values, out.data(), accumulate});
    return;
  }
  const std::uint64_t words = section.bitmap_words();
  for_each_item(exec, words, bitmap_popcounts{section, s.counts.data()});
  std::size_t temp_bytes = s.scan_temp.size();
  GRADCOMP_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(s.scan_temp.data(), temp_bytes, s.counts.data(), s.first.data(),
                                                    words, exec.native_stream()));
  for_each_item(exec, words, sparse_scatter_bitmap<T>{section, s.first.data(), values, out.data(), accumulate});
}

/// Decodes the sparse message `message` into `out` (or adds it): the envelope read and checked
/// against `want` on the host, the payload checked on the device, and only then `out` written.
/// @throws error as the CPU decoder (`malformed_payload` for any payload inconsistency); `out` is
///         untouched then.
template <class T>
void decode_sparse_message(const cuda_executor& exec, std::span<const std::byte> message,
                           const envelope_expectation& want, const decode_limits& limits, std::span<T> out,
                           bool accumulate, const operation& op, const crc_scratch& crc,
                           const sparse_decode_scratch& s) {
  std::uint64_t k = 0;
  const envelope e = read_envelope(exec, message, want, limits, crc, &k);
  const std::uint64_t payload_bytes = e.payload_bytes;
  const sparse_indices sizes = check_sparse_sizes(e, payload_bytes, k, sizeof(T));
  detail::require(sizes.bytes() + sizes.kept * sizeof(T) == payload_bytes, errc::malformed_payload, [&] {
    return "payload of " + std::to_string(payload_bytes) + " bytes does not match k = " + std::to_string(sizes.kept);
  });
  const std::byte* const payload = message.data() + envelope::size;
  const sparse_section section{sizes.coding, sizes.elements, sizes.kept, payload + 8};
  const auto* const values = reinterpret_cast<const T*>(payload + sizes.bytes());
  check_sparse_payload(exec, section, values, op, s);
  scatter_sparse(exec, section, values, out, accumulate, s);
}

/// Workspace bytes of a sparse decoder for n elements: status, CRC scratch, bitmap ranks.
inline std::size_t sparse_decoder_bytes(std::uint64_t n) {
  return operation::workspace_bytes([n](workspace_arena& arena) {
    (void)crc_scratch::carve(arena);
    (void)sparse_decode_scratch::carve(arena, n);
  });
}

/// Decodes a message of an index-sending sparsifier (top-k, threshold) in the workspace
/// `sparse_decoder_bytes` sizes.
template <class Codec>
void decode_sparse_codec(const Codec& codec, const cuda_executor& exec, std::span<const std::byte> message,
                         std::span<typename Codec::value_type> out, std::span<std::byte> ws,
                         const decode_limits& limits, bool accumulate) {
  using T = typename Codec::value_type;
  workspace_arena arena(ws);
  const operation op(exec, arena);
  const crc_scratch crc = crc_scratch::carve(arena);
  const sparse_decode_scratch s = sparse_decode_scratch::carve(arena, out.size());
  decode_sparse_message<T>(exec, message, {Codec::id, dtype_of<T>, out.size(), codec.params_hash()}, limits, out,
                           accumulate, op, crc, s);
}

}  // namespace gradcomp::detail::cuda
