// The compile test of the executor-generic collectives (issue 24): every collective with every
// codec family (collective/every_collective.hpp) instantiated for cuda_executor with
// nccl_transport and with the staging adapter over the in-process transport (and over MPI and
// Gloo where they are found), and for cpu_executor with every host transport. Nothing runs: the
// explicit instantiations below are the test, so CI, which compiles CUDA without a GPU, fails on
// a combination that no longer builds.
#include <gradcomp/cuda.cuh>
#include <gradcomp/transport/in_process.hpp>
#include <gradcomp/transport/nccl.cuh>
#include <gradcomp/transport/staged.cuh>
#if defined(GRADCOMP_COMPILE_CHECK_MPI)
#  include <gradcomp/transport/mpi.hpp>
#endif
#if defined(GRADCOMP_COMPILE_CHECK_GLOO)
#  include <gradcomp/transport/gloo.hpp>
#endif

#include <span>

#include "collective/every_collective.hpp"

namespace gradcomp::test {

// The device transports: NCCL, and host transports staged through pinned memory.
template void every_collective(const cuda_executor&, nccl_transport&, std::span<float>, std::span<const float>,
                               every_state<cuda_executor>);
template void every_collective(const cuda_executor&, staged_transport<in_process_transport>&, std::span<float>,
                               std::span<const float>, every_state<cuda_executor>);
// The host transports.
template void every_collective(const cpu_executor&, in_process_transport&, std::span<float>, std::span<const float>,
                               every_state<cpu_executor>);
#if defined(GRADCOMP_COMPILE_CHECK_MPI)
template void every_collective(const cuda_executor&, staged_transport<mpi_transport>&, std::span<float>,
                               std::span<const float>, every_state<cuda_executor>);
template void every_collective(const cpu_executor&, mpi_transport&, std::span<float>, std::span<const float>,
                               every_state<cpu_executor>);
#endif
#if defined(GRADCOMP_COMPILE_CHECK_GLOO)
template void every_collective(const cuda_executor&, staged_transport<gloo_transport>&, std::span<float>,
                               std::span<const float>, every_state<cuda_executor>);
template void every_collective(const cpu_executor&, gloo_transport&, std::span<float>, std::span<const float>,
                               every_state<cpu_executor>);
#endif

}  // namespace gradcomp::test
