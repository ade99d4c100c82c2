#pragma once
/// @file
/// Philox4x32-10 (Salmon et al., SC'11), the counter-based generator behind every random choice in
/// gradcomp, and the keying of its counters by (seed, step, tensor id, index). Host and device run
/// this same code, so ranks and backends that share a key draw the same numbers without talking.

#include <cstdint>

#include <gradcomp/core/config.hpp>

namespace gradcomp {

/// Four 32-bit words: a Philox counter or output block.
struct philox_block {
  std::uint32_t word[4];  ///< Little-endian word order, as in Random123.
};

/// Philox4x32 with 10 rounds: a keyed bijection of 128-bit counters.
/// @param counter the 128-bit counter; @param key0, key1 the 64-bit key.
GRADCOMP_HOST_DEVICE constexpr philox_block philox4x32_10(philox_block counter, std::uint32_t key0,
                                                          std::uint32_t key1) noexcept {
  constexpr std::uint32_t multiplier0 = 0xD2511F53u;
  constexpr std::uint32_t multiplier1 = 0xCD9E8D57u;
  constexpr std::uint32_t weyl0 = 0x9E3779B9u;
  constexpr std::uint32_t weyl1 = 0xBB67AE85u;
  std::uint32_t* c = counter.word;
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      key0 += weyl0;
      key1 += weyl1;
    }
    const std::uint64_t product0 = std::uint64_t{multiplier0} * c[0];
    const std::uint64_t product1 = std::uint64_t{multiplier1} * c[2];
    const auto hi0 = static_cast<std::uint32_t>(product0 >> 32);
    const auto lo0 = static_cast<std::uint32_t>(product0);
    const auto hi1 = static_cast<std::uint32_t>(product1 >> 32);
    const auto lo1 = static_cast<std::uint32_t>(product1);
    const std::uint32_t next[4] = {hi1 ^ c[1] ^ key0, lo1, hi0 ^ c[3] ^ key1, lo0};
    for (int w = 0; w < 4; ++w) c[w] = next[w];
  }
  return counter;
}

/// What a random stream is used for. Different purposes of the same (seed, step, tensor) draw
/// independent numbers. The values are part of the wire contract: never renumber them.
enum class random_purpose : std::uint8_t {
  stochastic_rounding = 0,  ///< One uniform per element of a quantized tensor.
  random_k = 1,             ///< Round keys of random-k's index permutation.
  threshold_sample = 2,     ///< Sample positions of the threshold estimate.
  sketch_hash = 3,          ///< Reserved, unused: the sketches hash with MurmurHash3 (core/murmur3.hpp) instead.
  low_rank_init = 4,        ///< PowerSGD's draws of its factor Q (lowrank/powersgd_math.hpp).
};

/// A keyed stream of 32-bit random words: word `i` of the stream for (seed, step, tensor, purpose)
/// is word `i % 4` of `philox4x32_10(counter, key)` with
/// key = (seed low 32 bits, seed high 32 bits XOR step high 32 bits) and
/// counter = (block low 32 bits, block bits 32..55 | purpose << 24, step low 32 bits, tensor id),
/// where block = i / 4. Streams support 2^58 words; for one seed every 64-bit step is distinct.
struct random_stream {
  std::uint64_t seed = 0;                                  ///< Shared by all ranks of a job.
  std::uint64_t step = 0;                                  ///< Training step.
  std::uint32_t tensor_id = 0;                             ///< Which tensor or bucket.
  random_purpose purpose = random_purpose::stochastic_rounding;  ///< Separates uses of one key.

  /// The four words of block `block` (words 4·block .. 4·block+3).
  [[nodiscard]] GRADCOMP_HOST_DEVICE constexpr philox_block block(std::uint64_t block) const noexcept {
    const philox_block counter{
        {static_cast<std::uint32_t>(block), counter1(block), static_cast<std::uint32_t>(step), tensor_id}};
    return philox4x32_10(counter, key0(), key1());
  }

  /// Counter word 1 of block `block`: its bits 32..55 and the purpose in the top byte.
  [[nodiscard]] GRADCOMP_HOST_DEVICE constexpr std::uint32_t counter1(std::uint64_t block) const noexcept {
    return (static_cast<std::uint32_t>(block >> 32) & 0x00ffffffu) |
           (std::uint32_t{static_cast<std::uint8_t>(purpose)} << 24);
  }
  /// Key word 0: the low half of the seed.
  [[nodiscard]] GRADCOMP_HOST_DEVICE constexpr std::uint32_t key0() const noexcept {
    return static_cast<std::uint32_t>(seed);
  }
  /// Key word 1: the high half of the seed XOR the high half of the step.
  [[nodiscard]] GRADCOMP_HOST_DEVICE constexpr std::uint32_t key1() const noexcept {
    return static_cast<std::uint32_t>(seed >> 32) ^ static_cast<std::uint32_t>(step >> 32);
  }

  /// Word `i` of the stream.
  [[nodiscard]] GRADCOMP_HOST_DEVICE constexpr std::uint32_t word(std::uint64_t i) const noexcept {
    return block(i / 4).word[i % 4];
  }

  /// A uniform float in [0, 1) with 24 random bits, from word `i`.
  [[nodiscard]] GRADCOMP_HOST_DEVICE constexpr float uniform(std::uint64_t i) const noexcept {
    return static_cast<float>(word(i) >> 8) * (1.0f / 16777216.0f);
  }
};

/// floor(x · n / 2^64): maps a uniform 64-bit word onto [0, n) without division.
GRADCOMP_HOST_DEVICE inline std::uint64_t scale_to_range(std::uint64_t x, std::uint64_t n) noexcept {
#if defined(__CUDA_ARCH__)
  return __umul64hi(x, n);
#else
  __extension__ using wide = unsigned __int128;
  return static_cast<std::uint64_t>((static_cast<wide>(x) * n) >> 64);
#endif
}

}  // namespace gradcomp
