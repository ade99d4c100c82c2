#pragma once
/// @file
/// Compiler configuration shared by every gradcomp header: host/device function markers and the
/// platform assumptions of the wire format, and the math flags gradcomp refuses.

#include <bit>

#if defined(__CUDACC__)
/// Marks a function that both the host compiler and nvcc compile, so the CPU reference and the CUDA
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
#  error "gradcomp does not support -ffast-math, -Ofast, -ffinite-math-only, -fassociative-math, -freciprocal-math or -fno-signed-zeros: they change results the library promises bit for bit and break its NaN/Inf checks (docs/design.md §6). Compile this file with -fno-fast-math."
#endif

static_assert(std::endian::native == std::endian::little,
              "gradcomp's wire format stores values in little-endian order; big-endian hosts are not supported");
