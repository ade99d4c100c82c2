#pragma once
/// @file
/// CPU backend of PowerSGD's large-matrix steps (reference/powersgd.hpp is the specification):
/// float32 with AVX2, where every lane runs one of the reference's sums in the reference's order,
/// so the bits are the reference's. M·Q takes eight rows at a time, one per lane (8 × 8 blocks
/// transposed in registers); Mᵀ·P̂ adds two rows at a time into transposed accumulators Qᵀ, which
/// stay in cache; P̂·Qᵀ writes eight outputs of a row per vector from transposed copies of Q.
/// Doubles, and CPUs (or executors) without AVX2, run the reference loops.

#include <algorithm>
#include <cstddef>
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

  /// What one pass of project_avx2 over eight rows needs: rows i..i+8, sums [first, first + Count)
  /// of each, `e` and `m` null when there is no error or no M to write.
  struct rows_pass {
    std::uint64_t i, first, b, whole, r;
    const float* g;
    const float* e;
    float* m;
    const float* q;
    float* sums;  ///< 8·r: row w's sum k at w·r + k.
  };

  /// One pass of project_avx2, its Count accumulators in registers (Count a compile-time constant).
  template <std::size_t Count>
  GRADCOMP_TARGET_AVX2 static void project_pass(const rows_pass& s) {
    __m256 acc[Count];
    for (__m256& v : acc) v = _mm256_setzero_ps();
    for (std::uint64_t j = 0; j < s.whole; j += 8) {
      __m256 block[8];
#  pragma GCC unroll 8
      for (std::uint64_t w = 0; w < 8; ++w) {
        const std::uint64_t at = (s.i + w) * s.b + j;
        block[w] = _mm256_loadu_ps(s.g + at);
        if (s.e != nullptr) block[w] = _mm256_add_ps(block[w], _mm256_loadu_ps(s.e + at));
        if (s.m != nullptr) _mm256_storeu_ps(s.m + at, block[w]);
      }
      transpose8(block);
#  pragma GCC unroll 8
      for (std::uint64_t c = 0; c < 8; ++c) {
        const float* const qj = s.q + (j + c) * s.r + s.first;
#  pragma GCC unroll 8
        for (std::size_t k = 0; k < Count; ++k)
          acc[k] = _mm256_add_ps(acc[k], rounded(_mm256_mul_ps(block[c], _mm256_set1_ps(qj[k]))));
      }
    }
    for (std::size_t k = 0; k < Count; ++k) {
      alignas(32) float lanes[8];
      _mm256_store_ps(lanes, acc[k]);
      for (std::uint64_t w = 0; w < 8; ++w) s.sums[w * s.r + s.first + static_cast<std::uint64_t>(k)] = lanes[w];
    }
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
        const rows_pass pass{i,
                             first,
                             b,
                             whole,
                             r,
                             g.data(),
                             error.empty() ? nullptr : error.data(),
                             first == 0 && !m.empty() ? m.data() : nullptr,
                             q.data(),
                             sums.data()};
        switch (std::min<std::uint64_t>(8, r - first)) {
          case 1: project_pass<1>(pass); break;
          case 2: project_pass<2>(pass); break;
          case 3: project_pass<3>(pass); break;
          case 4: project_pass<4>(pass); break;
          case 5: project_pass<5>(pass); break;
          case 6: project_pass<6>(pass); break;
          case 7: project_pass<7>(pass); break;
          default: project_pass<8>(pass); break;
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

  /// Rows of M that back_project_avx2 adds into Qᵀ per load and store of its accumulators (more
  /// rows would be more streams of M than the prefetchers follow well).
  static constexpr std::uint64_t back_project_tile = 8;

  /// What one pass of back_project_avx2 over a tile of rows needs: rows [i, end), sums [first,
  /// first + Count) of Qᵀ, columns [0, whole) in vectors of eight.
  struct tile_pass {
    std::uint64_t i, end, first, b, whole, r;
    const float* m;
    const float* p_hat;
    float* qt;  ///< r × b: Qᵀ[k][j] at k·b + j.
  };

  /// One pass of back_project_avx2: for each eight columns, Count accumulators loaded from Qᵀ, the
  /// tile's rows added in order, stored back.
  template <std::size_t Count>
  GRADCOMP_TARGET_AVX2 static void back_project_pass(const tile_pass& s) {
    for (std::uint64_t j = 0; j < s.whole; j += 8) {
      __m256 acc[Count];
#  pragma GCC unroll 8
      for (std::size_t k = 0; k < Count; ++k)
        acc[k] = _mm256_loadu_ps(s.qt + (s.first + static_cast<std::uint64_t>(k)) * s.b + j);
      for (std::uint64_t i = s.i; i < s.end; ++i) {
        const __m256 v = _mm256_loadu_ps(s.m + i * s.b + j);
        const float* const pi = s.p_hat + i * s.r + s.first;
#  pragma GCC unroll 8
        for (std::size_t k = 0; k < Count; ++k)
          acc[k] = _mm256_add_ps(acc[k], rounded(_mm256_mul_ps(v, _mm256_set1_ps(pi[k]))));
      }
#  pragma GCC unroll 8
      for (std::size_t k = 0; k < Count; ++k)
        _mm256_storeu_ps(s.qt + (s.first + static_cast<std::uint64_t>(k)) * s.b + j, acc[k]);
    }
  }

  /// Q = Mᵀ·P̂ for any r with AVX2, over transposed accumulators Qᵀ (r × b, zeros at first): for a
  /// tile of up to 8 rows at a time, eight columns of up to eight rows of Qᵀ are held in
  /// registers while the tile's rows add M[i][j..j+8)·P̂[i][k] in order, so each Q[j][k] still sums
  /// i ascending; the columns past the last eight go value by value, tile by tile. Qᵀ is then
  /// transposed into Q.
  GRADCOMP_TARGET_AVX2 static void back_project_avx2(matrix_shape shape, std::uint64_t r, std::span<const float> m,
                                                     std::span<const float> p_hat, std::span<float> q) {
    const std::uint64_t a = shape.rows, b = shape.cols, whole = b / 8 * 8;
    std::vector<float> qt(static_cast<std::size_t>(r * b), 0.0f);
    for (std::uint64_t i = 0; i < a; i += back_project_tile) {
      const std::uint64_t end = std::min(a, i + back_project_tile);
      for (std::uint64_t first = 0; first < r; first += 8) {
        const tile_pass pass{i, end, first, b, whole, r, m.data(), p_hat.data(), qt.data()};
        switch (std::min<std::uint64_t>(8, r - first)) {
          case 1: back_project_pass<1>(pass); break;
          case 2: back_project_pass<2>(pass); break;
          case 3: back_project_pass<3>(pass); break;
          case 4: back_project_pass<4>(pass); break;
          case 5: back_project_pass<5>(pass); break;
          case 6: back_project_pass<6>(pass); break;
          case 7: back_project_pass<7>(pass); break;
          default: back_project_pass<8>(pass); break;
        }
      }
      for (std::uint64_t row = i; row < end; ++row)
        for (std::uint64_t j = whole; j < b; ++j)
          for (std::uint64_t k = 0; k < r; ++k)
            qt[k * b + j] = qt[k * b + j] + mul_rn(m[row * b + j], p_hat[row * r + k]);
    }
    for (std::uint64_t j = 0; j < b; ++j)
      for (std::uint64_t k = 0; k < r; ++k) q[j * r + k] = qt[k * b + j];
  }

  /// What one block of rows of reconstruct_avx2 needs.
  struct rows_out {
    std::uint64_t i, b, whole, r;
    const float* p_hat;
    const float* ot;  ///< Q_outᵀ, r × b.
    const float* et;  ///< Q_errᵀ, r × b; `ot` itself when Q_err is Q_out.
    const float* m;
    float* out;
    float* error;
  };

  /// Rows i..i+Rows of reconstruct_avx2's whole vectors of eight columns: each load of Qᵀ serves
  /// every row of the block. Returns a mask whose bits are set where an error value is NaN or ±Inf.
  template <std::size_t Rows>
  GRADCOMP_TARGET_AVX2 static int reconstruct_rows(const rows_out& s) {
    const bool same = s.et == s.ot;
    const __m256i exponent = _mm256_set1_epi32(0x7F800000);
    __m256i special = _mm256_setzero_si256();
    for (std::uint64_t j = 0; j < s.whole; j += 8) {
      __m256 applied[Rows], subtracted[Rows];
#  pragma GCC unroll 8
      for (std::size_t w = 0; w < Rows; ++w) applied[w] = subtracted[w] = _mm256_setzero_ps();
      for (std::uint64_t k = 0; k < s.r; ++k) {
        const __m256 o = _mm256_loadu_ps(s.ot + k * s.b + j);
        const __m256 e = same ? o : _mm256_loadu_ps(s.et + k * s.b + j);
#  pragma GCC unroll 8
        for (std::size_t w = 0; w < Rows; ++w) {
          const __m256 pk = _mm256_set1_ps(s.p_hat[(s.i + static_cast<std::uint64_t>(w)) * s.r + k]);
          applied[w] = _mm256_add_ps(applied[w], rounded(_mm256_mul_ps(pk, o)));
          if (!same) subtracted[w] = _mm256_add_ps(subtracted[w], rounded(_mm256_mul_ps(pk, e)));
        }
      }
#  pragma GCC unroll 8
      for (std::size_t w = 0; w < Rows; ++w) {
        const std::uint64_t at = (s.i + static_cast<std::uint64_t>(w)) * s.b + j;
        const __m256 err = _mm256_sub_ps(_mm256_loadu_ps(s.m + at), same ? applied[w] : subtracted[w]);
        // All exponent bits set: NaN or ±Inf.
        special = _mm256_or_si256(special,
                                  _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_castps_si256(err), exponent), exponent));
        _mm256_storeu_ps(s.error + at, err);
        _mm256_storeu_ps(s.out + at, applied[w]);
      }
    }
    return _mm256_movemask_epi8(special);
  }

  /// The step's last pass with AVX2: for each eight consecutive outputs of two rows at a time (one
  /// when r < 4),
  /// each lane sums P̂[i][k]·Q[j][k] over k ascending from transposed copies of Q_out and Q_err
  /// (r × b); error = M − the Q_err sum (the Q_out sum when they are one span), out = the Q_out
  /// sum. The columns past the last eight go value by value. Returns whether every error value is
  /// finite.
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
    rows_out block{0,        b,          whole,       r, p_hat.data(), out_t.data(), same ? out_t.data() : err_t.data(),
                   m.data(), out.data(), error.data()};
    int special = 0;
    // Two rows per Qᵀ load from r = 4 on; below, the products are too few to pay for the streams.
    if (r >= 4)
      for (; block.i + 2 <= a; block.i += 2) special |= reconstruct_rows<2>(block);
    for (; block.i < a; ++block.i) special |= reconstruct_rows<1>(block);
    bool finite = special == 0;
    for (std::uint64_t i = 0; i < a; ++i) {
      const float* const pi = p_hat.data() + i * r;
      for (std::uint64_t j = whole; j < b; ++j) {
        float applied = 0.0f, subtracted = 0.0f;
        for (std::uint64_t k = 0; k < r; ++k) {
          applied = applied + mul_rn(pi[k], block.ot[k * b + j]);
          subtracted = subtracted + mul_rn(pi[k], block.et[k * b + j]);
        }
        error[i * b + j] = m[i * b + j] - subtracted;
        finite = finite && is_finite(error[i * b + j]);
        out[i * b + j] = applied;
      }
    }
    return finite;
  }
#endif
};

}  // namespace gradcomp
