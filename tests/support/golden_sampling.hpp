#pragma once
// Which truncations and single-bit flips of a golden message the GPU hostile-bytes test decodes.
// All of them by default (about 120,000 GPU decodes over the golden files); with
// GRADCOMP_GOLDEN_FLIP_STRIDE=N a deterministic sample of about one in N, for the GPU check and
// for compute-sanitizer runs (docs/cuda.md §6).
//
// The sample. A message is cut into four regions: the envelope (bytes 0 … 55), the payload's first
// 16 bytes, its last 16 bytes, and the rest of the payload between them (regions that do not exist
// for a short message are empty). In each non-empty region [a, b) of positions (bits for flips,
// lengths for truncations) the sample takes a, b − 1, and every position a + phase + k·N, where
// the phase (below N) comes from the file's name and the region. So every file and every region
// gets flips and truncations at any stride, the first and last position of each region always
// among them (the exact envelope, the first payload byte, the last padding bits), different files
// cover different residues, and N = 1 takes every position.
#include <gradcomp/core/wire_envelope.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

namespace gradcomp::test {

/// The environment variable that sets the stride.
inline constexpr const char* golden_flip_stride_variable = "GRADCOMP_GOLDEN_FLIP_STRIDE";

/// The stride a value of GRADCOMP_GOLDEN_FLIP_STRIDE asks for: 1 (every position) when unset or
/// empty, 0 when it is not a positive decimal number (the caller refuses it).
[[nodiscard]] inline std::size_t golden_flip_stride(const char* value) {
  if (value == nullptr || value[0] == '\0') return 1;
  char* end = nullptr;
  const unsigned long long stride = std::strtoull(value, &end, 10);
  return *end == '\0' && value[0] != '-' ? static_cast<std::size_t>(stride) : 0;
}

/// Bytes of the payload's first and last regions.
inline constexpr std::size_t golden_payload_edge = 16;

/// Names of the regions, in message order.
inline constexpr std::array<std::string_view, 4> golden_region_names = {"envelope", "payload start", "payload middle",
                                                                        "payload end"};

/// The byte offsets where the regions of a message of `size` bytes end (the last one is `size`).
[[nodiscard]] inline std::array<std::size_t, 4> golden_region_ends(std::size_t size) {
  const std::size_t envelope_end = std::min(size, envelope::size);
  const std::size_t start_end = std::min(size, envelope_end + golden_payload_edge);
  const std::size_t end_begin = std::max(start_end, size >= golden_payload_edge ? size - golden_payload_edge : 0);
  return {envelope_end, start_end, end_begin, size};
}

/// The sampled positions of one region [a, b) (empty when a = b), ascending.
[[nodiscard]] inline std::vector<std::size_t> sample_region(std::size_t a, std::size_t b, std::size_t stride,
                                                            std::size_t phase) {
  std::vector<std::size_t> positions;
  if (a >= b) return positions;
  positions.push_back(a);
  for (std::size_t offset = phase % stride; offset < b - a; offset += stride) {
    if (offset != 0 && offset != b - a - 1) positions.push_back(a + offset);
    if (stride > b - a - offset) break;  // the next step would leave the region (or wrap)
  }
  if (b - 1 != a) positions.push_back(b - 1);
  return positions;
}

/// A position sample of a message: the positions of each region (bits when `unit` is 8, lengths
/// when it is 1).
struct golden_sample {
  std::array<std::vector<std::size_t>, 4> regions;

  /// Positions in all regions, ascending.
  [[nodiscard]] std::vector<std::size_t> all() const {
    std::vector<std::size_t> positions;
    for (const std::vector<std::size_t>& r : regions) positions.insert(positions.end(), r.begin(), r.end());
    return positions;
  }
};

/// The sample of positions of a message of `size` bytes from the file `file`: bit positions
/// (`unit` 8) or truncation lengths (`unit` 1), at `stride` (≥ 1).
[[nodiscard]] inline golden_sample sample_golden_positions(std::string_view file, std::size_t size, std::size_t unit,
                                                           std::size_t stride) {
  std::uint64_t name_hash = 0xcbf29ce484222325ull;  // FNV-1a of the file name
  for (const char c : file) name_hash = (name_hash ^ static_cast<unsigned char>(c)) * 0x100000001b3ull;
  const std::array<std::size_t, 4> ends = golden_region_ends(size);
  golden_sample sample;
  std::size_t begin = 0;
  for (std::size_t r = 0; r < ends.size(); ++r) {
    const std::size_t phase = static_cast<std::size_t>((name_hash >> (8 * r)) % stride);
    sample.regions[r] = sample_region(begin * unit, ends[r] * unit, stride, phase);
    begin = ends[r];
  }
  return sample;
}

/// "envelope 27/448, payload start 9/128, …": what a sample took of each region.
[[nodiscard]] inline std::string describe(const golden_sample& sample, std::size_t size, std::size_t unit) {
  const std::array<std::size_t, 4> ends = golden_region_ends(size);
  std::string text;
  std::size_t begin = 0;
  for (std::size_t r = 0; r < ends.size(); ++r) {
    if (!text.empty()) text += ", ";
    text += std::string(golden_region_names[r]) + " " + std::to_string(sample.regions[r].size()) + "/" +
            std::to_string((ends[r] - begin) * unit);
    begin = ends[r];
  }
  return text;
}

}  // namespace gradcomp::test
