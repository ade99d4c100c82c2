#pragma once
/// @file
/// MurmurHash3_x86_32 (Austin Appleby, public domain algorithm) of one 32-bit key, the hash that
/// the lossless homomorphic compression reference code uses for its sketch rows, and that gradcomp's
/// sketches use for buckets and signs. Host and device run this same code.

#include <cstdint>

#include <gradcomp/core/config.hpp>

namespace gradcomp {

/// Rotates `x` left by `r` bits (0 < r < 32).
GRADCOMP_HOST_DEVICE constexpr std::uint32_t rotate_left32(std::uint32_t x, int r) noexcept {
  return (x << r) | (x >> (32 - r));
}

/// The MurmurHash3 finaliser: a bijection of 32-bit words that mixes every input bit into every
/// output bit.
GRADCOMP_HOST_DEVICE constexpr std::uint32_t murmur3_fmix32(std::uint32_t h) noexcept {
  h ^= h >> 16;
  h *= 0x85ebca6bu;
  h ^= h >> 13;
  h *= 0xc2b2ae35u;
  h ^= h >> 16;
  return h;
}

/// MurmurHash3_x86_32 of the 4-byte little-endian encoding of `key` with `seed`: equal to the
/// reference `MurmurHash3_x86_32(&key, 4, seed, &out)` on a little-endian machine, on every
/// machine.
GRADCOMP_HOST_DEVICE constexpr std::uint32_t murmur3_32(std::uint32_t key, std::uint32_t seed) noexcept {
  std::uint32_t k = key * 0xcc9e2d51u;
  k = rotate_left32(k, 15);
  k *= 0x1b873593u;
  std::uint32_t h = seed ^ k;
  h = rotate_left32(h, 13);
  h = h * 5u + 0xe6546b64u;
  h ^= 4u;  // the key length in bytes
  return murmur3_fmix32(h);
}

}  // namespace gradcomp
