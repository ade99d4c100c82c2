#pragma once
/// @file
/// Library version, kept in step with the CMake project version.

namespace gradcomp {

inline constexpr int version_major = 0;  ///< Incompatible API changes.
inline constexpr int version_minor = 1;  ///< Added functionality.
inline constexpr int version_patch = 0;  ///< Fixes.

}  // namespace gradcomp
