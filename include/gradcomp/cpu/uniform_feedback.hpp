#pragma once
/// @file
/// The float32 uniform quantizer's fused steps of error feedback and LoCo on the CPU
/// (feedback/fused_step.hpp): one pass over the blocks, in the vectorised layouts that
/// `detail::cpu::uniform_vectorised` accepts, writing the bytes and the new state of the wrappers' plain
/// steps bit for bit. Measurements: docs/feedback.md §8.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <span>

#include <gradcomp/core/cpu_executor.hpp>
#include <gradcomp/core/float_bits.hpp>
#include <gradcomp/core/wire_envelope.hpp>
#include <gradcomp/core/workspace.hpp>
#include <gradcomp/cpu/detail/feedback_kernels.hpp>
#include <gradcomp/cpu/detail/message.hpp>
#include <gradcomp/cpu/detail/staged_writer.hpp>
#include <gradcomp/cpu/detail/uniform_block_encoder.hpp>
#include <gradcomp/feedback/fused_step.hpp>
#include <gradcomp/quantize/uniform.hpp>
#include <gradcomp/quantize/uniform_math.hpp>

namespace gradcomp {

/// Error feedback and LoCo fused into the float32 uniform quantizer's CPU encode.
template <>
struct fused_feedback<uniform_quantizer<float>, cpu_executor> {
  using quantizer = uniform_quantizer<float>;

  /// Error feedback fuses in every layout the vectorised block encoder codes.
  static bool fuses_error_feedback(const quantizer& q, const cpu_executor&) noexcept {
    return detail::cpu::uniform_vectorised(q);
  }

  /// One block of h = g + e.
  static std::size_t error_feedback_workspace_bytes(const quantizer& q, const cpu_executor&, std::uint64_t n) {
    workspace_arena arena = workspace_arena::measure();
    (void)arena.take<float>(static_cast<std::size_t>(std::min<std::uint64_t>(n, q.params().block)));
    return arena.bytes_needed();
  }

  /// One step in one pass over the blocks: per block, h = g + e and its largest magnitude (which
  /// finds NaN and ±Inf), the message's codes (cpu/detail/uniform_block_encoder.hpp), and the new residual
  /// h − decoded written into `next` straight from the codes (streamed when large, per the
  /// executor). It reads g and e once and writes the codes and the new residual once. With β ≠ 1
  /// each block's residual is then multiplied by β while it is in cache (not streamed). The new
  /// residual needs no check: a code's level has the sign of its value (or is 0) and its decoding
  /// stays finite (uniform_step), so |β·(h − decoded)| ≤ max(|h|, |decoded|) is finite.
  static std::size_t encode_with_error_feedback(const quantizer& q, const cpu_executor& e,
                                                const error_feedback_operands<float>& step, std::span<std::byte> out,
                                                std::span<std::byte> ws, message_key key) {
    const std::uint64_t n = step.grad.size();
    const std::uint64_t block = q.params().block;
    workspace_arena arena(ws);
    float* const h = arena.take<float>(static_cast<std::size_t>(std::min<std::uint64_t>(n, block))).data();
    detail::cpu::uniform_block_encoder encoder(q, e, out, n, key);
    const bool avx2 = e.avx2();
    float* const next = step.next.data();
    const bool decays = step.decay != 1.0f;
    const bool streaming = !decays && e.streams(n * sizeof(float)) && detail::cpu::streamable(next);
    const float* const g = step.grad.data();
    const float* const residual = step.residual.data();
    for (std::uint64_t begin = 0; begin < n; begin += block) {
      const std::uint64_t count = std::min(block, n - begin);
      const std::uint32_t largest = detail::cpu::ef_compensate(g + begin, residual + begin, count, h, avx2);
      if (largest >= float_traits<float>::infinity_key) detail::fail_compensated_non_finite(step.grad, step.residual);
      encoder.next(h, count, from_bits<float>(largest), next + begin, streaming);
      if (decays) detail::cpu::ef_decay(next + begin, count, step.decay, avx2);
    }
    const std::size_t size = encoder.finish();
    if (streaming) detail::cpu::streaming_fence();
    return size;
  }

  /// LoCo fuses where its error groups are the quantizer's blocks, in a vectorised layout.
  static bool fuses_loco(const quantizer& q, const cpu_executor&, std::size_t error_group) noexcept {
    return error_group == q.params().block && detail::cpu::uniform_vectorised(q);
  }

  /// One block each of h and of the decoding, then the new error; one group of zero codes.
  static std::size_t loco_workspace_bytes(const quantizer& q, const cpu_executor&, std::uint64_t n) {
    workspace_arena arena = workspace_arena::measure();
    (void)carve_loco(arena, q, n);
    return arena.bytes_needed();
  }

  /// One step in one pass over the blocks: h, the message's block, ĥ, the new error and its codes
  /// are computed block by block in the workspace, and the block's error written back. Declines
  /// (nothing written) unless g and the old error are small enough (below FLT_MAX/16) that no step
  /// of the pass can overflow, so the state is written as the pass goes.
  static std::optional<std::size_t> encode_with_loco(const quantizer& q, const cpu_executor& e,
                                                     const loco_operands<float>& step, std::span<std::byte> out,
                                                     std::span<std::byte> ws, message_key key) {
    if (!small_enough(e, step)) return std::nullopt;
    const std::uint64_t n = step.grad.size();
    workspace_arena arena(ws);
    const loco_scratch s = carve_loco(arena, q, n);
    detail::cpu::uniform_block_encoder encoder(q, e, out, n, key);
    const std::uint64_t block = q.params().block;
    const int bits = q.bits();
    const bool avx2 = e.avx2();
    const float beta = step.beta;
    const float keep = 1.0f - beta;
    // After a reset the old error reads as +0, as the plain step's T{0} does.
    if (step.reset) std::ranges::fill(s.zero_codes, std::int8_t{0});
    constexpr std::uint64_t ahead = prefetch_bytes / sizeof(float);
    const float* const g = step.grad.data();
    for (std::uint64_t begin = 0, j = 0; begin < n; begin += block, ++j) {
      const std::uint64_t count = std::min(block, n - begin);
      detail::cpu::prefetch(g + std::min(n, begin + ahead), g + std::min(n, begin + count + ahead));
      std::int8_t* const error = step.codes.data() + begin;
      const std::int8_t* const old = step.reset ? s.zero_codes.data() : error;
      const float old_scale = step.reset ? 0.0f : step.scales[j];
      detail::cpu::loco_compensate(g + begin, old, old_scale, count, s.h.data(), avx2);
      const float coded_step = encoder.next(s.h.data(), count);
      detail::cpu::uniform_decode_block(encoder.codes(), count, bits, coded_step, s.v.data(), false, false, avx2);
      detail::cpu::loco_blend(s.h.data(), old, old_scale, beta, keep, count, s.v.data(), avx2);
      const float error_step = uniform_step(detail::cpu::max_magnitude(s.v.data(), s.v.data() + count, avx2), 8);
      step.scales[j] = error_step;
      if (error_step == 0.0f) {
        std::memset(error, 0, static_cast<std::size_t>(count));
        continue;
      }
      detail::cpu::loco_quantize_error(s.v.data(), error_step, count, error, avx2);
    }
    return encoder.finish();
  }

 private:
  /// How far ahead of the block being coded the fused LoCo step prefetches g, in bytes. The step is
  /// faster with it; error feedback and the plain quantizer, whose steps are lighter, are faster
  /// without software prefetch (cpu/uniform.hpp). Measurements: docs/feedback.md §8.4.
  static constexpr std::uint64_t prefetch_bytes = 16384;

  /// The fused LoCo step's workspace: one block of h, one of the decoding (then the new error),
  /// one group of zero codes (the old error after a reset).
  struct loco_scratch {
    std::span<float> h;
    std::span<float> v;
    std::span<std::int8_t> zero_codes;
  };
  static loco_scratch carve_loco(workspace_arena& arena, const quantizer& q, std::uint64_t n) {
    const auto block = static_cast<std::size_t>(std::min<std::uint64_t>(n, q.params().block));
    loco_scratch s;
    s.h = arena.take<float>(block);
    s.v = arena.take<float>(block);
    s.zero_codes = arena.take<std::int8_t>(block);
    return s;
  }

  /// Whether g and the old error are below FLT_MAX/16 (an old error scale below that over 127), so
  /// that no step of the fused pass overflows. NaN or ±Inf in g fails the test: the plain step
  /// reports it.
  static bool small_enough(const cpu_executor& e, const loco_operands<float>& step) noexcept {
    constexpr float limit = std::numeric_limits<float>::max() / 16.0f;
    const std::uint64_t n = step.grad.size();
    const std::uint64_t whole = n / detail::cpu::kernel_width * detail::cpu::kernel_width;
    std::uint32_t largest = detail::cpu::max_magnitude_key32(step.grad.data(), whole, e.avx2());
    for (std::uint64_t i = whole; i < n; ++i) largest = std::max(largest, magnitude_key(step.grad[i]));
    float scale = 0;
    if (!step.reset)
      for (const float v : step.scales) scale = std::max(scale, v);
    return largest <= to_bits(limit) && scale <= limit / 127.0f;
  }
};

}  // namespace gradcomp
