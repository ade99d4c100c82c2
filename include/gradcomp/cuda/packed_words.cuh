#pragma once
/// @file
/// 32-bit words of a packed code array (core/bit_packing.hpp order) in a device message: word w
/// holds the codes of elements [w·32/b, (w+1)·32/b). The array starts 4-byte aligned (device
/// messages start on 8 bytes, and every section before the codes has a size that is a multiple of
/// 4) but its length need not be a multiple of 4, so the last word is read and written byte by
/// byte, never past the array.

#include <gradcomp/cuda/config.cuh>

#include <cstddef>
#include <cstdint>

namespace gradcomp::cuda_detail {

/// Word w of the `bytes`-byte packed array at `codes` (bytes past the array read as zero).
__device__ inline std::uint32_t load_code_word(const std::byte* codes, std::uint64_t w, std::uint64_t bytes) {
  const std::uint64_t first = 4 * w;
  if (first + 4 <= bytes) return *reinterpret_cast<const std::uint32_t*>(codes + first);
  std::uint32_t word = 0;
  for (std::uint64_t b = first; b < bytes; ++b) word |= std::uint32_t{static_cast<std::uint8_t>(codes[b])} << (8 * (b - first));
  return word;
}

/// Writes word w of the `bytes`-byte packed array at `codes` (its bytes past the array dropped).
__device__ inline void store_code_word(std::byte* codes, std::uint64_t w, std::uint32_t word, std::uint64_t bytes) {
  const std::uint64_t first = 4 * w;
  if (first + 4 <= bytes) {
    *reinterpret_cast<std::uint32_t*>(codes + first) = word;
    return;
  }
  for (std::uint64_t b = first; b < bytes; ++b) codes[b] = static_cast<std::byte>(word >> (8 * (b - first)));
}

/// Code c (0-based) of a word of `bits`-bit codes.
__device__ inline std::uint8_t code_in_word(std::uint32_t word, int c, int bits) {
  return static_cast<std::uint8_t>((word >> (c * bits)) & ((1u << bits) - 1u));
}

}  // namespace gradcomp::cuda_detail
