#pragma once
/// @file
/// CPU backend of PowerSGD's large-matrix steps (reference/powersgd.hpp is the specification):
/// float32 with SSE, the r sums of a row (or the four outputs of a row) in the lanes of vectors, so
/// that every sum still runs in the reference's order and the bits are the reference's. M·Q takes
/// four rows at a time (four independent chains of additions, which hides their latency); Mᵀ·P̂
/// adds row after row into Q, which stays in cache; P̂·Qᵀ reads a transposed copy of Q and
/// writes four outputs per vector. Other types and ranks that are not a multiple of 4 run the
/// reference loops.

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

#if defined(__SSE2__)
#  include <emmintrin.h>
#endif

namespace gradcomp {

/// PowerSGD's steps over the a × b matrix on the CPU.
template <gradient_value T>
struct backend<powersgd<T>, cpu_executor> {
  /// M = G + E and P = M·Q, as the reference (`m` may be empty when `error` is).
  static void project(const cpu_executor&, matrix_shape shape, std::uint64_t r, std::span<const T> g,
                      std::span<const T> error, std::span<const T> q, std::span<T> m, std::span<T> p) {
#if defined(__SSE2__)
    if constexpr (vectorised) {
      if (r % 4 == 0) return project_sse(shape, r, g, error, q, m, p);
    }
#endif
    reference::project({}, shape, r, g, error, q, m, p);
  }

  /// Q = Mᵀ·P̂, as the reference: Q starts at zero and each row i of M adds M[i][j]·P̂[i] to row j
  /// of Q, i ascending.
  static void back_project(const cpu_executor&, matrix_shape shape, std::uint64_t r, std::span<const T> m,
                           std::span<const T> p_hat, std::span<T> q) {
#if defined(__SSE2__)
    if constexpr (vectorised) {
      if (r % 4 == 0) return back_project_sse(shape, r, m, p_hat, q);
    }
#endif
    reference::back_project({}, shape, r, m, p_hat, q);
  }

  /// The step's last pass, as the reference: four consecutive outputs of a row per vector, over
  /// transposed copies of Q_out and Q_err (r × b). Returns whether every error value is finite.
  static bool reconstruct(const cpu_executor&, matrix_shape shape, std::uint64_t r, std::span<const T> p_hat,
                          std::span<const T> q_out, std::span<const T> q_err, std::span<const T> m, std::span<T> out,
                          std::span<T> error) {
#if defined(__SSE2__)
    if constexpr (vectorised) {
      if (r % 4 == 0) return reconstruct_sse(shape, r, p_hat, q_out, q_err, m, out, error);
    }
#endif
    return reference::reconstruct({}, shape, r, p_hat, q_out, q_err, m, out, error);
  }

 private:
  using reference = backend<powersgd<T>, reference_executor>;

  /// float32 on a target with SSE2; r must then be a multiple of 4 as well.
#if defined(__SSE2__)
  static constexpr bool vectorised = std::is_same_v<T, float>;

  static void project_sse(matrix_shape shape, std::uint64_t r, std::span<const float> g, std::span<const float> error,
                          std::span<const float> q, std::span<float> m, std::span<float> p) {
    const std::uint64_t a = shape.rows, b = shape.cols, lanes = r / 4;
    std::uint64_t i = 0;
    for (; i + 4 <= a; i += 4) {
      // Rows i..i+3, each in chunks of up to 8 vectors of r (r ≤ 32 per pass over the rows).
      for (std::uint64_t first = 0; first < lanes; first += 8) {
        const std::uint64_t count = std::min<std::uint64_t>(8, lanes - first);
        __m128 acc[4][8];
        for (auto& row : acc)
          for (auto& v : row) v = _mm_setzero_ps();
        for (std::uint64_t j = 0; j < b; ++j) {
          __m128 mv[4];
          for (std::uint64_t w = 0; w < 4; ++w) {
            const std::uint64_t at = (i + w) * b + j;
            const float value = error.empty() ? g[at] : g[at] + error[at];
            if (first == 0 && !m.empty()) m[at] = value;
            mv[w] = _mm_set1_ps(value);
          }
          const float* const qj = q.data() + j * r + first * 4;
          for (std::uint64_t c = 0; c < count; ++c) {
            const __m128 qv = _mm_loadu_ps(qj + c * 4);
            for (std::uint64_t w = 0; w < 4; ++w) acc[w][c] = _mm_add_ps(acc[w][c], rounded(_mm_mul_ps(mv[w], qv)));
          }
        }
        for (std::uint64_t w = 0; w < 4; ++w)
          for (std::uint64_t c = 0; c < count; ++c) _mm_storeu_ps(p.data() + (i + w) * r + (first + c) * 4, acc[w][c]);
      }
    }
    for (; i < a; ++i) {  // the last rows, one at a time
      for (std::uint64_t first = 0; first < lanes; first += 8) {
        const std::uint64_t count = std::min<std::uint64_t>(8, lanes - first);
        __m128 acc[8];
        for (auto& v : acc) v = _mm_setzero_ps();
        for (std::uint64_t j = 0; j < b; ++j) {
          const std::uint64_t at = i * b + j;
          const float value = error.empty() ? g[at] : g[at] + error[at];
          if (first == 0 && !m.empty()) m[at] = value;
          const __m128 mv = _mm_set1_ps(value);
          for (std::uint64_t c = 0; c < count; ++c)
            acc[c] = _mm_add_ps(acc[c], rounded(_mm_mul_ps(mv, _mm_loadu_ps(q.data() + j * r + (first + c) * 4))));
        }
        for (std::uint64_t c = 0; c < count; ++c) _mm_storeu_ps(p.data() + i * r + (first + c) * 4, acc[c]);
      }
    }
  }

  static void back_project_sse(matrix_shape shape, std::uint64_t r, std::span<const float> m,
                               std::span<const float> p_hat, std::span<float> q) {
    const std::uint64_t a = shape.rows, b = shape.cols, lanes = r / 4;
    std::fill(q.begin(), q.end(), 0.0f);
    for (std::uint64_t i = 0; i < a; ++i) {
      const float* const mi = m.data() + i * b;
      for (std::uint64_t first = 0; first < lanes; first += 8) {
        const std::uint64_t count = std::min<std::uint64_t>(8, lanes - first);
        __m128 pv[8];
        for (std::uint64_t c = 0; c < count; ++c) pv[c] = _mm_loadu_ps(p_hat.data() + i * r + (first + c) * 4);
        for (std::uint64_t j = 0; j < b; ++j) {
          const __m128 mv = _mm_set1_ps(mi[j]);
          float* const qj = q.data() + j * r + first * 4;
          for (std::uint64_t c = 0; c < count; ++c)
            _mm_storeu_ps(qj + c * 4, _mm_add_ps(_mm_loadu_ps(qj + c * 4), rounded(_mm_mul_ps(mv, pv[c]))));
        }
      }
    }
  }

  /// Q (b × r) transposed into r × b.
  static std::vector<float> transposed(std::span<const float> q, std::uint64_t b, std::uint64_t r) {
    std::vector<float> qt(static_cast<std::size_t>(b * r));
    for (std::uint64_t j = 0; j < b; ++j)
      for (std::uint64_t k = 0; k < r; ++k) qt[k * b + j] = q[j * r + k];
    return qt;
  }

  static bool reconstruct_sse(matrix_shape shape, std::uint64_t r, std::span<const float> p_hat,
                              std::span<const float> q_out, std::span<const float> q_err, std::span<const float> m,
                              std::span<float> out, std::span<float> error) {
    const std::uint64_t a = shape.rows, b = shape.cols;
    const bool same = q_err.data() == q_out.data();
    const std::vector<float> out_t = transposed(q_out, b, r);
    const std::vector<float> err_t = same ? std::vector<float>{} : transposed(q_err, b, r);
    const float* const ot = out_t.data();
    const float* const et = same ? ot : err_t.data();
    const __m128i exponent = _mm_set1_epi32(0x7F800000);
    __m128i special = _mm_setzero_si128();
    bool finite = true;
    for (std::uint64_t i = 0; i < a; ++i) {
      const float* const pi = p_hat.data() + i * r;
      const std::uint64_t row = i * b;
      std::uint64_t j = 0;
      for (; j + 4 <= b; j += 4) {
        __m128 applied = _mm_setzero_ps();
        __m128 subtracted = _mm_setzero_ps();
        for (std::uint64_t k = 0; k < r; ++k) {
          const __m128 pk = _mm_set1_ps(pi[k]);
          applied = _mm_add_ps(applied, rounded(_mm_mul_ps(pk, _mm_loadu_ps(ot + k * b + j))));
          if (!same) subtracted = _mm_add_ps(subtracted, rounded(_mm_mul_ps(pk, _mm_loadu_ps(et + k * b + j))));
        }
        const __m128 e = _mm_sub_ps(_mm_loadu_ps(m.data() + row + j), same ? applied : subtracted);
        // All exponent bits set: NaN or ±Inf.
        special = _mm_or_si128(special, _mm_cmpeq_epi32(_mm_and_si128(_mm_castps_si128(e), exponent), exponent));
        _mm_storeu_ps(error.data() + row + j, e);
        _mm_storeu_ps(out.data() + row + j, applied);
      }
      for (; j < b; ++j) {
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
    return finite && _mm_movemask_epi8(special) == 0;
  }
#endif
};

}  // namespace gradcomp
