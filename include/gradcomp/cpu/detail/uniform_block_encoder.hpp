#pragma once
/// @file
/// The block step of the uniform quantizer's CPU encoder, shared by the quantizer itself and by the
/// fused error-feedback and LoCo paths that code a compensated block held in cache: the reference
/// arithmetic value by value (`uniform_scalar_codes`, any layout), and `uniform_block_encoder`,
/// which writes the float32 blocks of one message in order with the vectorised kernels.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <type_traits>

#include <gradcomp/core/bit_packing.hpp>
#include <gradcomp/core/cpu_executor.hpp>
#include <gradcomp/core/float_bits.hpp>
#include <gradcomp/core/philox.hpp>
#include <gradcomp/core/rounded_product.hpp>
#include <gradcomp/core/wire_envelope.hpp>
#include <gradcomp/cpu/detail/half_conversion.hpp>
#include <gradcomp/cpu/detail/message.hpp>
#include <gradcomp/cpu/detail/philox_simd.hpp>
#include <gradcomp/cpu/detail/staged_writer.hpp>
#include <gradcomp/cpu/detail/uniform_kernels.hpp>
#include <gradcomp/quantize/uniform_math.hpp>

namespace gradcomp::detail::cpu {

/// Codes (one per byte) of x[0, count) in a block of largest magnitude m and step s, with the
/// random halves `halves` (stochastic rounding only): the reference arithmetic, value by value.
/// The scaled values t (and stochastic rounding's u) come first, a run at a time, into arrays; with
/// stochastic rounding, which adds u to t, each product x·inv is rounded on its own (`mul_rn`). The
/// loop that turns them into codes then holds no product to fuse, and vectorises. Round to nearest
/// only converts t: the plain product.
template <gradient_value T>
void uniform_scalar_codes(const T* x, std::uint64_t count, T m, T s, int bits, rounding mode,
                          const std::uint16_t* halves, std::uint8_t* out) noexcept {
  constexpr std::uint64_t run = 512;
  const auto levels = static_cast<T>(uniform_levels(bits));
  const T inv = m > T{0} ? levels / m : T{0};
  const bool multiply = m > T{0} && is_finite(inv);
  const bool stochastic = mode == rounding::stochastic;
  T t[run], u[run];
  const auto scale_run = [&](const T* from, std::uint64_t n, auto product) {
    for (std::uint64_t c = 0; c < n; ++c) t[c] = s == T{0} ? T{0} : (multiply ? product(from[c]) : from[c] / s);
  };
  for (std::uint64_t first = 0; first < count; first += run) {
    const std::uint64_t n = std::min(run, count - first);
    if (stochastic) scale_run(x + first, n, [inv](T v) { return mul_rn(v, inv); });
    else
      scale_run(x + first, n, [inv](T v) { return v * inv; });
    for (std::uint64_t c = 0; c < n; ++c)
      u[c] = stochastic ? static_cast<T>(halves[first + c]) * static_cast<T>(1.0 / 65536.0) : T{0};
    for (std::uint64_t c = 0; c < n; ++c) out[first + c] = uniform_code(uniform_level(t[c], bits, mode, u[c]), bits);
  }
}

/// Packs `count` codes (one per byte) into the ⌈count·bits/8⌉ bytes at `packed`, starting on a
/// byte boundary.
inline void pack_codes_aligned(const std::uint8_t* codes, std::uint64_t count, int bits,
                               std::uint8_t* packed) noexcept {
  if (bits == 8) {
    std::memcpy(packed, codes, static_cast<std::size_t>(count));
    return;
  }
  const auto per_byte = static_cast<std::uint64_t>(8 / bits);
  for (std::uint64_t c = 0; c < count; c += per_byte)
    packed[c / per_byte] = pack_byte(codes + c, static_cast<int>(std::min(per_byte, count - c)), bits);
}

/// Writes the envelope of the uniform quantizer `codec`'s n-element message whose payload is in
/// place in `out`.
template <class Quantizer>
void seal_uniform_message(const Quantizer& codec, std::span<std::byte> out, message_key key, std::uint64_t n) {
  seal_message(out,
               {codec_id::uniform, dtype_of<typename Quantizer::value_type>, 0, 0, key, n, codec.payload_bytes(n),
                codec.params_hash(), 0},
               codec.wire().payload_checksum);
}

/// Decodes one block of `count` packed 8-bit or 4-bit codes (starting on a byte) of step s into
/// out[0, count), or adds them to it with `accumulate`: the vectorised kernel for whole groups of
/// 32 (with non-temporal stores when `streaming`), code·s value by value after.
inline void uniform_decode_block(const std::uint8_t* codes, std::uint64_t count, int bits, float s, float* out,
                                 bool accumulate, bool streaming, bool avx2) noexcept {
  const std::uint64_t whole = uniform_kernels_compiled ? count / kernel_width * kernel_width : 0;
  if constexpr (uniform_kernels_compiled) {
    if (bits == 8) decode_codes<8>(codes, whole, s, out, accumulate, streaming, avx2);
    else
      decode_codes<4>(codes, whole, s, out, accumulate, streaming, avx2);
  }
  for (std::uint64_t i = whole; i < count; ++i) {
    const float value = mul_rn(static_cast<float>(uniform_code_level(packed_code(codes, i, bits), bits)), s);
    out[i] = accumulate ? out[i] + value : value;
  }
}

/// residual[i] = x[i] − (the value uniform_decode_block gives code i) for i < count, the packed
/// 8-bit or 4-bit codes starting on a byte: the vectorised kernel for whole groups of 32 (streamed
/// when `streaming`), value by value after.
inline void uniform_residual_block(const std::uint8_t* codes, std::uint64_t count, int bits, float s, const float* x,
                                   float* residual, bool streaming, bool avx2) noexcept {
  const std::uint64_t whole = uniform_kernels_compiled ? count / kernel_width * kernel_width : 0;
  if constexpr (uniform_kernels_compiled) {
    if (bits == 8) residual_of_codes<8>(codes, whole, s, x, residual, streaming, avx2);
    else
      residual_of_codes<4>(codes, whole, s, x, residual, streaming, avx2);
  }
  for (std::uint64_t i = whole; i < count; ++i)
    residual[i] = x[i] - mul_rn(static_cast<float>(uniform_code_level(packed_code(codes, i, bits), bits)), s);
}

/// Whether `uniform_block_encoder` handles the uniform quantizer `codec`'s layout: float32 scales
/// (a float, bf16 or fp16 gradient), 8-bit codes, or 4-bit round to nearest, in blocks of a
/// multiple of 32 values whose codes fit the stage.
template <class Quantizer>
[[nodiscard]] constexpr bool uniform_vectorised(const Quantizer& codec) noexcept {
  const auto& p = codec.params();
  return std::is_same_v<typename Quantizer::scale_type, float> && p.block % kernel_width == 0 &&
         packed_bytes(p.block, p.bits) <= staged_writer::capacity &&
         (p.bits == 8 || (p.bits == 4 && p.round == rounding::nearest_even));
}

/// Writes the scales and codes of a uniform message with float32 scales (of `Quantizer` =
/// `uniform_quantizer<float>`, or of bf16 or fp16 whose blocks the caller widens, in a layout
/// `uniform_vectorised` accepts) block after block, each
/// block's codes staged whole (so they can be read back until the next block) and written to the
/// message through a staged_writer (streamed when large, per the executor). A template only so
/// that this header does not need the quantizer's own header, which includes it.
template <class Quantizer>
class uniform_block_encoder {
 public:
  /// Starts `codec`'s message of n values in `out`: checks that `out` holds it and zeroes the
  /// envelope (`begin_message`). @throws error `buffer_too_small`.
  uniform_block_encoder(const Quantizer& codec, const cpu_executor& exec, std::span<std::byte> out, std::uint64_t n,
                        message_key key)
      : codec_(codec),
        simd_(exec.simd()),
        avx2_(exec.avx2()),
        stream_{codec.params().seed, key.step, key.tensor_id, random_purpose::stochastic_rounding},
        out_(begin(out, codec.max_encoded_bytes(n))),
        key_(key),
        n_(n),
        scales_(out.data() + envelope::size),
        writer_(scales_ + codec.block_count(n) * sizeof(float), exec.streams(packed_bytes(n, codec.bits()))) {}

  /// Codes the next block, values x[0, count) (count = the block size, or less for the last
  /// block), and returns its step s; its codes are at `codes()` until the next call.
  /// @throws error `non_finite_input` when x holds NaN or ±Inf.
  float next(const float* x, std::uint64_t count) { return next(x, count, max_magnitude(x, x + count, avx2_)); }

  /// `next(x, count)` for a caller that has found m = max |x[0, count)| already (m finite).
  float next(const float* x, std::uint64_t count, float m) { return code_block(x, count, m, nullptr, false); }

  /// `next(x, count, m)` for a block of 16-bit values, coded as their float32 widening: bf16 read
  /// directly by the 8-bit round-to-nearest kernels, otherwise widened a chunk at a time into a
  /// buffer of the encoder's.
  template <half_precision H>
  float next(const H* x, std::uint64_t count, float m) {
    return code_block(x, count, m, nullptr, false);
  }

  /// `next(x, count, m)` that also writes residual[i] = x[i] − (the decoding of code i) for
  /// i < count, error feedback's new residual: with 8-bit round-to-nearest codes in the same pass,
  /// otherwise from the codes just written. With `streaming` (residual `streamable`) the residual
  /// is written with non-temporal stores; the caller orders them (streaming_fence).
  float next(const float* x, std::uint64_t count, float m, float* residual, bool streaming) {
    return code_block(x, count, m, residual, streaming);
  }

  /// Writes the staged codes out and seals the envelope, after the last block; returns the size of
  /// the message.
  std::size_t finish() {
    writer_.finish();
    seal_uniform_message(codec_, out_, key_, n_);
    return codec_.max_encoded_bytes(n_);
  }

  /// The packed codes of the block coded last.
  [[nodiscard]] const std::uint8_t* codes() const noexcept { return codes_; }

 private:
  /// Values coded per kernel call (and random halves drawn per Philox run).
  static constexpr std::uint64_t chunk = 512;

  static std::span<std::byte> begin(std::span<std::byte> out, std::size_t size) {
    begin_message(out, size);
    return out;
  }

  /// The block step of every `next`: the block's step and codes, and with `residual` its residual
  /// (float32 values only).
  template <class X>
  float code_block(const X* x, std::uint64_t count, float m, float* residual, bool streaming) {
    const auto& p = codec_.params();
    const int bits = p.bits;
    const float s = uniform_step(m, bits);
    std::memcpy(scales_ + block_ * sizeof(float), &s, sizeof s);
    const float inv = m > 0.0f ? static_cast<float>(uniform_levels(bits)) / m : 0.0f;
    const bool multiply = m > 0.0f && is_finite(inv);
    const bool rne = p.round == rounding::nearest_even;
    codes_ = reinterpret_cast<std::uint8_t*>(writer_.reserve(static_cast<std::size_t>(packed_bytes(count, bits))));
    for (std::uint64_t first = 0; first < count; first += chunk) {
      const std::uint64_t part = std::min(chunk, count - first);
      std::uint8_t* const target = codes_ + first * static_cast<std::uint64_t>(bits) / 8;
      const std::uint16_t* const halves =
          rne ? nullptr : detail::philox_stream_halves(stream_, element_ + first, part, random_halves_, simd_);
      const std::uint64_t done = uniform_kernels_compiled && multiply ? part / kernel_width * kernel_width : 0;
      std::uint64_t with_residual = 0;  // values whose residual the coding kernel wrote
      // The chunk as float32: x itself, or 16-bit values widened into `wide_` (bf16's 8-bit
      // round-to-nearest kernel reads them directly, so only its scalar tail is widened).
      const bool direct = std::is_same_v<X, bf16> && bits == 8 && rne;
      const float* xf = nullptr;
      if constexpr (std::is_same_v<X, float>) xf = x + first;
      else {
        const std::uint64_t from = direct ? done : 0;
        widen_values(x + first + from, part - from, wide_ + from);
        xf = wide_;
      }
      if constexpr (uniform_kernels_compiled) {
        if (bits == 4) {
          encode4_rtn(xf, done, inv, target, avx2_);
        } else if (rne && residual != nullptr) {
          encode8_rtn_residual(xf, done, inv, s, target, residual + first, streaming, avx2_);
          with_residual = done;
        } else if (rne) {
          if constexpr (std::is_same_v<X, bf16>) encode8_rtn(x + first, done, inv, target, avx2_);
          else
            encode8_rtn(xf, done, inv, target, avx2_);
        } else {
          encode8_sr(xf, done, inv, halves, target, avx2_);
        }
      }
      if (done < part) {
        uniform_scalar_codes(xf + done, part - done, m, s, bits, p.round, halves == nullptr ? nullptr : halves + done,
                             scalar_codes_);
        pack_codes_aligned(scalar_codes_, part - done, bits, target + done * static_cast<std::uint64_t>(bits) / 8);
      }
      if (residual != nullptr)
        uniform_residual_block(target + with_residual * static_cast<std::uint64_t>(bits) / 8, part - with_residual,
                               bits, s, xf + with_residual, residual + first + with_residual, streaming, avx2_);
    }
    ++block_;
    element_ += count;
    return s;
  }

  const Quantizer& codec_;
  cpu_simd simd_;
  bool avx2_;
  random_stream stream_;
  std::span<std::byte> out_;
  message_key key_;
  std::uint64_t n_;
  std::byte* scales_;
  staged_writer writer_;
  std::uint64_t block_ = 0;
  std::uint64_t element_ = 0;
  std::uint8_t* codes_ = nullptr;
  std::uint8_t scalar_codes_[chunk];
  alignas(64) float wide_[chunk];  ///< A chunk of 16-bit values widened (unused for float32 blocks).
  alignas(16) std::uint16_t random_halves_[chunk + detail::philox_halves_slack];
};

}  // namespace gradcomp::detail::cpu
