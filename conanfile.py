"""Conan 2 recipe for gradcomp, a header-only C++20 library.

    conan create . -pr:h packaging/conan/profile -pr:b packaging/conan/profile --build=missing --no-remote

With a profile from `conan profile detect` (GCC 12 defaults to gnu17), add `-s compiler.cppstd=20`:
the recipe refuses a C++ standard below 20.

The package is gradcomp's own CMake install (headers + gradcomp-config.cmake), so consumers call
find_package(gradcomp CONFIG REQUIRED [COMPONENTS cuda]) exactly as with a plain install. Nothing
is required from a remote: tests, benchmark and examples are not built here.
"""
import os
import re

from conan import ConanFile
from conan.tools.build import check_min_cppstd
from conan.tools.cmake import CMake, CMakeToolchain, cmake_layout
from conan.tools.files import copy, load


class GradcompConan(ConanFile):
    name = "gradcomp"
    description = "Header-only gradient compression for distributed deep-learning training"
    license = "Apache-2.0"
    # No public home page yet: set `url` and `homepage` when the repository is published.
    topics = ("gradient-compression", "distributed-training", "header-only", "cuda")
    package_type = "header-library"
    # Settings are declared only so that CMake can configure the install; package_id() drops them.
    settings = "os", "arch", "compiler", "build_type"
    exports_sources = "include/*", "cmake/*", "CMakeLists.txt", "LICENSE", "CHANGELOG.md"
    no_copy_source = True

    def set_version(self):
        # One source of truth: project(gradcomp VERSION x.y.z ...) in CMakeLists.txt.
        if not self.version:
            text = load(self, os.path.join(self.recipe_folder, "CMakeLists.txt"))
            self.version = re.search(r"project\(gradcomp\s+VERSION\s+([0-9.]+)", text).group(1)

    def validate(self):
        check_min_cppstd(self, 20)

    def layout(self):
        cmake_layout(self)

    def generate(self):
        tc = CMakeToolchain(self)
        tc.user_presets_path = False  # no CMakeUserPresets.json in the (shared, uncopied) sources
        tc.cache_variables["GRADCOMP_BUILD_TESTS"] = False
        tc.cache_variables["GRADCOMP_BUILD_BENCH"] = False
        tc.cache_variables["GRADCOMP_BUILD_EXAMPLES"] = False
        tc.cache_variables["GRADCOMP_INSTALL"] = True
        tc.cache_variables["GRADCOMP_ENABLE_CUDA"] = "OFF"
        tc.generate()

    def build(self):
        cmake = CMake(self)
        cmake.configure()

    def package(self):
        copy(self, "LICENSE", self.source_folder, os.path.join(self.package_folder, "licenses"))
        CMake(self).install()

    def package_id(self):
        self.info.clear()  # header-only: one package for every configuration

    def package_info(self):
        self.cpp_info.bindirs = []
        self.cpp_info.libdirs = []
        # Consumers use gradcomp's own share/gradcomp/gradcomp-config.cmake (components: cuda),
        # not a CMakeDeps-generated one: CMakeDeps cannot express CCCL::CCCL/CUDA::cudart, which
        # that config finds in the CUDA toolkit. The package root goes on CMAKE_PREFIX_PATH
        # (CMakeToolchain adds builddirs), where find_package looks in share/gradcomp/.
        self.cpp_info.set_property("cmake_find_mode", "none")
        self.cpp_info.builddirs = ["."]
