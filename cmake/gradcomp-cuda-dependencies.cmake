# What gradcomp::cuda links, CCCL::CCCL and CUDA::cudart, found in the CUDA toolkit, or taken from
# the caller where it found them first (to use another CCCL than the toolkit's, say). Included by
# gradcomp's CMakeLists.txt (gradcomp built here, or added with add_subdirectory or FetchContent)
# and by the installed package's gradcomp-config.cmake, so both find the same way.

# Sets `missing` to why CCCL::CCCL or CUDA::cudart cannot be had (empty when both are there).
# ARGN is passed on to find_package (GLOBAL where other directories' targets link gradcomp::cuda).
# A macro, so that the toolkit's variables (CUDAToolkit_LIBRARY_DIR, ...) reach the caller as they
# would from find_package.
macro(gradcomp_find_cuda_dependencies missing)
  if(NOT TARGET CUDA::cudart)
    find_package(CUDAToolkit QUIET ${ARGN})
  endif()
  if(TARGET CUDA::cudart AND NOT TARGET CCCL::CCCL)
    find_package(CCCL CONFIG QUIET ${ARGN} HINTS "${CUDAToolkit_LIBRARY_DIR}/cmake")
  endif()
  if(NOT TARGET CUDA::cudart)
    set(${missing} "the CUDA toolkit (CUDA::cudart) was not found; install it or set CUDAToolkit_ROOT")
  elseif(NOT TARGET CCCL::CCCL)
    set(${missing} "CCCL was not found (CUDA 12 and later ship it); set CCCL_DIR to <CCCL>/lib/cmake/cccl")
  else()
    set(${missing} "")
  endif()
endmacro()
