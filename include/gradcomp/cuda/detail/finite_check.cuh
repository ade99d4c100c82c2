#pragma once
/// @file
/// A device check that every value of a span is finite: a functor for an operation's own status
/// (the count sketch's cells), and a whole check for the calls that store values a caller hands in
/// (`set_carried_error` of error feedback and LoCo), whose status words live in stream scratch,
/// since those calls take no workspace.

#include <gradcomp/cuda/config.cuh>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include <gradcomp/core/error.hpp>
#include <gradcomp/core/float_bits.hpp>
#include <gradcomp/core/workspace.hpp>
#include <gradcomp/cuda/executor.cuh>
#include <gradcomp/cuda/detail/grid.cuh>
#include <gradcomp/cuda/detail/operation.cuh>

namespace gradcomp::detail::cuda {

/// Records the first NaN or Inf of `values` as `code` (check `reason`).
template <class T>
struct find_non_finite {
  const T* values;
  device_status* status;
  errc code = errc::non_finite_input;
  std::uint32_t reason = 0;

  __device__ void operator()(std::uint64_t i) const {
    if (!is_finite(values[i])) record_failure(status, code, i, reason);
  }
};

/// Throws `non_finite_input` (naming the first such value of `what`) unless every value of the
/// device span `values` is finite; waits for the stream. @throws error `device_failed` too.
template <class T>
void require_finite(const cuda_executor& exec, std::span<const T> values, const char* what) {
  const stream_scratch ws(exec, sizeof(device_status) + workspace_arena::alignment);
  workspace_arena arena(ws.span());
  const operation op(exec, arena);
  for_each_item(exec, values.size(), find_non_finite<T>{values.data(), op.status()});
  op.finish([what](errc, std::uint64_t i, std::uint32_t) {
    return "value " + std::to_string(i) + " of " + what + " is NaN or Inf; the state is unchanged";
  });
}

}  // namespace gradcomp::detail::cuda
