#pragma once
/// @file
/// The one rule that pairs an executor with a transport in a compressed collective: both work on
/// the same memory space (checked at compile time), and the transport's work is ordered with the
/// executor's (a `cuda_executor` and a device transport share one CUDA stream; checked when the
/// call starts).

#include <gradcomp/collective/collective_memory.hpp>
#include <gradcomp/core/concepts.hpp>
#include <gradcomp/core/memory_space.hpp>
#include <gradcomp/transport/transport.hpp>

namespace gradcomp::detail {

/// Checks that executor E and transport X can run a collective together.
/// @throws error `invalid_argument` when their work is not ordered (collective_memory.hpp).
template <executor E, transport X>
void require_executor_transport(const E& e, const X& t) {
  static_assert(memory_space_of<E> != memory_space::device || memory_space_of<X> == memory_space::device,
                "this transport takes host buffers and the executor's data lives on the device: wrap the transport "
                "in gradcomp::staged_transport (gradcomp/transport/staged.cuh), which stages device buffers through "
                "pinned host memory, or use gradcomp::nccl_transport");
  static_assert(memory_space_of<E> != memory_space::host || memory_space_of<X> == memory_space::host,
                "this transport takes device buffers and the executor's data lives on the host: use a cuda_executor "
                "with device spans, or a host transport (MPI, Gloo, in-process) with cpu_executor");
  collective_memory<E>::require_ordered(e, t);
}

}  // namespace gradcomp::detail
