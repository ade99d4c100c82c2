#pragma once
/// @file
/// The uniform quantizer's fused steps of error feedback and LoCo on the GPU
/// (feedback/fused_step.hpp), in the layouts whose blocks fill whole code words; they write the
/// bytes and the new state of the wrappers' plain steps bit for bit.
///
/// Error feedback: one kernel does the step. A warp per block forms h = g + e, finds its largest
/// magnitude, writes the scale and the codes, and writes fl(β·(h − code·s)) as the new residual
/// (one read of g and e, one write of the codes and of the new residual; for 8- and 4-bit codes and
/// blocks of at most 256 values the block stays in registers and moves by 128-bit accesses,
/// cuda/uniform.cuh).
///
/// LoCo, where the error groups are the quantizer's blocks (the defaults): check kernels read g
/// (NaN or Inf is `non_finite_input`) and the old error scales and decide, as the CPU's fused step
/// does, whether g and the old error are small enough (below FLT_MAX/16) that nothing later can
/// overflow; then one kernel does the step with a warp per block: h = g + dequant8(e), its scale
/// and codes, ĥ, the new error v = β·dequant8(e) + (1 − β)·(h − ĥ) and its 8-bit codes, written
/// over the old ones (each lane rewrites only the elements it read; for 8- and 4-bit codes and
/// blocks of at most 256 values the block stays in registers and is read once,
/// cuda/detail/lane_layout.cuh). The message is sealed before the host reads the verdict; when the
/// magnitudes are too large, the step declines and LoCo's plain steps run.

#include <gradcomp/cuda/config.cuh>

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>

#include <gradcomp/core/backend.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/float_bits.hpp>
#include <gradcomp/core/rounded_product.hpp>
#include <gradcomp/core/wire_envelope.hpp>
#include <gradcomp/core/workspace.hpp>
#include <gradcomp/cuda/detail/block_codes.cuh>
#include <gradcomp/cuda/executor.cuh>
#include <gradcomp/cuda/detail/grid.cuh>
#include <gradcomp/cuda/detail/lane_layout.cuh>
#include <gradcomp/cuda/detail/message.cuh>
#include <gradcomp/cuda/detail/operation.cuh>
#include <gradcomp/cuda/uniform.cuh>
#include <gradcomp/cuda/detail/warp.cuh>
#include <gradcomp/feedback/error_feedback.hpp>
#include <gradcomp/feedback/fused_step.hpp>
#include <gradcomp/feedback/loco.hpp>
#include <gradcomp/quantize/uniform.hpp>
#include <gradcomp/quantize/uniform_math.hpp>

namespace gradcomp {

namespace detail::cuda {

/// The reason (low byte of `device_status::detail`) recorded with `non_finite_input` where the new
/// residual, rather than h = g + e, is NaN or Inf.
inline constexpr std::uint32_t residual_not_finite = 1;

/// The values error feedback codes: h = g + e; the new residual fl(β·(h − decoded)) is written to
/// `next` as each value is coded (the uniform encoder's one-warp-per-block kernel, cuda/uniform.cuh),
/// and where it overflows (a 1-bit stochastic code of a large block can land far from h) the step
/// fails with `residual_not_finite`, as the plain step's check does.
template <class T>
struct compensated_values {
  const T* g;
  const T* e;
  T* next;
  T beta;
  device_status* status;

  __device__ T operator()(std::uint64_t i) const { return g[i] + e[i]; }
  __device__ void coded(std::uint64_t i, T h, T decoded) const { next[i] = checked_residual(i, h, decoded); }

  /// Whether the quad kernel may use 128-bit loads and stores.
  [[nodiscard]] bool aligned() const { return vector_aligned(g) && vector_aligned(e) && vector_aligned(next); }
  /// Reads h = g + e of the calling lane's quads of the block from element `begin`.
  __device__ void load(std::uint64_t begin, bool vector, lane_quads<T>& h) const {
    T residual[quad_rows][quad_values];
#pragma unroll
    for (unsigned r = 0; r < quad_rows; ++r) {
      const std::uint64_t first = begin + quad_offset(r, lane_id());
      load_quad(g + first, h.count[r], vector, h.x[r]);
      load_quad(e + first, h.count[r], vector, residual[r]);
#pragma unroll
      for (unsigned k = 0; k < quad_values; ++k) h.x[r][k] = h.x[r][k] + residual[r][k];
    }
  }
  /// Writes fl(β·(h − decoded)) of a coded quad as its new residual.
  __device__ void coded_quad(std::uint64_t first, unsigned count, bool vector, const T (&h)[quad_values],
                             const T (&decoded)[quad_values]) const {
    T residual[quad_values];
#pragma unroll
    for (unsigned k = 0; k < quad_values; ++k)  // values past `count` are zeros: their residual is 0
      residual[k] = checked_residual(first + k, h[k], decoded[k]);
    store_quad(next + first, count, vector, residual);
  }

 private:
  /// fl(β·(h − decoded)) of element i, recording `residual_not_finite` where it is NaN or Inf.
  __device__ T checked_residual(std::uint64_t i, T h, T decoded) const {
    const T residual = decayed_residual(beta, h, decoded);
    if (!is_finite(residual)) record_failure(status, errc::non_finite_input, i, residual_not_finite);
    return residual;
  }
};


/// Flags of the one-kernel path's check, in the workspace next to the status.
struct loco_check_flags {
  std::uint32_t too_large;  ///< Some |g| or old error scale exceeds the bound: take the plain steps.
};

/// The bound below which the one-kernel path cannot overflow (the CPU's fused path's: FLT_MAX/16
/// for |g|, that over 127 for an old error scale).
template <class T>
inline constexpr T loco_fused_limit = std::numeric_limits<T>::max() / T{16};

/// One thread per quad of g (4 values; 128-bit loads when `vector`): NaN or Inf is recorded
/// (its first in the quad); |g| above the bound raises `too_large`, so the plain steps decide.
template <class T>
struct loco_check_gradient {
  const T* g;
  std::uint64_t n;
  bool vector;  ///< g is 16-byte aligned.
  loco_check_flags* flags;
  device_status* status;

  /// Items to check: the quads of g.
  [[nodiscard]] std::uint64_t items() const { return (n + quad_values - 1) / quad_values; }

  __device__ void operator()(std::uint64_t q) const {
    const std::uint64_t first = q * quad_values;
    T x[quad_values];
    load_quad(g + first, quad_count(n, first), vector, x);
    bool large = false;
#pragma unroll
    for (unsigned e = 0; e < quad_values; ++e) {  // values past n read as 0
      if (!is_finite(x[e])) {
        record_failure(status, errc::non_finite_input, first + e);
        return;
      }
      large = large || from_bits<T>(magnitude_key(x[e])) > loco_fused_limit<T>;
    }
    if (large) atomicOr(&flags->too_large, 1u);
  }
};

/// One thread per error group: an old error scale above the bound, or NaN, raises `too_large`.
template <class T>
struct loco_check_scales {
  const T* scales;
  loco_check_flags* flags;

  __device__ void operator()(std::uint64_t j) const {
    if (!(scales[j] <= loco_fused_limit<T> / T{127})) atomicOr(&flags->too_large, 1u);  // NaN too
  }
};

/// The four error codes of a quad at `p`, byte e of the result (0 past `count`): one 32-bit load
/// when whole and `vector`.
__device__ inline std::uint32_t load_error_codes(const std::int8_t* p, unsigned count, bool vector) {
  if (vector && count == quad_values) return *reinterpret_cast<const std::uint32_t*>(p);
  std::uint32_t word = 0;
#pragma unroll
  for (unsigned e = 0; e < quad_values; ++e)
    if (e < count) word |= std::uint32_t{static_cast<std::uint8_t>(p[e])} << (8 * e);
  return word;
}

/// Error code e of a quad's codes as load_error_codes packs them.
__device__ inline std::int8_t error_code_at(std::uint32_t codes, unsigned e) {
  return static_cast<std::int8_t>(codes >> (8 * e));
}

/// Writes the first `count` error codes of a quad (byte e of `codes`) to `p`, as load_error_codes
/// reads them.
__device__ inline void store_error_codes(std::int8_t* p, unsigned count, bool vector, std::uint32_t codes) {
  if (vector && count == quad_values) {
    *reinterpret_cast<std::uint32_t*>(p) = codes;
    return;
  }
#pragma unroll
  for (unsigned e = 0; e < quad_values; ++e)
    if (e < count) p[e] = error_code_at(codes, e);
}

/// One warp per block (= error group, filling whole code words) where the quads do not fit: the
/// whole LoCo step in three passes over the block (the later ones hit L1). Every pass
/// maps the same elements to the same lane (the lanes take whole code words), and warp-wide
/// maxima separate the passes, so the old error codes a lane rewrites are read by no other lane.
template <class T>
struct loco_uniform_blocks {
  const T* g;
  block_layout layout;
  uniform_rule<T> rule;
  std::int8_t* codes;  ///< The state's error codes (old in, new out).
  T* error_scales;     ///< The state's error scales (old in, new out).
  bool reset;
  T beta;
  T keep;
  T* scales;           ///< The message's scales.
  std::byte* message_codes;
  const loco_check_flags* flags;
  const device_status* status;

  __device__ T old_error(std::uint64_t i, T old_scale) const {
    return reset ? T{0} : mul_rn(static_cast<T>(codes[i]), old_scale);
  }

  __device__ void operator()(std::uint64_t j) const {
    if (failed(status) || flags->too_large != 0) return;  // the host reports, or LoCo takes its plain steps
    const std::uint64_t begin = j * layout.block;
    const std::uint64_t count = layout.count(j);
    const std::uint64_t per_word = layout.per_word();
    const std::uint64_t words = (count + per_word - 1) / per_word;
    const T old_scale = reset ? T{0} : error_scales[j];
    const auto for_each_value = [&](auto&& f) {  // this lane's values, word by word
      for (std::uint64_t w = lane_id(); w < words; w += 32) {
        const std::uint64_t first = begin + w * per_word;
        const std::uint64_t last = first + per_word < begin + count ? first + per_word : begin + count;
        f(first, last);
      }
    };

    typename float_traits<T>::bits_type largest = 0;
    for_each_value([&](std::uint64_t first, std::uint64_t last) {
      for (std::uint64_t i = first; i < last; ++i) {
        const auto key = magnitude_key(g[i] + old_error(i, old_scale));
        largest = key > largest ? key : largest;
      }
    });
    const T m = from_bits<T>(warp_max(largest));
    const uniform_block_coding<T> coding(m, uniform_step(m, layout.bits), layout.bits);
    if (lane_id() == 0) scales[j] = coding.s;

    typename float_traits<T>::bits_type largest_error = 0;
    for_each_value([&](std::uint64_t first, std::uint64_t last) {
      std::uint32_t word = 0;
      philox_cache random;
      for (std::uint64_t i = first; i < last; ++i) {
        const T old = old_error(i, old_scale);
        const T h = g[i] + old;
        const std::uint8_t c = rule.code(h, i, coding, random);
        word |= std::uint32_t{c} << ((i - first) * static_cast<unsigned>(layout.bits));
        const auto key = magnitude_key(loco_blend(old, h, rule.value(c, coding.s), beta, keep));
        largest_error = key > largest_error ? key : largest_error;
      }
      store_code_word(message_codes, first / per_word, word, layout.code_bytes);
    });
    const T error_step = uniform_step(from_bits<T>(warp_max(largest_error)), 8);

    for_each_value([&](std::uint64_t first, std::uint64_t last) {
      philox_cache random;
      for (std::uint64_t i = first; i < last; ++i) {
        const T old = old_error(i, old_scale);
        const T h = g[i] + old;
        const std::uint8_t c = rule.code(h, i, coding, random);
        codes[i] = loco_error_code(loco_blend(old, h, rule.value(c, coding.s), beta, keep), error_step);
      }
    });
    if (lane_id() == 0) error_scales[j] = error_step;
  }
};

/// One warp per block (= error group) of Bits-bit codes (8 or 4) and at most 256 values, the
/// whole LoCo step in registers (quads, cuda/detail/lane_layout.cuh), with the operands of
/// loco_uniform_blocks: each lane reads its quads of g and of the old error codes once (128-bit
/// and 32-bit loads when `vector`) and forms h = g + dequant8(e); the warp's largest |h| gives the
/// message's scale; each lane codes h, keeps v = β·dequant8(e) + (1 − β)·(h − ĥ), and stores whole
/// message code words; the warp's largest |v| gives the error step, and each lane writes the new
/// error codes over the old ones it read (v / step is an IEEE division per value, as on the CPU: a
/// reciprocal would round differently).
template <class T, int Bits, rounding Mode>
struct loco_uniform_quads {
  loco_uniform_blocks<T> step;  ///< The gradient, layout, rule, state, β and outputs.
  bool vector;                  ///< `step.g` is 16-byte aligned and `step.codes` 4-byte aligned.

  __device__ void operator()(std::uint64_t j) const {
    const loco_uniform_blocks<T>& s = step;
    if (failed(s.status) || s.flags->too_large != 0) return;  // the host reports, or LoCo takes its plain steps
    const std::uint64_t begin = j * s.layout.block;
    const std::uint64_t count = s.layout.count(j);
    const unsigned lane = lane_id();
    const T old_scale = s.reset ? T{0} : s.error_scales[j];
    lane_quads<T> h(count);
    h.load(s.g + begin, vector);
    std::uint32_t old_codes[quad_rows] = {};  // dequant8(e) is recomputed from them (one product)
    const auto old = [&](unsigned r, unsigned e) {
      return s.reset ? T{0} : mul_rn(static_cast<T>(error_code_at(old_codes[r], e)), old_scale);
    };
#pragma unroll
    for (unsigned r = 0; r < quad_rows; ++r) {
      old_codes[r] = load_error_codes(s.codes + begin + quad_offset(r, lane), h.count[r], vector);
#pragma unroll
      for (unsigned e = 0; e < quad_values; ++e) h.x[r][e] = h.x[r][e] + old(r, e);
    }
    const T m = from_bits<T>(warp_max(h.largest_key()));
    const uniform_block_coding<T> coding(m, uniform_step(m, Bits), Bits);
    if (lane == 0) s.scales[j] = coding.s;

    std::uint32_t pieces[quad_rows];
    code_quads<Bits, Mode>(s.rule, coding, begin, h, pieces, [&](unsigned r, const T(&decoded)[quad_values]) {
#pragma unroll
      for (unsigned e = 0; e < quad_values; ++e)  // v over h, which is not read again
        h.x[r][e] = e < h.count[r] ? loco_blend(old(r, e), h.x[r][e], decoded[e], s.beta, s.keep) : T{0};
    });
    store_quad_words<Bits>(s.message_codes, s.layout.code_bytes, begin * Bits / 32, count, pieces);

    const T error_step = uniform_step(from_bits<T>(warp_max(h.largest_key())), 8);
#pragma unroll
    for (unsigned r = 0; r < quad_rows; ++r) {
      std::uint32_t word = 0;
#pragma unroll
      for (unsigned e = 0; e < quad_values; ++e)
        word |= std::uint32_t{static_cast<std::uint8_t>(loco_error_code(h.x[r][e], error_step))} << (8 * e);
      store_error_codes(s.codes + begin + quad_offset(r, lane), h.count[r], vector, word);
    }
    if (lane == 0) s.error_scales[j] = error_step;
  }
};

}  // namespace detail::cuda

/// Error feedback and LoCo fused into the uniform quantizer's GPU encode.
template <class T>
struct fused_feedback<uniform_quantizer<T>, cuda_executor> {
  using quantizer = uniform_quantizer<T>;
  using uniform_backend = backend<quantizer, cuda_executor>;

  /// Error feedback fuses where the quantizer's blocks fill whole code words.
  static bool fuses_error_feedback(const quantizer& q, const cuda_executor&) {
    return uniform_backend::layout_of(q, 0).whole_words();
  }

  /// The operation's status and the payload CRC's scratch.
  static std::size_t error_feedback_workspace_bytes(const quantizer& q, const cuda_executor&, std::uint64_t) {
    return detail::cuda::operation::workspace_bytes(
        [&](workspace_arena& arena) { (void)detail::cuda::carve_seal(arena, q.wire().payload_checksum); });
  }

  /// The whole step in one kernel; waits for its verdict.
  static std::size_t encode_with_error_feedback(const quantizer& q, const cuda_executor& exec,
                                                const error_feedback_operands<T>& step, std::span<std::byte> out,
                                                std::span<std::byte> ws, message_key key) {
    workspace_arena arena(ws);
    const detail::cuda::operation op(exec, arena);
    const detail::cuda::crc_scratch crc = detail::cuda::carve_seal(arena, q.wire().payload_checksum);
    const std::uint64_t n = step.grad.size();
    const std::size_t size = q.max_encoded_bytes(n);
    detail::cuda::begin_message(exec, out, size);
    const detail::cuda::block_layout layout = uniform_backend::layout_of(q, n);
    detail::cuda::encode_whole_word_blocks(exec,
                                           detail::cuda::compensated_values<T>{step.grad.data(), step.residual.data(),
                                                                               step.next.data(), step.decay,
                                                                               op.status()},
                                           layout, uniform_backend::rule_of(q, key),
                                           detail::cuda::scales_of<T>(out.data()),
                                           detail::cuda::codes_of<T>(out.data(), layout), op.status());
    detail::cuda::seal_message(exec, out.data(),
                               {codec_id::uniform, dtype_of<T>, 0, 0, key, n, q.payload_bytes(n), q.params_hash(), 0},
                               crc, op);
    op.finish([&](errc, std::uint64_t i, std::uint32_t reason) {
      return (reason == detail::cuda::residual_not_finite ? "the new residual (g + e minus its decoding) is NaN or Inf"
                                                          : "gradient + residual is NaN or Inf") +
             std::string(" at element ") + std::to_string(i) + " of " + std::to_string(n) + "; the state is unchanged";
    });
    return size;
  }

  /// LoCo fuses where its error groups are the quantizer's blocks, which fill whole code words.
  static bool fuses_loco(const quantizer& q, const cuda_executor&, std::size_t error_group) {
    return error_group == q.params().block && uniform_backend::layout_of(q, 0).whole_words();
  }

  /// The operation's status, the check's flags and the payload CRC's scratch.
  static std::size_t loco_workspace_bytes(const quantizer& q, const cuda_executor&, std::uint64_t) {
    return detail::cuda::operation::workspace_bytes([&](workspace_arena& arena) { (void)carve_loco(arena, q); });
  }

  /// The one-kernel step; declines (nothing written to the state) when the magnitudes call for the
  /// plain steps. @throws error `non_finite_input` for NaN or Inf in g (state unchanged).
  static std::optional<std::size_t> encode_with_loco(const quantizer& q, const cuda_executor& exec,
                                                     const loco_operands<T>& step, std::span<std::byte> out,
                                                     std::span<std::byte> ws, message_key key) {
    workspace_arena arena(ws);
    const detail::cuda::operation op(exec, arena);
    const loco_scratch s = carve_loco(arena, q);
    const std::uint64_t n = step.grad.size();
    const std::size_t size = q.max_encoded_bytes(n);
    detail::cuda::begin_message(exec, out, size);
    GRADCOMP_CUDA_CHECK(cudaMemsetAsync(s.flags, 0, sizeof(detail::cuda::loco_check_flags), exec.native_stream()));
    const detail::cuda::loco_check_gradient<T> check{step.grad.data(), n,
                                                     detail::cuda::vector_aligned(step.grad.data()), s.flags,
                                                     op.status()};
    detail::cuda::for_each_item(exec, check.items(), check);
    if (!step.reset)
      detail::cuda::for_each_item(exec, step.scales.size(),
                                  detail::cuda::loco_check_scales<T>{step.scales.data(), s.flags});
    const detail::cuda::block_layout layout = uniform_backend::layout_of(q, n);
    const detail::cuda::uniform_rule<T> rule = uniform_backend::rule_of(q, key);
    T* const scales = detail::cuda::scales_of<T>(out.data());
    std::byte* const codes = detail::cuda::codes_of<T>(out.data(), layout);
    const detail::cuda::loco_uniform_blocks<T> kernel{
        step.grad.data(), layout, rule,  step.codes.data(), step.scales.data(), step.reset, step.beta,
        T{1} - step.beta, scales, codes, s.flags,           op.status()};
    if (detail::cuda::quads_fit(layout.block, layout.bits)) {
      const bool vector = detail::cuda::vector_aligned(step.grad.data()) &&
                          reinterpret_cast<std::uintptr_t>(step.codes.data()) % 4 == 0;
      detail::cuda::with_quad_constants(layout.bits, rule.mode, [&](auto bits, auto mode) {
        detail::cuda::for_each_block(
            exec, layout.blocks(),
            detail::cuda::loco_uniform_quads<T, decltype(bits)::value, decltype(mode)::value>{kernel, vector});
      });
    } else {
      detail::cuda::for_each_block(exec, layout.blocks(), kernel);
    }
    // Sealed before the wait; the seal writes nothing after a recorded failure (NaN or Inf in g).
    detail::cuda::seal_message(exec, out.data(),
                               {codec_id::uniform, dtype_of<T>, 0, 0, key, n, q.payload_bytes(n), q.params_hash(), 0},
                               s.crc, op);
    op.finish([&](errc, std::uint64_t i, std::uint32_t) {
      return "gradient value " + std::to_string(i) + " of " + std::to_string(n) +
             " is NaN or Inf; the state is unchanged";
    });
    detail::cuda::loco_check_flags flags{};  // the stream is idle now: this read does not wait for the step
    GRADCOMP_CUDA_CHECK(cudaMemcpyAsync(&flags, s.flags, sizeof flags, cudaMemcpyDeviceToHost, exec.native_stream()));
    exec.synchronize();
    if (flags.too_large != 0) {
      // Nothing was coded, but the seal ran: unseal before the plain steps write the message.
      GRADCOMP_CUDA_CHECK(cudaMemsetAsync(out.data(), 0, envelope::size, exec.native_stream()));
      return std::nullopt;
    }
    return size;
  }

 private:
  /// The fused LoCo step's workspace after the operation's status.
  struct loco_scratch {
    detail::cuda::loco_check_flags* flags;  ///< The check's verdict.
    detail::cuda::crc_scratch crc;          ///< The payload CRC (with checksums).
  };
  static loco_scratch carve_loco(workspace_arena& arena, const quantizer& q) {
    loco_scratch s{};
    s.flags = arena.take<detail::cuda::loco_check_flags>(1).data();
    s.crc = detail::cuda::carve_seal(arena, q.wire().payload_checksum);
    return s;
  }
};

}  // namespace gradcomp
