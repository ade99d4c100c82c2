#pragma once
// Reading golden wire files, and rewriting them after a deliberate format change
// (GRADCOMP_UPDATE_GOLDEN=1, said so in the commit). GRADCOMP_GOLDEN_DIR in the environment
// overrides the folder compiled in.
#include <cstddef>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <doctest/doctest.h>

namespace gradcomp::test {

/// The folder of the golden files: $GRADCOMP_GOLDEN_DIR where it is set (binaries run away from the
/// tree they were built in, as tools/gpu-check.sh runs them), else the source tree's, compiled in.
inline std::filesystem::path golden_dir() {
  const char* const from_environment = std::getenv("GRADCOMP_GOLDEN_DIR");
  return from_environment != nullptr && *from_environment != '\0' ? from_environment : GRADCOMP_GOLDEN_DIR;
}

inline std::filesystem::path golden_path(const std::string& file) { return golden_dir() / file; }

/// The bytes of a golden file (empty if it does not exist).
inline std::vector<std::byte> read_golden(const std::string& file) {
  std::ifstream in(golden_path(file), std::ios::binary);
  const std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> bytes(chars.size());
  for (std::size_t i = 0; i < chars.size(); ++i) bytes[i] = static_cast<std::byte>(chars[i]);
  return bytes;
}

/// Rewrites the golden file with `fresh` when GRADCOMP_UPDATE_GOLDEN is set, then returns its bytes.
inline std::vector<std::byte> golden_bytes(const std::string& file, const std::vector<std::byte>& fresh) {
  if (std::getenv("GRADCOMP_UPDATE_GOLDEN") != nullptr) {
    std::ofstream out(golden_path(file), std::ios::binary);
    out.write(reinterpret_cast<const char*>(fresh.data()), static_cast<std::streamsize>(fresh.size()));
    MESSAGE("rewrote ", file);
  }
  return read_golden(file);
}

}  // namespace gradcomp::test
