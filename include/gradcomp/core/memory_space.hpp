#pragma once
/// @file
/// Where the data of an executor or a transport lives: host memory (`cpu_executor`, the MPI, Gloo
/// and in-process transports) or device memory (`cuda_executor`, `nccl_transport`, the staging
/// adapter). The compressed collectives require the executor's space and the transport's space to
/// be the same, at compile time.

#include <cstdint>

namespace gradcomp {

/// A memory space: where gradients, messages and workspace live.
enum class memory_space : std::uint8_t {
  host = 0,    ///< Host memory, addressed by the CPU.
  device = 1,  ///< Device memory of a GPU, addressed by its kernels and by NCCL.
};

/// The memory space of an executor or transport `X`: its `static constexpr memory_space memory`
/// member, or `memory_space::host` when it has none (a transport written before memory spaces, or
/// a user's host transport).
template <class X>
inline constexpr memory_space memory_space_of = [] {
  if constexpr (requires { X::memory; }) return static_cast<memory_space>(X::memory);
  else
    return memory_space::host;
}();

}  // namespace gradcomp
