#pragma once
// The error-feedback invariant as a reusable check: over `steps` steps of fresh N(0, 1e-3)
// gradients, Σ decoded + final residual equals Σ gradients within a rounding bound derived below,
// on any executor (the CUDA tests run it on the GPU; messages are decoded on the CPU).
#include <gradcomp/feedback/error_feedback.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "support/codec_io.hpp"
#include "support/data.hpp"
#include "support/executor_io.hpp"

namespace gradcomp::test {

// Checks Σ_t d_t + e_T = Σ_t g_t element by element over `steps` steps, where d_t is the test's own
// decoding of message t with the inner codec.
//
// Bound. With T's unit roundoff u = eps_T/2, a step computes a_t = fl(g_t + e_t) and
// e_{t+1} = fl(a_t − d_t), so e_{t+1} = g_t + e_t − d_t + ε_t with |ε_t| ≤ u·(|a_t| + |e_{t+1}|).
// Telescoping from e_0 = 0 gives Σ_t d_t + e_T − Σ_t g_t = Σ_t ε_t, at most u·Σ_t (|a_t| + |e_{t+1}|).
// The test forms the left side in double by recursive summation of 2·steps + 1 terms, which adds at
// most (2·steps + 1)·u_d·Σ|terms|; the bound below takes twice that, eps_d = 2·u_d, to cover the
// γ_m = m·u_d/(1 − m·u_d) denominator. For top-k and threshold d_t is 0 or exactly a_t, so
// e_{t+1} is exact and only the rounding of a_t contributes; random-k scales by n/k, so a_t − d_t
// rounds too.
template <class Codec, class E = cpu_executor>
void check_ef_invariant(const Codec& inner, std::size_t n, std::uint64_t steps, std::uint64_t seed,
                        std::uint32_t tensor_id, E exec = {}) {
  using T = typename Codec::value_type;
  const error_feedback<Codec> ef(inner);
  stepper<E, error_feedback<Codec>> run(exec, ef, n);
  std::vector<double> sum_decoded(n, 0.0), sum_grad(n, 0.0), sum_abs_terms(n, 0.0), ef_rounding(n, 0.0);
  std::vector<T> residual = run.carried_error();
  for (std::uint64_t t = 0; t < steps; ++t) {
    const std::vector<T> g = make_input<T>(input_kind::normal, n, seed + t);
    const std::vector<T> residual_before = residual;
    const std::vector<std::byte> message = run.step(g, {.step = t, .tensor_id = tensor_id});
    residual = run.carried_error();
    const std::vector<T> d = decode_values(inner, message, n);
    for (std::size_t i = 0; i < n; ++i) {
      const T a = g[i] + residual_before[i];
      sum_decoded[i] += static_cast<double>(d[i]);
      sum_grad[i] += static_cast<double>(g[i]);
      sum_abs_terms[i] += std::fabs(static_cast<double>(d[i])) + std::fabs(static_cast<double>(g[i]));
      ef_rounding[i] += std::fabs(static_cast<double>(a)) + std::fabs(static_cast<double>(residual[i]));
    }
  }
  CHECK(run.state().steps == steps);

  const double u = std::numeric_limits<T>::epsilon() / 2;
  const double eps_d = std::numeric_limits<double>::epsilon();
  const auto terms = static_cast<double>(2 * steps + 1);
  std::size_t violations = 0;
  double worst_bound = 0.0, largest_residual = 0.0;
  for (std::size_t i = 0; i < n; ++i) {
    const double e = static_cast<double>(residual[i]);
    const double bound = u * ef_rounding[i] + terms * eps_d * (sum_abs_terms[i] + std::fabs(e));
    const double gap = std::fabs(sum_decoded[i] + e - sum_grad[i]);
    if (!(gap <= bound)) {
      if (violations == 0) {
        CAPTURE(i);
        CAPTURE(gap);
        CAPTURE(bound);
        CHECK(gap <= bound);
      }
      ++violations;
    }
    worst_bound = std::max(worst_bound, bound);
    largest_residual = std::max(largest_residual, std::fabs(e));
  }
  CHECK(violations == 0);
  // The bound has teeth: a wrapper that dropped the residual would miss by about |e_T|.
  CHECK(worst_bound < 1e-3 * largest_residual);
}

}  // namespace gradcomp::test
