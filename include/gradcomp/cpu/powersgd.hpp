#pragma once
/// @file
/// CPU backend of PowerSGD's large-matrix steps (reference/powersgd.hpp is the specification):
/// float32 with AVX2, where every lane runs one of the reference's sums in the reference's order,
/// so the bits are the reference's. M·Q takes eight rows at a time, one per lane (8 × 8 blocks
/// transposed in registers); Mᵀ·P̂ adds two rows at a time into transposed accumulators Qᵀ, which
/// stay in cache; P̂·Qᵀ writes eight outputs of a row per vector from transposed copies of Q.
/// Doubles, and CPUs (or executors) without AVX2, run the reference loops.

#include <algorithm>
#include <cstdint>
#include <span>
#include <type_traits>
#include <vector>

#include <gradcomp/core/backend.hpp>
#include <gradcomp/core/cpu_executor.hpp>
#include <gradcomp/core/float_bits.hpp>
#include <gradcomp/core/rounded_product.hpp>
#include <gradcomp/lowrank/powersgd.hpp>
#include <gradcomp/reference/powersgd.hpp>

#if defined(GRADCOMP_HAVE_AVX2)
#  include <immintrin.h>
#endif

namespace gradcomp {

/// PowerSGD's steps over the a × b matrix on the CPU.
template <gradient_value T>
struct backend<powersgd<T>, cpu_executor> {
  /// M = G + E and P = M·Q, as the reference (`m` may be empty when `error` is).
  static void project(const cpu_executor& exec, matrix_shape shape, std::uint64_t r, std::span<const T> g,
                      std::span<const T> error, std::span<const T> q, std::span<T> m, std::span<T> p) {
    if (fast(exec)) {
#if defined(GRADCOMP_HAVE_AVX2)
      if constexpr (std::is_same_v<T, float>) return project_avx2(shape, r, g, error, q, m, p);
#endif
    }
    reference::project({}, shape, r, g, error, q, m, p);
  }

  /// Q = Mᵀ·P̂, as the reference (each Q[j][k] sums i ascending).
  static void back_project(const cpu_executor& exec, matrix_shape shape, std::uint64_t r, std::span<const T> m,
                           std::span<const T> p_hat, std::span<T> q) {
    if (fast(exec)) {
#if defined(GRADCOMP_HAVE_AVX2)
      if constexpr (std::is_same_v<T, float>) return back_project_avx2(shape, r, m, p_hat, q);
#endif
    }
    reference::back_project({}, shape, r, m, p_hat, q);
  }

  /// The step's last pass, as the reference. Returns whether every error value is finite.
  static bool reconstruct(const cpu_executor& exec, matrix_shape shape, std::uint64_t r, std::span<const T> p_hat,
                          std::span<const T> q_out, std::span<const T> q_err, std::span<const T> m, std::span<T> out,
                          std::span<T> error) {
    if (fast(exec)) {
#if defined(GRADCOMP_HAVE_AVX2)
      if constexpr (std::is_same_v<T, float>) return reconstruct_avx2(shape, r, p_hat, q_out, q_err, m, out, error);
#endif
    }
    return reference::reconstruct({}, shape, r, p_hat, q_out, q_err, m, out, error);
  }

 private:
  using reference = backend<powersgd<T>, reference_executor>;

  /// Whether the AVX2 kernels run: float32, compiled in, and the executor allows AVX2 on this CPU.
  static bool fast(const cpu_executor& exec) noexcept {
#if defined(GRADCOMP_HAVE_AVX2)
    return std::is_same_v<T, float> && exec.avx2();
#else
    (void)exec;
    return false;
#endif
  }

#if defined(GRADCOMP_HAVE_AVX2)
  /// The 8 × 8 block in `rows` transposed in place: rows[w] lane c becomes rows[c] lane w.
  GRADCOMP_TARGET_AVX2 static void transpose8(__m256 (&rows)[8]) noexcept {
    const __m256 t0 = _mm256_unpacklo_ps(rows[0], rows[1]), t1 = _mm256_unpackhi_ps(rows[0], rows[1]);
    const __m256 t2 = _mm256_unpacklo_ps(rows[2], rows[3]), t3 = _mm256_unpackhi_ps(rows[2], rows[3]);
    const __m256 t4 = _mm256_unpacklo_ps(rows[4], rows[5]), t5 = _mm256_unpackhi_ps(rows[4], rows[5]);
    const __m256 t6 = _mm256_unpacklo_ps(rows[6], rows[7]), t7 = _mm256_unpackhi_ps(rows[6], rows[7]);
    const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
    const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
    const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
    const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
    rows[0] = _mm256_permute2f128_ps(u0, u4, 0x20);
    rows[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
    rows[2] = _mm256_permute2f128_ps(u2, u6, 0x20);
    rows[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
    rows[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
    rows[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
    rows[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
    rows[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
  }

  /// M = G + E and P = M·Q for any r with AVX2: eight rows at a time, each lane one row, so that
  /// lane w of accumulator k sums M[i + w][j]·Q[j][k] over j ascending. Blocks of 8 × 8 values
  /// are read row by row (and M written so), then transposed into columns; the columns past the
  /// last whole block, and rows past the last eight, continue the same sums value by value.
  GRADCOMP_TARGET_AVX2 static void project_avx2(matrix_shape shape, std::uint64_t r, std::span<const float> g,
                                                std::span<const float> error, std::span<const float> q,
                                                std::span<float> m, std::span<float> p) {
    const std::uint64_t a = shape.rows, b = shape.cols, whole = b / 8 * 8;
    const auto compensated = [&](std::uint64_t at) { return error.empty() ? g[at] : g[at] + error[at]; };
    // Sums of row i from column j on, continued value by value (writing M there too).
    const auto finish_row = [&](std::uint64_t i, std::uint64_t j, float* sums) {
      for (; j < b; ++j) {
        const float value = compensated(i * b + j);
        if (!m.empty()) m[i * b + j] = value;
        for (std::uint64_t k = 0; k < r; ++k) sums[k] = sums[k] + mul_rn(value, q[j * r + k]);
      }
    };
    std::vector<float> sums(static_cast<std::size_t>(8 * r));
    std::uint64_t i = 0;
    for (; i + 8 <= a; i += 8) {
      for (std::uint64_t first = 0; first < r; first += 8) {  // up to 8 sums of each row per pass
        const std::uint64_t count = std::min<std::uint64_t>(8, r - first);
        __m256 acc[8];
        for (__m256& v : acc) v = _mm256_setzero_ps();
        for (std::uint64_t j = 0; j < whole; j += 8) {
          __m256 block[8];
          for (std::uint64_t w = 0; w < 8; ++w) {
            const std::uint64_t at = (i + w) * b + j;
            block[w] = _mm256_loadu_ps(g.data() + at);
            if (!error.empty()) block[w] = _mm256_add_ps(block[w], _mm256_loadu_ps(error.data() + at));
            if (first == 0 && !m.empty()) _mm256_storeu_ps(m.data() + at, block[w]);
          }
          transpose8(block);
          for (std::uint64_t c = 0; c < 8; ++c) {
            const float* const qj = q.data() + (j + c) * r + first;
            for (std::uint64_t k = 0; k < count; ++k)
              acc[k] = _mm256_add_ps(acc[k], rounded(_mm256_mul_ps(block[c], _mm256_set1_ps(qj[k]))));
          }
        }
        for (std::uint64_t k = 0; k < count; ++k) {
          alignas(32) float lanes[8];
          _mm256_store_ps(lanes, acc[k]);
          for (std::uint64_t w = 0; w < 8; ++w) sums[w * r + first + k] = lanes[w];
        }
      }
      for (std::uint64_t w = 0; w < 8; ++w) {
        finish_row(i + w, whole, sums.data() + w * r);
        std::copy_n(sums.data() + w * r, r, p.data() + (i + w) * r);
      }
    }
    for (; i < a; ++i) {
      std::fill_n(sums.data(), r, 0.0f);
      finish_row(i, 0, sums.data());
      std::copy_n(sums.data(), r, p.data() + i * r);
    }
  }

  /// Q = Mᵀ·P̂ for any r with AVX2, over transposed accumulators Qᵀ (r × b): rows of M two at a
  /// time, each adding M[i][j..j+8)·P̂[i][k] to Qᵀ[k][j..j+8) for every k, so that each Q[j][k]
  /// still sums i ascending. Qᵀ is then transposed into Q.
  GRADCOMP_TARGET_AVX2 static void back_project_avx2(matrix_shape shape, std::uint64_t r, std::span<const float> m,
                                                     std::span<const float> p_hat, std::span<float> q) {
    const std::uint64_t a = shape.rows, b = shape.cols, whole = b / 8 * 8;
    std::vector<float> qt(static_cast<std::size_t>(r * b), 0.0f);
    const auto add_row = [&](std::uint64_t i, std::uint64_t j, float value) {
      for (std::uint64_t k = 0; k < r; ++k) qt[k * b + j] = qt[k * b + j] + mul_rn(value, p_hat[i * r + k]);
    };
    std::uint64_t i = 0;
    for (; i + 2 <= a; i += 2) {
      const float* const m0 = m.data() + i * b;
      const float* const m1 = m0 + b;
      for (std::uint64_t j = 0; j < whole; j += 8) {
        const __m256 v0 = _mm256_loadu_ps(m0 + j), v1 = _mm256_loadu_ps(m1 + j);
        for (std::uint64_t k = 0; k < r; ++k) {
          float* const at = qt.data() + k * b + j;
          __m256 acc = _mm256_add_ps(_mm256_loadu_ps(at), rounded(_mm256_mul_ps(v0, _mm256_set1_ps(p_hat[i * r + k]))));
          acc = _mm256_add_ps(acc, rounded(_mm256_mul_ps(v1, _mm256_set1_ps(p_hat[(i + 1) * r + k]))));
          _mm256_storeu_ps(at, acc);
        }
      }
      for (std::uint64_t j = whole; j < b; ++j) {
        add_row(i, j, m0[j]);
        add_row(i + 1, j, m1[j]);
      }
    }
    for (; i < a; ++i) {  // an odd last row
      const float* const mi = m.data() + i * b;
      for (std::uint64_t j = 0; j < whole; j += 8) {
        const __m256 v = _mm256_loadu_ps(mi + j);
        for (std::uint64_t k = 0; k < r; ++k) {
          float* const at = qt.data() + k * b + j;
          _mm256_storeu_ps(at, _mm256_add_ps(_mm256_loadu_ps(at),
                                             rounded(_mm256_mul_ps(v, _mm256_set1_ps(p_hat[i * r + k])))));
        }
      }
      for (std::uint64_t j = whole; j < b; ++j) add_row(i, j, mi[j]);
    }
    for (std::uint64_t j = 0; j < b; ++j)
      for (std::uint64_t k = 0; k < r; ++k) q[j * r + k] = qt[k * b + j];
  }

  /// The step's last pass with AVX2: for each row i, eight consecutive outputs per vector, each
  /// lane summing P̂[i][k]·Q[j][k] over k ascending from transposed copies of Q_out and Q_err (r ×
  /// b); error = M − the Q_err sum (the Q_out sum when they are one span), out = the Q_out sum. The
  /// columns past the last eight go value by value. Returns whether every error value is finite.
  GRADCOMP_TARGET_AVX2 static bool reconstruct_avx2(matrix_shape shape, std::uint64_t r, std::span<const float> p_hat,
                                                    std::span<const float> q_out, std::span<const float> q_err,
                                                    std::span<const float> m, std::span<float> out,
                                                    std::span<float> error) {
    const std::uint64_t a = shape.rows, b = shape.cols, whole = b / 8 * 8;
    const bool same = q_err.data() == q_out.data();
    const auto transposed = [&](std::span<const float> q) {
      std::vector<float> qt(static_cast<std::size_t>(b * r));
      for (std::uint64_t j = 0; j < b; ++j)
        for (std::uint64_t k = 0; k < r; ++k) qt[k * b + j] = q[j * r + k];
      return qt;
    };
    const std::vector<float> out_t = transposed(q_out);
    const std::vector<float> err_t = same ? std::vector<float>{} : transposed(q_err);
    const float* const ot = out_t.data();
    const float* const et = same ? ot : err_t.data();
    const __m256i exponent = _mm256_set1_epi32(0x7F800000);
    __m256i special = _mm256_setzero_si256();
    bool finite = true;
    for (std::uint64_t i = 0; i < a; ++i) {
      const float* const pi = p_hat.data() + i * r;
      const std::uint64_t row = i * b;
      for (std::uint64_t j = 0; j < whole; j += 8) {
        __m256 applied = _mm256_setzero_ps();
        __m256 subtracted = _mm256_setzero_ps();
        for (std::uint64_t k = 0; k < r; ++k) {
          const __m256 pk = _mm256_set1_ps(pi[k]);
          applied = _mm256_add_ps(applied, rounded(_mm256_mul_ps(pk, _mm256_loadu_ps(ot + k * b + j))));
          if (!same)
            subtracted = _mm256_add_ps(subtracted, rounded(_mm256_mul_ps(pk, _mm256_loadu_ps(et + k * b + j))));
        }
        const __m256 e = _mm256_sub_ps(_mm256_loadu_ps(m.data() + row + j), same ? applied : subtracted);
        // All exponent bits set: NaN or ±Inf.
        special =
            _mm256_or_si256(special, _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_castps_si256(e), exponent), exponent));
        _mm256_storeu_ps(error.data() + row + j, e);
        _mm256_storeu_ps(out.data() + row + j, applied);
      }
      for (std::uint64_t j = whole; j < b; ++j) {
        float applied = 0.0f, subtracted = 0.0f;
        for (std::uint64_t k = 0; k < r; ++k) {
          applied = applied + mul_rn(pi[k], ot[k * b + j]);
          subtracted = subtracted + mul_rn(pi[k], et[k * b + j]);
        }
        error[row + j] = m[row + j] - subtracted;
        finite = finite && is_finite(error[row + j]);
        out[row + j] = applied;
      }
    }
    return finite && _mm256_movemask_epi8(special) == 0;
  }
#endif
};

}  // namespace gradcomp
