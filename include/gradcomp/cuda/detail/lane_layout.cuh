#pragma once
/// @file
/// Which elements each lane of a warp holds in the kernels that keep a whole quantization block in
/// registers, and the 128-bit accesses that move them. The rules are `__host__ __device__` so that
/// a CPU test (tests/cuda/test_kernel_layout.cu) can check them exhaustively: every element read
/// and written once, every code word stored once, every random word the CPU's.
///
/// **Quads.** A block of B values (B a multiple of 8, at most 256) is coded by one warp: lane L
/// holds the quads (4 consecutive values) at offsets 4L and 128 + 4L of the block. Every access of
/// the warp then covers contiguous bytes: a quad of floats is one 128-bit load or store (a quad of
/// doubles two), 32 lanes read 512 contiguous bytes, and a quad's four 8-bit codes are one 32-bit
/// code word. A quad of 4-bit codes is half a word: neighbouring lanes swap halves (one shuffle)
/// and each lane stores one whole word. The last block may end inside a quad: its missing values
/// read as 0, code nothing, and are never written.
///
/// **Random words.** Stochastic rounding draws element i's uniform from half i mod 2 of stream word
/// ⌊i/2⌋, so a Philox block of 4 words serves 8 consecutive elements: two quads, held by the lanes
/// 2k and 2k + 1. Lane 2k computes the block of its pair's quads in row 0 and lane 2k + 1 that of
/// row 1, and each gives its partner the half it needs (two shuffles): every lane computes exactly
/// one Philox block, as many as the CPU per element.
///
/// **Tiles.** The sign and QSGD encoders sum each block serially in index order (the wire format's
/// order, quantize/sign_math.hpp). One warp takes 32 consecutive blocks, stages 128-byte column
/// chunks of all 32 (up to the longest of them) in shared memory with coalesced loads, and lane b
/// sums block b: the sums run on 32 lanes at once, each in its block's order.

#include <gradcomp/cuda/config.cuh>

#include <cstdint>

#include <gradcomp/core/config.hpp>
#include <gradcomp/core/float_bits.hpp>
#include <gradcomp/core/philox.hpp>
#include <gradcomp/cuda/detail/warp.cuh>

namespace gradcomp::detail::cuda {

/// Values of a quad.
inline constexpr unsigned quad_values = 4;
/// Quads a lane holds (rows of 32 quads: 128 values each).
inline constexpr unsigned quad_rows = 2;
/// Largest block that a warp holds in registers.
inline constexpr std::uint64_t quad_block_limit = 32 * quad_values * quad_rows;

/// Whether blocks of B values coded in b bits fit the quad layout: b ∈ {4, 8} (a quad's codes are a
/// word or half a word), B a multiple of 8 (blocks start on a Philox block and a whole code word)
/// and at most 256.
GRADCOMP_HOST_DEVICE constexpr bool quads_fit(std::uint64_t block, int bits) noexcept {
  return (bits == 4 || bits == 8) && block % 8 == 0 && block >= 8 && block <= quad_block_limit;
}

/// Offset in its block of the first value of lane `lane`'s quad in row `row`.
GRADCOMP_HOST_DEVICE constexpr unsigned quad_offset(unsigned row, unsigned lane) noexcept {
  return 32 * quad_values * row + quad_values * lane;
}

/// How many values of the quad from offset `first` lie in a range of `count` values (0 to 4).
GRADCOMP_HOST_DEVICE constexpr unsigned quad_count(std::uint64_t count, std::uint64_t first) noexcept {
  return first >= count ? 0u : (count - first >= quad_values ? quad_values : static_cast<unsigned>(count - first));
}

/// Whether `p` allows 128-bit accesses.
template <class T>
GRADCOMP_HOST_DEVICE inline bool vector_aligned(const T* p) noexcept {
  return reinterpret_cast<std::uintptr_t>(p) % 16 == 0;
}

/// The bits of a quad's packed b-bit codes that belong to its `count` values in the block (the
/// codes of values past the block are masked out, so that padding bits stay zero).
GRADCOMP_HOST_DEVICE constexpr std::uint32_t quad_piece_mask(unsigned count, int bits) noexcept {
  const unsigned used = count * static_cast<unsigned>(bits);
  return used >= 32 ? ~0u : (1u << used) - 1u;
}

/// The code word (index in its block) that lane `lane` stores in slot `slot`, or −1: with 8-bit
/// codes its quads' words 32·slot + lane; with 4-bit codes one word in slot 0, that of row
/// lane mod 2 of its lane pair, 16·(lane mod 2) + ⌊lane/2⌋.
GRADCOMP_HOST_DEVICE constexpr int quad_word_index(int bits, unsigned lane, unsigned slot) noexcept {
  if (bits == 8) return static_cast<int>(32 * slot + lane);
  return slot == 0 ? static_cast<int>(16 * (lane % 2) + lane / 2) : -1;
}

/// The word lane `lane` stores in slot `slot` (see quad_word_index), from the code pieces of its
/// quads (`own[row]`: the quad's codes packed from bit 0) and of its partner lane^1's (`partner`).
GRADCOMP_HOST_DEVICE constexpr std::uint32_t quad_word(int bits, unsigned lane, unsigned slot,
                                                       const std::uint32_t (&own)[quad_rows],
                                                       const std::uint32_t (&partner)[quad_rows]) noexcept {
  if (bits == 8) return slot == 0 ? own[0] : own[1];
  return lane % 2 == 0 ? own[0] | (partner[0] << 16) : partner[1] | (own[1] << 16);
}

/// The Philox block (of the stochastic-rounding stream) that lane `lane` computes for the block
/// starting at element `begin` (a multiple of 8).
GRADCOMP_HOST_DEVICE constexpr std::uint64_t quad_random_block(std::uint64_t begin, unsigned lane) noexcept {
  return begin / 8 + 16 * (lane % 2) + lane / 2;
}

/// Two stream words.
struct word_pair {
  std::uint32_t first;   ///< The lower-numbered word.
  std::uint32_t second;  ///< The next one.
};

/// The half of lane `lane`'s Philox block that its partner lane^1 needs.
GRADCOMP_HOST_DEVICE constexpr word_pair quad_random_sent(unsigned lane, const philox_block& own) noexcept {
  return lane % 2 != 0 ? word_pair{own.word[0], own.word[1]} : word_pair{own.word[2], own.word[3]};
}

/// The stream words of lane `lane`'s quad in row `row` (values 0 and 1 take the halves of the
/// first, values 2 and 3 of the second): half of its own block, or the half its partner sent.
GRADCOMP_HOST_DEVICE constexpr word_pair quad_random_words(unsigned lane, unsigned row, const philox_block& own,
                                                           word_pair received) noexcept {
  if (row != lane % 2) return received;
  return lane % 2 != 0 ? word_pair{own.word[2], own.word[3]} : word_pair{own.word[0], own.word[1]};
}

/// The 16-bit half of a stream word that value `value` (0 to 3) of a quad draws.
GRADCOMP_HOST_DEVICE constexpr std::uint32_t quad_random_half(word_pair words, unsigned value) noexcept {
  const std::uint32_t w = value < 2 ? words.first : words.second;
  return value % 2 == 0 ? (w & 0xFFFFu) : (w >> 16);
}

/// Values of a block's column chunk in a staging tile: 128 bytes of each block.
template <class T>
inline constexpr unsigned tile_columns = 128 / sizeof(T);

/// The tile row (block of the warp's 32) that lane `lane` loads in load `step` (0 ≤ step <
/// tile_columns<T>): tile_columns<T> lanes load one block's chunk together, so that one load
/// instruction reads 32/tile_columns<T> whole 128-byte segments.
template <class T>
GRADCOMP_HOST_DEVICE constexpr unsigned tile_row(unsigned step, unsigned lane) noexcept {
  return step * (32 / tile_columns<T>)+lane / tile_columns<T>;
}
/// The column (value of the chunk) that lane `lane` loads.
template <class T>
GRADCOMP_HOST_DEVICE constexpr unsigned tile_column(unsigned lane) noexcept {
  return lane % tile_columns<T>;
}

/// No element: a tile cell past its block or past the tensor.
inline constexpr std::uint64_t no_element = ~std::uint64_t{0};

/// The element staged in tile cell (row, column) of the chunk from value `k` of each block, for the
/// 32 blocks from block `first` of an n-element tensor in blocks of `block` values.
GRADCOMP_HOST_DEVICE constexpr std::uint64_t tile_element(std::uint64_t n, std::uint64_t block, std::uint64_t first,
                                                          unsigned row, std::uint64_t k, unsigned column) noexcept {
  const std::uint64_t i = (first + row) * block + k + column;
  return k + column < block && i < n ? i : no_element;
}

/// Values of the longest of the 32 blocks from block `first` (the first of them: only the last block
/// of the tensor is short) of an n-element tensor in blocks of `block` values: a tile's column
/// chunks run from value 0 up to it, not to `block`, which may exceed n by far (one scale for a
/// whole tensor), so that no chunk stages nothing.
GRADCOMP_HOST_DEVICE constexpr std::uint64_t tile_length(std::uint64_t n, std::uint64_t block,
                                                         std::uint64_t first) noexcept {
  const std::uint64_t begin = first * block;
  return n - begin < block ? n - begin : block;
}

/// Reads the `count` ≤ 4 values of a quad at `p` into `x` (0 past them): one 128-bit load (two for
/// double) when the quad is whole and `vector` (p 16-byte aligned), else value by value.
template <class T>
__device__ inline void load_quad(const T* p, unsigned count, bool vector, T (&x)[quad_values]) {
  if (vector && count == quad_values) {
    if constexpr (sizeof(T) == 4) {
      const float4 v = *reinterpret_cast<const float4*>(p);
      x[0] = v.x, x[1] = v.y, x[2] = v.z, x[3] = v.w;
    } else {
      const double2 a = reinterpret_cast<const double2*>(p)[0];
      const double2 b = reinterpret_cast<const double2*>(p)[1];
      x[0] = a.x, x[1] = a.y, x[2] = b.x, x[3] = b.y;
    }
    return;
  }
#pragma unroll
  for (unsigned e = 0; e < quad_values; ++e) x[e] = e < count ? p[e] : T{0};
}

/// Writes the first `count` ≤ 4 values of `x` to `p`, as `load_quad` reads them.
template <class T>
__device__ inline void store_quad(T* p, unsigned count, bool vector, const T (&x)[quad_values]) {
  if (vector && count == quad_values) {
    if constexpr (sizeof(T) == 4) {
      *reinterpret_cast<float4*>(p) = make_float4(x[0], x[1], x[2], x[3]);
    } else {
      reinterpret_cast<double2*>(p)[0] = make_double2(x[0], x[1]);
      reinterpret_cast<double2*>(p)[1] = make_double2(x[2], x[3]);
    }
    return;
  }
#pragma unroll
  for (unsigned e = 0; e < quad_values; ++e)
    if (e < count) p[e] = x[e];
}

/// A lane's two quads of one block: their values (0 past the block) and how many of each lie in it.
template <class T>
struct lane_quads {
  T x[quad_rows][quad_values];  ///< Row r, value e: element quad_offset(r, lane) + e of the block.
  unsigned count[quad_rows];    ///< Values of each quad in the block.

  /// The calling lane's quads of a block of `count` values, their values not yet read.
  __device__ explicit lane_quads(std::uint64_t block_count) {
#pragma unroll
    for (unsigned r = 0; r < quad_rows; ++r) count[r] = quad_count(block_count, quad_offset(r, lane_id()));
  }

  /// Reads the quads from the block's first element at `p`.
  __device__ void load(const T* p, bool vector) {
#pragma unroll
    for (unsigned r = 0; r < quad_rows; ++r) load_quad(p + quad_offset(r, lane_id()), count[r], vector, x[r]);
  }

  /// The largest magnitude key of the values (0 for those past the block).
  [[nodiscard]] __device__ typename float_traits<T>::bits_type largest_key() const {
    typename float_traits<T>::bits_type largest = 0;
#pragma unroll
    for (unsigned r = 0; r < quad_rows; ++r)
#pragma unroll
      for (unsigned e = 0; e < quad_values; ++e) {
        const auto key = magnitude_key(x[r][e]);
        largest = key > largest ? key : largest;
      }
    return largest;
  }
};

}  // namespace gradcomp::detail::cuda
