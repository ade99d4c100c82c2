#pragma once
/// @file
/// Writes a contiguous output front to back through a small cache-resident stage, so that kernels
/// fill aligned memory whatever the alignment of the destination, and large outputs reach memory
/// with non-temporal stores of whole cache lines (no read of the destination first).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__SSE2__)
#  include <emmintrin.h>
#endif

namespace gradcomp::detail::cpu {

/// Orders earlier non-temporal stores before every later store, so that data written with them
/// is visible to whoever is handed the buffer next.
inline void streaming_fence() noexcept {
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

/// Stages output bytes and copies them to the destination `capacity` bytes at a time. With
/// `streaming`, the whole 64-byte lines of each copy are written with non-temporal stores and the
/// partial lines at its ends with ordinary ones; `finish` (or the destructor) writes what is
/// staged and orders the non-temporal stores before any later store.
class staged_writer {
 public:
  /// Stage size in bytes; every `reserve` asks for at most this much.
  static constexpr std::size_t capacity = 4096;

  staged_writer(std::byte* destination, bool streaming) noexcept : next_(destination), streaming_(streaming) {}
  staged_writer(const staged_writer&) = delete;
  staged_writer& operator=(const staged_writer&) = delete;
  ~staged_writer() { finish(); }

  /// Room for the next `bytes` (≤ capacity) output bytes, 64-byte aligned when `bytes` and every
  /// earlier reservation are multiples of 64.
  [[nodiscard]] std::byte* reserve(std::size_t bytes) noexcept {
    if (fill_ + bytes > capacity) flush();
    std::byte* const at = stage_ + fill_;
    fill_ += bytes;
    return at;
  }

  /// Writes what is staged, then `bytes` bytes from `data` (any size; from an aligned, cache-resident
  /// buffer this is the cheapest way to write output that is already assembled).
  void write(const std::byte* data, std::size_t bytes) noexcept {
    flush();
    streamed_ = copy_lines(next_, data, bytes, streaming_) || streamed_;
    next_ += bytes;
  }

  /// Writes the staged bytes out; the writer may be used no further.
  void finish() noexcept {
    flush();
    if (streamed_) streaming_fence();
    streamed_ = false;
  }

 private:
  void flush() noexcept {
    if (fill_ == 0) return;
    streamed_ = copy_lines(next_, stage_, fill_, streaming_) || streamed_;
    next_ += fill_;
    fill_ = 0;
  }

  /// Copies `bytes` bytes from `from` to `to`: with `streaming`, the whole 64-byte lines of `to`
  /// with non-temporal stores and the partial lines at its ends with ordinary ones. Returns
  /// whether it wrote any line with non-temporal stores.
  static bool copy_lines(std::byte* to, const std::byte* from, std::size_t bytes, bool streaming) noexcept {
    std::size_t head = 0;
    bool streamed = false;
#if defined(__SSE2__)
    if (streaming) {
      const auto misalignment = reinterpret_cast<std::uintptr_t>(to) % 64;
      head = std::min(bytes, misalignment == 0 ? std::size_t{0} : 64 - misalignment);
      std::memcpy(to, from, head);
      std::size_t i = head;
      for (; bytes - i >= 64; i += 64) {
        for (std::size_t k = 0; k < 64; k += 16)
          _mm_stream_si128(reinterpret_cast<__m128i*>(to + i + k),
                           _mm_loadu_si128(reinterpret_cast<const __m128i*>(from + i + k)));
      }
      streamed = i > head;
      head = i;
    }
#else
    (void)streaming;
#endif
    std::memcpy(to + head, from + head, bytes - head);
    return streamed;
  }

  alignas(64) std::byte stage_[capacity];
  std::byte* next_;
  std::size_t fill_ = 0;
  bool streaming_;
  bool streamed_ = false;
};

}  // namespace gradcomp::detail::cpu
