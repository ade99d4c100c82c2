# Consumer projects built by ctest (included from tests/CMakeLists.txt):
#   package.install              installs this build tree into package-prefix (fixture setup)
#   package.find_package_host    host/: find_package(gradcomp) from that prefix, built and run
#   package.find_package_cuda    cuda/: find_package(gradcomp COMPONENTS cuda), built only, when
#                                nvcc was found (the machine running the tests may have no GPU)
#   package.add_subdirectory     subdirectory/: add_subdirectory(<this source tree>), built and run
set(gradcomp_package_dir "${CMAKE_CURRENT_LIST_DIR}")
set(gradcomp_package_prefix "${CMAKE_CURRENT_BINARY_DIR}/package-prefix")

add_test(NAME package.install
         COMMAND "${CMAKE_COMMAND}" --install "${PROJECT_BINARY_DIR}" --prefix "${gradcomp_package_prefix}")
set_tests_properties(package.install PROPERTIES FIXTURES_SETUP gradcomp_install)

add_test(NAME package.find_package_host
         COMMAND "${CMAKE_CTEST_COMMAND}" --build-and-test "${gradcomp_package_dir}/host"
                 "${CMAKE_CURRENT_BINARY_DIR}/package-host" --build-generator "${CMAKE_GENERATOR}"
                 --build-options "-DCMAKE_PREFIX_PATH=${gradcomp_package_prefix}"
                                 "-DCMAKE_CXX_COMPILER=${CMAKE_CXX_COMPILER}"
                                 "-DCMAKE_BUILD_TYPE=Release"
                 --test-command package_consumer)
set_tests_properties(package.find_package_host PROPERTIES FIXTURES_REQUIRED gradcomp_install)

if(GRADCOMP_HAS_CUDA)
  # Without --test-command, --build-and-test configures and builds only.
  add_test(NAME package.find_package_cuda
           COMMAND "${CMAKE_CTEST_COMMAND}" --build-and-test "${gradcomp_package_dir}/cuda"
                   "${CMAKE_CURRENT_BINARY_DIR}/package-cuda" --build-generator "${CMAKE_GENERATOR}"
                   --build-options "-DCMAKE_PREFIX_PATH=${gradcomp_package_prefix}"
                                   "-DCMAKE_CXX_COMPILER=${CMAKE_CXX_COMPILER}"
                                   "-DCMAKE_CUDA_COMPILER=${CMAKE_CUDA_COMPILER}"
                                   "-DCMAKE_CUDA_ARCHITECTURES=80"
                                   "-DCMAKE_BUILD_TYPE=Release")
  set_tests_properties(package.find_package_cuda PROPERTIES FIXTURES_REQUIRED gradcomp_install)
endif()

add_test(NAME package.add_subdirectory
         COMMAND "${CMAKE_CTEST_COMMAND}" --build-and-test "${gradcomp_package_dir}/subdirectory"
                 "${CMAKE_CURRENT_BINARY_DIR}/package-subdirectory" --build-generator "${CMAKE_GENERATOR}"
                 --build-options "-DGRADCOMP_SOURCE_DIR=${PROJECT_SOURCE_DIR}"
                                 "-DCMAKE_CXX_COMPILER=${CMAKE_CXX_COMPILER}"
                                 "-DCMAKE_BUILD_TYPE=Release"
                 --test-command subdirectory_consumer)
