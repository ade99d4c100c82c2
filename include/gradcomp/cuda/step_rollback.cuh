#pragma once
/// @file
/// `step_rollback` (feedback/step_rollback.hpp) for the GPU states of the stateful wrappers, so
/// that a compressed collective whose later stage fails puts a `cuda_executor`'s state back as it
/// was, as on the CPU:
///
/// - error feedback keeps its previous residual by itself (a step writes `next` and exchanges the
///   two device arrays when it succeeds): the rollback exchanges them back and restores the step
///   count, with no copy;
/// - LoCo's 8-bit error is rewritten in place by a step: the rollback copies the codes and scales
///   into stream-ordered device buffers on the executor's stream before the step, and back on
///   restore.

#include <gradcomp/cuda/config.cuh>

#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>

#include <gradcomp/cuda/collective_memory.cuh>
#include <gradcomp/cuda/error_feedback.cuh>
#include <gradcomp/cuda/executor.cuh>
#include <gradcomp/cuda/loco.cuh>
#include <gradcomp/feedback/step_rollback.hpp>

namespace gradcomp {

/// Undoes a step of error feedback on the GPU without a copy: a step that succeeds leaves the
/// previous residual in `next` and adds one to `steps`, and a step that fails changes neither.
template <gradient_value T>
class step_rollback<cuda_error_feedback_state<T>> : public exchanging_rollback<cuda_error_feedback_state<T>> {
 public:
  using exchanging_rollback<cuda_error_feedback_state<T>>::exchanging_rollback;
};

/// Undoes a step of LoCo on the GPU: a device copy of the codes and scales, made on the executor's
/// stream before the step and copied back by `restore`.
template <gradient_value T>
class step_rollback<cuda_loco_state<T>> {
  using memory = collective_memory<cuda_executor>;

 public:
  /// Copies `state` on `e`'s stream (in order with the step that follows). @throws error `device_failed`.
  step_rollback(const cuda_executor& e, const cuda_loco_state<T>& state)
      : exec_(e),
        codes_(e, state.codes.size()),
        scales_(e, state.scales.size()),
        steps_(state.steps),
        total_steps_(state.total_steps) {
    memory::copy(e, state.codes.span(), codes_.span());
    memory::copy(e, state.scales.span(), scales_.span());
  }
  /// Puts `state` back as it was when this rollback was made (queued on the executor's stream);
  /// call at most once. @throws error `device_failed`.
  void restore(cuda_loco_state<T>& state) {
    if (state.total_steps == total_steps_) return;  // the step did not happen
    memory::copy(exec_, std::span<const std::int8_t>(codes_.span()), state.codes.span());
    memory::copy(exec_, std::span<const T>(scales_.span()), state.scales.span());
    state.steps = steps_;
    state.total_steps = total_steps_;
  }

 private:
  cuda_executor exec_;
  memory::buffer<std::int8_t> codes_;
  memory::buffer<T> scales_;
  std::uint64_t steps_;
  std::uint64_t total_steps_;
};

}  // namespace gradcomp
