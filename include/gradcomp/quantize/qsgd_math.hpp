#pragma once
/// @file
/// The per-bucket and per-value arithmetic of the QSGD quantizer, shared by the reference, CPU and
/// CUDA backend so that all produce the same bytes. Conventions (s = levels, w = code bits, a
/// bucket of c values x_0 … x_{c−1}, m = max|x_i|, i the element's index in the whole tensor):
///
///     w = 1 + bit_width(s), rounded up to 2, 4 or 8 (s = 1 → 2; s ≤ 7 → 4; s ≤ 127 → 8)
///     norm (float):  acc = Σ double(x_i)² left to right in index order (exact squares, rounded
///                    sums); N = sqrt(acc) in double; norm = float(N) (rejected when N > FLT_MAX)
///     norm (double): E = ilogb(m); acc = Σ (ldexp(x_i, −E))² left to right in index order;
///                    norm = ldexp(sqrt(acc), E) (rejected when not finite)
///     m = 0 gives norm = 0 and every code 0
///     per value (norm > 0): t = min(|x_i| / norm, 1); r = t · s; l = ⌊r⌋ (all in T)
///                    u = (word i of the stochastic-rounding stream >> 8) · 2^−24 (in T)
///                    level = l + 1 when u < r − l, else l (so 0 ≤ level ≤ s)
///     code = level | (sign << (w − 1)), sign = IEEE sign bit of x_i when level > 0, else 0
///     decoded value: ±(norm · fl(level / s)), + for sign 0; level 0 decodes to +0
///
/// The norm's reduction order is part of the format. Since fl(level/s) ≤ 1, a decoded value never
/// exceeds its finite norm in magnitude; the clamp of t guards the double path, whose rounded sum
/// of squares may put the norm an ulp below m.

#include <cstdint>

#include <gradcomp/core/config.hpp>
#include <gradcomp/core/float_bits.hpp>
#include <gradcomp/core/rounded_product.hpp>
#include <gradcomp/quantize/sign_math.hpp>
#include <gradcomp/quantize/uniform_math.hpp>

namespace gradcomp {

/// Largest number of levels QSGD supports: 7 level bits plus the sign fill an 8-bit code.
inline constexpr std::uint32_t qsgd_max_levels = 127;

/// Width in bits of a QSGD code with s levels (1 ≤ s ≤ 127): sign plus level, rounded up to 2, 4, 8.
GRADCOMP_HOST_DEVICE constexpr int qsgd_code_bits(std::uint32_t levels) noexcept {
  int needed = 1;  // the sign, plus bit_width(levels) (std::bit_width is host-only under nvcc)
  for (std::uint32_t rest = levels; rest != 0; rest >>= 1) ++needed;
  return needed <= 2 ? 2 : (needed <= 4 ? 4 : 8);
}

/// The sum of squares behind a bucket's norm, Σx_i² (block_sum's order and scaling;
/// qsgd_bucket_norm is its loop).
template <gradient_value T>
struct qsgd_square_sum : block_sum<T> {
  using block_sum<T>::block_sum;

  /// Adds the next value's square.
  GRADCOMP_HOST_DEVICE void add(T x) noexcept {
    const double v = this->scaled(x);
    this->acc += mul_rn(v, v);
  }

  /// The norm into `out` once the bucket's values are added (0 when `max_abs` is 0); false
  /// (leaving `out` unset) when it is not representable in T.
  GRADCOMP_HOST_DEVICE bool norm(T max_abs, T& out) const noexcept {
    if (!(max_abs > T{0})) {
      out = T{0};
      return true;
    }
    if constexpr (sizeof(T) == 4) {
      const double root = detail::square_root(this->acc);
      if (!(root <= static_cast<double>(3.40282346638528859811704183484516925e+38))) return false;  // FLT_MAX
      out = static_cast<T>(root);
      return true;
    } else {
      out = detail::scale_by_pow2(detail::square_root(this->acc), this->exponent);
      return is_finite(out);
    }
  }
};

/// Norm of a bucket of `count` ≥ 1 finite values whose largest magnitude is `max_abs`, computed in
/// the documented order (bf16 and fp16 values as their float32 widenings, the norm a float32).
/// Returns false (leaving `norm` unset) when the norm is not representable in the compute type.
template <gradient_value X>
GRADCOMP_HOST_DEVICE inline bool qsgd_bucket_norm(const X* x, std::uint64_t count, compute_type<X> max_abs,
                                                  compute_type<X>& norm) noexcept {
  using T = compute_type<X>;
  qsgd_square_sum<T> sum(max_abs);
  if (max_abs > T{0})
    for (std::uint64_t i = 0; i < count; ++i) sum.add(widen(x[i]));
  return sum.norm(max_abs, norm);
}

/// Level in [0, s] of a value of magnitude `abs_x` in a bucket of norm `norm` > 0; `u` ∈ [0, 1).
template <gradient_value T>
GRADCOMP_HOST_DEVICE inline int qsgd_level(T abs_x, T norm, std::uint32_t levels, T u) noexcept {
  T t = abs_x / norm;
  t = t > T{1} ? T{1} : t;
  const T r = mul_rn(t, static_cast<T>(levels));
  const int l = floor_to_int(r);
  return u < r - static_cast<T>(l) ? l + 1 : l;
}

/// Stored code of a level and a sign bit (the sign is dropped for level 0).
GRADCOMP_HOST_DEVICE constexpr std::uint8_t qsgd_code(int level, std::uint8_t sign, int bits) noexcept {
  return static_cast<std::uint8_t>(level == 0 ? 0 : (level | (int{sign} << (bits - 1))));
}

/// Level of a stored code.
GRADCOMP_HOST_DEVICE constexpr int qsgd_code_level(std::uint8_t code, int bits) noexcept {
  return int{code} & ((1 << (bits - 1)) - 1);
}

/// Sign bit of a stored code.
GRADCOMP_HOST_DEVICE constexpr std::uint8_t qsgd_code_sign(std::uint8_t code, int bits) noexcept {
  return static_cast<std::uint8_t>(code >> (bits - 1));
}

/// Decoded value of a code in a bucket of norm `norm` (the code already validated: level ≤ s).
template <gradient_value T>
GRADCOMP_HOST_DEVICE inline T qsgd_decoded(std::uint8_t code, T norm, std::uint32_t levels, int bits) noexcept {
  const int level = qsgd_code_level(code, bits);
  if (level == 0) return T{0};
  const T magnitude = mul_rn(norm, static_cast<T>(level) / static_cast<T>(levels));
  return qsgd_code_sign(code, bits) != 0 ? -magnitude : magnitude;
}

}  // namespace gradcomp
