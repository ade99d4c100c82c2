#pragma once
/// @file
/// `step_rollback<State>`: undoes one step of a stateful wrapper after the fact, for a caller whose
/// step succeeded but whose collective failed later (compressed_all_reduce, compressed_reduce_scatter).
/// Made before the step, `restore` puts the state back as it was, whether the step ran or threw.
/// In general it keeps a copy of the state; a state that keeps its previous contents by itself
/// specialises it to keep less (error feedback: `feedback/error_feedback.hpp` on the host,
/// `cuda/step_rollback.cuh` on the GPU), and a state in device memory specialises it to copy on the
/// executor's stream (LoCo on the GPU: `cuda/step_rollback.cuh`). `rollback_point(e, state)` makes
/// the right one for executor `e`.

#include <cstdint>
#include <type_traits>
#include <utility>

namespace gradcomp {

/// Undoes the next step on a state: a copy of the state, restored by `restore`.
template <class State>
class step_rollback {
 public:
  /// Remembers `state` as it is before the step.
  explicit step_rollback(const State& state) : saved_(state) {}
  /// Puts `state` back as it was when this rollback was made; call at most once.
  void restore(State& state) { state = std::move(saved_); }

 private:
  State saved_;
};

/// Undoes a step of a state that keeps its previous contents by itself (error feedback, on any
/// executor): a step that succeeds writes the new residual into `next`, exchanges it with
/// `residual` and adds one to `steps`; a step that fails changes neither. No copy: `restore`
/// exchanges the two back. The specialisations of `step_rollback` for such states derive from it.
template <class State>
class exchanging_rollback {
 public:
  /// Remembers the step count before the step.
  explicit exchanging_rollback(const State& state) noexcept : steps_(state.steps) {}
  /// Puts `state` back as it was when this rollback was made; call at most once.
  void restore(State& state) noexcept {
    if (state.steps == steps_) return;  // the step did not happen
    std::swap(state.residual, state.next);
    state.steps = steps_;
  }

 private:
  std::uint64_t steps_;
};

/// The rollback of `state`, made before a step on executor `e`: `step_rollback<State>(e, state)`
/// where the specialisation takes the executor (a device state copied on its stream), else
/// `step_rollback<State>(state)`.
template <class E, class State>
[[nodiscard]] step_rollback<State> rollback_point(const E& e, const State& state) {
  if constexpr (std::is_constructible_v<step_rollback<State>, const E&, const State&>)
    return step_rollback<State>(e, state);
  else
    return step_rollback<State>(state);
}

}  // namespace gradcomp
