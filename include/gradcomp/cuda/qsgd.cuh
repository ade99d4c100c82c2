#pragma once
/// @file
/// The QSGD quantizer on the GPU, byte-identical to the CPU reference: a warp per bucket finds its
/// largest magnitude and lane 0 sums its squared norm in the documented left-to-right order
/// (quantize/qsgd_math.hpp, the very function the CPU calls); then one thread per 32-bit word
/// codes its values, drawing element i's uniform from word i of the Philox stream. Decoding
/// checks every norm and code first, then writes ±norm·level/s (cuda/block_codes.cuh).

#include <gradcomp/cuda/config.cuh>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include <gradcomp/core/backend.hpp>
#include <gradcomp/core/bit_packing.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/float_bits.hpp>
#include <gradcomp/core/philox.hpp>
#include <gradcomp/core/wire_envelope.hpp>
#include <gradcomp/core/workspace.hpp>
#include <gradcomp/cuda/block_codes.cuh>
#include <gradcomp/cuda/executor.cuh>
#include <gradcomp/cuda/grid.cuh>
#include <gradcomp/cuda/message.cuh>
#include <gradcomp/cuda/operation.cuh>
#include <gradcomp/quantize/qsgd.hpp>
#include <gradcomp/quantize/qsgd_math.hpp>
#include <gradcomp/quantize/sign_math.hpp>

namespace gradcomp {

namespace cuda_detail {

/// Reason of a bucket whose L2 norm overflows the value type (after the block-code reasons).
inline constexpr std::uint32_t qsgd_norm_overflow = 4;

/// A bucket's L2 norm into the message (`non_finite_input` when it overflows the value type).
template <class T>
struct qsgd_bucket_norm_stat {
  T* norms;

  __device__ void operator()(std::uint64_t j, const T* x, std::uint64_t count, T m, device_status* status) const {
    T norm = T{0};
    if (!qsgd_bucket_norm(x, count, m, norm)) {
      record_failure(status, errc::non_finite_input, j, qsgd_norm_overflow);
      norm = T{0};
    }
    norms[j] = norm;
  }
};

/// The per-value rule of QSGD.
template <class T>
struct qsgd_rule {
  std::uint32_t levels;
  int bits;
  random_stream stream;
  const T* norms;  ///< Per-bucket norms (the encoder only).

  __device__ std::uint8_t code(T x, std::uint64_t i, std::uint64_t j, philox_cache& random) const {
    const T norm = norms[j];
    if (norm == T{0}) return 0;
    const T u = static_cast<T>(random.word(stream, i) >> 8) * static_cast<T>(1.0 / 16777216.0);
    return qsgd_code(qsgd_level(from_bits<T>(magnitude_key(x)), norm, levels, u), sign_bit_of(x), bits);
  }
  __device__ bool valid_scale(T norm) const { return sign_bit_of(norm) == 0 && is_finite(norm); }
  __device__ bool valid_code(std::uint8_t c, T norm) const {
    if (norm == T{0}) return c == 0;
    const int level = qsgd_code_level(c, bits);
    return level <= static_cast<int>(levels) && (level != 0 || c == 0);
  }
  __device__ T value(std::uint8_t c, T norm) const { return qsgd_decoded(c, norm, levels, bits); }
};

}  // namespace cuda_detail

/// QSGD quantization on the GPU.
template <gradient_value T>
struct backend<qsgd_quantizer<T>, cuda_executor> {
  using rule = cuda_detail::qsgd_rule<T>;

  static std::size_t workspace_bytes(const qsgd_quantizer<T>& codec, const cuda_executor&, std::uint64_t) {
    workspace_arena encode_arena = workspace_arena::measure();
    cuda_detail::operation::reserve(encode_arena);
    (void)cuda_detail::carve_seal(encode_arena, codec.wire().payload_checksum);
    workspace_arena decode_arena = workspace_arena::measure();
    cuda_detail::operation::reserve(decode_arena);
    (void)cuda_detail::crc_scratch::carve(decode_arena);
    return std::max(encode_arena.bytes_needed(), decode_arena.bytes_needed());
  }

  static std::size_t encode(const qsgd_quantizer<T>& codec, const cuda_executor& exec, std::span<const T> grad,
                            std::span<std::byte> out, std::span<std::byte> ws, message_key key) {
    const std::uint64_t n = grad.size();
    const std::size_t size = codec.max_encoded_bytes(n);
    workspace_arena arena(ws);
    const cuda_detail::operation op(exec, arena);
    const cuda_detail::crc_scratch crc = cuda_detail::carve_seal(arena, codec.wire().payload_checksum);
    cuda_detail::begin_message(exec, out, size);  // after the workspace is carved: a refused call writes nothing
    const cuda_detail::block_layout layout = layout_of(codec, n);
    auto* const norms = reinterpret_cast<T*>(out.data() + envelope::size);
    std::byte* const codes = out.data() + envelope::size + layout.blocks() * sizeof(T);
    cuda_detail::for_each_block(exec, layout.blocks(),
                                cuda_detail::block_statistics<T, cuda_detail::qsgd_bucket_norm_stat<T>>{
                                    grad.data(), layout, {norms}, op.status()});
    cuda_detail::for_each_item(exec, layout.words(),
                               cuda_detail::encode_words<T, rule>{grad.data(), layout, rule_of(codec, key, norms), codes});
    cuda_detail::seal_message(exec, out.data(),
                              {codec_id::qsgd, dtype_of<T>, 0, 0, key, n, codec.payload_bytes(n), codec.params_hash(), 0},
                              crc, op);
    op.finish_encode([](errc, std::uint64_t position, std::uint32_t reason) {
      if (reason == cuda_detail::qsgd_norm_overflow)
        return "the L2 norm of bucket " + std::to_string(position) + " overflows the value type; no message was written";
      return "gradient value " + std::to_string(position) + " is NaN or Inf; no message was written";
    });
    return size;
  }

  static void decode(const qsgd_quantizer<T>& codec, const cuda_executor& exec, std::span<const std::byte> message,
                     std::span<T> out, std::span<std::byte> ws, const decode_limits& limits, bool accumulate) {
    workspace_arena arena(ws);
    const cuda_detail::operation op(exec, arena);
    const cuda_detail::crc_scratch crc = cuda_detail::crc_scratch::carve(arena);
    const envelope e =
        cuda_detail::read_envelope(exec, message, {codec_id::qsgd, dtype_of<T>, out.size(), codec.params_hash()}, limits, crc);
    codec.validate_payload_size(e);
    const cuda_detail::block_layout layout = layout_of(codec, e.elements);
    const auto* const norms = reinterpret_cast<const T*>(message.data() + envelope::size);
    const std::byte* const codes = message.data() + envelope::size + layout.blocks() * sizeof(T);
    const rule r = rule_of(codec, e.key, nullptr);
    const cuda_detail::check_codes<T, rule> check{layout, r, norms, codes, op.status()};
    cuda_detail::for_each_item(exec, check.items(), check);
    op.finish([](errc, std::uint64_t position, std::uint32_t reason) {
      return cuda_detail::describe_block_code_failure(position, reason, "norm");
    });
    cuda_detail::for_each_item(exec, layout.words(),
                               cuda_detail::decode_words<T, rule>{layout, r, norms, codes, out.data(), accumulate});
  }

 private:
  static cuda_detail::block_layout layout_of(const qsgd_quantizer<T>& codec, std::uint64_t n) {
    return {n, codec.params().bucket, codec.bits(), packed_bytes(n, codec.bits())};
  }
  static rule rule_of(const qsgd_quantizer<T>& codec, message_key key, const T* norms) {
    return {codec.levels(), codec.bits(),
            random_stream{codec.params().seed, key.step, key.tensor_id, random_purpose::stochastic_rounding}, norms};
  }
};

}  // namespace gradcomp
