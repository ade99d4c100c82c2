#pragma once
/// @file
/// Compiler configuration shared by every gradcomp header: the C++20 check, host/device function
/// markers, the platform assumptions of the wire format, and the math flags gradcomp refuses.

// The language check comes before any include: a C++17 compiler would otherwise stop at the first
// C++20 name (std::endian, concepts) with no word about the cause. MSVC reports the standard in
// _MSVC_LANG (__cplusplus stays 199711L without /Zc:__cplusplus); nvcc and clang in CUDA mode
// report their -std in __cplusplus. Anything after C++17 passes (GCC 10 and Clang 10 say 201709L
// and 201707L for -std=c++2a).
#if defined(_MSVC_LANG)
#  define GRADCOMP_CPLUSPLUS _MSVC_LANG
#else
/// The C++ standard the compiler is in (`__cplusplus`, or `_MSVC_LANG` with MSVC).
#  define GRADCOMP_CPLUSPLUS __cplusplus
#endif
#if GRADCOMP_CPLUSPLUS <= 201703L
// clang-format off
#  error "gradcomp needs C++20, and this compiler is in C++17 or older mode: compile with -std=c++20 (GCC, Clang, nvcc) or /std:c++20 (MSVC); CMake users link gradcomp::gradcomp, which asks for cxx_std_20"
// clang-format on
#endif

#include <bit>

#if defined(__CUDACC__)
/// Marks a function that both the host compiler and nvcc compile, so the CPU backend and the CUDA
/// backend run the very same arithmetic.
#  define GRADCOMP_HOST_DEVICE __host__ __device__
#else
#  define GRADCOMP_HOST_DEVICE
#endif

// gradcomp promises results bit for bit (docs/design.md §6) and rejects NaN and ±Inf. Value-
// changing math flags break both: -ffast-math reassociates the ordered sums, turns divisions into
// reciprocal products, drops signed zeros, lets the compiler assume that no value is NaN or Inf,
// and (when it links the program) flushes subnormals to zero for the whole process. The flags the
// compiler announces are refused here; compile the translation units that include gradcomp
// without them (e.g. with -fno-fast-math after the project's flags).
#if defined(__FAST_MATH__) || (defined(__FINITE_MATH_ONLY__) && __FINITE_MATH_ONLY__) || \
    defined(__ASSOCIATIVE_MATH__) || defined(__RECIPROCAL_MATH__) || defined(__NO_SIGNED_ZEROS__)
// clang-format off
#  error "gradcomp does not support -ffast-math, -Ofast, -ffinite-math-only, -fassociative-math, -freciprocal-math or -fno-signed-zeros: they change results the library promises bit for bit and break its NaN/Inf checks (docs/design.md §6). Compile this file with -fno-fast-math."
// clang-format on
#endif

static_assert(std::endian::native == std::endian::little,
              "gradcomp's wire format stores values in little-endian order; big-endian hosts are not supported");
