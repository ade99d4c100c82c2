#pragma once
/// @file
/// What the CUDA backends of the block-scaled quantizers (uniform, sign, QSGD) share. Their
/// payload is one scale per block of B values (B = block or bucket, value dtype) followed by the
/// packed b-bit codes (core/bit_packing.hpp order); the codes start 4-byte aligned, since device
/// messages start on 8 bytes and the envelope and the scales take a multiple of 4 bytes.
///
/// The shared kernels (cuda/grid.cuh shapes): a warp per block finds the block's largest magnitude
/// (recording the first NaN or Inf) and lane 0 writes the block's scale; then one thread per
/// 32-bit code word codes its 32/b values, each under its own block's scale (`encode_words`); a
/// decoder checks every scale and code (`check_codes`), and once the host has the verdict writes
/// or adds each value (`decode_words`). A codec supplies the per-value rule: its code, whether a
/// code is valid under a scale, and the value it decodes to.

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
#include <gradcomp/cuda/grid.cuh>
#include <gradcomp/cuda/message.cuh>
#include <gradcomp/cuda/operation.cuh>
#include <gradcomp/cuda/warp.cuh>

namespace gradcomp::cuda_detail {

/// Reasons a block-coded payload fails its check (the low byte of `device_status::detail`).
enum block_code_reason : std::uint32_t {
  bad_scale = 1,    ///< A scale (or norm) that is negative or not finite (or too large to decode).
  bad_code = 2,     ///< A code that its block's scale does not allow.
  bad_padding = 3,  ///< Non-zero bits after the last code.
};

/// Sizes of a block-coded payload.
struct block_layout {
  std::uint64_t n;           ///< Elements.
  std::uint64_t block;       ///< Values per scale.
  int bits;                  ///< Bits per code (1, 2, 4 or 8).
  std::uint64_t code_bytes;  ///< Bytes of the packed codes (⌈n·b/8⌉).

  /// Number of blocks (and scales).
  [[nodiscard]] __host__ __device__ std::uint64_t blocks() const { return (n + block - 1) / block; }
  /// Codes per 32-bit word.
  [[nodiscard]] __host__ __device__ std::uint64_t per_word() const { return 32u / static_cast<unsigned>(bits); }
  /// Code words (the last may be partial).
  [[nodiscard]] __host__ __device__ std::uint64_t words() const { return (n + per_word() - 1) / per_word(); }
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
};

/// Word w of the `bytes`-byte packed array at `codes`, 4-byte aligned (bytes past the array read
/// as zero: the last word is read byte by byte, never past the array).
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

/// Code c of a word of `bits`-bit codes.
__device__ inline std::uint8_t code_in_word(std::uint32_t word, unsigned c, int bits) {
  return static_cast<std::uint8_t>((word >> (c * static_cast<unsigned>(bits))) & ((1u << bits) - 1u));
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
    return words.word[i % 4];
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

/// One thread per item: scale t (`rule.valid_scale`) and code word t (`rule.valid_code` for each
/// code, zero padding bits), recording failures.
template <class T, class Rule>
struct check_codes {
  block_layout layout;
  Rule rule;
  const T* scales;
  const std::byte* codes;
  device_status* status;

  /// Items to check: the larger of the scale and word counts.
  [[nodiscard]] std::uint64_t items() const { return layout.words() > layout.blocks() ? layout.words() : layout.blocks(); }

  __device__ void operator()(std::uint64_t t) const {
    if (t < layout.blocks() && !rule.valid_scale(scales[t])) record_failure(status, errc::malformed_payload, t, bad_scale);
    if (t >= layout.words()) return;
    const std::uint32_t word = load_code_word(codes, t, layout.code_bytes);
    unsigned used = 0;
    layout.for_each_in_word(t, [&](std::uint64_t i, unsigned c, std::uint64_t j) {
      used = c + 1;
      if (!rule.valid_code(code_in_word(word, c, layout.bits), scales[j]))
        record_failure(status, errc::malformed_payload, i, bad_code);
    });
    if (used < layout.per_word() && (word >> (used * static_cast<unsigned>(layout.bits))) != 0)
      record_failure(status, errc::malformed_payload, layout.n, bad_padding);
  }
};

/// One thread per code word: `rule.value(code, scale)` of its values written into `out`, or added
/// to it when `accumulate`.
template <class T, class Rule>
struct decode_words {
  block_layout layout;
  Rule rule;
  const T* scales;
  const std::byte* codes;
  T* out;
  bool accumulate;

  __device__ void operator()(std::uint64_t w) const {
    const std::uint32_t word = load_code_word(codes, w, layout.code_bytes);
    layout.for_each_in_word(w, [&](std::uint64_t i, unsigned c, std::uint64_t j) {
      const T v = rule.value(code_in_word(word, c, layout.bits), scales[j]);
      out[i] = accumulate ? out[i] + v : v;
    });
  }
};

/// The detail text of a failed block-code check.
inline std::string describe_block_code_failure(std::uint64_t position, std::uint32_t reason, const char* scale_name) {
  switch (reason) {
    case bad_scale: return std::string(scale_name) + " of block " + std::to_string(position) + " is negative, not finite or too large";
    case bad_code: return "the code of element " + std::to_string(position) + " is not allowed under its block's " + scale_name;
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
std::size_t encode_block_coded(const Codec& codec, const cuda_executor& exec, std::span<const typename Codec::value_type> grad,
                               std::span<std::byte> out, std::span<std::byte> ws, message_key key, const block_layout& layout,
                               MakeStat make_stat, MakeRule make_rule, Describe&& describe) {
  using T = typename Codec::value_type;
  const std::uint64_t n = grad.size();
  const std::size_t size = codec.max_encoded_bytes(n);
  workspace_arena arena(ws);
  const operation op(exec, arena);
  const crc_scratch crc = carve_seal(arena, codec.wire().payload_checksum);
  const auto stat = make_stat(arena, scales_of<T>(out.data()));
  begin_message(exec, out, size);  // after the workspace is carved: a refused call writes nothing
  for_each_block(exec, layout.blocks(), block_statistics<T, std::decay_t<decltype(stat)>>{grad.data(), layout, stat, op.status()});
  const auto rule = make_rule(stat);
  for_each_item(exec, layout.words(),
                encode_words<T, std::decay_t<decltype(rule)>>{grad.data(), layout, rule, codes_of<T>(out.data(), layout)});
  seal_message(exec, out.data(), {Codec::id, dtype_of<T>, 0, 0, key, n, codec.payload_bytes(n), codec.params_hash(), 0}, crc, op);
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
  const envelope e = read_envelope(exec, message, {Codec::id, dtype_of<T>, out.size(), codec.params_hash()}, limits, crc);
  codec.validate_payload_size(e);
  const block_layout layout = layout_of(e.elements);
  const T* const scales = scales_of<T>(message.data());
  const std::byte* const codes = codes_of<T>(message.data(), layout);
  const auto rule = rule_of(e.key);
  using rule_type = std::decay_t<decltype(rule)>;
  const check_codes<T, rule_type> check{layout, rule, scales, codes, op.status()};
  for_each_item(exec, check.items(), check);
  op.finish([scale_name](errc, std::uint64_t position, std::uint32_t reason) {
    return describe_block_code_failure(position, reason, scale_name);
  });
  for_each_item(exec, layout.words(), decode_words<T, rule_type>{layout, rule, scales, codes, out.data(), accumulate});
}

}  // namespace gradcomp::cuda_detail
