# cmake -DPKG_CONFIG=<pkg-config> -DPREFIX=<install prefix> -DCXX=<c++ compiler> -DSOURCE=<main.cpp>
#       -DBINARY_DIR=<folder> -DVERSION=<x.y.z> -P pkg_config_consumer.cmake
# A consumer without CMake: pkg-config finds gradcomp.pc in the install tree at PREFIX (and nowhere
# else: PKG_CONFIG_LIBDIR replaces the system's search path), its --cflags name PREFIX's include
# folder, and a program compiled with them (and -std=c++20) runs and succeeds.
set(ENV{PKG_CONFIG_LIBDIR} "${PREFIX}/share/pkgconfig")
unset(ENV{PKG_CONFIG_PATH})
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE result OUTPUT_VARIABLE output ERROR_VARIABLE output
                  OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT result EQUAL 0)
    list(JOIN ARGN " " command)
    message(FATAL_ERROR "${command} failed (${result}):\n${output}")
  endif()
  set(output "${output}" PARENT_SCOPE)
endfunction()

run("${PKG_CONFIG}" --modversion gradcomp)
if(NOT output STREQUAL VERSION)
  message(FATAL_ERROR "pkg-config --modversion gradcomp says '${output}', the project is ${VERSION}")
endif()
run("${PKG_CONFIG}" --cflags gradcomp)
message(STATUS "pkg-config --cflags gradcomp: ${output}")
separate_arguments(cflags UNIX_COMMAND "${output}")
set(include_dir "")
foreach(flag IN LISTS cflags)
  if(flag MATCHES "^-I(.+)$")
    file(REAL_PATH "${CMAKE_MATCH_1}" include_dir)
  endif()
endforeach()
file(REAL_PATH "${PREFIX}/include" expected_dir)
if(NOT include_dir STREQUAL expected_dir)
  message(FATAL_ERROR "pkg-config --cflags gradcomp names '${include_dir}', not ${expected_dir}")
endif()
file(MAKE_DIRECTORY "${BINARY_DIR}")
run("${CXX}" -std=c++20 ${cflags} "${SOURCE}" -o "${BINARY_DIR}/pkg_config_consumer")
run("${BINARY_DIR}/pkg_config_consumer")
