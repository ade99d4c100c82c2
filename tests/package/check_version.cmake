# cmake -DVERSION=<project version> -DSOURCE_DIR=<gradcomp> -P check_version.cmake
# CMakeLists.txt's project(gradcomp VERSION ...) is the one source of the version. What cannot be
# generated from it must agree with it, or this check (ctest package.version) fails:
#   include/gradcomp/version.hpp       used without CMake (pkg-config, a plain -I), so it is a file
#   packaging/vcpkg/.../vcpkg.json     read by vcpkg before any CMake runs
#   CHANGELOG.md                       its newest release heading
# conanfile.py reads the version from CMakeLists.txt, and gradcomp.pc and the package's version
# file are generated from it.
string(REPLACE "." ";" parts "${VERSION}")
list(GET parts 0 major)
list(GET parts 1 minor)
list(GET parts 2 patch)
set(problems "")

file(READ "${SOURCE_DIR}/include/gradcomp/version.hpp" header)
foreach(part IN ITEMS major minor patch)
  if(NOT header MATCHES "version_${part} = ([0-9]+);")
    string(APPEND problems "\n  version.hpp has no version_${part}")
  elseif(NOT CMAKE_MATCH_1 STREQUAL ${part})
    string(APPEND problems "\n  version.hpp: version_${part} = ${CMAKE_MATCH_1}, CMakeLists.txt: ${${part}}")
  endif()
endforeach()

file(READ "${SOURCE_DIR}/packaging/vcpkg/ports/gradcomp/vcpkg.json" manifest)
string(JSON manifest_version ERROR_VARIABLE json_error GET "${manifest}" version)
if(json_error)
  string(APPEND problems "\n  vcpkg.json: ${json_error}")
elseif(NOT manifest_version STREQUAL VERSION)
  string(APPEND problems "\n  vcpkg.json: version ${manifest_version}")
endif()

file(READ "${SOURCE_DIR}/CHANGELOG.md" changelog)
if(NOT changelog MATCHES "\n## \\[([0-9.]+)\\]")
  string(APPEND problems "\n  CHANGELOG.md has no '## [x.y.z]' release heading")
elseif(NOT CMAKE_MATCH_1 STREQUAL VERSION)
  string(APPEND problems "\n  CHANGELOG.md: newest release ${CMAKE_MATCH_1}")
endif()

file(READ "${SOURCE_DIR}/conanfile.py" recipe)
if(NOT recipe MATCHES "project\\\\\\(gradcomp")
  string(APPEND problems "\n  conanfile.py no longer reads the version from CMakeLists.txt's project(gradcomp VERSION ...)")
endif()

if(problems)
  message(FATAL_ERROR "the version is ${VERSION} in CMakeLists.txt, but:${problems}")
endif()
message(STATUS "version ${VERSION} agrees in CMakeLists.txt, version.hpp, vcpkg.json and CHANGELOG.md")
