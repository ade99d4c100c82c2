#pragma once
/// @file
/// The uniform quantizer on the GPU, byte-identical to the CPU reference (quantize/uniform_math.hpp
/// is the arithmetic of both).
///
/// Encode. When a block's codes fill whole 32-bit words (B·b a multiple of 32, as for the default
/// B = 256), one kernel gives each block one warp: the lanes read the block for its largest
/// magnitude (which also finds NaN and Inf), lane 0 writes the scale, and each lane then codes
/// whole words of 32/b consecutive values (the second read of the block hits L1). Otherwise a
/// first kernel writes every block's scale and largest magnitude and a second codes word by word,
/// each value under its own block's scale. The payload is sealed on the device once both are done.
///
/// Decode. The envelope is read and checked on the host; one kernel checks every scale and code
/// (the all-ones code, padding bits), the host reads its verdict, and only then one thread per
/// code word writes (or adds) code·s for its values.

#include <gradcomp/cuda/config.cuh>

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include <gradcomp/core/backend.hpp>
#include <gradcomp/core/bit_packing.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/float_bits.hpp>
#include <gradcomp/core/philox.hpp>
#include <gradcomp/core/rounded_product.hpp>
#include <gradcomp/core/wire_envelope.hpp>
#include <gradcomp/core/workspace.hpp>
#include <gradcomp/cuda/executor.cuh>
#include <gradcomp/cuda/message.cuh>
#include <gradcomp/cuda/operation.cuh>
#include <gradcomp/cuda/packed_words.cuh>
#include <gradcomp/cuda/warp.cuh>
#include <gradcomp/quantize/uniform.hpp>
#include <gradcomp/quantize/uniform_math.hpp>

namespace gradcomp {

namespace cuda_detail {

/// Reasons a uniform payload fails its check (the low byte of `device_status::detail`).
enum uniform_reason : std::uint32_t { uniform_bad_scale = 1, uniform_bad_code = 2, uniform_bad_padding = 3 };

/// Everything a uniform kernel needs to know about the quantizer and the tensor.
template <class T>
struct uniform_shape {
  std::uint64_t n;         ///< Elements.
  std::uint64_t block;     ///< Values per scale.
  int bits;                ///< Bits per code.
  rounding mode;           ///< Rounding.
  random_stream stream;    ///< Stochastic rounding's stream.
  std::uint64_t code_bytes;  ///< Bytes of the packed codes.

  [[nodiscard]] __host__ __device__ std::uint64_t blocks() const { return (n + block - 1) / block; }
  [[nodiscard]] __host__ __device__ std::uint64_t per_word() const { return 32u / static_cast<unsigned>(bits); }
  [[nodiscard]] __host__ __device__ std::uint64_t words() const { return (n + per_word() - 1) / per_word(); }
};

/// The codes of `count` ≤ 32/b consecutive values x[0, count) — elements first … first + count − 1
/// of one block whose largest magnitude is m and step s — packed into a word from bit 0, as the
/// CPU's uniform_scalar_codes computes them.
template <class T>
__device__ std::uint32_t uniform_code_word(const T* x, std::uint64_t first, unsigned count, const uniform_shape<T>& q,
                                           T m, T s) {
  const auto levels = static_cast<T>(uniform_levels(q.bits));
  const T inv = m > T{0} ? levels / m : T{0};
  const bool multiply = m > T{0} && is_finite(inv);
  std::uint32_t word = 0;
  philox_block random{};
  std::uint64_t cached = UINT64_MAX;
  for (unsigned c = 0; c < count; ++c) {
    const std::uint64_t i = first + c;
    T u = T{0};
    if (q.mode == rounding::stochastic) {  // half i mod 2 of stream word ⌊i/2⌋, 8 values per Philox block
      if (i / 8 != cached) {
        cached = i / 8;
        random = q.stream.block(cached);
      }
      const std::uint32_t w = random.word[(i / 2) % 4];
      u = static_cast<T>(i % 2 == 0 ? (w & 0xFFFFu) : (w >> 16)) * static_cast<T>(1.0 / 65536.0);
    }
    const T t = s == T{0} ? T{0} : (multiply ? mul_rn(x[c], inv) : x[c] / s);
    word |= std::uint32_t{uniform_code(uniform_level(t, q.bits, q.mode, u), q.bits)} << (c * static_cast<unsigned>(q.bits));
  }
  return word;
}

/// Largest magnitude key of elements [begin, begin + count), on every lane of the calling warp.
template <class T>
__device__ typename float_traits<T>::bits_type warp_block_max_key(const T* g, std::uint64_t begin, std::uint64_t count) {
  typename float_traits<T>::bits_type largest = 0;
  for (std::uint64_t i = lane_id(); i < count; i += 32) {
    const auto key = magnitude_key(g[begin + i]);
    largest = key > largest ? key : largest;
  }
  return warp_max(largest);
}

/// Records `non_finite_input` at the first NaN or Inf of elements [begin, begin + count) (the
/// calling warp's block, known to hold one).
template <class T>
__device__ void record_non_finite(const T* g, std::uint64_t begin, std::uint64_t count, device_status* status) {
  for (std::uint64_t i = lane_id(); i < count; i += 32)
    if (!is_finite(g[begin + i])) {
      record_failure(status, errc::non_finite_input, begin + i);
      return;
    }
}

/// One warp per block (blocks whose codes fill whole words): largest magnitude, scale, codes.
template <class T>
__global__ void uniform_encode_blocks_kernel(const T* g, uniform_shape<T> q, T* scales, std::byte* codes,
                                             device_status* status) {
  const std::uint64_t per_word = q.per_word();
  for (std::uint64_t j = warp_id(); j < q.blocks(); j += warp_count()) {
    const std::uint64_t begin = j * q.block;
    const std::uint64_t count = q.n - begin < q.block ? q.n - begin : q.block;
    const auto largest = warp_block_max_key(g, begin, count);
    if (largest >= float_traits<T>::infinity_key) {
      record_non_finite(g, begin, count, status);
      continue;
    }
    const T m = from_bits<T>(largest);
    const T s = uniform_step(m, q.bits);
    if (lane_id() == 0) scales[j] = s;
    const std::uint64_t words = (count + per_word - 1) / per_word;
    for (std::uint64_t w = lane_id(); w < words; w += 32) {
      const std::uint64_t first = begin + w * per_word;
      const auto c = static_cast<unsigned>(count - w * per_word < per_word ? count - w * per_word : per_word);
      store_code_word(codes, first / per_word, uniform_code_word(g + first, first, c, q, m, s), q.code_bytes);
    }
  }
}

/// One warp per block: its scale, and its largest magnitude into `maxima` (any block size).
template <class T>
__global__ void uniform_scales_kernel(const T* g, uniform_shape<T> q, T* scales, T* maxima, device_status* status) {
  for (std::uint64_t j = warp_id(); j < q.blocks(); j += warp_count()) {
    const std::uint64_t begin = j * q.block;
    const std::uint64_t count = q.n - begin < q.block ? q.n - begin : q.block;
    const auto largest = warp_block_max_key(g, begin, count);
    const bool finite = largest < float_traits<T>::infinity_key;
    if (!finite) record_non_finite(g, begin, count, status);
    if (lane_id() == 0) {
      const T m = finite ? from_bits<T>(largest) : T{0};
      maxima[j] = m;
      scales[j] = uniform_step(m, q.bits);
    }
  }
}

/// One thread per code word, its values under their own blocks' scales (any block size).
template <class T>
__global__ void uniform_codes_kernel(const T* g, uniform_shape<T> q, const T* scales, const T* maxima, std::byte* codes) {
  const std::uint64_t per_word = q.per_word();
  for (std::uint64_t w = thread_id(); w < q.words(); w += thread_count()) {
    const std::uint64_t first = w * per_word;
    const std::uint64_t last = first + per_word < q.n ? first + per_word : q.n;
    std::uint32_t word = 0;
    for (std::uint64_t i = first; i < last;) {  // runs of values within one block
      const std::uint64_t j = i / q.block;
      const std::uint64_t run_end = (j + 1) * q.block < last ? (j + 1) * q.block : last;
      word |= uniform_code_word(g + i, i, static_cast<unsigned>(run_end - i), q, maxima[j], scales[j])
              << ((i - first) * static_cast<unsigned>(q.bits));
      i = run_end;
    }
    store_code_word(codes, w, word, q.code_bytes);
  }
}

/// Checks every scale (not negative, L·s finite) and code (not all ones for b ≥ 2; zero padding).
template <class T>
__global__ void uniform_check_kernel(uniform_shape<T> q, const T* scales, const std::byte* codes, device_status* status) {
  const auto levels = static_cast<T>(uniform_levels(q.bits));
  const std::uint64_t per_word = q.per_word();
  const std::uint64_t items = q.words() > q.blocks() ? q.words() : q.blocks();
  for (std::uint64_t t = thread_id(); t < items; t += thread_count()) {
    if (t < q.blocks()) {
      const T s = scales[t];
      if ((to_bits(s) >> (sizeof(T) * 8 - 1)) != 0 || !is_finite(s * levels))
        record_failure(status, errc::malformed_payload, t, uniform_bad_scale);
    }
    if (t >= q.words()) continue;
    const std::uint32_t word = load_code_word(codes, t, q.code_bytes);
    const std::uint64_t first = t * per_word;
    const std::uint64_t used = q.n - first < per_word ? q.n - first : per_word;
    const std::uint32_t all_ones = (1u << q.bits) - 1u;
    for (unsigned c = 0; c < used && q.bits >= 2; ++c)
      if (code_in_word(word, static_cast<int>(c), q.bits) == all_ones) {
        record_failure(status, errc::malformed_payload, first + c, uniform_bad_code);
        break;
      }
    if (used < per_word && (word >> (used * static_cast<unsigned>(q.bits))) != 0)
      record_failure(status, errc::malformed_payload, q.n, uniform_bad_padding);
  }
}

/// One thread per code word: code·s of its values written into (or added to) `out`.
template <class T>
__global__ void uniform_decode_kernel(uniform_shape<T> q, const T* scales, const std::byte* codes, T* out,
                                      bool accumulate) {
  const std::uint64_t per_word = q.per_word();
  for (std::uint64_t w = thread_id(); w < q.words(); w += thread_count()) {
    const std::uint32_t word = load_code_word(codes, w, q.code_bytes);
    const std::uint64_t first = w * per_word;
    const std::uint64_t last = first + per_word < q.n ? first + per_word : q.n;
    std::uint64_t j = first / q.block;
    std::uint64_t next_block = (j + 1) * q.block;
    T s = scales[j];
    for (std::uint64_t i = first; i < last; ++i) {
      if (i == next_block) {
        s = scales[++j];
        next_block += q.block;
      }
      const T v = mul_rn(static_cast<T>(uniform_code_level(code_in_word(word, static_cast<int>(i - first), q.bits), q.bits)), s);
      out[i] = accumulate ? out[i] + v : v;
    }
  }
}

}  // namespace cuda_detail

/// Uniform quantization on the GPU.
template <gradient_value T>
struct backend<uniform_quantizer<T>, cuda_executor> {
  using shape = cuda_detail::uniform_shape<T>;

  struct scratch {
    std::span<T> maxima;              ///< Per-block largest magnitudes (encoders whose blocks share words).
    cuda_detail::crc_scratch crc;     ///< The payload CRC (encode with checksums; every decode).
  };

  static std::size_t workspace_bytes(const uniform_quantizer<T>& codec, const cuda_executor&, std::uint64_t n) {
    workspace_arena arena = workspace_arena::measure();
    cuda_detail::operation::reserve(arena);
    (void)carve_encode(arena, codec, n);
    const std::size_t encode_bytes = arena.bytes_needed();
    workspace_arena decode_arena = workspace_arena::measure();
    cuda_detail::operation::reserve(decode_arena);
    (void)cuda_detail::crc_scratch::carve(decode_arena);
    return std::max(encode_bytes, decode_arena.bytes_needed());
  }

  static std::size_t encode(const uniform_quantizer<T>& codec, const cuda_executor& exec, std::span<const T> grad,
                            std::span<std::byte> out, std::span<std::byte> ws, message_key key) {
    const std::uint64_t n = grad.size();
    const std::size_t size = codec.max_encoded_bytes(n);
    cuda_detail::begin_message(exec, out, size);
    workspace_arena arena(ws);
    const cuda_detail::operation op(exec, arena);
    const scratch s = carve_encode(arena, codec, n);
    const shape q = shape_of(codec, n, key);
    auto* const scales = reinterpret_cast<T*>(out.data() + envelope::size);
    std::byte* const codes = out.data() + envelope::size + q.blocks() * sizeof(T);
    if (n > 0) {
      if (whole_words(codec)) {
        cuda_detail::launch(exec, cuda_detail::grid_for(q.blocks(), cuda_detail::block_warps), cuda_detail::block_threads,
                            cuda_detail::uniform_encode_blocks_kernel<T>, grad.data(), q, scales, codes, op.status());
      } else {
        cuda_detail::launch(exec, cuda_detail::grid_for(q.blocks(), cuda_detail::block_warps), cuda_detail::block_threads,
                            cuda_detail::uniform_scales_kernel<T>, grad.data(), q, scales, s.maxima.data(), op.status());
        cuda_detail::launch(exec, cuda_detail::grid_for(q.words()), cuda_detail::block_threads,
                            cuda_detail::uniform_codes_kernel<T>, grad.data(), q, static_cast<const T*>(scales),
                            static_cast<const T*>(s.maxima.data()), codes);
      }
    }
    cuda_detail::seal_message(exec, out.data(),
                              {codec_id::uniform, dtype_of<T>, 0, 0, key, n, codec.payload_bytes(n), codec.params_hash(), 0},
                              s.crc, op);
    op.finish_encode([](errc, std::uint64_t i, std::uint32_t) {
      return "gradient value " + std::to_string(i) + " is NaN or Inf; no message was written";
    });
    return size;
  }

  static void decode(const uniform_quantizer<T>& codec, const cuda_executor& exec, std::span<const std::byte> message,
                     std::span<T> out, std::span<std::byte> ws, const decode_limits& limits, bool accumulate) {
    workspace_arena arena(ws);
    const cuda_detail::operation op(exec, arena);
    const cuda_detail::crc_scratch crc = cuda_detail::crc_scratch::carve(arena);
    const envelope e = cuda_detail::read_envelope(exec, message, {codec_id::uniform, dtype_of<T>, out.size(), codec.params_hash()},
                                                  limits, crc);
    codec.validate_payload_size(e);
    const std::uint64_t n = e.elements;
    if (n == 0) return;
    const shape q = shape_of(codec, n, e.key);
    const auto* const scales = reinterpret_cast<const T*>(message.data() + envelope::size);
    const std::byte* const codes = message.data() + envelope::size + q.blocks() * sizeof(T);
    const std::uint64_t items = std::max(q.words(), q.blocks());
    cuda_detail::launch(exec, cuda_detail::grid_for(items), cuda_detail::block_threads, cuda_detail::uniform_check_kernel<T>,
                        q, scales, codes, op.status());
    op.finish([](errc, std::uint64_t position, std::uint32_t reason) -> std::string {
      switch (reason) {
        case cuda_detail::uniform_bad_scale: return "scale of block " + std::to_string(position) + " is negative or too large";
        case cuda_detail::uniform_bad_code: return "the code of element " + std::to_string(position) + " exceeds the largest level";
        default: return "non-zero padding bits after the last code";
      }
    });
    cuda_detail::launch(exec, cuda_detail::grid_for(q.words()), cuda_detail::block_threads, cuda_detail::uniform_decode_kernel<T>,
                        q, scales, codes, out.data(), accumulate);
  }

 private:
  /// Whether a block's codes fill whole 32-bit words, so one warp codes a block alone.
  [[nodiscard]] static bool whole_words(const uniform_quantizer<T>& codec) noexcept {
    return std::uint64_t{codec.params().block} * static_cast<std::uint64_t>(codec.bits()) % 32 == 0;
  }

  static scratch carve_encode(workspace_arena& arena, const uniform_quantizer<T>& codec, std::uint64_t n) {
    scratch s;
    if (!whole_words(codec)) s.maxima = arena.take<T>(static_cast<std::size_t>(codec.block_count(n)));
    s.crc = cuda_detail::carve_seal(arena, codec.wire().payload_checksum);
    return s;
  }

  static shape shape_of(const uniform_quantizer<T>& codec, std::uint64_t n, message_key key) {
    const uniform_params& p = codec.params();
    return {n, p.block, p.bits, p.round, random_stream{p.seed, key.step, key.tensor_id, random_purpose::stochastic_rounding},
            packed_bytes(n, p.bits)};
  }
};

}  // namespace gradcomp
