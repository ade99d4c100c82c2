# Consumers of gradcomp and checks of its packaging, run by ctest (included from tests/CMakeLists.txt):
#   package.install              installs this build tree into package-prefix (fixture setup)
#   package.find_package_host    host/: find_package(gradcomp) from that prefix, built and run
#   package.find_package_cuda    cuda/: find_package(gradcomp COMPONENTS cuda), built only, where
#                                CUDA is enabled (the machine running the tests may have no GPU)
#   package.optional_cuda_without_toolkit, package.required_cuda_without_toolkit,
#   package.unknown_component    components/: the cuda component where CMake cannot see the CUDA
#                                toolkit (hidden below), and a component that does not exist
#   package.pkg_config           a program compiled with `pkg-config --cflags gradcomp` (where
#                                pkg-config and a GCC-style compiler are found)
#   package.add_subdirectory     subdirectory/: add_subdirectory(<this source tree>), built and run
#   package.add_subdirectory_links_cuda_without_cuda
#                                subdirectory/ in a C++-only project that links gradcomp::cuda:
#                                the configure stops and says CUDA is not enabled
#   package.add_subdirectory_cuda  subdirectory_cuda/: a CUDA project's gradcomp::cuda, built only
#   package.fetchcontent         fetchcontent/: FetchContent by git tag from a local repository of
#                                this tree (package.fetchcontent_repository; where git is found)
#   package.cxx17_error          a C++17 compile of <gradcomp/gradcomp.hpp> stops first at the
#                                C++20 check (GCC-style compilers; package.cxx17_error_nvcc: nvcc)
#   package.version              the version files agree with project(VERSION) (check_version.cmake)
set(gradcomp_package_dir "${CMAKE_CURRENT_LIST_DIR}")
set(gradcomp_package_prefix "${CMAKE_CURRENT_BINARY_DIR}/package-prefix")
set(gradcomp_consumer_options "-DCMAKE_CXX_COMPILER=${CMAKE_CXX_COMPILER}" "-DCMAKE_BUILD_TYPE=Release")

# Makes test `name` pass when its output holds `text`, which CMake may have wrapped between words.
function(gradcomp_test_passes_with name text)
  string(REGEX REPLACE "([][()*+.?^$|\\])" "\\\\\\1" pattern "${text}")
  string(REPLACE " " "[ \n]+" pattern "${pattern}")
  set_tests_properties(${name} PROPERTIES PASS_REGULAR_EXPRESSION "${pattern}")
endfunction()

add_test(NAME package.install
         COMMAND "${CMAKE_COMMAND}" --install "${PROJECT_BINARY_DIR}" --prefix "${gradcomp_package_prefix}")
set_tests_properties(package.install PROPERTIES FIXTURES_SETUP gradcomp_install)

add_test(NAME package.find_package_host
         COMMAND "${CMAKE_CTEST_COMMAND}" --build-and-test "${gradcomp_package_dir}/host"
                 "${CMAKE_CURRENT_BINARY_DIR}/package-host" --build-generator "${CMAKE_GENERATOR}"
                 --build-options "-DCMAKE_PREFIX_PATH=${gradcomp_package_prefix}" ${gradcomp_consumer_options}
                 --test-command package_consumer)
set_tests_properties(package.find_package_host PROPERTIES FIXTURES_REQUIRED gradcomp_install)

if(GRADCOMP_HAS_CUDA)
  # Without --test-command, --build-and-test configures and builds only.
  add_test(NAME package.find_package_cuda
           COMMAND "${CMAKE_CTEST_COMMAND}" --build-and-test "${gradcomp_package_dir}/cuda"
                   "${CMAKE_CURRENT_BINARY_DIR}/package-cuda" --build-generator "${CMAKE_GENERATOR}"
                   --build-options "-DCMAKE_PREFIX_PATH=${gradcomp_package_prefix}" ${gradcomp_consumer_options}
                                   "-DCMAKE_CUDA_COMPILER=${CMAKE_CUDA_COMPILER}" "-DCMAKE_CUDA_ARCHITECTURES=80")
  set_tests_properties(package.find_package_cuda PROPERTIES FIXTURES_REQUIRED gradcomp_install)
endif()

# ---- components where CMake cannot see the CUDA toolkit ------------------------------------------
# A machine without the toolkit is simulated by hiding this one from CMake's find commands, the only
# way gradcomp's package config looks for it (find_package(CUDAToolkit), find_package(CCCL)):
# every folder holding nvcc is dropped from PATH and ignored as a search path, CUDA_PATH,
# CUDAToolkit_ROOT and CUDACXX are unset, and the toolkit's folders (/usr/local/cuda*, and the one
# this build found) are ignored as search paths and prefixes. components/ then checks that
# find_package(CUDAToolkit) and find_program(nvcc) fail, so the test fails, instead of passing for
# the wrong reason, wherever the hiding falls short. On a machine without a toolkit the hiding
# changes nothing. (Unix paths: these tests are not written for Windows.)
file(GLOB gradcomp_toolkit_roots LIST_DIRECTORIES true "/usr/local/cuda" "/usr/local/cuda-*" "/opt/cuda")
if(CUDAToolkit_BIN_DIR)
  get_filename_component(gradcomp_found_root "${CUDAToolkit_BIN_DIR}" DIRECTORY)
  list(APPEND gradcomp_toolkit_roots "${gradcomp_found_root}")
endif()
set(gradcomp_hidden_roots)
foreach(root IN LISTS gradcomp_toolkit_roots)
  file(REAL_PATH "${root}" real_root)
  list(APPEND gradcomp_hidden_roots "${root}" "${real_root}")
endforeach()
list(REMOVE_DUPLICATES gradcomp_hidden_roots)
# Every folder holding an nvcc where find_program would look: PATH, <system prefix>/bin (a toolkit
# may have put links into /usr/local/bin), the toolkits' bin folders.
string(REPLACE ":" ";" gradcomp_path_entries "$ENV{PATH}")
list(TRANSFORM gradcomp_hidden_roots APPEND "/bin" OUTPUT_VARIABLE gradcomp_toolkit_bins)
list(TRANSFORM CMAKE_SYSTEM_PREFIX_PATH APPEND "/bin" OUTPUT_VARIABLE gradcomp_system_bins)
set(gradcomp_nvcc_dirs)
foreach(dir IN LISTS gradcomp_path_entries gradcomp_system_bins gradcomp_toolkit_bins)
  if(EXISTS "${dir}/nvcc")
    list(APPEND gradcomp_nvcc_dirs "${dir}")
  endif()
endforeach()
set(gradcomp_path_without_nvcc "")
foreach(entry IN LISTS gradcomp_path_entries)
  if(NOT entry IN_LIST gradcomp_nvcc_dirs)
    string(APPEND gradcomp_path_without_nvcc ":${entry}")
  endif()
endforeach()
string(REGEX REPLACE "^:" "" gradcomp_path_without_nvcc "${gradcomp_path_without_nvcc}")
set(gradcomp_hidden_dirs ${gradcomp_hidden_roots} ${gradcomp_nvcc_dirs})
list(REMOVE_DUPLICATES gradcomp_hidden_dirs)
string(REPLACE ";" "\\;" gradcomp_hidden_roots_arg "${gradcomp_hidden_roots}")
string(REPLACE ";" "\\;" gradcomp_hidden_dirs_arg "${gradcomp_hidden_dirs}")
# --fresh: no cache entry left by an earlier run (a found nvcc, say) may stand in for a search.
set(gradcomp_without_toolkit_options --fresh ${gradcomp_consumer_options} "-DCMAKE_PREFIX_PATH=${gradcomp_package_prefix}"
    "-DCMAKE_IGNORE_PREFIX_PATH=${gradcomp_hidden_roots_arg}" "-DCMAKE_IGNORE_PATH=${gradcomp_hidden_dirs_arg}")
set(gradcomp_without_toolkit_environment
    "PATH=set:${gradcomp_path_without_nvcc}" "CUDA_PATH=unset:" "CUDAToolkit_ROOT=unset:" "CUDACXX=unset:")

add_test(NAME package.optional_cuda_without_toolkit
         COMMAND "${CMAKE_CTEST_COMMAND}" --build-and-test "${gradcomp_package_dir}/components"
                 "${CMAKE_CURRENT_BINARY_DIR}/package-optional-cuda" --build-generator "${CMAKE_GENERATOR}"
                 --build-options -DSCENARIO=optional ${gradcomp_without_toolkit_options}
                 --test-command components_consumer)
# Configure only: the configure must fail, with the package's reason.
foreach(test IN ITEMS required_cuda_without_toolkit:required unknown_component:unknown)
  string(REPLACE ":" ";" test "${test}")
  list(GET test 0 name)
  list(GET test 1 scenario)
  add_test(NAME package.${name}
           COMMAND "${CMAKE_COMMAND}" -S "${gradcomp_package_dir}/components"
                   -B "${CMAKE_CURRENT_BINARY_DIR}/package-${scenario}-component" -G "${CMAKE_GENERATOR}"
                   -DSCENARIO=${scenario} ${gradcomp_without_toolkit_options})
endforeach()
gradcomp_test_passes_with(package.required_cuda_without_toolkit
  "Reason given by package: gradcomp's cuda component needs the CUDA toolkit: the CUDA toolkit (CUDA::cudart) was not found")
gradcomp_test_passes_with(package.unknown_component
  "Reason given by package: gradcomp has no component 'cuda_typo' (its components: cuda)")
set_tests_properties(package.optional_cuda_without_toolkit package.required_cuda_without_toolkit
                     package.unknown_component PROPERTIES
                     FIXTURES_REQUIRED gradcomp_install
                     ENVIRONMENT_MODIFICATION "${gradcomp_without_toolkit_environment}")

# ---- pkg-config ----------------------------------------------------------------------------------
find_program(GRADCOMP_PKG_CONFIG NAMES pkg-config pkgconf)
if(GRADCOMP_PKG_CONFIG AND CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
  add_test(NAME package.pkg_config
           COMMAND "${CMAKE_COMMAND}" "-DPKG_CONFIG=${GRADCOMP_PKG_CONFIG}" "-DPREFIX=${gradcomp_package_prefix}"
                   "-DCXX=${CMAKE_CXX_COMPILER}" "-DSOURCE=${gradcomp_package_dir}/host/main.cpp"
                   "-DBINARY_DIR=${CMAKE_CURRENT_BINARY_DIR}/package-pkg-config" "-DVERSION=${PROJECT_VERSION}"
                   -P "${gradcomp_package_dir}/pkg_config_consumer.cmake")
  set_tests_properties(package.pkg_config PROPERTIES FIXTURES_REQUIRED gradcomp_install)
else()
  message(STATUS "gradcomp: pkg-config not found: package.pkg_config is off (install pkg-config)")
endif()

# ---- add_subdirectory and FetchContent -----------------------------------------------------------
add_test(NAME package.add_subdirectory
         COMMAND "${CMAKE_CTEST_COMMAND}" --build-and-test "${gradcomp_package_dir}/subdirectory"
                 "${CMAKE_CURRENT_BINARY_DIR}/package-subdirectory" --build-generator "${CMAKE_GENERATOR}"
                 --build-options "-DGRADCOMP_SOURCE_DIR=${PROJECT_SOURCE_DIR}" ${gradcomp_consumer_options}
                 --test-command subdirectory_consumer)
add_test(NAME package.add_subdirectory_links_cuda_without_cuda
         COMMAND "${CMAKE_COMMAND}" -S "${gradcomp_package_dir}/subdirectory"
                 -B "${CMAKE_CURRENT_BINARY_DIR}/package-subdirectory-links-cuda" -G "${CMAKE_GENERATOR}"
                 "-DGRADCOMP_SOURCE_DIR=${PROJECT_SOURCE_DIR}" -DLINK_CUDA=ON ${gradcomp_consumer_options})
gradcomp_test_passes_with(package.add_subdirectory_links_cuda_without_cuda
  "subdirectory_consumer links gradcomp::cuda, which this build does not define: CUDA is not enabled")
if(GRADCOMP_HAS_CUDA)
  add_test(NAME package.add_subdirectory_cuda
           COMMAND "${CMAKE_CTEST_COMMAND}" --build-and-test "${gradcomp_package_dir}/subdirectory_cuda"
                   "${CMAKE_CURRENT_BINARY_DIR}/package-subdirectory-cuda" --build-generator "${CMAKE_GENERATOR}"
                   --build-options "-DGRADCOMP_SOURCE_DIR=${PROJECT_SOURCE_DIR}" ${gradcomp_consumer_options}
                                   "-DCMAKE_CUDA_COMPILER=${CMAKE_CUDA_COMPILER}" "-DCMAKE_CUDA_ARCHITECTURES=80")
endif()

find_package(Git QUIET)
if(GIT_EXECUTABLE)
  set(gradcomp_git_repository "${CMAKE_CURRENT_BINARY_DIR}/package-git-repository")
  add_test(NAME package.fetchcontent_repository
           COMMAND "${CMAKE_COMMAND}" "-DSOURCE_DIR=${PROJECT_SOURCE_DIR}" "-DREPOSITORY=${gradcomp_git_repository}"
                   "-DTAG=v${PROJECT_VERSION}" "-DGIT=${GIT_EXECUTABLE}"
                   -P "${gradcomp_package_dir}/fetchcontent/make_repository.cmake")
  set_tests_properties(package.fetchcontent_repository PROPERTIES FIXTURES_SETUP gradcomp_git_repository)
  add_test(NAME package.fetchcontent
           COMMAND "${CMAKE_CTEST_COMMAND}" --build-and-test "${gradcomp_package_dir}/fetchcontent"
                   "${CMAKE_CURRENT_BINARY_DIR}/package-fetchcontent" --build-generator "${CMAKE_GENERATOR}"
                   --build-options "-DGRADCOMP_GIT_REPOSITORY=file://${gradcomp_git_repository}"
                                   "-DGRADCOMP_GIT_TAG=v${PROJECT_VERSION}" ${gradcomp_consumer_options}
                   --test-command fetchcontent_consumer)
  set_tests_properties(package.fetchcontent PROPERTIES FIXTURES_REQUIRED gradcomp_git_repository)
else()
  message(STATUS "gradcomp: git not found: package.fetchcontent is off")
endif()

# ---- the C++20 check ------------------------------------------------------------------------------
set(gradcomp_cxx20_message "gradcomp needs C++20, and this compiler is in C++17 or older mode")
if(CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
  add_test(NAME package.cxx17_error
           COMMAND "${CMAKE_COMMAND}" "-DEXPECTED=${gradcomp_cxx20_message}"
                   -P "${gradcomp_package_dir}/expect_first_error.cmake" --
                   "${CMAKE_CXX_COMPILER}" -std=c++17 -fsyntax-only "-I${PROJECT_SOURCE_DIR}/include"
                   "${gradcomp_package_dir}/cxx17/consumer.cpp")
endif()
if(GRADCOMP_HAS_CUDA)
  add_test(NAME package.cxx17_error_nvcc
           COMMAND "${CMAKE_COMMAND}" "-DEXPECTED=${gradcomp_cxx20_message}"
                   -P "${gradcomp_package_dir}/expect_first_error.cmake" --
                   "${CMAKE_CUDA_COMPILER}" -std=c++17 -x cu -c "-I${PROJECT_SOURCE_DIR}/include"
                   "${gradcomp_package_dir}/cxx17/consumer.cpp" -o "${CMAKE_CURRENT_BINARY_DIR}/package-cxx17-nvcc.o")
endif()

# ---- one version -----------------------------------------------------------------------------------
add_test(NAME package.version
         COMMAND "${CMAKE_COMMAND}" "-DVERSION=${PROJECT_VERSION}" "-DSOURCE_DIR=${PROJECT_SOURCE_DIR}"
                 -P "${gradcomp_package_dir}/check_version.cmake")
