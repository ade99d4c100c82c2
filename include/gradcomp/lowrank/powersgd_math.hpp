#pragma once
/// @file
/// PowerSGD's small-matrix steps, shared by every host backend so that all give the same bits:
/// the orthonormalisation of P (a × r) and the draw of Q (b × r). Both touch (a + b)·r values,
/// not the a·b of the gradient.

#include <cmath>
#include <cstdint>
#include <span>

#include <gradcomp/core/float_bits.hpp>
#include <gradcomp/core/philox.hpp>
#include <gradcomp/core/rounded_product.hpp>

namespace gradcomp {

/// s = ⌈√n⌉, the side of the square matrix PyTorch's `batched_powerSGD_hook` views n values as
/// (padded with zeros to s²), computed exactly on integers.
[[nodiscard]] constexpr std::uint64_t powersgd_square_side(std::uint64_t n) noexcept {
  std::uint64_t side = 0;
  for (std::uint64_t bit = std::uint64_t{1} << 31; bit != 0; bit >>= 1)
    if ((side + bit) * (side + bit) <= n) side += bit;  // ⌊√n⌋, bit by bit
  return side * side == n ? side : side + 1;
}

/// Orthonormalises the r columns of the row-major rows × r matrix `m` in place by modified
/// Gram–Schmidt, columns in order (PyTorch's `_orthogonalize_gram_schmidt`): column k is divided
/// by its norm √(Σ_i m[i][k]²), then its projection is subtracted from each later column l,
/// m[i][l] −= (Σ_i m[i][k]·m[i][l])·m[i][k]. Sums run over i ascending, in `Acc` (T, or double
/// with PowerSGD's `orthonormalise_in_double`), each product rounded on its own; the norm's square
/// root is correctly rounded (IEEE) in Acc, and the division and the update are done in T.
/// Guard: a column whose norm is 0, or not finite, or whose reciprocal would not be finite, is set
/// to zeros (it adds nothing to P̂·Qᵀ) instead of becoming NaN.
template <class Acc, gradient_value T>
void powersgd_orthonormalise(std::span<T> m, std::uint64_t rows, std::uint64_t r) noexcept {
  const auto at = [&](std::uint64_t i, std::uint64_t k) -> T& { return m[i * r + k]; };
  for (std::uint64_t k = 0; k < r; ++k) {
    Acc squares = Acc{0};
    for (std::uint64_t i = 0; i < rows; ++i) {
      const Acc v = static_cast<Acc>(at(i, k));
      squares = squares + mul_rn(v, v);
    }
    const auto norm = static_cast<T>(std::sqrt(squares));
    const bool usable = norm > T{0} && is_finite(norm) && is_finite(T{1} / norm);
    for (std::uint64_t i = 0; i < rows; ++i) at(i, k) = usable ? at(i, k) / norm : T{0};
    if (!usable) continue;
    for (std::uint64_t l = k + 1; l < r; ++l) {
      Acc dot = Acc{0};
      for (std::uint64_t i = 0; i < rows; ++i)
        dot = dot + mul_rn(static_cast<Acc>(at(i, k)), static_cast<Acc>(at(i, l)));
      const auto projection = static_cast<T>(dot);
      for (std::uint64_t i = 0; i < rows; ++i) at(i, l) = at(i, l) - mul_rn(projection, at(i, k));
    }
  }
}

/// The orthonormalisation in the accumulator PowerSGD's parameters name.
template <gradient_value T>
void powersgd_orthonormalise(std::span<T> m, std::uint64_t rows, std::uint64_t r, bool in_double) noexcept {
  if (in_double) powersgd_orthonormalise<double>(m, rows, r);
  else
    powersgd_orthonormalise<T>(m, rows, r);
}

/// Fills the row-major b × r matrix `q` with PowerSGD's draw for (seed, step, tensor id): value
/// i is u·2^-23 − 1 with u the top 24 bits of word i of the stream (random_purpose::low_rank_init),
/// uniform in [−1, 1) and exact in float and double; then orthonormalises it as P̂.
template <gradient_value T>
void powersgd_draw_q(std::span<T> q, std::uint64_t cols, std::uint64_t r, std::uint64_t seed, std::uint64_t step,
                     std::uint32_t tensor_id, bool in_double) noexcept {
  const random_stream stream{seed, step, tensor_id, random_purpose::low_rank_init};
  for (std::uint64_t i = 0; i < q.size(); ++i)
    q[i] = mul_rn(static_cast<T>(stream.word(i) >> 8), static_cast<T>(1.0 / 8388608.0)) - T{1};
  powersgd_orthonormalise(q, cols, r, in_double);
}

}  // namespace gradcomp
