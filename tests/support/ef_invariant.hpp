#pragma once
// The error-feedback invariant as a reusable check: over `steps` steps of fresh N(0, 1e-3)
// gradients with decay β, every new residual is exactly fl(β·(a − d)) (a − d for β = 1), and
// Σ decoded + final residual + Σ what the decay removed equals Σ gradients within a rounding bound
// derived below, on any executor (the CUDA tests run it on the GPU; messages are decoded on the CPU).
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

// Checks, element by element over `steps` steps, where d_t is the test's own decoding of message t
// with the inner codec, a_t = fl(g_t + e_t) and r_t = fl(a_t − d_t) are formed by the test:
// - e_{t+1} == fl(β·r_t) bit for bit (r_t itself for β = 1), the product rounded through a
//   volatile store, so that no contraction into a multiply-add can change it;
// - Σ_t d_t + e_T + Σ_t (r_t − e_{t+1}) = Σ_t g_t within the bound below. The middle sum is what
//   the decay removed; it is 0 for β = 1, which leaves the classic invariant Σ d + e_T = Σ g.
//
// Bound. With T's unit roundoff u = eps_T/2, a step computes a_t = fl(g_t + e_t) and
// r_t = fl(a_t − d_t), so r_t = g_t + e_t − d_t + ε_t with |ε_t| ≤ u·(|a_t| + |r_t|). With
// e_{t+1} = r_t − (r_t − e_{t+1}), telescoping from e_0 = 0 gives
// Σ_t d_t + e_T + Σ_t (r_t − e_{t+1}) − Σ_t g_t = Σ_t ε_t, at most u·Σ_t (|a_t| + |r_t|). The test
// forms the left side in double by recursive summation of m = 2·steps + 1 terms (4·steps + 1 with
// the decay's r_t and −e_{t+1}), which adds at most m·u_d·Σ|terms|; the bound below takes twice
// that, eps_d = 2·u_d, to cover the γ_m = m·u_d/(1 − m·u_d) denominator. For top-k and threshold
// d_t is 0 or exactly a_t, so r_t is exact and only the rounding of a_t contributes; random-k
// scales by n/k, so a_t − d_t rounds too.
template <class Codec, class E = cpu_executor>
void check_ef_invariant(const Codec& inner, std::size_t n, std::uint64_t steps, std::uint64_t seed,
                        std::uint32_t tensor_id, E exec = {}, double decay = 1.0) {
  using T = typename Codec::value_type;
  const error_feedback<Codec> ef(inner, {.decay = decay});
  const T beta = ef.decay();
  const bool decays = beta != T{1};
  stepper<E, error_feedback<Codec>> run(exec, ef, n);
  std::vector<double> sum_decoded(n, 0.0), sum_grad(n, 0.0), sum_abs_terms(n, 0.0), ef_rounding(n, 0.0),
      sum_decayed(n, 0.0);
  std::vector<T> residual = run.carried_error(), expected_residual(n);
  std::uint64_t wrong_steps = 0;
  for (std::uint64_t t = 0; t < steps; ++t) {
    const std::vector<T> g = make_input<T>(input_kind::normal, n, seed + t);
    const std::vector<T> residual_before = residual;
    const std::vector<std::byte> message = run.step(g, {.step = t, .tensor_id = tensor_id});
    residual = run.carried_error();
    const std::vector<T> d = decode_values(inner, message, n);
    for (std::size_t i = 0; i < n; ++i) {
      const T a = g[i] + residual_before[i];
      const T r = a - d[i];
      volatile T product = beta * r;  // rounded to T here, whatever the compiler's contraction flags
      expected_residual[i] = decays ? T{product} : r;
      sum_decoded[i] += static_cast<double>(d[i]);
      sum_grad[i] += static_cast<double>(g[i]);
      sum_abs_terms[i] += std::fabs(static_cast<double>(d[i])) + std::fabs(static_cast<double>(g[i]));
      if (decays) {
        sum_decayed[i] += static_cast<double>(r);
        sum_decayed[i] -= static_cast<double>(residual[i]);
        sum_abs_terms[i] += std::fabs(static_cast<double>(r)) + std::fabs(static_cast<double>(residual[i]));
      }
      ef_rounding[i] += std::fabs(static_cast<double>(a)) + std::fabs(static_cast<double>(r));
    }
    wrong_steps += static_cast<std::uint64_t>(!bitwise_equal(residual, expected_residual));
  }
  CHECK(wrong_steps == 0);
  CHECK(run.state().steps == steps);

  const double u = std::numeric_limits<T>::epsilon() / 2;
  const double eps_d = std::numeric_limits<double>::epsilon();
  const auto terms = static_cast<double>((decays ? 4 : 2) * steps + 1);
  std::size_t violations = 0;
  double worst_bound = 0.0, largest_residual = 0.0;
  for (std::size_t i = 0; i < n; ++i) {
    const double e = static_cast<double>(residual[i]);
    const double bound = u * ef_rounding[i] + terms * eps_d * (sum_abs_terms[i] + std::fabs(e));
    const double gap = std::fabs(sum_decoded[i] + e + sum_decayed[i] - sum_grad[i]);
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
