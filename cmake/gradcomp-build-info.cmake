# gradcomp_build_info: an INTERFACE target whose users can include <gradcomp_build_info.hpp>, the
# commit this build was made from and the compile flags of its configuration, for the benchmarks'
# JSON records (bench/bench_report.hpp). The header is rewritten at every build, and only when its
# text changes (cmake/write-build-info.cmake), so the commit is that of the sources compiled, not of
# the last configure.
set(gradcomp_build_info_dir "${PROJECT_BINARY_DIR}/generated")
# The flags of the configuration being built: CMAKE_CXX_FLAGS and CMAKE_CXX_FLAGS_<CONFIG>.
set(gradcomp_build_flags "${CMAKE_CXX_FLAGS}")
foreach(config IN ITEMS Debug Release RelWithDebInfo MinSizeRel)
  string(TOUPPER "${config}" config_upper)
  string(APPEND gradcomp_build_flags "$<$<CONFIG:${config}>: ${CMAKE_CXX_FLAGS_${config_upper}}>")
endforeach()
find_package(Git QUIET)
add_custom_target(gradcomp_build_info_header
  COMMAND "${CMAKE_COMMAND}" "-DSOURCE_DIR=${PROJECT_SOURCE_DIR}" "-DGIT=${GIT_EXECUTABLE}"
          "-DFLAGS=${gradcomp_build_flags}" "-DOUTPUT=${gradcomp_build_info_dir}/gradcomp_build_info.hpp"
          -P "${PROJECT_SOURCE_DIR}/cmake/write-build-info.cmake"
  BYPRODUCTS "${gradcomp_build_info_dir}/gradcomp_build_info.hpp"
  COMMENT "Recording the commit and flags of this build"
  VERBATIM)
add_library(gradcomp_build_info INTERFACE)
target_include_directories(gradcomp_build_info INTERFACE "${gradcomp_build_info_dir}")
add_dependencies(gradcomp_build_info gradcomp_build_info_header)
