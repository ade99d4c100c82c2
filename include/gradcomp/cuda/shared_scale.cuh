#pragma once
/// @file
/// The shared-scale (homomorphic) quantizer on the GPU, byte-identical to the CPU backend.
///
/// `block_maxima`: a warp per block (NaN or Inf makes every maximum +Inf, as on the CPU).
/// `encode_shared`: one kernel checks the agreed maxima (one thread per block, in the CPU's order
/// of checks), then a warp per block checks this rank's own maximum against them; only then are
/// the scales, the contribution count and the field words written, one thread per u64 word of
/// ⌊64/w⌋ fields, each value coded by the uniform quantizer's rule under its block's agreed
/// maximum. Decoding checks the count, the scales, the padding and every field on the device
/// first. `accumulate_encoded` checks both messages and that their scales agree, then adds the
/// summable words on the device.

#include <gradcomp/cuda/config.cuh>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include <gradcomp/core/backend.hpp>
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
#include <gradcomp/cuda/uniform.cuh>
#include <gradcomp/quantize/shared_scale.hpp>
#include <gradcomp/quantize/sign_math.hpp>
#include <gradcomp/quantize/uniform_math.hpp>

namespace gradcomp {

namespace detail::cuda {

/// Checks of agreed maxima and of this rank's own maxima, numbered in the CPU's order.
enum shared_maximum_reason : std::uint32_t {
  maximum_not_finite = 1,  ///< An agreed maximum is NaN or Inf.
  maximum_negative = 2,    ///< An agreed maximum is negative.
  maximum_overflows = 3,   ///< 2^k·L·s overflows the value type.
  own_not_finite = 4,      ///< This rank's block holds NaN or Inf.
  own_above_agreed = 5,    ///< This rank's block maximum exceeds the agreed one.
};

/// The sizes of a shared-scale message.
struct shared_layout {
  std::uint64_t n;
  std::uint64_t block;
  int bits;
  int width;                ///< w = bits + headroom bits.
  std::uint64_t per_word;   ///< F = ⌊64/w⌋ fields per word.
  std::uint64_t offset;     ///< Offset of the summable region in the message.
  std::uint64_t max_contributions;

  [[nodiscard]] __host__ __device__ std::uint64_t blocks() const { return (n + block - 1) / block; }
  [[nodiscard]] __host__ __device__ std::uint64_t words() const { return (n + per_word - 1) / per_word; }
  [[nodiscard]] __host__ __device__ std::uint64_t count(std::uint64_t j) const {
    return n - j * block < block ? n - j * block : block;
  }
};

/// A block's largest magnitude into `maxima` (block_statistics writes 0 for a block holding NaN
/// or Inf and records it; the caller then sets every maximum to +Inf).
template <class T>
struct maximum_stat {
  T* maxima;

  __device__ void operator()(std::uint64_t j, const T*, std::uint64_t, T m, device_status*) const { maxima[j] = m; }
};

/// Sets every maximum to +Inf (a rank whose gradient held NaN or Inf, as on the CPU).
template <class T>
struct infinite_maxima {
  T* maxima;

  __device__ void operator()(std::uint64_t j) const { maxima[j] = from_bits<T>(float_traits<T>::infinity_key); }
};

/// One thread per block: the agreed maximum finite, non-negative, and small enough that 2^k
/// contributions decode finitely.
template <class T>
struct shared_check_agreed {
  const T* agreed;
  int bits;
  T largest_level_sum;
  device_status* status;

  __device__ void operator()(std::uint64_t j) const {
    const T m = agreed[j];
    if (!is_finite(m)) record_failure(status, errc::non_finite_input, j, maximum_not_finite);
    else if (sign_bit_of(m) != 0)
      record_failure(status, errc::invalid_argument, j, maximum_negative);
    else if (!is_finite(uniform_step(m, bits) * largest_level_sum))
      record_failure(status, errc::non_finite_input, j, maximum_overflows);
  }
};

/// One warp per block: this rank's block is finite and its maximum at most the agreed one.
template <class T>
struct shared_check_own {
  const T* g;
  shared_layout layout;
  const T* agreed;
  device_status* status;

  __device__ void operator()(std::uint64_t j) const {
    const std::uint64_t begin = j * layout.block;
    const auto largest = warp_max_key(plain_values<T>{g}, begin, begin + layout.count(j));
    if (lane_id() != 0) return;
    if (largest >= float_traits<T>::infinity_key) record_failure(status, errc::non_finite_input, j, own_not_finite);
    else if (from_bits<T>(largest) > agreed[j])
      record_failure(status, errc::parameter_mismatch, j, own_above_agreed);
  }
};

/// One thread per block: the block's step, under the agreed maximum, into the message.
template <class T>
struct shared_scales {
  const T* agreed;
  int bits;
  T* scales;

  __device__ void operator()(std::uint64_t j) const { scales[j] = uniform_step(agreed[j], bits); }
};

/// One thread per field word: the codes of its F values, each under its block's agreed maximum.
template <class T>
struct shared_encode_words {
  const T* g;
  shared_layout layout;
  uniform_rule<T> rule;  ///< With the agreed maxima and the message's steps.
  std::uint64_t* words;

  __device__ void operator()(std::uint64_t w) const {
    const std::uint64_t first = w * layout.per_word;
    const std::uint64_t last = first + layout.per_word < layout.n ? first + layout.per_word : layout.n;
    std::uint64_t word = 0;
    philox_cache random;
    std::uint64_t j = first / layout.block;
    uniform_block_coding<T> coding(rule.maxima[j], rule.scales[j], layout.bits);
    for (std::uint64_t i = first; i < last; ++i) {
      if (i / layout.block != j) {  // the word runs into the next block
        j = i / layout.block;
        coding = uniform_block_coding<T>(rule.maxima[j], rule.scales[j], layout.bits);
      }
      word |= std::uint64_t{rule.code(g[i], i, coding, random)} << ((i - first) * static_cast<unsigned>(layout.width));
    }
    words[w] = word;
  }
};

/// One thread per item: the contribution count (item 0), scale t, padding byte t, field word t.
template <class T>
struct shared_check_message {
  shared_layout layout;
  const std::byte* message;
  T largest_level_sum;
  std::uint64_t code_limit;  ///< The largest code, (2^b − 2) or 1.
  device_status* status;

  [[nodiscard]] std::uint64_t items() const {
    return std::max({layout.blocks(), layout.words(), layout.offset - envelope::size, std::uint64_t{1}});
  }

  __device__ void operator()(std::uint64_t t) const {
    const std::uint64_t contributions = *reinterpret_cast<const std::uint64_t*>(message + layout.offset);
    const bool count_ok = contributions >= 1 && contributions <= layout.max_contributions;
    if (t == 0 && !count_ok) record_failure(status, errc::malformed_payload, 0, bad_code);
    const T* const scales = reinterpret_cast<const T*>(message + envelope::size);
    if (t < layout.blocks() && (sign_bit_of(scales[t]) != 0 || !is_finite(scales[t] * largest_level_sum)))
      record_failure(status, errc::malformed_payload, t, bad_scale);
    const std::uint64_t pad = envelope::size + layout.blocks() * sizeof(T) + t;
    if (pad < layout.offset && message[pad] != std::byte{0})
      record_failure(status, errc::malformed_payload, pad, bad_padding);
    if (t >= layout.words() || !count_ok) return;
    std::uint64_t word = reinterpret_cast<const std::uint64_t*>(message + layout.offset + 8)[t];
    const std::uint64_t first = t * layout.per_word;
    const std::uint64_t fields = layout.n - first < layout.per_word ? layout.n - first : layout.per_word;
    const std::uint64_t mask = (std::uint64_t{1} << layout.width) - 1;
    bool valid = true;
    for (std::uint64_t f = 0; f < fields; ++f, word >>= layout.width)
      valid &= (word & mask) <= contributions * code_limit;
    if (!valid || word != 0) record_failure(status, errc::malformed_payload, first, bad_code);
  }
};

/// One thread per field word: Σq·s of its values written into (or added to) `out`.
template <class T>
struct shared_decode_words {
  shared_layout layout;
  const std::byte* message;
  T* out;
  bool accumulate;

  __device__ void operator()(std::uint64_t w) const {
    const std::uint64_t contributions = *reinterpret_cast<const std::uint64_t*>(message + layout.offset);
    const T* const scales = reinterpret_cast<const T*>(message + envelope::size);
    std::uint64_t word = reinterpret_cast<const std::uint64_t*>(message + layout.offset + 8)[w];
    const std::uint64_t first = w * layout.per_word;
    const std::uint64_t last = first + layout.per_word < layout.n ? first + layout.per_word : layout.n;
    const std::uint64_t mask = (std::uint64_t{1} << layout.width) - 1;
    for (std::uint64_t i = first; i < last; ++i, word >>= layout.width) {
      const T v = mul_rn(static_cast<T>(shared_scale_level_sum(word & mask, contributions, layout.bits)),
                         scales[i / layout.block]);
      out[i] = accumulate ? out[i] + v : v;
    }
  }
};

/// Records a byte of the scales and their padding that differs between two messages.
struct same_bytes {
  const std::byte* a;
  const std::byte* b;
  device_status* status;

  __device__ void operator()(std::uint64_t i) const {
    if (a[i] != b[i]) record_failure(status, errc::parameter_mismatch, i);
  }
};

/// acc's summable words += other's (the count and every field word).
struct add_words {
  std::uint64_t* acc;
  const std::uint64_t* other;

  __device__ void operator()(std::uint64_t w) const { acc[w] += other[w]; }
};

}  // namespace detail::cuda

/// Shared-scale quantization on the GPU.
template <gradient_value T>
struct backend<shared_scale_quantizer<T>, cuda_executor> {
  using codec_type = shared_scale_quantizer<T>;

  /// Status and CRC scratch, and the single-stage `encode`'s own block maxima.
  static std::size_t workspace_bytes(const codec_type& codec, const cuda_executor&, std::uint64_t n) {
    return detail::cuda::operation::workspace_bytes([&](workspace_arena& arena) {
      (void)detail::cuda::crc_scratch::carve(arena);
      (void)arena.take<T>(static_cast<std::size_t>(codec.block_count(n)));
    });
  }

  static void block_maxima(const codec_type& codec, const cuda_executor& exec, std::span<const T> grad,
                           std::span<T> maxima) {
    const detail::cuda::pooled_status_and_crc scratch(exec);
    find_block_maxima(codec, exec, grad, maxima, scratch.op);
  }

  static std::size_t encode(const codec_type& codec, const cuda_executor& exec, std::span<const T> grad,
                            std::span<std::byte> out, std::span<std::byte> ws, message_key key) {
    workspace_arena arena(ws);
    const detail::cuda::operation op(exec, arena);
    (void)detail::cuda::crc_scratch::carve(arena);
    const std::span<T> maxima = arena.take<T>(static_cast<std::size_t>(codec.block_count(grad.size())));
    find_block_maxima(codec, exec, grad, maxima, op);
    check_agreed(codec, exec, grad.size(), maxima, op);
    return write_message(codec, exec, grad, maxima, out, key, 0, op);
  }

  static std::size_t encode_shared(const codec_type& codec, const cuda_executor& exec, std::span<const T> grad,
                                   std::span<const T> agreed, std::span<std::byte> out, std::span<std::byte> ws,
                                   message_key key, std::uint32_t rank) {
    workspace_arena arena(ws);
    const detail::cuda::operation op(exec, arena);
    const std::uint64_t n = grad.size();
    check_agreed(codec, exec, n, agreed, op);
    const detail::cuda::shared_layout layout = layout_of(codec, n);
    detail::cuda::for_each_block(exec, layout.blocks(),
                                 detail::cuda::shared_check_own<T>{grad.data(), layout, agreed.data(), op.status()});
    finish_maxima_check(op);
    return write_message(codec, exec, grad, agreed, out, key, rank, op);
  }

  static void decode(const codec_type& codec, const cuda_executor& exec, std::span<const std::byte> message,
                     std::span<T> out, std::span<std::byte> ws, const decode_limits& limits, bool accumulate) {
    workspace_arena arena(ws);
    const detail::cuda::operation op(exec, arena);
    const detail::cuda::crc_scratch crc = detail::cuda::crc_scratch::carve(arena);
    const envelope e = detail::cuda::read_envelope(exec, message, expectation(codec, out.size()), limits, crc);
    check_payload(codec, exec, message, e, op);
    const detail::cuda::shared_layout layout = layout_of(codec, e.elements);
    detail::cuda::for_each_item(exec, layout.words(),
                                detail::cuda::shared_decode_words<T>{layout, message.data(), out.data(), accumulate});
  }

  static void accumulate_encoded(const codec_type& codec, const cuda_executor& exec, std::span<std::byte> acc,
                                 std::span<const std::byte> other) {
    const detail::cuda::pooled_status_and_crc scratch(exec);
    const envelope mine = detail::cuda::fetch_envelope(exec, acc, scratch.crc);
    validate_envelope(mine, expectation(codec, mine.elements), {});
    check_payload(codec, exec, acc, mine, scratch.op);
    const envelope theirs =
        detail::cuda::read_envelope(exec, other, expectation(codec, mine.elements), {}, scratch.crc);
    check_payload(codec, exec, other, theirs, scratch.op);
    detail::require(mine.key == theirs.key, errc::step_mismatch,
                    "messages of different steps or tensors cannot be summed");
    const detail::cuda::shared_layout layout = layout_of(codec, mine.elements);
    detail::cuda::for_each_item(exec, layout.offset - envelope::size,
                                detail::cuda::same_bytes{acc.data() + envelope::size, other.data() + envelope::size,
                                                         scratch.op.status()});
    scratch.op.finish([](errc, std::uint64_t, std::uint32_t) {
      return std::string("the block scales differ: the ranks did not agree the block maxima");
    });
    std::uint64_t counts[2] = {};
    GRADCOMP_CUDA_CHECK(
        cudaMemcpyAsync(&counts[0], acc.data() + layout.offset, 8, cudaMemcpyDeviceToHost, exec.native_stream()));
    GRADCOMP_CUDA_CHECK(
        cudaMemcpyAsync(&counts[1], other.data() + layout.offset, 8, cudaMemcpyDeviceToHost, exec.native_stream()));
    exec.synchronize();
    detail::require(counts[0] + counts[1] <= codec.max_contributions(), errc::invalid_argument, [&] {
      return "the sum would hold " + std::to_string(counts[0] + counts[1]) + " contributions, the headroom allows " +
             std::to_string(codec.max_contributions()) + ": raise headroom_bits";
    });
    detail::cuda::for_each_item(exec, 1 + layout.words(),
                                detail::cuda::add_words{reinterpret_cast<std::uint64_t*>(acc.data() + layout.offset),
                                                        reinterpret_cast<const std::uint64_t*>(other.data() +
                                                                                               layout.offset)});
  }

 private:
  static detail::cuda::shared_layout layout_of(const codec_type& codec, std::uint64_t n) {
    return {n,
            codec.params().block,
            codec.bits(),
            codec.field_bits(),
            codec.fields_per_word(),
            codec.summable_offset(n),
            codec.max_contributions()};
  }

  /// This rank's block maxima into `maxima`; on NaN or Inf every maximum is +Inf and
  /// `non_finite_input` is thrown.
  static void find_block_maxima(const codec_type& codec, const cuda_executor& exec, std::span<const T> grad,
                                std::span<T> maxima, const detail::cuda::operation& op) {
    const std::uint64_t n = grad.size();
    detail::require(maxima.size() == codec.block_count(n), errc::size_mismatch, [&] {
      return "maxima hold " + std::to_string(maxima.size()) + " values, the gradient has " +
             std::to_string(codec.block_count(n)) + " blocks";
    });
    const detail::cuda::block_layout layout{n, codec.params().block, codec.bits(), 0};
    detail::cuda::for_each_block(exec, layout.blocks(),
                                 detail::cuda::block_statistics<T, detail::cuda::maximum_stat<T>>{
                                     grad.data(), layout, {maxima.data()}, op.status()});
    try {
      op.finish([](errc, std::uint64_t i, std::uint32_t) {
        return "gradient value " + std::to_string(i) + " is NaN or Inf";
      });
    } catch (const error&) {
      detail::cuda::for_each_item(exec, maxima.size(), detail::cuda::infinite_maxima<T>{maxima.data()});
      exec.synchronize();
      throw;
    }
  }

  /// Checks agreed maxima in the CPU's order (count, then per block: finite, sign, overflow).
  static void check_agreed(const codec_type& codec, const cuda_executor& exec, std::uint64_t n,
                           std::span<const T> agreed, const detail::cuda::operation& op) {
    detail::require(agreed.size() == codec.block_count(n), errc::size_mismatch, [&] {
      return "agreed maxima hold " + std::to_string(agreed.size()) + " values, the gradient has " +
             std::to_string(codec.block_count(n)) + " blocks";
    });
    detail::cuda::for_each_item(exec, agreed.size(),
                                detail::cuda::shared_check_agreed<T>{agreed.data(), codec.bits(),
                                                                     codec.largest_level_sum(), op.status()});
    finish_maxima_check(op);
  }

  static void finish_maxima_check(const detail::cuda::operation& op) {
    op.finish_by_reason(
        [](std::uint32_t reason) {
          switch (reason) {
            case detail::cuda::maximum_negative: return errc::invalid_argument;
            case detail::cuda::own_above_agreed: return errc::parameter_mismatch;
            default: return errc::non_finite_input;
          }
        },
        [](std::uint64_t j, std::uint32_t reason) -> std::string {
          switch (reason) {
            case detail::cuda::maximum_not_finite:
              return "agreed maximum of block " + std::to_string(j) + " is NaN or Inf";
            case detail::cuda::maximum_negative: return "agreed maximum of block " + std::to_string(j) + " is negative";
            case detail::cuda::maximum_overflows:
              return "agreed maximum of block " + std::to_string(j) +
                     " is so large that the largest sum overflows the value type";
            case detail::cuda::own_not_finite:
              return "block " + std::to_string(j) + " of the gradient holds NaN or Inf";
            default:
              return "agreed maximum of block " + std::to_string(j) +
                     " is below this rank's own maximum: the maxima were not MAX-reduced over all ranks";
          }
        });
  }

  /// Writes the message for `grad` under checked maxima (scales, padding, count 1, field words)
  /// and seals it.
  static std::size_t write_message(const codec_type& codec, const cuda_executor& exec, std::span<const T> grad,
                                   std::span<const T> maxima, std::span<std::byte> out, message_key key,
                                   std::uint32_t rank, const detail::cuda::operation& op) {
    const std::uint64_t n = grad.size();
    const std::size_t size = codec.max_encoded_bytes(n);
    detail::cuda::begin_message(exec, out, size);
    const detail::cuda::shared_layout layout = layout_of(codec, n);
    std::byte* const message = out.data();
    GRADCOMP_CUDA_CHECK(
        cudaMemsetAsync(message + envelope::size, 0, layout.offset - envelope::size, exec.native_stream()));
    T* const scales = detail::cuda::scales_of<T>(message);
    detail::cuda::for_each_item(exec, layout.blocks(),
                                detail::cuda::shared_scales<T>{maxima.data(), layout.bits, scales});
    detail::cuda::launch(exec, 1, 32, detail::cuda::store_word_kernel<>, message + layout.offset, std::uint64_t{1});
    const shared_scale_params& p = codec.params();
    const detail::cuda::uniform_rule<T> rule{p.bits, p.round,
                                             random_stream{shared_scale_stream_seed(p.seed, rank), key.step,
                                                           key.tensor_id, random_purpose::stochastic_rounding},
                                             maxima.data(), scales};
    detail::cuda::for_each_item(exec, layout.words(),
                                detail::cuda::shared_encode_words<T>{grad.data(), layout, rule,
                                                                     reinterpret_cast<std::uint64_t*>(
                                                                         message + layout.offset + 8)});
    detail::cuda::seal_message(exec, message,
                               {codec_id::uniform_shared, dtype_of<T>, 0, 0, key, n, size - envelope::size,
                                codec.params_hash(), 0},
                               detail::cuda::crc_scratch{}, op);
    return size;
  }

  /// What a decoder of an `elements`-element buffer expects of a message's envelope.
  static envelope_expectation expectation(const codec_type& codec, std::uint64_t elements) {
    return {codec_id::uniform_shared, dtype_of<T>, elements, codec.params_hash()};
  }

  /// Checks the payload of a message whose envelope `e` was read and checked: its size (host),
  /// then the count, scales, padding and fields (device).
  static void check_payload(const codec_type& codec, const cuda_executor& exec, std::span<const std::byte> message,
                            const envelope& e, const detail::cuda::operation& op) {
    codec.validate_payload_size(e);
    const detail::cuda::shared_check_message<T> check{layout_of(codec, e.elements), message.data(),
                                                      codec.largest_level_sum(), codec.largest_field(1), op.status()};
    detail::cuda::for_each_item(exec, check.items(), check);
    op.finish([](errc, std::uint64_t position, std::uint32_t reason) {
      return detail::cuda::describe_block_code_failure(position, reason, "scale");
    });
  }
};

}  // namespace gradcomp
