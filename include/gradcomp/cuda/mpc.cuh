#pragma once
/// @file
/// MPC on the GPU, byte for byte the CPU backend's stream (lossless/mpc.hpp and docs/lossless.md
/// §1 have the format): one warp per chunk of 1024 words, one lane per word of a group of 32.
///
/// Encoding, per group of the chunk, lane t holding v[t]: step 1 takes v[t − d] from a lane of the
/// group or, across the group boundary, of the previous group (kept in a register), and pads the
/// words past n with 0; step 2, the 32 × 32 bit transpose, is 32 warp ballots (ballot L collects
/// bit L of every lane's word, and lane L keeps it); step 3 subtracts the word of the lane before,
/// or the previous group's last word; step 4's bitmap is the ballot of the non-zero words, and
/// each non-zero word goes to the chunk's running offset plus its rank among them. A first pass
/// counts each chunk's kept words, CUB's exclusive scan turns the counts into offsets (and the
/// total the host reads back for the message size), and a second pass writes the words: the
/// gradient is read twice, and encoding waits for the device once.
///
/// Decoding reads the bitmaps' counts per chunk the same way (the total must equal the words the
/// payload carries), then checks the padding of a partial last group (its transposed words below
/// 2^r) with one warp over the last chunk, waits, and only then decodes: each lane takes its word
/// (or 0) by its rank in the bitmap, a warp scan plus the previous group's last word undoes step
/// 3, 32 ballots transpose back, and a scan with stride d (within the group, then the previous
/// group's word d·(⌊t/d⌋ + 1) back) undoes step 1.

#include <gradcomp/cuda/config.cuh>

#include <cub/device/device_scan.cuh>
#include <cuda_runtime.h>

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
#include <gradcomp/lossless/mpc.hpp>

namespace gradcomp {

namespace detail::cuda {

/// Where a stream's pieces lie: n words in chunks of 1024, G = ⌈n/32⌉ bitmaps (u32, from the
/// payload's start), the kept words after them, and d.
struct mpc_layout {
  std::uint64_t n;
  std::uint64_t chunks;
  std::uint32_t* bitmaps;
  std::uint32_t* words;
  unsigned dim;

  /// The layout of an n-word stream whose payload starts at `payload` (4-byte aligned).
  static mpc_layout of(std::byte* payload, std::uint64_t n, unsigned dim) noexcept {
    auto* const bitmaps = reinterpret_cast<std::uint32_t*>(payload);
    return {n, (n + mpc_codec<float>::chunk - 1) / mpc_codec<float>::chunk, bitmaps,
            bitmaps + mpc_codec<float>::group_count(n), dim};
  }
  /// Groups of chunk c.
  __device__ unsigned groups_of(std::uint64_t c) const {
    const std::uint64_t left = n - c * mpc_codec<float>::chunk;
    return left >= mpc_codec<float>::chunk ? 32u : static_cast<unsigned>((left + 31) / 32);
  }
};

/// The mask of the lanes below this one.
__device__ inline unsigned lanes_below() { return (1u << lane_id()) - 1u; }

/// The 32 × 32 bit transpose of the warp's words: lane L gets the word whose bit i is bit L of
/// lane i's word (its own inverse).
__device__ inline std::uint32_t warp_transpose(std::uint32_t word) {
  std::uint32_t mine = 0;
#pragma unroll
  for (unsigned bit = 0; bit < 32; ++bit) {
    const std::uint32_t column = __ballot_sync(0xFFFFFFFFu, ((word >> bit) & 1u) != 0);
    if (lane_id() == bit) mine = column;
  }
  return mine;
}

/// Steps 1 to 4 of chunk c (see the file comment), by the whole warp: without `write`, returns
/// the chunk's kept-word count and writes its bitmaps; with it, writes the kept words from
/// `offset` on (the chunk's first kept word).
template <bool Write>
__device__ std::uint64_t mpc_forward_chunk(const std::uint32_t* x, const mpc_layout& layout, std::uint64_t c,
                                           std::uint64_t offset) {
  const unsigned lane = lane_id();
  const unsigned groups = layout.groups_of(c);
  std::uint32_t previous_value = 0;
  std::uint32_t previous_last = 0;
  std::uint64_t kept = 0;
  for (unsigned g = 0; g < groups; ++g) {
    const std::uint64_t index = c * mpc_codec<float>::chunk + 32 * g + lane;
    const bool valid = index < layout.n;
    const std::uint32_t value = valid ? x[index] : 0u;
    // Step 1: a[t] = v[t] − v[t − d] (t ≥ d in the chunk), v[t] for t < d, 0 past n.
    const std::uint32_t back_here = __shfl_sync(0xFFFFFFFFu, value, (lane - layout.dim) & 31u);
    const std::uint32_t back_before = __shfl_sync(0xFFFFFFFFu, previous_value, (lane + 32 - layout.dim) & 31u);
    const unsigned position = 32 * g + lane;
    const std::uint32_t a =
        !valid ? 0u : (position < layout.dim ? value : value - (lane >= layout.dim ? back_here : back_before));
    // Step 2: transpose; step 3: subtract the previous word of the chunk.
    const std::uint32_t w = warp_transpose(a);
    const std::uint32_t before = __shfl_up_sync(0xFFFFFFFFu, w, 1);
    const std::uint32_t b = lane != 0 ? w - before : (g == 0 ? w : w - previous_last);
    // Step 4: the bitmap and the non-zero words.
    const std::uint32_t bitmap = __ballot_sync(0xFFFFFFFFu, b != 0);
    if constexpr (Write) {
      if (b != 0) layout.words[offset + kept + static_cast<unsigned>(__popc(bitmap & lanes_below()))] = b;
    } else {
      if (lane == 0) layout.bitmaps[c * 32 + g] = bitmap;
    }
    kept += static_cast<unsigned>(__popc(bitmap));
    previous_last = __shfl_sync(0xFFFFFFFFu, w, 31);
    previous_value = value;
  }
  return kept;
}

/// Pass 1 of the encoder: each chunk's bitmaps, and its kept-word count in counts[c].
template <class = void>
__global__ void mpc_count_kernel(const std::uint32_t* x, mpc_layout layout, unsigned long long* counts) {
  for (std::uint64_t c = warp_id(); c < layout.chunks; c += warp_count()) {
    const std::uint64_t kept = mpc_forward_chunk<false>(x, layout, c, 0);
    if (lane_id() == 0) counts[c] = kept;
  }
}

/// Pass 2 of the encoder: each chunk's kept words from its offset on.
template <class = void>
__global__ void mpc_write_kernel(const std::uint32_t* x, mpc_layout layout, const unsigned long long* offsets) {
  for (std::uint64_t c = warp_id(); c < layout.chunks; c += warp_count())
    (void)mpc_forward_chunk<true>(x, layout, c, offsets[c]);
}

/// The kept words each chunk's bitmaps mark, in counts[c] (one thread per chunk).
template <class = void>
__global__ void mpc_marked_kernel(mpc_layout layout, unsigned long long* counts) {
  for (std::uint64_t c = thread_id(); c < layout.chunks; c += thread_count()) {
    const unsigned groups = layout.groups_of(c);
    unsigned long long marked = 0;
    for (unsigned g = 0; g < groups; ++g) marked += static_cast<unsigned>(__popc(layout.bitmaps[c * 32 + g]));
    counts[c] = marked;
  }
}

/// The inverse of steps 4 to 1 for chunk c, by the whole warp, its kept words from `offset` on:
/// records `malformed_payload` when a partial last group's transposed words have bits at or above
/// r; with `out`, writes (or adds) the chunk's values.
__device__ inline void mpc_inverse_chunk(const mpc_layout& layout, std::uint64_t c, std::uint64_t offset, float* out,
                                         bool accumulate, device_status* status) {
  const unsigned lane = lane_id();
  const unsigned groups = layout.groups_of(c);
  const unsigned dim = layout.dim;
  std::uint32_t previous_last = 0;
  std::uint32_t previous_value = 0;
  for (unsigned g = 0; g < groups; ++g) {
    const std::uint32_t bitmap = layout.bitmaps[c * 32 + g];
    const std::uint32_t b = ((bitmap >> lane) & 1u) != 0
                                ? layout.words[offset + static_cast<unsigned>(__popc(bitmap & lanes_below()))]
                                : 0u;
    offset += static_cast<unsigned>(__popc(bitmap));
    // Undo step 3: a running sum over the chunk's words.
    std::uint32_t w = b;
#pragma unroll
    for (unsigned shift = 1; shift < 32; shift *= 2) {
      const std::uint32_t lower = __shfl_up_sync(0xFFFFFFFFu, w, shift);
      if (lane >= shift) w += lower;
    }
    w += previous_last;
    previous_last = __shfl_sync(0xFFFFFFFFu, w, 31);
    const std::uint64_t first = c * mpc_codec<float>::chunk + 32 * g;
    if (const std::uint64_t r = layout.n - first; r < 32) {  // a partial last group: its padding must be zero
      if (__ballot_sync(0xFFFFFFFFu, (w >> r) != 0) != 0 && lane == 0)
        record_failure(status, errc::malformed_payload, first);
    }
    // Undo step 2, then step 1: v[t] = a[t] + v[t − d], within the group by a scan with stride d,
    // then the chain's last value in the previous group.
    std::uint32_t v = warp_transpose(w);
    for (unsigned shift = dim; shift < 32; shift *= 2) {
      const std::uint32_t lower = __shfl_up_sync(0xFFFFFFFFu, v, shift);
      if (lane >= shift) v += lower;
    }
    const unsigned from = lane + 32 - dim * (lane / dim + 1);
    const std::uint32_t carried = __shfl_sync(0xFFFFFFFFu, previous_value, from & 31u);
    if (g > 0) v += carried;
    previous_value = v;
    const std::uint64_t index = first + lane;
    if (out != nullptr && index < layout.n) {
      const float value = from_bits<float>(v);
      out[index] = accumulate ? out[index] + value : value;
    }
  }
}

/// Checks the padding of the last chunk's partial last group (one warp; writes nothing).
template <class = void>
__global__ void mpc_padding_kernel(mpc_layout layout, const unsigned long long* offsets, device_status* status) {
  if (warp_id() != 0) return;
  const std::uint64_t c = layout.chunks - 1;
  mpc_inverse_chunk(layout, c, offsets[c], nullptr, false, status);
}

/// Decodes every chunk into (or onto) `out`.
template <class = void>
__global__ void mpc_decode_kernel(mpc_layout layout, const unsigned long long* offsets, float* out, bool accumulate,
                                  device_status* status) {
  for (std::uint64_t c = warp_id(); c < layout.chunks; c += warp_count())
    mpc_inverse_chunk(layout, c, offsets[c], out, accumulate, status);
}

/// The per-chunk counts and offsets of a stream (chunks + 1 entries each: the last count is 0,
/// so the last offset is the total) and CUB's scan scratch.
struct mpc_scratch {
  std::span<unsigned long long> counts;
  std::span<unsigned long long> offsets;
  std::span<std::byte> scan_temp;

  static mpc_scratch carve(workspace_arena& arena, std::uint64_t n) {
    const std::uint64_t entries = (n + mpc_codec<float>::chunk - 1) / mpc_codec<float>::chunk + 1;
    std::size_t temp_bytes = 0;
    GRADCOMP_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(nullptr, temp_bytes,
                                                      static_cast<const unsigned long long*>(nullptr),
                                                      static_cast<unsigned long long*>(nullptr), entries));
    mpc_scratch s;
    s.counts = arena.take<unsigned long long>(static_cast<std::size_t>(entries));
    s.offsets = arena.take<unsigned long long>(static_cast<std::size_t>(entries));
    s.scan_temp = arena.take<std::byte>(temp_bytes);
    return s;
  }

  /// Queues the offsets of the counts the previous kernel wrote, and returns their total (waits).
  [[nodiscard]] std::uint64_t offsets_and_total(const cuda_executor& exec) const {
    std::size_t temp_bytes = scan_temp.size();
    GRADCOMP_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(scan_temp.data(), temp_bytes, counts.data(), offsets.data(),
                                                      counts.size(), exec.native_stream()));
    unsigned long long total = 0;
    GRADCOMP_CUDA_CHECK(cudaMemcpyAsync(&total, offsets.data() + offsets.size() - 1, sizeof total,
                                        cudaMemcpyDeviceToHost, exec.native_stream()));
    exec.synchronize();
    return total;
  }
};

}  // namespace detail::cuda

/// MPC on the GPU.
template <>
struct backend<mpc_codec<float>, cuda_executor> {
  static std::size_t workspace_bytes(const mpc_codec<float>&, const cuda_executor&, std::uint64_t n) {
    return detail::cuda::operation::workspace_bytes([n](workspace_arena& arena) {
      (void)detail::cuda::crc_scratch::carve(arena);
      (void)detail::cuda::mpc_scratch::carve(arena, n);
    });
  }

  static std::size_t encode(const mpc_codec<float>& codec, const cuda_executor& exec, std::span<const float> grad,
                            std::span<std::byte> out, std::span<std::byte> ws, message_key key) {
    namespace cd = detail::cuda;
    const std::uint64_t n = grad.size();
    workspace_arena arena(ws);
    const cd::operation op(exec, arena);
    const cd::crc_scratch crc = cd::carve_seal(arena, codec.wire().payload_checksum);
    const cd::mpc_scratch s = cd::mpc_scratch::carve(arena, n);
    cd::begin_message(exec, out, codec.max_encoded_bytes(n));
    const cd::mpc_layout layout = cd::mpc_layout::of(out.data() + envelope::size, n, codec.params().dim);
    const auto* const x = reinterpret_cast<const std::uint32_t*>(grad.data());
    GRADCOMP_CUDA_CHECK(cudaMemsetAsync(s.counts.data(), 0, s.counts.size_bytes(), exec.native_stream()));
    if (layout.chunks > 0)
      cd::launch(exec, cd::grid_for(layout.chunks, cd::block_warps), cd::block_threads, cd::mpc_count_kernel<>, x,
                 layout, s.counts.data());
    const std::uint64_t kept = s.offsets_and_total(exec);
    if (layout.chunks > 0)
      cd::launch(exec, cd::grid_for(layout.chunks, cd::block_warps), cd::block_threads, cd::mpc_write_kernel<>, x,
                 layout, static_cast<const unsigned long long*>(s.offsets.data()));
    const std::uint64_t payload = 4 * (mpc_codec<float>::group_count(n) + kept);
    cd::seal_message(exec, out.data(),
                     {codec_id::mpc, value_dtype::float32, 0, 0, key, n, payload, codec.params_hash(), 0}, crc, op);
    op.finish_encode(
        [](errc, std::uint64_t, std::uint32_t) { return std::string("internal error in the MPC encoder"); });
    return static_cast<std::size_t>(envelope::size + payload);
  }

  static void decode(const mpc_codec<float>& codec, const cuda_executor& exec, std::span<const std::byte> message,
                     std::span<float> out, std::span<std::byte> ws, const decode_limits& limits, bool accumulate) {
    namespace cd = detail::cuda;
    workspace_arena arena(ws);
    const cd::operation op(exec, arena);
    const cd::crc_scratch crc = cd::crc_scratch::carve(arena);
    const envelope e =
        cd::read_envelope(exec, message, {codec_id::mpc, value_dtype::float32, out.size(), codec.params_hash()}, limits,
                          crc);
    const std::uint64_t carried = mpc_codec<float>::carried_words(e);
    const std::uint64_t n = e.elements;
    const cd::mpc_scratch s = cd::mpc_scratch::carve(arena, n);
    // mpc_layout takes a writable pointer; the decoder only reads through it.
    const cd::mpc_layout layout =
        cd::mpc_layout::of(const_cast<std::byte*>(message.data() + envelope::size), n, codec.params().dim);
    GRADCOMP_CUDA_CHECK(cudaMemsetAsync(s.counts.data(), 0, s.counts.size_bytes(), exec.native_stream()));
    if (layout.chunks > 0)
      cd::launch(exec, cd::grid_for(layout.chunks), cd::block_threads, cd::mpc_marked_kernel<>, layout,
                 s.counts.data());
    const std::uint64_t marked = s.offsets_and_total(exec);
    detail::require(marked == carried, errc::malformed_payload, [&] {
      return "bitmaps mark " + std::to_string(marked) + " words, the payload carries " + std::to_string(carried);
    });
    if (n == 0) return;
    const auto* const offsets = static_cast<const unsigned long long*>(s.offsets.data());
    if (n % mpc_codec<float>::group != 0) {
      cd::launch(exec, 1, 32, cd::mpc_padding_kernel<>, layout, offsets, op.status());
      op.finish([](errc, std::uint64_t, std::uint32_t) {
        return std::string("the last group's transposed words have bits set for elements past the tensor's end");
      });
    }
    cd::launch(exec, cd::grid_for(layout.chunks, cd::block_warps), cd::block_threads, cd::mpc_decode_kernel<>, layout,
               offsets, out.data(), accumulate, op.status());
  }
};

}  // namespace gradcomp
