#pragma once
/// @file
/// What the CUDA backends of the block-scaled quantizers (uniform, sign, QSGD) share. Their
/// payload is one scale per block of B values (B = block or bucket, value dtype) followed by the
/// packed b-bit codes (core/bit_packing.hpp order); the codes start 4-byte aligned, since device
/// messages start on 8 bytes and the envelope and the scales take a multiple of 4 bytes.
///
/// The shared kernels (cuda/detail/grid.cuh shapes): the block's scale first, either by a warp per block
/// (its largest magnitude, recording the first NaN or Inf; lane 0 writes the scale) or, for the
/// scales that sum the block in the documented order (sign, QSGD), by a warp per 32 blocks that
/// stages them in shared memory and sums block b on lane b (tiles, cuda/detail/lane_layout.cuh); then
/// one thread per 32-bit code word codes its 32/b values, each under its own block's scale
/// (`encode_words`). A decoder checks every scale and code (`check_items`: a thread per item of 16
/// values of 4- or 8-bit codes, the width a compile-time constant, where each word lies in one
/// block; else `check_codes`, a thread per code word), and once the host has the verdict writes or
/// adds each value (`decode_quads`: a thread per quad of 4 values and 128-bit stores where each
/// word lies in one block and the output is aligned; else `decode_words`, a thread per code word).
/// A codec supplies the per-value rule: its code, whether a code is valid under a scale, and the
/// value it decodes to.

#include <gradcomp/cuda/config.cuh>

#include <cstddef>
#include <cstdint>

#include <algorithm>
#include <span>
#include <string>
#include <type_traits>
#include <utility>

#include <gradcomp/core/error.hpp>
#include <gradcomp/core/float_bits.hpp>
#include <gradcomp/core/philox.hpp>
#include <gradcomp/core/wire_envelope.hpp>
#include <gradcomp/core/workspace.hpp>
#include <gradcomp/cuda/executor.cuh>
#include <gradcomp/cuda/detail/grid.cuh>
#include <gradcomp/cuda/detail/lane_layout.cuh>
#include <gradcomp/cuda/detail/message.cuh>
#include <gradcomp/cuda/detail/operation.cuh>
#include <gradcomp/cuda/detail/warp.cuh>

namespace gradcomp::detail::cuda {

/// Reasons a block-coded payload fails its check (the low byte of `device_status::detail`).
enum block_code_reason : std::uint32_t {
  bad_scale = 1,    ///< A scale (or norm) that is negative or not finite (or too large to decode).
  bad_code = 2,     ///< A code that its block's scale does not allow.
  bad_padding = 3,  ///< Non-zero bits after the last code.
};

/// x / d for a divisor d ≥ 1 fixed at launch, exactly: a shift when d is a power of two, a 32-bit
/// division when x and d fit in 32 bits, else a 64-bit one.
struct index_divisor {
  std::uint64_t d;  ///< The divisor.
  int shift;        ///< log2 d when d is a power of two, else −1.

  GRADCOMP_HOST_DEVICE constexpr explicit index_divisor(std::uint64_t divisor) noexcept : d(divisor), shift(-1) {
    if ((d & (d - 1)) == 0)
      for (shift = 0; (d >> shift) > 1;) ++shift;
  }
  GRADCOMP_HOST_DEVICE constexpr std::uint64_t operator()(std::uint64_t x) const noexcept {
    if (shift >= 0) return x >> shift;
    if (((x | d) >> 32) == 0) return static_cast<std::uint32_t>(x) / static_cast<std::uint32_t>(d);
    return x / d;
  }
};

/// Sizes of a block-coded payload.
struct block_layout {
  std::uint64_t n;           ///< Elements.
  std::uint64_t block;       ///< Values per scale.
  int bits;                  ///< Bits per code (1, 2, 4 or 8).
  std::uint64_t code_bytes;  ///< Bytes of the packed codes (⌈n·b/8⌉).

  // Per-element kernels call these for every item: no integer division by a run-time value (a
  // 64-bit one is a long instruction sequence on the GPU) except in blocks(), which such kernels
  // take from the host.

  /// Number of blocks (and scales).
  [[nodiscard]] __host__ __device__ std::uint64_t blocks() const { return (n + block - 1) / block; }
  /// Codes per 32-bit word (32/b).
  [[nodiscard]] __host__ __device__ std::uint64_t per_word() const {
    return bits == 1 ? 32u : bits == 2 ? 16u : bits == 4 ? 8u : 4u;
  }
  /// Code words (the last may be partial): ⌈n·b/32⌉.
  [[nodiscard]] __host__ __device__ std::uint64_t words() const { return (n * static_cast<unsigned>(bits) + 31) / 32; }
  /// Number of values of block j.
  [[nodiscard]] __host__ __device__ std::uint64_t count(std::uint64_t j) const {
    return n - j * block < block ? n - j * block : block;
  }
  /// Whether every block's codes fill whole words (B·b a multiple of 32), so a block is coded alone.
  [[nodiscard]] __host__ __device__ bool whole_words() const { return block * static_cast<unsigned>(bits) % 32 == 0; }

  /// Calls f(i, c, j) for each element i of code word w: c its position in the word, j its block.
  template <class F>
  __device__ void for_each_in_word(std::uint64_t w, F&& f) const {
    const std::uint64_t first = w * per_word();
    const std::uint64_t last = first + per_word() < n ? first + per_word() : n;
    std::uint64_t j = first / block;
    std::uint64_t next_block = (j + 1) * block;
    for (std::uint64_t i = first; i < last; ++i) {
      if (i == next_block) {
        ++j;
        next_block += block;
      }
      f(i, static_cast<unsigned>(i - first), j);
    }
  }

  /// for_each_in_word where every word lies in one block (whole_words()): the block is found once
  /// per word, by `word_block` (which divides by the B·b/32 words per block).
  template <class F>
  __device__ void for_each_in_whole_word(std::uint64_t w, const index_divisor& word_block, F&& f) const {
    const std::uint64_t first = w * per_word();
    const std::uint64_t last = first + per_word() < n ? first + per_word() : n;
    const std::uint64_t j = word_block(w);
    for (std::uint64_t i = first; i < last; ++i) f(i, static_cast<unsigned>(i - first), j);
  }

  /// The divisor that finds a word's block where whole_words() (1 otherwise: unused).
  [[nodiscard]] GRADCOMP_HOST_DEVICE index_divisor word_block() const {
    return index_divisor(whole_words() ? block * static_cast<unsigned>(bits) / 32 : 1);
  }
};

/// Word w of the `bytes`-byte packed array at `codes`, 4-byte aligned (bytes past the array read
/// as zero: the last word is read byte by byte, never past the array).
__device__ inline std::uint32_t load_code_word(const std::byte* codes, std::uint64_t w, std::uint64_t bytes) {
  const std::uint64_t first = 4 * w;
  if (first + 4 <= bytes) return *reinterpret_cast<const std::uint32_t*>(codes + first);
  std::uint32_t word = 0;
  for (std::uint64_t b = first; b < bytes; ++b)
    word |= std::uint32_t{static_cast<std::uint8_t>(codes[b])} << (8 * (b - first));
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

/// Code c of a word of `bits`-bit codes.
__device__ inline std::uint8_t code_in_word(std::uint32_t word, unsigned c, int bits) {
  return static_cast<std::uint8_t>((word >> (c * static_cast<unsigned>(bits))) & ((1u << bits) - 1u));
}

/// Values of an item of the wide check: four quads, whose 4- or 8-bit codes are 8 or 16 bytes.
inline constexpr unsigned item_values = 4 * quad_values;

/// The b-bit codes of an item's values: value e's code is bits [e·b, e·b + b) of hi:lo (the
/// packed array's little-endian order). Two 64-bit halves rather than an array of words, so that
/// a code found by a run-time shift stays in registers.
struct item_codes {
  std::uint64_t lo = 0;  ///< Bits 0–63.
  std::uint64_t hi = 0;  ///< Bits 64–127 (8-bit codes only).

  /// Code e (< 16) of `bits`-bit codes.
  [[nodiscard]] GRADCOMP_HOST_DEVICE std::uint8_t code(unsigned e, int bits) const {
    const unsigned at = e * static_cast<unsigned>(bits);
    const std::uint64_t part = at < 64 ? lo >> at : hi >> (at - 64);
    return static_cast<std::uint8_t>(part & ((1u << bits) - 1u));
  }
  /// Whether any bit at or above `used` (< 128) is set.
  [[nodiscard]] GRADCOMP_HOST_DEVICE bool any_from(unsigned used) const {
    return used < 64 ? ((lo >> used) | hi) != 0 : (hi >> (used - 64)) != 0;
  }
};

/// The largest of 16, 8 and 4 that divides the address of `p` (the codes start 4-byte aligned).
[[nodiscard]] inline unsigned code_alignment(const std::byte* p) noexcept {
  const auto address = reinterpret_cast<std::uintptr_t>(p);
  return address % 16 == 0 ? 16u : address % 8 == 0 ? 8u : 4u;
}

/// The codes of item t (values 16t … 16t + 15) of the `bytes`-byte packed array of `bits`-bit
/// codes (4 or 8) at `codes`: 2b bytes from byte 2b·t, by the widest loads `align`
/// (code_alignment) allows. Bytes past the array read as zero: an item that reaches past it is
/// read byte by byte.
__device__ inline item_codes load_item_codes(const std::byte* codes, std::uint64_t t, int bits, unsigned align,
                                             std::uint64_t bytes) {
  const unsigned size = 2u * static_cast<unsigned>(bits);  // 8 or 16
  const std::uint64_t first = t * size;
  const std::byte* const at = codes + first;
  item_codes c;
  if (first + size > bytes) {
#pragma unroll
    for (unsigned k = 0; k < 16; ++k)
      if (k < size && first + k < bytes)
        (k < 8 ? c.lo : c.hi) |= std::uint64_t{static_cast<std::uint8_t>(at[k])} << (8 * (k % 8));
    return c;
  }
  const auto word = [&](unsigned k) { return std::uint64_t{reinterpret_cast<const std::uint32_t*>(at)[k]}; };
  if (size == 16 && align == 16) {
    const uint4 v = *reinterpret_cast<const uint4*>(at);
    c.lo = v.x | std::uint64_t{v.y} << 32;
    c.hi = v.z | std::uint64_t{v.w} << 32;
  } else if (align >= 8) {
    c.lo = reinterpret_cast<const std::uint64_t*>(at)[0];
    if (size == 16) c.hi = reinterpret_cast<const std::uint64_t*>(at)[1];
  } else {
    c.lo = word(0) | word(1) << 32;
    if (size == 16) c.hi = word(2) | word(3) << 32;
  }
  return c;
}

/// Word i of a random stream, keeping the last Philox block so that consecutive words cost one
/// call per four.
struct philox_cache {
  std::uint64_t block = UINT64_MAX;  ///< Index of the block held.
  philox_block words{};              ///< Its words.

  __device__ std::uint32_t word(const random_stream& stream, std::uint64_t i) {
    if (i / 4 != block) {
      block = i / 4;
      words = stream.block(block);
    }
    // Selected without a run-time array index, so that the words stay in registers.
    const auto k = static_cast<unsigned>(i % 4);
    return k < 2 ? (k == 0 ? words.word[0] : words.word[1]) : (k == 2 ? words.word[2] : words.word[3]);
  }
};

/// The values a kernel reads, element by element: those at a pointer, as they are. (Error feedback
/// codes g + e instead and keeps what each code leaves: cuda/error_feedback.cuh.)
template <class T>
struct plain_values {
  const T* x;

  __device__ T operator()(std::uint64_t i) const { return x[i]; }
  /// Called with each value and its decoding, once coded (nothing to keep here).
  __device__ void coded(std::uint64_t, T, T) const {}

  /// Whether the quad kernels may read with 128-bit loads.
  [[nodiscard]] bool aligned() const { return vector_aligned(x); }
  /// Reads the calling lane's quads of the block from element `begin`.
  __device__ void load(std::uint64_t begin, bool vector, lane_quads<T>& h) const { h.load(x + begin, vector); }
  /// Called with each quad (its first element, how many of its values lie in the block, the values
  /// and their decodings) once coded: nothing to keep here.
  __device__ void coded_quad(std::uint64_t, unsigned, bool, const T (&)[quad_values], const T (&)[quad_values]) const {}
};

/// Largest magnitude key of values(i) for begin ≤ i < end, on every lane of the calling warp.
template <class Values>
__device__ auto warp_max_key(const Values& values, std::uint64_t begin, std::uint64_t end) {
  decltype(magnitude_key(values(begin))) largest = 0;
  for (std::uint64_t i = begin + lane_id(); i < end; i += 32) {
    const auto key = magnitude_key(values(i));
    largest = key > largest ? key : largest;
  }
  return warp_max(largest);
}

/// Records `non_finite_input` at the first NaN or Inf of values(i), begin ≤ i < end (the calling
/// warp's block, known to hold one).
template <class Values>
__device__ void record_non_finite(const Values& values, std::uint64_t begin, std::uint64_t end, device_status* status) {
  for (std::uint64_t i = begin + lane_id(); i < end; i += 32)
    if (!is_finite(values(i))) {
      record_failure(status, errc::non_finite_input, i);
      return;
    }
}

/// One warp per block: the block's largest magnitude m (0 for a block holding NaN or Inf, whose
/// first such value is recorded as `non_finite_input`), then on lane 0 `stat(j, x, count, m,
/// status)`, which writes the block's scale (and whatever else its encoder needs).
template <class T, class Stat>
struct block_statistics {
  const T* g;
  block_layout layout;
  Stat stat;
  device_status* status;

  __device__ void operator()(std::uint64_t j) const {
    const std::uint64_t begin = j * layout.block;
    const std::uint64_t count = layout.count(j);
    const auto largest = warp_max_key(plain_values<T>{g}, begin, begin + count);
    const bool finite = largest < float_traits<T>::infinity_key;
    if (!finite) record_non_finite(plain_values<T>{g}, begin, begin + count, status);
    if (lane_id() == 0) stat(j, g + begin, count, finite ? from_bits<T>(largest) : T{0}, status);
  }
};

/// One warp per 32 consecutive blocks, for the scales that sum a block in the documented order
/// (`Stat::sum_type`, e.g. sign_magnitude_sum): the blocks are staged in shared memory a 128-byte
/// column chunk at a time with coalesced loads (tiles, cuda/detail/lane_layout.cuh), and lane b finds
/// block b's largest magnitude m and adds its values to its sum in index order (after a first
/// pass for m when the terms need it). Lane b then calls `stat(j, sum, count, m, status)`, which
/// writes the block's scale; a block holding NaN or Inf gets m = 0 and its first such value is
/// recorded as `non_finite_input`.
template <class T, class Stat>
__global__ void block_sums_kernel(const T* g, block_layout layout, Stat stat, device_status* status) {
  using sum_type = typename Stat::sum_type;
  constexpr unsigned columns = tile_columns<T>;
  __shared__ T tiles[block_warps][32][columns + 1];  // + 1: lane b's reads of row b hit distinct banks
  T(&tile)[32][columns + 1] = tiles[threadIdx.x / 32];
  const unsigned lane = lane_id();
  const std::uint64_t blocks = layout.blocks();
  for (std::uint64_t first = warp_id() * 32; first < blocks; first += warp_count() * 32) {
    const std::uint64_t j = first + lane;  // this lane's block
    const std::uint64_t count = j < blocks ? layout.count(j) : 0;
    const std::uint64_t length = tile_length(layout.n, layout.block, first);  // the same on every lane
    const auto for_each_value = [&](auto&& f) {  // f(x) for the values of block j, in index order
      for (std::uint64_t k = 0; k < length; k += columns) {
        const unsigned column = tile_column<T>(lane);
#pragma unroll 8
        for (unsigned step = 0; step < columns; ++step) {
          const unsigned row = tile_row<T>(step, lane);
          const std::uint64_t i = tile_element(layout.n, layout.block, first, row, k, column);
          if (i != no_element) tile[row][column] = g[i];
        }
        __syncwarp();
        for (unsigned c = 0; c < columns && k + c < count; ++c) f(tile[lane][c]);
        __syncwarp();
      }
    };
    typename float_traits<T>::bits_type largest = 0;
    const auto find_largest = [&](T x) {
      const auto key = magnitude_key(x);
      largest = key > largest ? key : largest;
    };
    const auto finite_max = [&] { return largest < float_traits<T>::infinity_key ? from_bits<T>(largest) : T{0}; };
    sum_type sum(T{0});
    if constexpr (sum_type::needs_max) {
      for_each_value(find_largest);
      sum = sum_type(finite_max());
      for_each_value([&](T x) { sum.add(x); });
    } else {
      for_each_value([&](T x) {
        find_largest(x);
        sum.add(x);
      });
    }
    if (count == 0) continue;
    if (largest >= float_traits<T>::infinity_key)
      for (std::uint64_t i = j * layout.block; i < j * layout.block + count; ++i)
        if (!is_finite(g[i])) {
          record_failure(status, errc::non_finite_input, i);
          break;
        }
    stat(j, sum, count, finite_max(), status);
  }
}

/// Queues the per-block statistic `stat` over the gradient `g`: block_sums_kernel for the scales
/// that sum their block (`Stat::sum_type`), block_statistics (a warp per block) for the others.
template <class T, class Stat>
void for_each_block_statistic(const cuda_executor& exec, const T* g, const block_layout& layout, const Stat& stat,
                              device_status* status) {
  if constexpr (requires { typename Stat::sum_type; }) {
    const std::uint64_t groups = (layout.blocks() + 31) / 32;
    if (groups != 0)
      launch(exec, grid_for(groups, block_warps), block_threads, block_sums_kernel<T, Stat>, g, layout, stat, status);
  } else {
    for_each_block(exec, layout.blocks(), block_statistics<T, Stat>{g, layout, stat, status});
  }
}

/// One thread per code word: the codes `rule.code(x, i, j, random)` of its values packed.
template <class T, class Rule>
struct encode_words {
  const T* g;
  block_layout layout;
  Rule rule;
  std::byte* codes;

  __device__ void operator()(std::uint64_t w) const {
    std::uint32_t word = 0;
    philox_cache random;
    layout.for_each_in_word(w, [&](std::uint64_t i, unsigned c, std::uint64_t j) {
      word |= std::uint32_t{rule.code(g[i], i, j, random)} << (c * static_cast<unsigned>(layout.bits));
    });
    store_code_word(codes, w, word, layout.code_bytes);
  }
};

/// What the block-code check and decoder kernels read: a message's scales and packed codes, their
/// layout and the codec's per-value rule.
template <class T, class Rule>
struct coded_blocks {
  block_layout layout;
  Rule rule;
  const T* scales;
  const std::byte* codes;
  index_divisor word_block;  ///< layout.word_block().
  std::uint64_t blocks;      ///< layout.blocks(), divided once on the host.

  /// Records `bad_scale` where scale t (< blocks) fails `rule.valid_scale`: the checks run a
  /// thread per item, and item t also checks scale t.
  __device__ void check_scale(std::uint64_t t, device_status* status) const {
    if (t < blocks && !rule.valid_scale(scales[t])) record_failure(status, errc::malformed_payload, t, bad_scale);
  }
};

/// One thread per code word: scale t and the codes of word t (`rule.valid_code` for each, zero
/// padding bits after the last), recording failures. The check of 1- and 2-bit codes (32 and 16
/// values a word: the sign check took 149 µs by words, 263 µs by items of 16 on an H200), and of
/// blocks that share words; 4- and 8-bit codes in whole words take check_items.
template <class T, class Rule>
struct check_codes {
  coded_blocks<T, Rule> in;
  device_status* status;

  /// Items to check: the larger of the scale and word counts.
  [[nodiscard]] std::uint64_t items() const { return std::max(in.layout.words(), in.blocks); }

  __device__ void operator()(std::uint64_t t) const {
    in.check_scale(t, status);
    const block_layout& layout = in.layout;
    if (t >= layout.words()) return;
    const std::uint32_t word = load_code_word(in.codes, t, layout.code_bytes);
    unsigned used = 0;
    const auto check = [&](std::uint64_t i, unsigned c, T s) {
      used = c + 1;
      if (!in.rule.valid_code(code_in_word(word, c, layout.bits), s))
        record_failure(status, errc::malformed_payload, i, bad_code);
    };
    if (layout.whole_words()) {
      const T s = in.scales[in.word_block(t)];
      layout.for_each_in_whole_word(t, in.word_block,
                                    [&](std::uint64_t i, unsigned c, std::uint64_t) { check(i, c, s); });
    } else {
      layout.for_each_in_word(t, [&](std::uint64_t i, unsigned c, std::uint64_t j) { check(i, c, in.scales[j]); });
    }
    if (used < layout.per_word() && (word >> (used * static_cast<unsigned>(layout.bits))) != 0)
      record_failure(status, errc::malformed_payload, layout.n, bad_padding);
  }
};

/// check_codes for `Bits`-bit codes (4 or 8, a compile-time constant) where every word lies in one
/// block (`fits`): one thread per item of 16 values, whose 8 or 16 code bytes come by the widest
/// loads their alignment allows (`load_item_codes`), each quad's scale found once, and its codes
/// tested by constant shifts without a branch; the failing ones are looked for only when one
/// fails. On an H200 the 8-bit check of 2^28 codes took 519 µs at a word per thread, 201 µs by
/// items with the width read at run time (docs/cuda.md §8.8, §8.9).
template <class T, class Rule, int Bits>
struct check_items {
  static_assert(Bits == 4 || Bits == 8);
  coded_blocks<T, Rule> in;
  device_status* status;
  unsigned align;  ///< code_alignment(in.codes).

  /// Whether `layout` is checked by items.
  [[nodiscard]] static bool fits(const block_layout& layout) { return layout.bits == Bits && layout.whole_words(); }

  /// Items to check: the larger of the scale and item counts.
  [[nodiscard]] std::uint64_t items() const {
    return std::max((in.layout.n + item_values - 1) / item_values, in.blocks);
  }

  /// Item t (values 16t … 16t + 15, fewer at the end); the padding bits, all in the last byte,
  /// belong to the last item.
  __device__ void operator()(std::uint64_t t) const {
    in.check_scale(t, status);
    const std::uint64_t first = t * item_values;
    const std::uint64_t n = in.layout.n;
    if (first >= n) return;
    const auto count = static_cast<unsigned>(n - first < item_values ? n - first : item_values);
    const item_codes c = load_item_codes(in.codes, t, Bits, align, in.layout.code_bytes);
    // The scale of value e's quad (e < count).
    const auto scale = [&](unsigned e) {
      return in.scales[in.word_block((first + e / quad_values * quad_values) * Bits / 32)];
    };
    bool all_valid = true;
#pragma unroll
    for (unsigned q = 0; q < item_values / quad_values; ++q) {
      if (q * quad_values >= count) break;
      const T s = scale(q * quad_values);
#pragma unroll
      for (unsigned e = q * quad_values; e < (q + 1) * quad_values; ++e)
        all_valid &= e >= count || in.rule.valid_code(c.code(e, Bits), s);
    }
    if (!all_valid)  // find them: a corrupted or hostile message
      for (unsigned e = 0; e < count; ++e)
        if (!in.rule.valid_code(c.code(e, Bits), scale(e)))
          record_failure(status, errc::malformed_payload, first + e, bad_code);
    if (count < item_values && c.any_from(count * Bits))
      record_failure(status, errc::malformed_payload, n, bad_padding);
  }
};

/// `rule.value(code, scale)` of every element written into `out`, or added to it when
/// `accumulate`, one thread per code word, value by value: the decoder of blocks that share words
/// and of outputs not 16-byte aligned; the others take decode_quads.
template <class T, class Rule>
struct decode_words {
  coded_blocks<T, Rule> in;
  T* out;
  bool accumulate;

  /// Items to decode: code words.
  [[nodiscard]] std::uint64_t items() const { return in.layout.words(); }

  __device__ void operator()(std::uint64_t t) const {
    const block_layout& layout = in.layout;
    const std::uint32_t word = load_code_word(in.codes, t, layout.code_bytes);
    const auto write = [&](std::uint64_t i, unsigned c, T s) {
      const T v = in.rule.value(code_in_word(word, c, layout.bits), s);
      out[i] = accumulate ? out[i] + v : v;
    };
    if (layout.whole_words()) {
      const T s = in.scales[in.word_block(t)];
      layout.for_each_in_whole_word(t, in.word_block,
                                    [&](std::uint64_t i, unsigned c, std::uint64_t) { write(i, c, s); });
    } else {
      layout.for_each_in_word(t, [&](std::uint64_t i, unsigned c, std::uint64_t j) { write(i, c, in.scales[j]); });
    }
  }
};

/// decode_words where every word's values lie in one block (B·b a multiple of 32) and `out` is
/// 16-byte aligned (`fits`): one thread per quad of 4 values. It reads the code word holding them
/// (the lanes sharing a word read it together), its block's scale, and writes the quad by one
/// 128-bit store, so a warp's stores are 512 contiguous bytes whatever the code width (one thread
/// per word of 1-bit codes would store 32 values, 128 bytes apart from its neighbours'). `Bits` is
/// the code width where it is a compile-time constant (8 or 4), else 0 (read from the layout).
template <class T, class Rule, int Bits>
struct decode_quads {
  coded_blocks<T, Rule> in;
  T* out;
  bool accumulate;

  /// Whether `layout` decodes into `out` by quads.
  [[nodiscard]] static bool fits(const block_layout& layout, const T* out) {
    return layout.whole_words() && vector_aligned(out);
  }

  /// Items to decode: quads.
  [[nodiscard]] std::uint64_t items() const { return (in.layout.n + quad_values - 1) / quad_values; }

  /// Quad q: elements 4q … 4q + 3 (fewer at the end), codes 4q mod (32/b) onwards of one word.
  __device__ void operator()(std::uint64_t q) const {
    const unsigned bits = Bits != 0 ? static_cast<unsigned>(Bits) : static_cast<unsigned>(in.layout.bits);
    const std::uint64_t n = in.layout.n;
    const std::uint64_t first = q * quad_values;
    // 32/b codes per word (4, 8, 16 or 32: a power of two, a multiple of the quad), not divided at
    // run time.
    const unsigned per_word = Bits != 0 ? 32u / Bits : static_cast<unsigned>(in.layout.per_word());
    const std::uint64_t w = first * bits / 32;
    const std::uint32_t word = load_code_word(in.codes, w, in.layout.code_bytes);
    const auto c = static_cast<unsigned>(first & (per_word - 1));
    const T s = in.scales[in.word_block(w)];
    const auto value = [&](unsigned e) { return in.rule.value(code_in_word(word, c + e, static_cast<int>(bits)), s); };
    T* const at = out + first;
    if (first + quad_values <= n) {
      T v[quad_values]{};
      if (accumulate) load_quad(at, quad_values, true, v);
#pragma unroll
      for (unsigned e = 0; e < quad_values; ++e) v[e] = accumulate ? v[e] + value(e) : value(e);
      store_quad(at, quad_values, true, v);
      return;
    }
    for (std::uint64_t i = first; i < n; ++i) {
      const T x = value(static_cast<unsigned>(i - first));
      out[i] = accumulate ? out[i] + x : x;
    }
  }
};

/// The detail text of a failed block-code check.
inline std::string describe_block_code_failure(std::uint64_t position, std::uint32_t reason, const char* scale_name) {
  switch (reason) {
    case bad_scale:
      return std::string(scale_name) + " of block " + std::to_string(position) +
             " is negative, not finite or too large";
    case bad_code:
      return "the code of element " + std::to_string(position) + " is not allowed under its block's " + scale_name;
    default: return "non-zero padding bits after the last code";
  }
}

/// The scales of a block-coded message (`message` is its first byte: the scales follow the envelope).
template <class T, class Byte>
auto* scales_of(Byte* message) {
  using scale_type = std::conditional_t<std::is_const_v<Byte>, const T, T>;
  return reinterpret_cast<scale_type*>(message + envelope::size);
}
/// The packed codes of a block-coded message, after its scales.
template <class T, class Byte>
Byte* codes_of(Byte* message, const block_layout& layout) {
  return message + envelope::size + layout.blocks() * sizeof(T);
}

/// Encodes with the shared kernels and seals: a warp per block runs the statistic
/// `make_stat(arena, scales)` returns (which writes the block's scale, and may take scratch from
/// the workspace), then one thread per code word codes under the rule `make_rule(stat)`
/// returns. The sign and QSGD encoders, and the uniform one whose blocks share code words.
template <class Codec, class MakeStat, class MakeRule, class Describe>
std::size_t encode_block_coded(const Codec& codec, const cuda_executor& exec,
                               std::span<const typename Codec::value_type> grad, std::span<std::byte> out,
                               std::span<std::byte> ws, message_key key, const block_layout& layout, MakeStat make_stat,
                               MakeRule make_rule, Describe&& describe) {
  using T = typename Codec::value_type;
  const std::uint64_t n = grad.size();
  const std::size_t size = codec.max_encoded_bytes(n);
  workspace_arena arena(ws);
  const operation op(exec, arena);
  const crc_scratch crc = carve_seal(arena, codec.wire().payload_checksum);
  const auto stat = make_stat(arena, scales_of<T>(out.data()));
  begin_message(exec, out, size);  // after the workspace is carved: a refused call writes nothing
  for_each_block_statistic(exec, grad.data(), layout, stat, op.status());
  const auto rule = make_rule(stat);
  for_each_item(exec, layout.words(),
                encode_words<T, std::decay_t<decltype(rule)>>{grad.data(), layout, rule,
                                                              codes_of<T>(out.data(), layout)});
  seal_message(exec, out.data(), {Codec::id, dtype_of<T>, 0, 0, key, n, codec.payload_bytes(n), codec.params_hash(), 0},
               crc, op);
  op.finish_encode(std::forward<Describe>(describe));
  return size;
}

/// Decodes a block-coded message (uniform, sign, QSGD): the envelope read and checked on the host,
/// every scale and code checked on the device, then the values written or added.
/// `layout_of(n)` and `rule_of(key)` give the message's layout and per-value rule; `scale_name`
/// names the scales in errors.
template <class Codec, class LayoutOf, class RuleOf>
void decode_block_coded(const Codec& codec, const cuda_executor& exec, std::span<const std::byte> message,
                        std::span<typename Codec::value_type> out, std::span<std::byte> ws, const decode_limits& limits,
                        bool accumulate, LayoutOf layout_of, RuleOf rule_of, const char* scale_name) {
  using T = typename Codec::value_type;
  workspace_arena arena(ws);
  const operation op(exec, arena);
  const crc_scratch crc = crc_scratch::carve(arena);
  const envelope e =
      read_envelope(exec, message, {Codec::id, dtype_of<T>, out.size(), codec.params_hash()}, limits, crc);
  codec.validate_payload_size(e);
  const block_layout layout = layout_of(e.elements);
  const T* const scales = scales_of<T>(message.data());
  const std::byte* const codes = codes_of<T>(message.data(), layout);
  const auto rule = rule_of(e.key);
  using rule_type = std::decay_t<decltype(rule)>;
  const coded_blocks<T, rule_type> in{layout, rule, scales, codes, layout.word_block(), layout.blocks()};
  const auto run = [&](const auto& kernel) { for_each_item(exec, kernel.items(), kernel); };
  if (check_items<T, rule_type, 8>::fits(layout))
    run(check_items<T, rule_type, 8>{in, op.status(), code_alignment(codes)});
  else if (check_items<T, rule_type, 4>::fits(layout))
    run(check_items<T, rule_type, 4>{in, op.status(), code_alignment(codes)});
  else
    run(check_codes<T, rule_type>{in, op.status()});
  op.finish([scale_name](errc, std::uint64_t position, std::uint32_t reason) {
    return describe_block_code_failure(position, reason, scale_name);
  });
  T* const to = out.data();
  if (!decode_quads<T, rule_type, 0>::fits(layout, to)) run(decode_words<T, rule_type>{in, to, accumulate});
  else if (layout.bits == 8)
    run(decode_quads<T, rule_type, 8>{in, to, accumulate});
  else if (layout.bits == 4)
    run(decode_quads<T, rule_type, 4>{in, to, accumulate});
  else
    run(decode_quads<T, rule_type, 0>{in, to, accumulate});
}

}  // namespace gradcomp::detail::cuda
