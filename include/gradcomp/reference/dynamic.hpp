#pragma once
/// @file
/// Reference backend of TAGC's dynamic sparsifier (docs/sparsifiers.md §5): the specification the
/// `cpu_executor` backend is checked against, bit for bit. a = g + R is formed once into the
/// workspace, τ* is the z-th smallest magnitude key found with `std::nth_element` (or the table
/// rule's bisection), and one loop splits a into ã and the new residual.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include <gradcomp/core/backend.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/float_bits.hpp>
#include <gradcomp/core/reference_executor.hpp>
#include <gradcomp/core/workspace.hpp>
#include <gradcomp/sparsify/dynamic.hpp>

namespace gradcomp {

/// The dynamic sparsifier, written to be read. A 16-bit gradient's values are widened to float32
/// (C), in which a, the residuals, ã and the threshold are.
template <gradient_value T>
struct backend<dynamic_sparsifier<T>, reference_executor> {
  using C = compute_type<T>;  ///< The type of a, the residuals and ã.
  using sparsifier = dynamic_sparsifier<T>;
  using state_type = dynamic_state<C>;
  using key_type = typename float_traits<C>::bits_type;

  /// The n compensated values a and their n magnitude keys.
  struct scratch {
    std::span<C> a;
    std::span<key_type> keys;
  };
  static scratch carve(workspace_arena& arena, std::uint64_t n) {
    return {arena.take<C>(static_cast<std::size_t>(n)), arena.take<key_type>(static_cast<std::size_t>(n))};
  }

  static std::size_t workspace_bytes(const sparsifier&, const reference_executor&, std::uint64_t n) {
    workspace_arena arena = workspace_arena::measure();
    (void)carve(arena, n);
    return arena.bytes_needed();
  }

  static C threshold(const sparsifier& sp, const reference_executor&, std::span<const T> a, std::span<std::byte> ws) {
    workspace_arena arena(ws);
    const scratch s = carve(arena, a.size());
    for (std::size_t i = 0; i < a.size(); ++i) s.a[i] = C{widen(a[i])};
    return from_bits<C>(threshold_key(sp, s));
  }

  static dynamic_result<C> sparsify(const sparsifier& sp, const reference_executor&, state_type& state,
                                    std::uint64_t tensor_id, std::span<const T> grad, std::span<C> out,
                                    std::span<std::byte> ws) {
    const std::size_t n = grad.size();
    const auto found = detail::find_dynamic_residual(state.residuals, tensor_id, n, out.size());
    const bool known = found != state.residuals.end();
    workspace_arena arena(ws);
    const scratch s = carve(arena, n);
    // docs/sparsifiers.md §5: a = g + R, with R = 0 for an id not seen yet.
    for (std::size_t i = 0; i < n; ++i) s.a[i] = C{widen(grad[i])} + (known ? found->second[i] : C{0});
    const key_type tau = threshold_key(sp, s);
    // Nothing fails past this point but the allocation of a new id's residual, which changes
    // nothing if it throws. Then ã_i and the new R_i from a_i (`dynamic_split`).
    std::vector<C>& residual =
        known ? found->second : state.residuals.emplace(tensor_id, std::vector<C>(n, C{0})).first->second;
    std::uint64_t kept = 0;
    for (std::size_t i = 0; i < n; ++i) kept += dynamic_split(s.a[i], tau, out[i], residual[i]) ? 1u : 0u;
    ++state.steps;
    const double zero_fraction = n == 0 ? 0.0 : static_cast<double>(n - kept) / static_cast<double>(n);
    return {from_bits<C>(tau), kept, zero_fraction};
  }

  static std::size_t save_state(const sparsifier& sp, const reference_executor&, const state_type& state,
                                std::span<std::byte> bytes) {
    return sp.write_saved_state(state, bytes);
  }

  static void load_state(const sparsifier& sp, const reference_executor&, std::span<const std::byte> bytes,
                         state_type& state) {
    state = sp.read_saved_state(bytes);
  }

 private:
  /// τ* of the values in `s.a` as a magnitude key (docs/sparsifiers.md §5): +Inf's key (keeps
  /// nothing) when z = n, else the z-th smallest key (0-based) under `exact`; the bisection of
  /// `tagc_table`. NaN or ±Inf anywhere in a throws `non_finite_input`.
  static key_type threshold_key(const sparsifier& sp, const scratch& s) {
    const std::size_t n = s.a.size();
    if (sp.params().mode == dynamic_threshold_mode::tagc_table)
      return detail::dynamic_table_key<C>(sp.params().zero_fraction, n, [&](std::size_t i) { return s.a[i]; });
    std::uint64_t non_finite = 0;
    for (std::size_t i = 0; i < n; ++i) {
      s.keys[i] = magnitude_key(s.a[i]);
      non_finite += s.keys[i] >= float_traits<C>::infinity_key ? 1u : 0u;
    }
    detail::require_dynamic_finite(non_finite, n);
    const std::uint64_t z = sp.zeroed_count(n);
    if (z == n) return float_traits<C>::infinity_key;
    std::nth_element(s.keys.begin(), s.keys.begin() + static_cast<std::ptrdiff_t>(z), s.keys.end());
    return s.keys[static_cast<std::size_t>(z)];
  }
};

}  // namespace gradcomp
