#pragma once
/// @file
/// What the CUDA backend requires of its compiler and of CCCL, checked once: every `cuda/` header
/// includes this first. The backend is compiled by nvcc (or clang in CUDA mode) with C++20 and
/// CCCL ≥ 3.0; CCCL 3.0.1 (CUDA 13.0) has no `cub::DeviceTopK`, so exact top-k is gradcomp's own
/// radix select (cuda/detail/radix_select.cuh), built from CUB's block primitives.

#if !defined(__CUDACC__)
// clang-format off
#  error "gradcomp's CUDA backend must be compiled as CUDA (nvcc, or clang -x cuda); host-only code includes <gradcomp/gradcomp.hpp>"
// clang-format on
#endif

#include <cuda/std/version>

#if !defined(CCCL_VERSION) || CCCL_VERSION < 3000000
#  error "gradcomp's CUDA backend needs CCCL 3.0 or later (the CUDA 13 toolkit ships it)"
#endif

#if __cplusplus < 202002L
#  error "gradcomp's CUDA backend needs C++20 (nvcc -std=c++20)"
#endif
