"""Builds gradcomp's PyTorch extension (gradcomp._gradcomp_torch) with torch's BuildExtension,
against the torch that the installing Python imports (pyproject.toml says why the build is not
isolated). The C++ sources are python/csrc/ and the repository's include/ and examples/train/ headers,
so the package is installed from a checkout: `python3 -m pip install --no-build-isolation ./python`.

GRADCOMP_PYTHON_BUILD_DIR, when set, holds setuptools' build and egg-info folders (default:
build/ and gradcomp.egg-info/ here); the tests set it to keep the source tree clean."""

import os
import sys

from setuptools import setup

try:
    from torch.utils.cpp_extension import BuildExtension, CppExtension
except ImportError:
    sys.exit("gradcomp: torch is not importable here. The extension is compiled against the torch of the "
             "environment it is installed into, which pip's isolated build hides: install torch first, then run "
             "`python3 -m pip install --no-build-isolation ./python` (docs/pytorch.md §1).")

HERE = os.path.dirname(os.path.abspath(__file__))
INCLUDE = os.path.join(os.path.dirname(HERE), "include")
if not os.path.isfile(os.path.join(INCLUDE, "gradcomp", "gradcomp.hpp")):
    sys.exit(f"gradcomp: the library's headers are not at {INCLUDE}: install from a gradcomp checkout "
             "(python3 -m pip install --no-build-isolation ./python)")

options = {}
build_dir = os.environ.get("GRADCOMP_PYTHON_BUILD_DIR")
if build_dir:
    os.makedirs(build_dir, exist_ok=True)
    options = {"build": {"build_base": build_dir}, "egg_info": {"egg_base": build_dir}}

setup(
    ext_modules=[
        CppExtension("gradcomp._gradcomp_torch", ["csrc/gradcomp_torch.cpp"], include_dirs=[INCLUDE],
                     extra_compile_args=["-std=c++20", "-O2"]),
    ],
    cmdclass={"build_ext": BuildExtension},
    options=options,
)
