#pragma once
/// @file
/// The uniform quantizer on the GPU, byte-identical to the CPU backend (quantize/uniform_math.hpp
/// is the arithmetic of both).
///
/// Encode. When a block's codes fill whole 32-bit words (B·b a multiple of 32, as for the default
/// B = 256), one kernel gives each block one warp. For 8- and 4-bit codes and blocks of at most
/// 256 values (a multiple of 8), the warp holds the block in registers (quads,
/// cuda/detail/lane_layout.cuh): each lane reads its two quads once (128-bit loads where the gradient is
/// 16-byte aligned), the warp's largest magnitude gives the scale (and finds NaN and Inf), and each
/// lane codes its quads from registers, stochastic rounding drawing one Philox block per lane, and
/// stores whole code words. For other whole-word blocks the lanes read the block for its largest
/// magnitude and then code whole words of 32/b consecutive values (the second read of the block
/// hits L1). Otherwise the shared block-code kernels run (cuda/detail/block_codes.cuh): scales and
/// largest magnitudes first, then word by word. The payload is sealed on the device once the
/// codes are written.
///
/// Decode. The envelope is read and checked on the host; a kernel checks every scale and code
/// (the all-ones code, padding bits), the host reads its verdict, and only then code·s is written
/// (or added) for each value.

#include <gradcomp/cuda/config.cuh>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>

#include <gradcomp/core/backend.hpp>
#include <gradcomp/core/bit_packing.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/float_bits.hpp>
#include <gradcomp/core/philox.hpp>
#include <gradcomp/core/rounded_product.hpp>
#include <gradcomp/core/wire_envelope.hpp>
#include <gradcomp/core/workspace.hpp>
#include <gradcomp/cuda/detail/block_codes.cuh>
#include <gradcomp/cuda/executor.cuh>
#include <gradcomp/cuda/detail/grid.cuh>
#include <gradcomp/cuda/detail/message.cuh>
#include <gradcomp/cuda/detail/operation.cuh>
#include <gradcomp/cuda/detail/warp.cuh>
#include <gradcomp/quantize/sign_math.hpp>
#include <gradcomp/quantize/uniform.hpp>
#include <gradcomp/quantize/uniform_math.hpp>

namespace gradcomp {

namespace detail::cuda {

/// The coding of one block: its largest magnitude m, step s, and L/m when that is finite.
template <class T>
struct uniform_block_coding {
  T s;
  T inv;
  bool multiply;  ///< t = x·(L/m); never with s = 0 (then m < L·2^−150 for float, and L/m overflows).

  __device__ uniform_block_coding(T m, T step, int bits) : s(step) {
    const auto levels = static_cast<T>(uniform_levels(bits));
    inv = m > T{0} ? levels / m : T{0};
    multiply = s != T{0} && m > T{0} && is_finite(inv);
  }

  /// The scaled value t of x that the level rounds: 0 under a zero step, else x·(L/m), or x/s
  /// when L/m overflows (the CPU's uniform_scalar_codes).
  __device__ T scaled(T x) const { return multiply ? mul_rn(x, inv) : quotient(x, s); }
  /// t where the product does not apply: 0 under a zero step, else x/s.
  __device__ static T quotient(T x, T step) { return step == T{0} ? T{0} : x / step; }
};

/// The per-value rule of the uniform quantizer: codes as the CPU's uniform_scalar_codes computes
/// them (stochastic rounding draws half i mod 2 of stream word ⌊i/2⌋), values code·s, and the
/// checks of the CPU decoder.
template <class T>
struct uniform_rule {
  int bits;
  rounding mode;
  random_stream stream;
  const T* maxima;  ///< Per-block largest magnitudes (the word-by-word encoder only).
  const T* scales;  ///< Per-block steps (the word-by-word encoder only).

  /// The uniform u ∈ [0, 1) of stochastic rounding from a 16-bit half of a stream word.
  __device__ static T uniform_of(std::uint32_t half) {
    return mul_rn(static_cast<T>(half), static_cast<T>(1.0 / 65536.0));
  }
  /// The code of x under a block's coding, stochastic rounding adding u.
  __device__ std::uint8_t code(T x, const uniform_block_coding<T>& b, T u) const {
    return uniform_code(uniform_level(b.scaled(x), bits, mode, u), bits);
  }
  __device__ std::uint8_t code(T x, std::uint64_t i, const uniform_block_coding<T>& b, philox_cache& random) const {
    T u = T{0};
    if (mode == rounding::stochastic) {
      const std::uint32_t w = random.word(stream, i / 2);
      u = uniform_of(i % 2 == 0 ? (w & 0xFFFFu) : (w >> 16));
    }
    return code(x, b, u);
  }
  __device__ std::uint8_t code(T x, std::uint64_t i, std::uint64_t j, philox_cache& random) const {
    return code(x, i, uniform_block_coding<T>(maxima[j], scales[j], bits), random);
  }
  __device__ bool valid_scale(T s) const {
    return sign_bit_of(s) == 0 && is_finite(s * static_cast<T>(uniform_levels(bits)));
  }
  __device__ bool valid_code(std::uint8_t c, T) const { return bits == 1 || c != (1u << bits) - 1u; }
  __device__ T value(std::uint8_t c, T s) const { return mul_rn(static_cast<T>(uniform_code_level(c, bits)), s); }
};

/// The stream words of stochastic rounding for a lane's quads of the block from element `begin`
/// (quads, cuda/detail/lane_layout.cuh): each lane computes one Philox block and swaps halves with its
/// partner lane. The whole warp calls this.
template <class T>
__device__ void quad_random(const uniform_rule<T>& rule, std::uint64_t begin, word_pair (&words)[quad_rows]) {
  const unsigned lane = lane_id();
  const philox_block own = rule.stream.block(quad_random_block(begin, lane));
  const word_pair sent = quad_random_sent(lane, own);
  const word_pair received{__shfl_xor_sync(0xFFFFFFFFu, sent.first, 1), __shfl_xor_sync(0xFFFFFFFFu, sent.second, 1)};
#pragma unroll
  for (unsigned r = 0; r < quad_rows; ++r) words[r] = quad_random_words(lane, r, own, received);
}

/// Codes the `count` values of a quad x under a block's coding, for a fixed width (8 or 4 bits)
/// and rounding mode (`random`: the quad's stream words, stochastic rounding only):
/// uniform_rule::code's arithmetic with nothing to branch on per value. `piece` gets the codes
/// packed from bit 0 (zero past the block), `decoded` their decoded values (of values past the
/// block too: the caller drops them).
template <int Bits, rounding Mode, class T>
__device__ void code_quad(const uniform_block_coding<T>& coding, const T (&x)[quad_values], unsigned count,
                          word_pair random, std::uint32_t& piece, T (&decoded)[quad_values]) {
  std::uint32_t codes = 0;
  const auto code_all = [&](auto scaled) {
#pragma unroll
    for (unsigned e = 0; e < quad_values; ++e) {
      const T u = Mode == rounding::stochastic ? uniform_rule<T>::uniform_of(quad_random_half(random, e)) : T{0};
      codes |= std::uint32_t{uniform_code(uniform_level(scaled(x[e]), Bits, Mode, u), Bits)} << (e * Bits);
    }
  };
  if (coding.multiply) code_all([&](T v) { return mul_rn(v, coding.inv); });
  else
    code_all([&](T v) { return uniform_block_coding<T>::quotient(v, coding.s); });  // tiny blocks
  piece = codes & quad_piece_mask(count, Bits);
#pragma unroll
  for (unsigned e = 0; e < quad_values; ++e)  // uniform_rule::value
    decoded[e] = mul_rn(static_cast<T>(uniform_code_level(code_in_word(codes, e, Bits), Bits)), coding.s);
}

/// Stores the code words of a lane's quads (`pieces`, from code_quad) of a block of `count`
/// values whose codes start at word `first_word` of the `bytes`-byte codes: 4-bit halves are
/// swapped with the partner lane first. The whole warp calls this.
template <int Bits>
__device__ void store_quad_words(std::byte* codes, std::uint64_t bytes, std::uint64_t first_word, std::uint64_t count,
                                 const std::uint32_t (&pieces)[quad_rows]) {
  const unsigned lane = lane_id();
  std::uint32_t partner[quad_rows] = {};
  if constexpr (Bits == 4)
#pragma unroll
    for (unsigned r = 0; r < quad_rows; ++r) partner[r] = __shfl_xor_sync(0xFFFFFFFFu, pieces[r], 1);
  const std::uint64_t words = (count * Bits + 31) / 32;
#pragma unroll
  for (unsigned slot = 0; slot < quad_rows; ++slot) {
    const int index = quad_word_index(Bits, lane, slot);
    if (index >= 0 && static_cast<std::uint64_t>(index) < words)
      store_code_word(codes, first_word + static_cast<unsigned>(index), quad_word(Bits, lane, slot, pieces, partner),
                      bytes);
  }
}

/// Calls f(bits, mode) with the quad kernels' width (8 or 4) and rounding mode as compile-time
/// constants (std::integral_constant), so that each kernel codes without branching on them.
template <class F>
void with_quad_constants(int bits, rounding mode, F&& f) {
  const auto with_bits = [&](auto b) {
    if (mode == rounding::stochastic) f(b, std::integral_constant<rounding, rounding::stochastic>{});
    else
      f(b, std::integral_constant<rounding, rounding::nearest_even>{});
  };
  if (bits == 8) with_bits(std::integral_constant<int, 8>{});
  else
    with_bits(std::integral_constant<int, 4>{});
}

/// One warp per block whose codes fill whole words: largest magnitude of the block's values
/// (recording the first NaN or Inf), scale, then the codes of whole words of consecutive values,
/// lane by lane (the second read of the block hits L1).
template <class T, class Values>
struct uniform_encode_blocks {
  Values values;
  block_layout layout;
  uniform_rule<T> rule;
  T* scales;
  std::byte* codes;
  device_status* status;

  __device__ void operator()(std::uint64_t j) const {
    const std::uint64_t begin = j * layout.block;
    const std::uint64_t end = begin + layout.count(j);
    const auto largest = warp_max_key(values, begin, end);
    if (largest >= float_traits<T>::infinity_key) {
      record_non_finite(values, begin, end, status);
      return;
    }
    const T m = from_bits<T>(largest);
    const uniform_block_coding<T> coding(m, uniform_step(m, layout.bits), layout.bits);
    if (lane_id() == 0) scales[j] = coding.s;
    const std::uint64_t per_word = layout.per_word();
    for (std::uint64_t first = begin + lane_id() * per_word; first < end; first += 32 * per_word) {
      const std::uint64_t last = first + per_word < end ? first + per_word : end;
      std::uint32_t word = 0;
      philox_cache random;
      for (std::uint64_t i = first; i < last; ++i) {
        const T x = values(i);
        const std::uint8_t c = rule.code(x, i, coding, random);
        word |= std::uint32_t{c} << ((i - first) * static_cast<unsigned>(layout.bits));
        values.coded(i, x, rule.value(c, coding.s));
      }
      store_code_word(codes, first / per_word, word, layout.code_bytes);
    }
  }
};

/// Codes a lane's quads of the block from element `begin` (code_quad, Bits-bit codes), drawing
/// stochastic rounding's words for them first (one Philox block per lane): `pieces[r]` gets quad
/// r's codes, and `coded(r, decoded)` is called with its decoded values. The whole warp calls this.
template <int Bits, rounding Mode, class T, class Coded>
__device__ void code_quads(const uniform_rule<T>& rule, const uniform_block_coding<T>& coding, std::uint64_t begin,
                           const lane_quads<T>& h, std::uint32_t (&pieces)[quad_rows], Coded&& coded) {
  word_pair random[quad_rows] = {};
  if constexpr (Mode == rounding::stochastic) quad_random(rule, begin, random);
#pragma unroll
  for (unsigned r = 0; r < quad_rows; ++r) {
    T decoded[quad_values];
    code_quad<Bits, Mode>(coding, h.x[r], h.count[r], random[r], pieces[r], decoded);
    coded(r, decoded);
  }
}

/// One warp per block of Bits-bit codes (8 or 4) and at most 256 values, held in registers
/// (quads, cuda/detail/lane_layout.cuh), with the operands of uniform_encode_blocks: each lane reads its
/// quads once (128-bit loads when `vector`), the warp's largest magnitude (recording the first
/// NaN or Inf) gives the scale, and the lanes code from registers, stochastic rounding drawing one
/// Philox block per lane, and store whole code words.
template <class T, class Values, int Bits, rounding Mode>
struct uniform_encode_quads {
  uniform_encode_blocks<T, Values> step;  ///< The values, layout, rule and outputs.
  bool vector;                            ///< Every pointer of `step.values` is 16-byte aligned.

  __device__ void operator()(std::uint64_t j) const {
    const std::uint64_t begin = j * step.layout.block;
    const std::uint64_t count = step.layout.count(j);
    lane_quads<T> h(count);
    step.values.load(begin, vector, h);
    const auto largest = warp_max(h.largest_key());
    if (largest >= float_traits<T>::infinity_key) {
      record_non_finite(step.values, begin, begin + count, step.status);
      return;
    }
    const T m = from_bits<T>(largest);
    const uniform_block_coding<T> coding(m, uniform_step(m, Bits), Bits);
    if (lane_id() == 0) step.scales[j] = coding.s;
    std::uint32_t pieces[quad_rows];
    code_quads<Bits, Mode>(step.rule, coding, begin, h, pieces, [&](unsigned r, const T(&decoded)[quad_values]) {
      step.values.coded_quad(begin + quad_offset(r, lane_id()), h.count[r], vector, h.x[r], decoded);
    });
    store_quad_words<Bits>(step.codes, step.layout.code_bytes, begin * Bits / 32, count, pieces);
  }
};

/// Queues the one-kernel encode of a layout whose blocks fill whole code words: the quad kernel
/// where it fits (quads_fit), else uniform_encode_blocks.
template <class T, class Values>
void encode_whole_word_blocks(const cuda_executor& exec, const Values& values, const block_layout& layout,
                              const uniform_rule<T>& rule, T* scales, std::byte* codes, device_status* status) {
  const uniform_encode_blocks<T, Values> step{values, layout, rule, scales, codes, status};
  if (!quads_fit(layout.block, layout.bits)) return for_each_block(exec, layout.blocks(), step);
  with_quad_constants(layout.bits, rule.mode, [&](auto bits, auto mode) {
    for_each_block(exec, layout.blocks(),
                   uniform_encode_quads<T, Values, decltype(bits)::value, decltype(mode)::value>{step,
                                                                                                 values.aligned()});
  });
}

/// A block's step into the message and its largest magnitude into `maxima` (the word-by-word
/// encoder reads both).
template <class T>
struct uniform_block_step {
  int bits;
  T* scales;
  T* maxima;

  __device__ void operator()(std::uint64_t j, const T*, std::uint64_t, T m, device_status*) const {
    maxima[j] = m;
    scales[j] = uniform_step(m, bits);
  }
};

}  // namespace detail::cuda

/// Uniform quantization on the GPU.
template <gradient_value T>
struct backend<uniform_quantizer<T>, cuda_executor> {
  static std::size_t workspace_bytes(const uniform_quantizer<T>& codec, const cuda_executor&, std::uint64_t n) {
    const std::size_t encoder = detail::cuda::operation::workspace_bytes([&](workspace_arena& arena) {
      (void)detail::cuda::carve_seal(arena, codec.wire().payload_checksum);
      if (!layout_of(codec, n).whole_words()) (void)arena.take<T>(static_cast<std::size_t>(codec.block_count(n)));
    });
    return std::max(encoder, detail::cuda::status_and_crc_bytes());
  }

  static std::size_t encode(const uniform_quantizer<T>& codec, const cuda_executor& exec, std::span<const T> grad,
                            std::span<std::byte> out, std::span<std::byte> ws, message_key key) {
    const std::uint64_t n = grad.size();
    const detail::cuda::block_layout layout = layout_of(codec, n);
    if (!layout.whole_words())
      return detail::cuda::encode_block_coded(
          codec, exec, grad, out, ws, key, layout,
          [&](workspace_arena& arena, T* scales) {
            return detail::cuda::uniform_block_step<T>{layout.bits, scales,
                                                       arena.take<T>(static_cast<std::size_t>(layout.blocks())).data()};
          },
          [&](const detail::cuda::uniform_block_step<T>& stat) {
            return rule_of(codec, key, stat.maxima, stat.scales);
          },
          describe_encode_failure);
    const std::size_t size = codec.max_encoded_bytes(n);
    workspace_arena arena(ws);
    const detail::cuda::operation op(exec, arena);
    const detail::cuda::crc_scratch crc = detail::cuda::carve_seal(arena, codec.wire().payload_checksum);
    detail::cuda::begin_message(exec, out, size);  // after the workspace is carved: a refused call writes nothing
    detail::cuda::encode_whole_word_blocks(exec, detail::cuda::plain_values<T>{grad.data()}, layout,
                                           rule_of(codec, key), detail::cuda::scales_of<T>(out.data()),
                                           detail::cuda::codes_of<T>(out.data(), layout), op.status());
    detail::cuda::seal_message(exec, out.data(),
                               {codec_id::uniform, dtype_of<T>, 0, 0, key, n, codec.payload_bytes(n),
                                codec.params_hash(), 0},
                               crc, op);
    op.finish_encode(describe_encode_failure);
    return size;
  }

  static void decode(const uniform_quantizer<T>& codec, const cuda_executor& exec, std::span<const std::byte> message,
                     std::span<T> out, std::span<std::byte> ws, const decode_limits& limits, bool accumulate) {
    detail::cuda::decode_block_coded(
        codec, exec, message, out, ws, limits, accumulate, [&](std::uint64_t n) { return layout_of(codec, n); },
        [&](message_key key) { return rule_of(codec, key); }, "scale");
  }

  /// The layout of an n-element message.
  static detail::cuda::block_layout layout_of(const uniform_quantizer<T>& codec, std::uint64_t n) {
    return {n, codec.params().block, codec.bits(), packed_bytes(n, codec.bits())};
  }
  /// The per-value rule for `key` (with the per-block maxima and steps the word-by-word encoder reads).
  static detail::cuda::uniform_rule<T> rule_of(const uniform_quantizer<T>& codec, message_key key,
                                               const T* maxima = nullptr, const T* scales = nullptr) {
    const uniform_params& p = codec.params();
    return {p.bits, p.round, random_stream{p.seed, key.step, key.tensor_id, random_purpose::stochastic_rounding},
            maxima, scales};
  }

 private:
  static std::string describe_encode_failure(errc, std::uint64_t i, std::uint32_t) {
    return "gradient value " + std::to_string(i) + " is NaN or Inf; no message was written";
  }
};

}  // namespace gradcomp

#include <gradcomp/cuda/uniform_feedback.cuh>
