#pragma once
// An oracle for the MPC codec's payload, independent of the library's code.

#include <bit>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace gradcomp::test {

// The reference (MPC_float_12.cu) for one tensor, without its magic and length words and without
// words of groups past n: per chunk of 1024 words (zero past n), subtract the word dim back where
// the index is below n, transpose each warp of 32 words bit by bit as its shuffle loop does,
// subtract the previous word across the chunk, then per group a ballot of non-zero words. The
// payload is all bitmaps, then all kept words, as little-endian uint32.
inline std::vector<std::byte> mpc_oracle_payload(const std::vector<float>& x, std::uint32_t dim) {
  const std::size_t n = x.size();
  std::vector<std::uint32_t> bitmaps, words;
  for (std::size_t base = 0; base < n; base += 1024) {
    std::vector<std::uint32_t> v(1024, 0), a(1024), w(1024), d(1024);
    for (std::size_t t = 0; t < 1024; ++t)
      if (base + t < n) v[t] = std::bit_cast<std::uint32_t>(x[base + t]);
    for (std::size_t t = 0; t < 1024; ++t) a[t] = (t >= dim && base + t < n) ? v[t] - v[t - dim] : v[t];
    for (std::size_t tid = 0; tid < 1024; ++tid) {
      const std::size_t lane = tid % 32, warp = tid - lane;
      std::uint32_t v2 = 0;
      for (int i = 31; i >= 0; --i) v2 = (v2 << 1) + ((a[warp + static_cast<std::size_t>(i)] >> lane) & 1u);
      w[tid] = v2;
    }
    for (std::size_t tid = 0; tid < 1024; ++tid) d[tid] = tid > 0 ? w[tid] - w[tid - 1] : w[tid];
    for (std::size_t g = 0; g < 32 && base + 32 * g < n; ++g) {
      std::uint32_t bitmap = 0;
      for (std::size_t lane = 0; lane < 32; ++lane) {
        if (d[32 * g + lane] == 0) continue;
        bitmap |= 1u << lane;
        words.push_back(d[32 * g + lane]);
      }
      bitmaps.push_back(bitmap);
    }
  }
  std::vector<std::byte> payload;
  for (const std::vector<std::uint32_t>* part : {&bitmaps, &words})
    for (const std::uint32_t word : *part)
      for (int b = 0; b < 4; ++b) payload.push_back(static_cast<std::byte>((word >> (8 * b)) & 0xFFu));
  return payload;
}

}  // namespace gradcomp::test
