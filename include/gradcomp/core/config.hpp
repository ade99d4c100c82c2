#pragma once
/// @file
/// Compiler configuration shared by every gradcomp header: host/device function markers and the
/// platform assumptions of the wire format.

#include <bit>

#if defined(__CUDACC__)
/// Marks a function that both the host compiler and nvcc compile, so the CPU reference and the CUDA
/// backend run the very same arithmetic.
#  define GRADCOMP_HOST_DEVICE __host__ __device__
#else
#  define GRADCOMP_HOST_DEVICE
#endif

static_assert(std::endian::native == std::endian::little,
              "gradcomp's wire format stores values in little-endian order; big-endian hosts are not supported");
