# What gradcomp's own programs (tests, benchmark, examples) need, checked before anything else in
# the configure step. A package that is missing stops the configure at once with the line that
# installs it on each platform: the README's two commands (`cmake --workflow --preset demo` and
# `--preset test`) then tell a new user exactly what to run, instead of CMake's generic "Could not
# find a package configuration file provided by fmt" after the CUDA toolchain checks.
#
# The configure step never installs anything itself. A library's build that runs the system's
# package manager (sudo, network, a changed system) behind a `cmake` command would surprise its
# users and is refused by the packagers that build it offline (Debian, vcpkg, Conan); the line to
# paste is one step more for a human and none for them. A user who has the packages elsewhere
# points CMake at them the usual way (CMAKE_PREFIX_PATH, <Package>_DIR, a toolchain file: all three
# can be set in the environment for `cmake --workflow`, which takes no -D options).
#
# The optional packages (libzfp, MPI, Gloo, PyTorch) are only reported, where their tests are
# configured (tests/, examples/).

# Per package: its find_package name and oldest version ("" for any), then its name for apt, dnf,
# Homebrew, vcpkg and Conan.
set(gradcomp_dependency_doctest doctest "" doctest-dev doctest-devel doctest doctest doctest/2.4.11)
set(gradcomp_dependency_fmt fmt 9 libfmt-dev fmt-devel fmt fmt fmt/9.1.0)

# Finds the named packages (keys of gradcomp_dependency_<name>) and stops the configure when one is
# missing, with the install lines for all that are. A macro: find_package must run in the caller's
# scope, where packages leave their variables (doctest its CMAKE_MODULE_PATH entry for
# doctest_discover_tests), so that tests/ and bench/ use what was found here.
macro(gradcomp_require_packages)
  set(_gradcomp_missing)
  foreach(_gradcomp_name IN ITEMS ${ARGN})
    list(GET gradcomp_dependency_${_gradcomp_name} 0 _gradcomp_package)
    list(GET gradcomp_dependency_${_gradcomp_name} 1 _gradcomp_version)
    find_package(${_gradcomp_package} ${_gradcomp_version} CONFIG QUIET)
    if(NOT ${_gradcomp_package}_FOUND)
      list(APPEND _gradcomp_missing ${_gradcomp_name})
    endif()
  endforeach()
  if(_gradcomp_missing)
    gradcomp_stop_for_missing_packages(${_gradcomp_missing})
  endif()
  unset(_gradcomp_missing)
  unset(_gradcomp_name)
  unset(_gradcomp_package)
  unset(_gradcomp_version)
endmacro()

# Stops the configure with the lines that install the named packages.
function(gradcomp_stop_for_missing_packages)
  set(missing ${ARGN})
  set(apt) # per package manager, the names of the missing packages
  set(dnf)
  set(brew)
  set(vcpkg)
  set(conan)
  foreach(name IN LISTS missing)
    list(GET gradcomp_dependency_${name} 2 name_apt)
    list(GET gradcomp_dependency_${name} 3 name_dnf)
    list(GET gradcomp_dependency_${name} 4 name_brew)
    list(GET gradcomp_dependency_${name} 5 name_vcpkg)
    list(GET gradcomp_dependency_${name} 6 name_conan)
    string(APPEND apt " ${name_apt}")
    string(APPEND dnf " ${name_dnf}")
    string(APPEND brew " ${name_brew}")
    string(APPEND vcpkg " ${name_vcpkg}")
    string(APPEND conan " --requires=${name_conan}")
  endforeach()
  # sudo only for a user who is not root (a fresh container or chroot runs as root, without sudo).
  set(sudo "sudo ")
  if(CMAKE_HOST_UNIX)
    execute_process(COMMAND id -u OUTPUT_VARIABLE uid OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    if(uid STREQUAL "0")
      set(sudo "")
    endif()
  endif()
  list(JOIN missing ", " missing_text)
  message(FATAL_ERROR
    "gradcomp's tests, benchmark and examples need ${missing_text}, which CMake did not find.\n"
    "Install with one of these, then run the same command again:\n"
    "  Debian, Ubuntu:    ${sudo}apt-get update && ${sudo}apt-get install -y${apt}\n"
    "  Fedora:            ${sudo}dnf install -y${dnf}\n"
    "  macOS (Homebrew):  brew install${brew}\n"
    "  vcpkg:             vcpkg install${vcpkg}\n"
    "                     export CMAKE_TOOLCHAIN_FILE=<vcpkg root>/scripts/buildsystems/vcpkg.cmake\n"
    "  Conan 2:           conan profile detect --exist-ok\n"
    "                     conan install${conan} -g CMakeDeps --build=missing --output-folder=build/deps -s compiler.cppstd=20\n"
    "                     export CMAKE_PREFIX_PATH=$PWD/build/deps\n"
    "Installed elsewhere: export CMAKE_PREFIX_PATH=<its prefix> (or pass -D<Package>_DIR=<dir> to cmake).\n"
    "The library alone needs neither: -DGRADCOMP_BUILD_TESTS=OFF -DGRADCOMP_BUILD_BENCH=OFF "
    "-DGRADCOMP_BUILD_EXAMPLES=OFF.\n"
    "Optional, reported at configure: libzfp (ZFP cross-check), MPI and Gloo (multi-process tests), "
    "PyTorch (the DDP hook's tests); on Debian: apt-get install libzfp-dev libopenmpi-dev openmpi-bin "
    "libgloo-dev python3-torch libtorch-dev pybind11-dev ninja-build python3-dev")
endfunction()
