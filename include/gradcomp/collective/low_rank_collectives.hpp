#pragma once
/// @file
/// PowerSGD's collectives (lowrank/powersgd.hpp; docs/lowrank.md): the compressed all-reduce's
/// `low_rank` plan, two SUM all-reduces of the factors P (a × r) and Q (b × r) per step instead of
/// one of the a × b gradient, and the same step for reduce-scatter users, on a host executor
/// (`reference_executor`, `cpu_executor`) over any transport. The transports sum in rank order
/// (transport/rank_ordered.hpp), so every rank gets the same P, P̂, Q and result bits, and the same
/// ones over MPI, Gloo and in-process.
///
/// Before anything is sent the ranks agree (collective/agreement.hpp): the record names PowerSGD,
/// the plan, the element count, step and tensor, and hashes the parameters with the matrix shape;
/// its non-finite flag is raised by NaN or ±Inf in M = G + E (so an error that overflows with the
/// gradient is caught too), found in P = M·Q, or by a P that overflows. A disagreement, a rank's
/// own bad arguments or a non-finite M make every rank throw the same error with `data` and
/// `state` unchanged (but for its scratch matrices); a timeout or a transport failure during the
/// exchange leaves both unchanged too (the new state is committed after the last collective).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <gradcomp/collective/agreement.hpp>
#include <gradcomp/collective/all_reduce_cost.hpp>
#include <gradcomp/collective/call_deadline.hpp>
#include <gradcomp/collective/collective_memory.hpp>
#include <gradcomp/collective/compressed_all_reduce.hpp>
#include <gradcomp/collective/compressed_reduce_scatter.hpp>
#include <gradcomp/collective/executor_transport.hpp>
#include <gradcomp/core/concepts.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/memory_space.hpp>
#include <gradcomp/cpu/powersgd.hpp>
#include <gradcomp/lowrank/powersgd.hpp>
#include <gradcomp/lowrank/powersgd_math.hpp>
#include <gradcomp/reference/powersgd.hpp>
#include <gradcomp/transport/transport.hpp>

namespace gradcomp {

namespace detail {

/// What the agreement record of a PowerSGD call names: the scheme, with the matrix shape hashed
/// into its parameters (two ranks with the same count in other shapes must not agree).
template <class T>
struct powersgd_call {
  using value_type = T;
  static constexpr codec_id id = codec_id::powersgd;
  std::uint64_t hash;
  [[nodiscard]] std::uint64_t params_hash() const noexcept { return hash; }
};

/// This rank's own argument problems of a PowerSGD call (`where`: the collective's name; `plan_ok`:
/// the requested plan is one PowerSGD runs; `extra`: the collective's own check, run first).
template <class T>
[[nodiscard]] local_problem powersgd_problem(const powersgd<T>& scheme, const powersgd_state<T>& state,
                                             std::size_t count, matrix_shape shape, bool plan_ok, const char* where,
                                             local_problem extra = {}) {
  if (!extra.empty()) return extra;
  if (!plan_ok)
    return {errc::invalid_argument, std::string(where) + ": PowerSGD runs the low_rank and dense plans only"};
  if (count != shape.count())
    return {errc::size_mismatch, std::string(where) + ": data has " + std::to_string(count) + " values, the matrix " +
                                     std::to_string(shape.rows) + " x " + std::to_string(shape.cols)};
  try {
    scheme.require_state_shape(state, shape);
  } catch (const error& failure) {
    return {failure.code(), failure.what()};
  }
  return {};
}

/// What a PowerSGD collective asks of the step both run.
struct powersgd_call_options {
  message_key key;
  bool low_rank = false;  ///< The resolved plan is PowerSGD's (else the caller's dense plan).
  std::uint8_t plan = 0;  ///< The agreement record's plan byte.
  bool average = false;
  const char* where = "";  ///< The collective's name, for errors.
};

/// The step of both PowerSGD collectives, after the caller resolved its plan: the agreement (with
/// `problem`), then, for the low-rank plan, the two factor all-reduces, the result written into
/// `data` (the sum, or the mean with `average`) and the new state. Returns the report, or nothing
/// when the plan is the caller's dense one (agreed, nothing else done).
template <executor E, transport X, gradient_value T>
std::optional<compressed_report> powersgd_step(const E& e, X& t, const powersgd<T>& scheme, powersgd_state<T>& state,
                                               std::span<T> data, matrix_shape shape, const local_problem& problem,
                                               const powersgd_call_options& call) {
  using steps = backend<powersgd<T>, E>;
  const powersgd_params& p = scheme.params();
  const powersgd_call<T> named{params_hasher{}.add(scheme.params_hash()).add(shape.rows).add(shape.cols).value()};
  const std::uint64_t a = shape.rows, b = shape.cols, r = scheme.rank_for(shape);
  const bool low_rank = call.low_rank && problem.empty();

  // M = G + E and P = M·Q before the agreement. NaN or ±Inf in M makes its row of P NaN or ±Inf
  // (float sums never return to finite), so the non-finite flag checks P, not the a·b values of M.
  std::vector<T> q(low_rank ? static_cast<std::size_t>(b * r) : 0);
  std::vector<T> factor_p(low_rank ? static_cast<std::size_t>(a * r) : 0);
  if (low_rank) {
    if (state.q.empty() || !p.warm_start)
      powersgd_draw_q(std::span<T>(q), b, r, p.seed, call.key.step, call.key.tensor_id, p.orthonormalise_in_double);
    else {
      q = state.q;  // Q/p of the last step, orthonormalised again as PyTorch's hook does
      powersgd_orthonormalise(std::span<T>(q), b, r, p.orthonormalise_in_double);
    }
    // The first step has E = 0: M is G itself, read from `data` until the last pass overwrites it.
    state.compensated.resize(state.error.empty() ? 0 : data.size());
    steps::project(e, shape, r, std::span<const T>(data), std::span<const T>(state.error), std::span<const T>(q),
                   std::span<T>(state.compensated), std::span<T>(factor_p));
  }
  const bool finite = low_rank ? collective_memory<E>::all_finite(e, std::span<const T>(factor_p))
                               : collective_memory<E>::all_finite(e, std::span<const T>(data));
  agree(t, record_of(named, data.size(), call.plan, call.key, !finite), problem, call.where);
  if (!call.low_rank) return std::nullopt;

  const auto ranks = static_cast<std::uint64_t>(t.size());
  compressed_report report;
  report.sent_bytes = ring_all_reduce_dense_bytes(factor_p.size() * sizeof(T), ranks) +
                      ring_all_reduce_dense_bytes(q.size() * sizeof(T), ranks);
  const std::span<const T> m = state.error.empty() ? std::span<const T>(data) : std::span<const T>(state.compensated);
  t.all_reduce_sum(std::span<T>(factor_p));
  powersgd_orthonormalise(std::span<T>(factor_p), a, r, p.orthonormalise_in_double);
  const std::span<const T> p_hat(factor_p);
  steps::back_project(e, shape, r, m, p_hat, std::span<T>(q));
  const std::vector<T> q_local = p.feedback == powersgd_feedback::local ? q : std::vector<T>{};
  t.all_reduce_sum(std::span<T>(q));

  // After the last collective: Q/p, then one pass for the result and the new error, then the state.
  std::vector<T> q_mean(q.size());
  for (std::size_t i = 0; i < q.size(); ++i) q_mean[i] = q[i] / static_cast<T>(ranks);
  const std::span<const T> q_out(call.average ? q_mean : q);
  const std::span<const T> q_err(p.feedback == powersgd_feedback::local ? q_local : q_mean);
  state.next_error.resize(data.size());
  if (!steps::reconstruct(e, shape, r, p_hat, q_out, q_err, m, data, std::span<T>(state.next_error)))
    std::ranges::fill(state.next_error, T{0});
  std::swap(state.error, state.next_error);
  state.q = std::move(q_mean);
  ++state.steps;
  return report;
}

}  // namespace detail

/// All-reduces the rows × cols row-major matrix `data` with PowerSGD on host executor `e`: `data`
/// becomes the sum over ranks of the rank-r approximations P̂·(Mᵣᵀ·P̂)ᵀ (the mean with
/// `options.average`), the same bits on every rank, and `state` (this rank's, for this tensor)
/// takes the step (lowrank/powersgd.hpp). The plan: `low_rank` (what `automatic` picks) when the
/// scheme compresses the shape and `key.step` has reached both `start_iter` and
/// `options.dense_steps`; otherwise `dense`, an uncompressed SUM all-reduce with `state`
/// untouched. `report.sent_bytes` counts the two factor all-reduces as ring all-reduces.
/// @throws error on every rank alike, with `data` and `state` unchanged: the agreement's errors
/// (`parameter_mismatch` for other parameters or another shape on a rank, `non_finite_input` for
/// NaN or ±Inf in a rank's G + E, or a factor P that overflows), `invalid_argument` for a plan
/// other than `automatic`, `low_rank` or `dense`, `size_mismatch` for `data` or `state` not of
/// `shape`; `timeout` and `transport_failed` as the other overloads.
template <executor E, transport X, gradient_value T>
  requires(memory_space_of<E> == memory_space::host)
compressed_report compressed_all_reduce(const E& e, X& t, const powersgd<T>& scheme, powersgd_state<T>& state,
                                        std::type_identity_t<std::span<T>> data, matrix_shape shape,
                                        all_reduce_options options = {}) {
  return detail::within_deadline(t, options.timeout, "compressed_all_reduce", options.key, [&] {
    detail::require_executor_transport<E, X>(e, t);
    options.dense_steps = std::max(options.dense_steps, scheme.params().start_iter);
    const all_reduce_plan plan =
        detail::resolved_plan(options, scheme.compresses(shape) ? all_reduce_plan::low_rank : all_reduce_plan::dense);
    const bool plan_ok = plan == all_reduce_plan::low_rank || plan == all_reduce_plan::dense;
    const auto report =
        detail::powersgd_step(e, t, scheme, state, data, shape,
                              detail::powersgd_problem(scheme, state, data.size(), shape, plan_ok,
                                                       "compressed_all_reduce"),
                              {options.key, plan == all_reduce_plan::low_rank, static_cast<std::uint8_t>(plan),
                               options.average, "compressed_all_reduce"});
    if (!report) return detail::dense_all_reduce(e, t, data, options.average);
    compressed_report r = *report;
    r.dense_bytes = ring_all_reduce_dense_bytes(data.size() * sizeof(T), static_cast<std::uint64_t>(t.size()));
    return r;
  });
}

/// The batched view of PyTorch's `batched_powerSGD_hook`: `data` of any shape (a 1-D gradient, a
/// whole bucket) is padded with zeros to s² values, s = ⌈√n⌉ (`powersgd_square_side`), and
/// all-reduced as one s × s matrix by the overload above; `data` gets back its n values of the
/// result. `state` is the square matrix's (s² errors; the padding's error stays 0). Sends
/// 2·s·r values per all-reduce pair where the per-tensor view sends Σ (a + b)·r, and one pair of
/// all-reduces per call instead of one per tensor. @throws error as the overload above.
template <executor E, transport X, gradient_value T>
  requires(memory_space_of<E> == memory_space::host)
compressed_report compressed_all_reduce(const E& e, X& t, const powersgd<T>& scheme, powersgd_state<T>& state,
                                        std::type_identity_t<std::span<T>> data, all_reduce_options options = {}) {
  const std::uint64_t side = powersgd_square_side(data.size());
  std::vector<T> square(static_cast<std::size_t>(side * side), T{0});
  std::ranges::copy(data, square.begin());
  compressed_report report = compressed_all_reduce(e, t, scheme, state, std::span<T>(square), {side, side}, options);
  std::copy_n(square.begin(), data.size(), data.begin());
  report.dense_bytes = ring_all_reduce_dense_bytes(data.size() * sizeof(T), static_cast<std::uint64_t>(t.size()));
  return report;
}

/// PowerSGD for reduce-scatter users (FSDP, ZeRO): `out` (`ring_chunk_of(n, P, rank).count`
/// values) becomes this rank's chunk of the sum over ranks (the mean with `options.average`) of
/// the rank-r approximations, on host executor `e`. A low-rank approximation cannot be split by
/// chunks (P and Q are sums over the whole matrix), so every rank all-reduces the factors as
/// `compressed_all_reduce` does, sending the same (a + b)·r values twice per step against the
/// (P − 1)/P of the matrix a dense reduce-scatter sends, and keeps its chunk of the result; its
/// error feedback needs the whole reconstruction anyway (E = M − P̂·(Q/p)ᵀ over the matrix). So it
/// sends 4(P − 1)/P·(a + b)·r values against (P − 1)/P·a·b, and pays where 4(a + b)·r < a·b; and a
/// rank holds its whole gradient and error, not a shard: sharding saves no gradient memory. Plans:
/// `automatic` (`low_rank` where the scheme compresses the shape and past the warm-up, else
/// `dense`), `dense` (state untouched; `reduce_scatter_plan::dense`'s zero-padded blocks), or
/// `low_rank`. @throws error as the all-reduce, and `invalid_argument` for an `out` of another size.
template <executor E, transport X, gradient_value T>
  requires(memory_space_of<E> == memory_space::host)
compressed_report compressed_reduce_scatter(const E& e, X& t, const powersgd<T>& scheme, powersgd_state<T>& state,
                                            std::type_identity_t<std::span<const T>> data, matrix_shape shape,
                                            std::type_identity_t<std::span<T>> out,
                                            reduce_scatter_options options = {}) {
  return detail::within_deadline(t, options.timeout, "compressed_reduce_scatter", options.key, [&] {
    detail::require_executor_transport<E, X>(e, t);
    const std::uint64_t n = data.size();
    const ring_chunk chunk = ring_chunk_of(n, t.size(), t.rank());
    options.dense_steps = std::max(options.dense_steps, scheme.params().start_iter);
    reduce_scatter_plan plan = options.key.step < options.dense_steps ? reduce_scatter_plan::dense : options.plan;
    if (plan == reduce_scatter_plan::automatic)
      plan = scheme.compresses(shape) ? reduce_scatter_plan::low_rank : reduce_scatter_plan::dense;
    const bool plan_ok = plan == reduce_scatter_plan::low_rank || plan == reduce_scatter_plan::dense;
    detail::local_problem extra;
    if (out.size() != chunk.count)
      extra = {errc::invalid_argument, "compressed_reduce_scatter: out has " + std::to_string(out.size()) +
                                           " values, this rank's chunk " + std::to_string(chunk.count)};
    std::vector<T> whole(data.begin(), data.end());
    const auto report =
        detail::powersgd_step(e, t, scheme, state, std::span<T>(whole), shape,
                              detail::powersgd_problem(scheme, state, data.size(), shape, plan_ok,
                                                       "compressed_reduce_scatter", extra),
                              {options.key, plan == reduce_scatter_plan::low_rank, detail::agreement_plan(plan),
                               options.average, "compressed_reduce_scatter"});
    if (!report) return detail::dense_reduce_scatter(e, t, data, out, options.average);
    std::copy_n(whole.begin() + static_cast<std::ptrdiff_t>(chunk.offset), chunk.count, out.begin());
    compressed_report r = *report;
    r.dense_bytes = (n - chunk.count) * sizeof(T);
    return r;
  });
}

}  // namespace gradcomp
