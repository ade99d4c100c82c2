# Overlay port for the gradcomp source tree this file lives in (header-only):
#   vcpkg install gradcomp --overlay-ports=<gradcomp>/packaging/vcpkg/ports
# or, in manifest mode, "dependencies": ["gradcomp"] plus the same overlay.
# The sources are this checkout (packaging/vcpkg/ports/gradcomp -> four levels up), not a download.
get_filename_component(SOURCE_PATH "${CMAKE_CURRENT_LIST_DIR}/../../../.." ABSOLUTE)
if(NOT EXISTS "${SOURCE_PATH}/include/gradcomp/gradcomp.hpp")
    message(FATAL_ERROR "gradcomp sources not found at ${SOURCE_PATH}")
endif()

set(VCPKG_BUILD_TYPE release) # header-only port

# gradcomp::cuda is always installed (it only names CCCL::CCCL and CUDA::cudart, which
# find_package(gradcomp COMPONENTS cuda) resolves on the consuming machine), so nothing here
# depends on the "cuda" feature and no CUDA toolkit is needed to install the port.
vcpkg_cmake_configure(
    SOURCE_PATH "${SOURCE_PATH}"
    OPTIONS
        -DGRADCOMP_BUILD_TESTS=OFF
        -DGRADCOMP_BUILD_BENCH=OFF
        -DGRADCOMP_BUILD_EXAMPLES=OFF
        -DGRADCOMP_INSTALL=ON
        -DGRADCOMP_ENABLE_CUDA=OFF
)
vcpkg_cmake_install()
vcpkg_cmake_config_fixup(PACKAGE_NAME gradcomp CONFIG_PATH share/gradcomp)
vcpkg_fixup_pkgconfig()

# LICENSE and CHANGELOG.md, which CMake installs into share/doc/gradcomp, are the port's copyright
# file here (vcpkg's place for them).
file(REMOVE_RECURSE "${CURRENT_PACKAGES_DIR}/debug" "${CURRENT_PACKAGES_DIR}/lib" "${CURRENT_PACKAGES_DIR}/share/doc")

file(INSTALL "${CMAKE_CURRENT_LIST_DIR}/usage" DESTINATION "${CURRENT_PACKAGES_DIR}/share/${PORT}")
vcpkg_install_copyright(FILE_LIST "${SOURCE_PATH}/LICENSE")
