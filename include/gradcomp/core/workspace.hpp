#pragma once
/// @file
/// Carving typed scratch arrays out of the caller's workspace. The same carving code, run in
/// measuring mode, computes `workspace_bytes(n)`, so the two can never disagree.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include <gradcomp/core/error.hpp>

namespace gradcomp {

/// Hands out 64-byte aligned arrays from a caller-provided buffer, or measures how much a
/// sequence of requests needs (`workspace_arena::measure()`; its arrays have no storage).
class workspace_arena {
 public:
  /// Alignment of every array handed out.
  static constexpr std::size_t alignment = 64;

  /// An arena that only adds up the sizes requested.
  [[nodiscard]] static workspace_arena measure() noexcept { return workspace_arena{}; }

  /// An arena over `workspace`.
  explicit workspace_arena(std::span<std::byte> workspace) noexcept
      : base_(workspace.data()), capacity_(workspace.size()), measuring_(false) {}

  /// The next array of `count` elements of `T`.
  /// @throws error `workspace_too_small` when the workspace is exhausted.
  template <class T>
  [[nodiscard]] std::span<T> take(std::size_t count) {
    const std::size_t start = (used_ + alignment - 1) / alignment * alignment;
    used_ = start + count * sizeof(T);
    if (measuring_) return {};
    const std::size_t misalignment = reinterpret_cast<std::uintptr_t>(base_) % alignment;
    const std::size_t shift = misalignment == 0 ? 0 : alignment - misalignment;
    detail::require(shift + used_ <= capacity_, errc::workspace_too_small, [&] {
      return "workspace of " + std::to_string(capacity_) + " bytes is too small; see workspace_bytes(n)";
    });
    return {reinterpret_cast<T*>(base_ + shift + start), count};
  }

  /// Bytes requested so far, plus the slack that aligning the start of any buffer may cost.
  [[nodiscard]] std::size_t bytes_needed() const noexcept { return used_ == 0 ? 0 : used_ + alignment; }

 private:
  workspace_arena() noexcept = default;
  std::byte* base_ = nullptr;
  std::size_t capacity_ = 0;
  std::size_t used_ = 0;
  bool measuring_ = true;
};

}  // namespace gradcomp
