#pragma once
/// @file
/// Reference backend of PowerSGD's large-matrix steps (lowrank/powersgd.hpp): the specification the
/// `cpu_executor` backend is checked against, bit for bit. Every sum runs sequentially in index
/// order, each product rounded on its own.

#include <cstdint>
#include <span>

#include <gradcomp/core/backend.hpp>
#include <gradcomp/core/float_bits.hpp>
#include <gradcomp/core/reference_executor.hpp>
#include <gradcomp/core/rounded_product.hpp>
#include <gradcomp/lowrank/powersgd.hpp>

namespace gradcomp {

/// PowerSGD's steps over the a × b matrix, written to be read.
template <gradient_value T>
struct backend<powersgd<T>, reference_executor> {
  /// M = G + E and P = M·Q: P[i][k] = Σ_j M[i][j]·Q[j][k], j ascending; `p` receives P (a × r) and
  /// `m` M (a·b). With `error` empty, M = G and `m` may be empty (nothing written).
  static void project(const reference_executor&, matrix_shape shape, std::uint64_t r, std::span<const T> g,
                      std::span<const T> error, std::span<const T> q, std::span<T> m, std::span<T> p) {
    const std::uint64_t a = shape.rows, b = shape.cols;
    const auto compensated = [&](std::uint64_t i) { return error.empty() ? g[i] : g[i] + error[i]; };
    if (!m.empty())
      for (std::uint64_t i = 0; i < a * b; ++i) m[i] = compensated(i);
    for (std::uint64_t i = 0; i < a; ++i)
      for (std::uint64_t k = 0; k < r; ++k) {
        T sum = T{0};
        for (std::uint64_t j = 0; j < b; ++j) sum = sum + mul_rn(compensated(i * b + j), q[j * r + k]);
        p[i * r + k] = sum;
      }
  }

  /// Q = Mᵀ·P̂: Q[j][k] = Σ_i M[i][j]·P̂[i][k], i ascending.
  static void back_project(const reference_executor&, matrix_shape shape, std::uint64_t r, std::span<const T> m,
                           std::span<const T> p_hat, std::span<T> q) {
    const std::uint64_t a = shape.rows, b = shape.cols;
    for (std::uint64_t j = 0; j < b; ++j)
      for (std::uint64_t k = 0; k < r; ++k) {
        T sum = T{0};
        for (std::uint64_t i = 0; i < a; ++i) sum = sum + mul_rn(m[i * b + j], p_hat[i * r + k]);
        q[j * r + k] = sum;
      }
  }

  /// The step's last pass: out = P̂·Q_outᵀ and error = M − P̂·Q_errᵀ, each sum Σ_k P̂[i][k]·Q[j][k]
  /// with k ascending (computed once when `q_err` is `q_out`, the same span). Returns whether every
  /// error value is finite.
  static bool reconstruct(const reference_executor&, matrix_shape shape, std::uint64_t r, std::span<const T> p_hat,
                          std::span<const T> q_out, std::span<const T> q_err, std::span<const T> m, std::span<T> out,
                          std::span<T> error) {
    const std::uint64_t a = shape.rows, b = shape.cols;
    const auto product = [&](std::span<const T> q, std::uint64_t i, std::uint64_t j) {
      T sum = T{0};
      for (std::uint64_t k = 0; k < r; ++k) sum = sum + mul_rn(p_hat[i * r + k], q[j * r + k]);
      return sum;
    };
    const bool same = q_err.data() == q_out.data();
    bool finite = true;
    for (std::uint64_t i = 0; i < a; ++i)
      for (std::uint64_t j = 0; j < b; ++j) {
        const T applied = product(q_out, i, j);
        error[i * b + j] = m[i * b + j] - (same ? applied : product(q_err, i, j));
        finite = finite && is_finite(error[i * b + j]);
        out[i * b + j] = applied;
      }
    return finite;
  }
};

}  // namespace gradcomp
