#pragma once
/// @file
/// LoCo on the GPU, with the CPU backend's bytes and 8-bit error state.
///
/// State: the error codes (int8, one per element) and scales in device memory, about one byte per
/// element as on the CPU, and the step counters on the host.
///
/// Around the uniform quantizer whose blocks fill whole code words and equal the error groups (the
/// defaults), check kernels read g (NaN or Inf is `non_finite_input`) and the old error scales and
/// decide, as the CPU's fused path does, whether g and the old error are small enough (below
/// FLT_MAX/16) that nothing later can overflow; then one kernel does the step with a warp per
/// block: h = g + dequant8(e), its scale and codes, ĥ, the new error v = β·dequant8(e) +
/// (1 − β)·(h − ĥ) and its 8-bit codes, written over the old ones (each lane rewrites only the
/// elements it read; for 8- and 4-bit codes and blocks of at most 256 values the block stays in
/// registers and is read once, cuda/lane_layout.cuh). The message is sealed before the host
/// reads the verdict. When the magnitudes
/// are too large for that, and around any other codec, the reference steps run: h into the
/// workspace (checked), the inner codec's encode and decode, v (checked; a failure zeroes the
/// message's envelope), and the error quantized group by group into the state.

#include <gradcomp/cuda/config.cuh>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <type_traits>

#include <gradcomp/core/backend.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/float_bits.hpp>
#include <gradcomp/core/rounded_product.hpp>
#include <gradcomp/core/wire_envelope.hpp>
#include <gradcomp/core/workspace.hpp>
#include <gradcomp/cuda/block_codes.cuh>
#include <gradcomp/cuda/device_array.cuh>
#include <gradcomp/cuda/error_feedback.cuh>
#include <gradcomp/cuda/executor.cuh>
#include <gradcomp/cuda/finite_check.cuh>
#include <gradcomp/cuda/grid.cuh>
#include <gradcomp/cuda/message.cuh>
#include <gradcomp/cuda/operation.cuh>
#include <gradcomp/cuda/uniform.cuh>
#include <gradcomp/feedback/loco.hpp>
#include <gradcomp/quantize/uniform_math.hpp>

namespace gradcomp {

/// State of LoCo for one tensor on the GPU: the 8-bit compensation error and step counters.
template <gradient_value T>
struct cuda_loco_state {
  device_array<std::int8_t> codes;  ///< Error codes in [−127, 127], one per element.
  device_array<T> scales;           ///< Error scales, one per group of `error_group` elements.
  std::uint64_t steps = 0;          ///< Steps since the last reset (t).
  std::uint64_t total_steps = 0;    ///< Steps completed in all.
};

namespace cuda_detail {

/// The stored error: dequant8(e)_i = code_i·scale_{i/G}, or +0 at a reset.
template <class T>
struct loco_error {
  const std::int8_t* codes;
  const T* scales;
  std::uint64_t group;
  bool reset;

  __device__ T at(std::uint64_t i) const { return reset ? T{0} : mul_rn(static_cast<T>(codes[i]), scales[i / group]); }
};

/// v = β·old + (1 − β)·(h − ĥ), with each product rounded on its own as on the CPU.
template <class T>
__device__ T loco_blend(T old, T h, T decoded, T beta, T keep) {
  return mul_rn(beta, old) + mul_rn(keep, h - decoded);
}

/// The 8-bit error code of v under step s (0 for a zero step), as the CPU's quantize_error.
template <class T>
__device__ std::int8_t loco_error_code(T v, T s) {
  return s == T{0} ? std::int8_t{0} : static_cast<std::int8_t>(uniform_level(v / s, 8, rounding::nearest_even, T{0}));
}

/// dequant8 of every element into `out` (the carried error).
template <class T>
struct loco_dequantize {
  loco_error<T> error;
  T* out;

  __device__ void operator()(std::uint64_t i) const { out[i] = error.at(i); }
};

/// h = g + dequant8(e) into the workspace, recording the first NaN or Inf.
template <class T>
struct loco_compensate {
  const T* g;
  loco_error<T> old;
  T* h;
  device_status* status;

  __device__ void operator()(std::uint64_t i) const {
    h[i] = g[i] + old.at(i);
    if (!is_finite(h[i])) record_failure(status, errc::non_finite_input, i);
  }
};

/// v = β·dequant8(e) + (1 − β)·(h − ĥ) over ĥ, recording the first NaN or Inf.
template <class T>
struct loco_new_error {
  const T* h;
  loco_error<T> old;
  T beta;
  T keep;
  T* decoded;  ///< ĥ in, v out.
  device_status* status;

  __device__ void operator()(std::uint64_t i) const {
    decoded[i] = loco_blend(old.at(i), h[i], decoded[i], beta, keep);
    if (!is_finite(decoded[i])) record_failure(status, errc::non_finite_input, i);
  }
};

/// One warp per error group: quant8 of v into the state's codes and scale.
template <class T>
struct loco_quantize_error {
  const T* v;
  std::uint64_t n;
  std::uint64_t group;
  std::int8_t* codes;
  T* scales;

  __device__ void operator()(std::uint64_t j) const {
    const std::uint64_t begin = j * group;
    const std::uint64_t count = n - begin < group ? n - begin : group;
    const T step = uniform_step(from_bits<T>(warp_max_key(plain_values<T>{v}, begin, begin + count)), 8);
    if (lane_id() == 0) scales[j] = step;
    for (std::uint64_t i = begin + lane_id(); i < begin + count; i += 32) codes[i] = loco_error_code(v[i], step);
  }
};

/// Flags of the one-kernel path's check, in the workspace next to the status.
struct loco_check_flags {
  std::uint32_t too_large;  ///< Some |g| or old error scale exceeds the bound: take the reference steps.
};

/// The bound below which the one-kernel path cannot overflow (the CPU's fused path's: FLT_MAX/16
/// for |g|, that over 127 for an old error scale).
template <class T>
inline constexpr T loco_fused_limit = std::numeric_limits<T>::max() / T{16};

/// One thread per quad of g (4 values; 128-bit loads when `vector`): NaN or Inf is recorded
/// (its first in the quad); |g| above the bound raises `too_large`, so the reference steps decide.
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
    if (failed(status) || flags->too_large != 0) return;  // the host reports or takes the reference steps
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
/// whole LoCo step in registers (quads, cuda/lane_layout.cuh), with the operands of
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
    if (failed(s.status) || s.flags->too_large != 0) return;  // the host reports or takes the reference steps
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

}  // namespace cuda_detail

/// LoCo on the GPU.
template <class Codec>
struct backend<loco<Codec>, cuda_executor> {
  using T = typename Codec::value_type;
  using loco_type = loco<Codec>;
  using state_type = cuda_loco_state<T>;

  struct scratch {
    std::span<cuda_detail::loco_check_flags> flags;  ///< The one-kernel path's check.
    std::span<T> compensated;                        ///< h (the reference steps).
    std::span<T> decoded;                            ///< ĥ, then v (the reference steps).
    std::span<std::byte> inner;                      ///< The inner codec's workspace.
    cuda_detail::crc_scratch crc;                    ///< The payload CRC (the one-kernel path, with checksums).
  };

  static std::size_t workspace_bytes(const loco_type& lc, const cuda_executor& e, std::uint64_t n) {
    return cuda_detail::operation::workspace_bytes([&](workspace_arena& arena) { (void)carve(arena, lc, e, n); });
  }

  static state_type make_state(const loco_type& lc, const cuda_executor& exec, std::uint64_t n) {
    return state_type{device_array<std::int8_t>(static_cast<std::size_t>(n), exec),
                      device_array<T>(static_cast<std::size_t>(lc.group_count(n)), exec), 0, 0};
  }

  static std::size_t encode(const loco_type& lc, const cuda_executor& caller, std::span<const T> grad,
                            state_type& state, std::span<std::byte> out, std::span<std::byte> ws, message_key key) {
    // Deferred errors do not apply: the step waits for its verdict anyway, and its stages must not
    // leave a sticky word behind.
    const cuda_executor exec{.stream = caller.stream};
    const std::uint64_t n = grad.size();
    check_shape(lc, state, n, "gradient");
    workspace_arena arena(ws);
    const cuda_detail::operation op(exec, arena);
    const scratch s = carve(arena, lc, exec, n);
    const bool reset = state.steps >= lc.params().reset_period;
    std::size_t bytes = 0;
    bool done = false;
    if constexpr (fusable) {
      if (one_kernel(lc)) done = encode_fused(lc, exec, grad, state, out, s, op, key, reset, bytes);
    }
    if (!done) bytes = encode_reference(lc, exec, grad, state, out, s, op, key, reset);
    state.steps = reset ? 1 : state.steps + 1;
    ++state.total_steps;
    return bytes;
  }

  static std::size_t save_state(const loco_type& lc, const cuda_executor& exec, const state_type& state,
                                std::span<std::byte> bytes) {
    const std::uint64_t n = state.codes.size();
    check_shape(lc, state, n, "state");
    return lc.write_saved_state(n, state.steps, state.total_steps, bytes, [&](std::byte* codes, std::byte* scales) {
      GRADCOMP_CUDA_CHECK(
          cudaMemcpyAsync(codes, state.codes.data(), state.codes.size(), cudaMemcpyDeviceToHost, exec.native_stream()));
      GRADCOMP_CUDA_CHECK(cudaMemcpyAsync(scales, state.scales.data(), state.scales.size() * sizeof(T),
                                          cudaMemcpyDeviceToHost, exec.native_stream()));
      exec.synchronize();
    });
  }

  static void load_state(const loco_type& lc, const cuda_executor& exec, std::span<const std::byte> bytes,
                         state_type& state) {
    const auto saved = lc.check_saved_state(bytes, state.codes.size(), state.scales.size());
    GRADCOMP_CUDA_CHECK(cudaMemcpyAsync(state.codes.data(), saved.codes.data(), saved.codes.size(),
                                        cudaMemcpyHostToDevice, exec.native_stream()));
    GRADCOMP_CUDA_CHECK(cudaMemcpyAsync(state.scales.data(), saved.scales.data(), saved.scales.size(),
                                        cudaMemcpyHostToDevice, exec.native_stream()));
    exec.synchronize();
    state.steps = saved.steps;
    state.total_steps = saved.total_steps;
  }

  static void carried_error(const loco_type& lc, const cuda_executor& exec, const state_type& state, std::span<T> out) {
    check_shape(lc, state, out.size(), "output");
    cuda_detail::for_each_item(exec, out.size(),
                               cuda_detail::loco_dequantize<T>{error_of(lc, state, false), out.data()});
  }

  /// Checks `error` on the device, then stores it in 8 bits.
  static void set_carried_error(const loco_type& lc, const cuda_executor& exec, std::span<const T> error,
                                state_type& state) {
    check_shape(lc, state, error.size(), "error");
    cuda_detail::require_finite(exec, error, "the new carried error");
    quantize_error(lc, exec, error.data(), state);
  }

 private:
  /// Whether a one-kernel path exists: LoCo around the uniform quantizer.
  static constexpr bool fusable = std::is_same_v<Codec, uniform_quantizer<T>>;

  /// Whether the one-kernel path applies: error groups equal the quantizer's blocks, which fill
  /// whole code words.
  static bool one_kernel(const loco_type& lc) {
    return lc.params().error_group == lc.inner().params().block &&
           backend<uniform_quantizer<T>, cuda_executor>::layout_of(lc.inner(), 0).whole_words();
  }

  static scratch carve(workspace_arena& arena, const loco_type& lc, const cuda_executor& e, std::uint64_t n) {
    scratch s;
    s.flags = arena.take<cuda_detail::loco_check_flags>(1);
    s.compensated = arena.take<T>(static_cast<std::size_t>(n));
    s.decoded = arena.take<T>(static_cast<std::size_t>(n));
    s.inner = arena.take<std::byte>(lc.inner().workspace_bytes(e, n));
    s.crc = cuda_detail::carve_seal(arena, lc.inner().wire().payload_checksum);
    return s;
  }

  static cuda_detail::loco_error<T> error_of(const loco_type& lc, const state_type& state, bool reset) {
    return {state.codes.data(), state.scales.data(), lc.params().error_group, reset};
  }

  static void check_shape(const loco_type& lc, const state_type& state, std::uint64_t n, const char* what) {
    detail::require(state.codes.size() == n, errc::size_mismatch, [&] {
      return std::string(what) + " has " + std::to_string(n) + " elements, the state " +
             std::to_string(state.codes.size());
    });
    detail::require(state.scales.size() == lc.group_count(n), errc::size_mismatch, [&] {
      return "state holds " + std::to_string(state.scales.size()) + " error scales, " + std::to_string(n) +
             " elements in groups of " + std::to_string(lc.params().error_group) + " need " +
             std::to_string(lc.group_count(n));
    });
  }

  static void quantize_error(const loco_type& lc, const cuda_executor& exec, const T* v, state_type& state) {
    cuda_detail::for_each_block(exec, state.scales.size(),
                                cuda_detail::loco_quantize_error<T>{v, state.codes.size(), lc.params().error_group,
                                                                    state.codes.data(), state.scales.data()});
  }

  /// The reference steps; the state is written only by the last one, after every check.
  static std::size_t encode_reference(const loco_type& lc, const cuda_executor& exec, std::span<const T> grad,
                                      state_type& state, std::span<std::byte> out, const scratch& s,
                                      const cuda_detail::operation& op, message_key key, bool reset) {
    const std::uint64_t n = grad.size();
    const cuda_detail::loco_error<T> old = error_of(lc, state, reset);
    cuda_detail::for_each_item(exec, n,
                               cuda_detail::loco_compensate<T>{grad.data(), old, s.compensated.data(), op.status()});
    op.finish([&](errc, std::uint64_t i, std::uint32_t) {
      return "gradient + error is NaN or Inf at element " + std::to_string(i) + " of " + std::to_string(n) +
             "; the state is unchanged";
    });
    const std::size_t bytes = lc.inner().encode(exec, std::span<const T>(s.compensated), out, s.inner, key);
    lc.inner().decode(exec, std::span<const std::byte>(out.first(bytes)), s.decoded, s.inner);
    const auto beta = static_cast<T>(lc.params().beta);
    cuda_detail::for_each_item(exec, n,
                               cuda_detail::loco_new_error<T>{s.compensated.data(), old, beta, T{1} - beta,
                                                              s.decoded.data(), op.status()});
    try {
      op.finish([&](errc, std::uint64_t i, std::uint32_t) {
        return "the new compensation error is NaN or Inf at element " + std::to_string(i) + "; the state is unchanged";
      });
    } catch (const error&) {
      // The inner message is already in `out`; do not leave it passing for a sent step.
      GRADCOMP_CUDA_CHECK(cudaMemsetAsync(out.data(), 0, envelope::size, exec.native_stream()));
      exec.synchronize();
      throw;
    }
    quantize_error(lc, exec, s.decoded.data(), state);
    return bytes;
  }

  /// The one-kernel step; returns false (nothing written) when the magnitudes call for the
  /// reference steps. @throws error `non_finite_input` for NaN or Inf in g (state unchanged).
  static bool encode_fused(const loco_type& lc, const cuda_executor& exec, std::span<const T> grad, state_type& state,
                           std::span<std::byte> out, const scratch& s, const cuda_detail::operation& op,
                           message_key key, bool reset, std::size_t& bytes) {
    const uniform_quantizer<T>& inner = lc.inner();
    const std::uint64_t n = grad.size();
    const std::size_t size = inner.max_encoded_bytes(n);
    cuda_detail::begin_message(exec, out, size);
    GRADCOMP_CUDA_CHECK(
        cudaMemsetAsync(s.flags.data(), 0, sizeof(cuda_detail::loco_check_flags), exec.native_stream()));
    const cuda_detail::loco_check_gradient<T> check{grad.data(), n, cuda_detail::vector_aligned(grad.data()),
                                                    s.flags.data(), op.status()};
    cuda_detail::for_each_item(exec, check.items(), check);
    if (!reset)
      cuda_detail::for_each_item(exec, state.scales.size(),
                                 cuda_detail::loco_check_scales<T>{state.scales.data(), s.flags.data()});
    using uniform_backend = backend<uniform_quantizer<T>, cuda_executor>;
    const cuda_detail::block_layout layout = uniform_backend::layout_of(inner, n);
    const cuda_detail::uniform_rule<T> rule = uniform_backend::rule_of(inner, key);
    const auto beta = static_cast<T>(lc.params().beta);
    T* const scales = cuda_detail::scales_of<T>(out.data());
    std::byte* const codes = cuda_detail::codes_of<T>(out.data(), layout);
    const cuda_detail::loco_uniform_blocks<T> step{
        grad.data(), layout, rule,  state.codes.data(), state.scales.data(), reset, beta,
        T{1} - beta, scales, codes, s.flags.data(),     op.status()};
    if (cuda_detail::quads_fit(layout.block, layout.bits)) {
      const bool vector =
          cuda_detail::vector_aligned(grad.data()) && reinterpret_cast<std::uintptr_t>(state.codes.data()) % 4 == 0;
      cuda_detail::with_quad_constants(layout.bits, rule.mode, [&](auto bits, auto mode) {
        cuda_detail::for_each_block(
            exec, layout.blocks(),
            cuda_detail::loco_uniform_quads<T, decltype(bits)::value, decltype(mode)::value>{step, vector});
      });
    } else {
      cuda_detail::for_each_block(exec, layout.blocks(), step);
    }
    // Sealed before the wait; the seal writes nothing after a recorded failure (NaN or Inf in g).
    cuda_detail::seal_message(exec, out.data(),
                              {codec_id::uniform, dtype_of<T>, 0, 0, key, n, inner.payload_bytes(n),
                               inner.params_hash(), 0},
                              s.crc, op);
    op.finish([&](errc, std::uint64_t i, std::uint32_t) {
      return "gradient value " + std::to_string(i) + " of " + std::to_string(n) +
             " is NaN or Inf; the state is unchanged";
    });
    cuda_detail::loco_check_flags flags{};  // the stream is idle now: this read does not wait for the step
    GRADCOMP_CUDA_CHECK(
        cudaMemcpyAsync(&flags, s.flags.data(), sizeof flags, cudaMemcpyDeviceToHost, exec.native_stream()));
    exec.synchronize();
    if (flags.too_large != 0) {
      // Nothing was coded, but the seal ran: unseal before the reference steps write the message.
      GRADCOMP_CUDA_CHECK(cudaMemsetAsync(out.data(), 0, envelope::size, exec.native_stream()));
      return false;
    }
    bytes = size;
    return true;
  }
};

}  // namespace gradcomp
