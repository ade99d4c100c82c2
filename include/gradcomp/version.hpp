#pragma once
/// @file
/// Library version. CMakeLists.txt's `project(gradcomp VERSION ...)` is the one source; the ctest
/// `package.version` fails when this header, packaging/vcpkg/ports/gradcomp/vcpkg.json or
/// CHANGELOG.md disagree with it (conanfile.py reads it from CMakeLists.txt).

#include <gradcomp/core/config.hpp>

namespace gradcomp {

inline constexpr int version_major = 0;  ///< Incompatible API changes.
inline constexpr int version_minor = 1;  ///< Added functionality.
inline constexpr int version_patch = 0;  ///< Fixes.

}  // namespace gradcomp
