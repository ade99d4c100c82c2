#pragma once
/// @file
/// TAGC's dynamic sparsifier on the GPU, bit for bit the CPU backend's τ*, ã, residuals and
/// report (sparsify/dynamic.hpp has the rules).
///
/// a = g + R is never stored: every pass recomputes it with the same IEEE addition (a new id's
/// a = g + 0, as on the CPU). Exact rule: radix selection (cuda/detail/radix_select.cuh) of the
/// (z + 1)-th smallest |a| key, one histogram pass over a per 11-bit digit (three for float, six
/// for double); the first pass also counts NaN and ±Inf, which fill the top bins. The host then
/// reads the status and the selection's state: τ* and, from the rank left among the ties at τ*, how
/// many keys lie below it, so the kept count needs no counting pass. Table rule: one pass counts
/// every key into 26 bins by how many (rounded) table values lie at or below it, and NaN/±Inf
/// apart; the host replays the reference's bisection on the prefix sums of those bins. A step then
/// queues one kernel that writes ã and the new residual (`dynamic_split`, shared with the CPU)
/// and returns: it waits for the device once, before anything is written, so a failed step
/// leaves the state as it was.
///
/// The state keeps each tensor's residual in its own `device_array`; the first successful step of
/// an id allocates it (cudaMalloc). Saved states are the same "GCDS" bytes as on the CPU
/// (`dynamic_sparsifier::write_saved_state`, `read_saved_state`): `save_state` copies the residuals
/// to the host, `load_state` checks the bytes before it replaces anything.

#include <gradcomp/cuda/config.cuh>

#include <cuda_runtime.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include <gradcomp/core/backend.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/float_bits.hpp>
#include <gradcomp/core/workspace.hpp>
#include <gradcomp/cuda/device_array.cuh>
#include <gradcomp/cuda/executor.cuh>
#include <gradcomp/cuda/detail/grid.cuh>
#include <gradcomp/cuda/detail/operation.cuh>
#include <gradcomp/cuda/detail/radix_select.cuh>
#include <gradcomp/sparsify/dynamic.hpp>

namespace gradcomp {

/// Residuals of the dynamic sparsifier on the GPU: one device array per tensor id.
template <gradient_value T>
struct cuda_dynamic_state {
  std::map<std::uint64_t, device_array<T>> residuals;  ///< R per tensor id; n is fixed per id.
  std::uint64_t steps = 0;                             ///< Successful steps, all tensors together.
};

namespace detail::cuda {

/// Values of the reference's threshold table.
inline constexpr unsigned tagc_table_slots = static_cast<unsigned>(tagc_threshold_table.size());
/// Bins of the table rule's counting pass: one per count of table values at or below a key (0 …
/// 25), then one for NaN and ±Inf.
inline constexpr unsigned tagc_table_bins = tagc_table_slots + 2;

/// The magnitude keys of a = g + r (of g + 0 when r is null), index j at position j.
template <class T>
struct compensated_keys {
  const T* g;
  const T* r;
  std::uint64_t n;

  struct view_type {
    const T* g;
    const T* r;
    std::uint64_t n;
    __device__ std::uint64_t size() const { return n; }
    __device__ T value(std::uint64_t j) const { return g[j] + (r != nullptr ? r[j] : T{0}); }
    __device__ std::uint64_t key(std::uint64_t j) const { return magnitude_key(value(j)); }
    __device__ std::uint64_t index(std::uint64_t j) const { return j; }
  };
  __device__ view_type view() const { return {g, r, n}; }
};

/// The table values rounded to T, as magnitude keys (ascending).
template <class T>
struct tagc_table_keys {
  typename float_traits<T>::bits_type key[tagc_table_slots];
};

/// The table rule's counting pass: bins[p] counts the keys with exactly p table values at or below
/// them, bins[26] the NaN and ±Inf.
template <class T>
__global__ void tagc_table_count_kernel(compensated_keys<T> source, tagc_table_keys<T> table,
                                        unsigned long long* bins) {
  __shared__ unsigned int local[tagc_table_bins];
  for (unsigned b = threadIdx.x; b < tagc_table_bins; b += blockDim.x) local[b] = 0;
  __syncthreads();
  const auto view = source.view();
  constexpr unsigned slots = tagc_table_slots;
  for (std::uint64_t j = thread_id(); j < view.size(); j += thread_count()) {
    const auto key = static_cast<typename float_traits<T>::bits_type>(view.key(j));
    unsigned at_or_below = 0;
#pragma unroll
    for (unsigned t = 0; t < slots; ++t) at_or_below += table.key[t] <= key ? 1u : 0u;
    atomicAdd(&local[key >= float_traits<T>::infinity_key ? slots + 1 : at_or_below], 1u);
  }
  __syncthreads();
  for (unsigned b = threadIdx.x; b < tagc_table_bins; b += blockDim.x)
    if (local[b] != 0) atomicAdd(&bins[b], static_cast<unsigned long long>(local[b]));
}

/// out[i] = ã_i and r[i] = a_i − ã_i (`dynamic_split`); r may be a new id's uninitialised residual
/// (then `fresh`, and a = g + 0). `out` may be `g`.
template <class T>
struct dynamic_apply {
  const T* g;
  T* r;
  T* out;
  typename float_traits<T>::bits_type tau;
  bool fresh;

  __device__ void operator()(std::uint64_t i) const {
    const T a = g[i] + (fresh ? T{0} : r[i]);
    T passed;
    T residual;
    (void)dynamic_split(a, tau, passed, residual);
    out[i] = passed;
    r[i] = residual;
  }
};

}  // namespace detail::cuda

/// The dynamic sparsifier on the GPU.
template <gradient_value T>
struct backend<dynamic_sparsifier<T>, cuda_executor> {
  using sparsifier = dynamic_sparsifier<T>;
  using state_type = cuda_dynamic_state<T>;
  using key_type = typename float_traits<T>::bits_type;
  static constexpr int key_bits = float_traits<T>::magnitude_bits;

  /// The workspace after the status: the selection's bins and states, the table's bins.
  struct scratch {
    detail::cuda::radix_scratch radix;
    std::span<unsigned long long> table_bins;
  };

  static scratch carve(workspace_arena& arena) {
    scratch s;
    s.radix = detail::cuda::radix_scratch::carve(arena);
    s.table_bins = arena.take<unsigned long long>(detail::cuda::tagc_table_bins);
    return s;
  }

  /// About 16 KiB, whatever n is (the same for both rules).
  static std::size_t workspace_bytes(const sparsifier&, const cuda_executor&, std::uint64_t) {
    return detail::cuda::operation::workspace_bytes([](workspace_arena& arena) { (void)carve(arena); });
  }

  static T threshold(const sparsifier& sp, const cuda_executor& exec, std::span<const T> a, std::span<std::byte> ws) {
    return from_bits<T>(find_threshold(sp, exec, {a.data(), nullptr, a.size()}, ws).tau);
  }

  static dynamic_result<T> sparsify(const sparsifier& sp, const cuda_executor& exec, state_type& state,
                                    std::uint64_t tensor_id, std::span<const T> grad, std::span<T> out,
                                    std::span<std::byte> ws) {
    const std::uint64_t n = grad.size();
    const auto found =
        detail::find_dynamic_residual(state.residuals, tensor_id, static_cast<std::size_t>(n), out.size());
    const bool known = found != state.residuals.end();
    const threshold_found t = find_threshold(sp, exec, {grad.data(), known ? found->second.data() : nullptr, n}, ws);
    // Nothing can fail past this point but the allocation of a new id's residual, which changes
    // nothing if it throws.
    device_array<T>& residual =
        known ? found->second : state.residuals.emplace(tensor_id, device_array<T>(n, exec)).first->second;
    detail::cuda::for_each_item(exec, n,
                                detail::cuda::dynamic_apply<T>{grad.data(), residual.data(), out.data(), t.tau,
                                                               !known});
    ++state.steps;
    const double zero_fraction = n == 0 ? 0.0 : static_cast<double>(n - t.kept) / static_cast<double>(n);
    return {from_bits<T>(t.tau), t.kept, zero_fraction};
  }

  /// The CPU's bytes: the residuals copied to the host first, in order on the stream after the
  /// steps queued there (one wait at the end).
  static std::size_t save_state(const sparsifier& sp, const cuda_executor& exec, const state_type& state,
                                std::span<std::byte> bytes) {
    dynamic_state<T> host;
    host.steps = state.steps;
    for (const auto& [id, residual] : state.residuals) {
      std::vector<T>& values = host.residuals.emplace(id, std::vector<T>(residual.size())).first->second;
      if (!values.empty())
        GRADCOMP_CUDA_CHECK(cudaMemcpyAsync(values.data(), residual.data(), values.size() * sizeof(T),
                                            cudaMemcpyDeviceToHost, exec.native_stream()));
    }
    exec.synchronize();
    return sp.write_saved_state(host, bytes);
  }

  /// Checks the bytes (`read_saved_state`), then replaces the state's residuals by device copies.
  static void load_state(const sparsifier& sp, const cuda_executor& exec, std::span<const std::byte> bytes,
                         state_type& state) {
    const dynamic_state<T> host = sp.read_saved_state(bytes);
    std::map<std::uint64_t, device_array<T>> residuals;
    for (const auto& [id, values] : host.residuals) {
      device_array<T>& residual = residuals.emplace(id, device_array<T>(values.size(), exec)).first->second;
      if (!values.empty())
        GRADCOMP_CUDA_CHECK(cudaMemcpyAsync(residual.data(), values.data(), values.size() * sizeof(T),
                                            cudaMemcpyHostToDevice, exec.native_stream()));
    }
    exec.synchronize();  // the host copies go out of scope
    state.residuals.swap(residuals);
    state.steps = host.steps;
  }

 private:
  /// τ* as a magnitude key, and how many keys are at or above it.
  struct threshold_found {
    key_type tau;
    std::uint64_t kept;
  };

  /// τ* of the values of `source` under the current rule; waits for the device.
  /// @throws error `non_finite_input`, `workspace_too_small`, `device_failed`.
  static threshold_found find_threshold(const sparsifier& sp, const cuda_executor& exec,
                                        const detail::cuda::compensated_keys<T>& source, std::span<std::byte> ws) {
    namespace cd = detail::cuda;
    const std::uint64_t n = source.n;
    workspace_arena arena(ws);
    const cd::operation op(exec, arena);
    const scratch s = carve(arena);
    if (sp.params().mode == dynamic_threshold_mode::tagc_table) {
      if (n == 0) return {0, 0};
      cd::tagc_table_keys<T> table{};
      for (std::size_t t = 0; t < tagc_threshold_table.size(); ++t)
        table.key[t] = magnitude_key(static_cast<T>(tagc_threshold_table[t]));
      GRADCOMP_CUDA_CHECK(cudaMemsetAsync(s.table_bins.data(), 0, s.table_bins.size_bytes(), exec.native_stream()));
      cd::launch(exec, cd::streaming_grid_for(n), cd::block_threads, cd::tagc_table_count_kernel<T>, source, table,
                 s.table_bins.data());
      std::array<unsigned long long, cd::tagc_table_bins> bins{};
      GRADCOMP_CUDA_CHECK(
          cudaMemcpyAsync(bins.data(), s.table_bins.data(), sizeof bins, cudaMemcpyDeviceToHost, exec.native_stream()));
      exec.synchronize();
      detail::require_dynamic_finite(bins.back(), n);
      // below[t] = #{|a| < table[t]}: the keys with at most t table values at or below them.
      std::array<std::uint64_t, tagc_threshold_table.size()> below{};
      std::uint64_t running = 0;
      for (std::size_t t = 0; t < below.size(); ++t) below[t] = running += bins[t];
      std::size_t lo = 0;
      std::size_t hi = below.size();
      while (lo < hi) {
        const std::size_t mid = (lo + hi) / 2;
        if (static_cast<double>(below[mid]) / static_cast<double>(n) < sp.params().zero_fraction) lo = mid + 1;
        else
          hi = mid;
      }
      return lo == 0 ? threshold_found{0, n} : threshold_found{table.key[lo - 1], n - below[lo - 1]};
    }
    const std::uint64_t z = sp.zeroed_count(n);
    if (n == 0) return {float_traits<T>::infinity_key, 0};
    // z = n keeps nothing, but its first pass still looks for NaN and ±Inf.
    const std::uint64_t rank = z < n ? z + 1 : n;
    cd::radix_begin(exec, s.radix, rank);
    const auto infinite_bin =
        static_cast<unsigned>(float_traits<T>::infinity_key >> cd::radix_digit_of(key_bits, 0).shift);
    const int digits = z < n ? cd::radix_digit_count(key_bits) : 1;
    for (int d = 0; d < digits; ++d)
      cd::radix_pass<cd::radix_order::smallest_first>(exec, s.radix, source, cd::by_key{}, s.radix.value_state(),
                                                      cd::radix_digit_of(key_bits, d), n,
                                                      d == 0 ? infinite_bin : cd::radix_bins, op.status());
    cd::radix_state found{};
    GRADCOMP_CUDA_CHECK(
        cudaMemcpyAsync(&found, s.radix.value_state(), sizeof found, cudaMemcpyDeviceToHost, exec.native_stream()));
    op.finish(
        [n](errc, std::uint64_t non_finite, std::uint32_t) { return detail::dynamic_non_finite_text(non_finite, n); });
    if (z == n) return {float_traits<T>::infinity_key, 0};
    // The target is the rank-th smallest key and the found.rank-th among its ties: rank −
    // found.rank keys lie below it.
    return {static_cast<key_type>(found.prefix), n - (rank - found.rank)};
  }
};

}  // namespace gradcomp
