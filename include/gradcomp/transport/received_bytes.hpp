#pragma once
/// @file
/// `received_bytes`: the buffers a variable-size byte collective (`all_gather_bytes`,
/// `all_to_all_bytes`) of a device transport delivers, read without copying: one block in the
/// transport's memory and, on the host, where each buffer lies in it. Each buffer starts on an
/// 8-byte boundary of the block, so that a codec message in it can be decoded on the device
/// (docs/cuda.md §1). The view is valid until the transport's next call.
///
/// Host transports may return `std::vector<std::vector<std::byte>>` instead: both model
/// `received_buffers` (`r.size()` buffers, `r[p]` convertible to `std::span<const std::byte>`), the
/// one accessor the collectives read them through.

#include <concepts>
#include <cstddef>
#include <span>
#include <vector>

namespace gradcomp {

/// What a variable-size byte collective returns: `r.size()` buffers in rank order, `r[p]` the
/// bytes of buffer p (in the transport's memory).
template <class R>
concept received_buffers = requires(const R& r, std::size_t p) {
  { r.size() } -> std::convertible_to<std::size_t>;
  std::span<const std::byte>(r[p]);
};

/// Buffers received into one block of a transport's memory; valid until its next call.
struct received_bytes {
  std::span<const std::byte> block;        ///< The transport's memory holding every buffer.
  std::span<const std::size_t> offsets;    ///< Host: where buffer p starts in `block` (a multiple of 8).
  std::span<const std::size_t> sizes;      ///< Host: bytes of buffer p.

  /// Number of buffers.
  [[nodiscard]] std::size_t size() const noexcept { return sizes.size(); }
  /// Buffer p.
  [[nodiscard]] std::span<const std::byte> operator[](std::size_t p) const noexcept {
    return block.subspan(offsets[p], sizes[p]);
  }
};

static_assert(received_buffers<received_bytes>);
static_assert(received_buffers<std::vector<std::vector<std::byte>>>);

namespace detail {

/// Where buffers of given sizes lie in one block, each starting on an 8-byte boundary: the layout
/// of a `received_bytes`, kept by a transport and reused across calls (grow-only vectors).
class received_layout {
 public:
  /// Alignment of every buffer's start.
  static constexpr std::size_t alignment = 8;

  /// Lays out buffers of `sizes[p]` bytes (any unsigned count type), in order.
  template <class Count>
  void assign(std::span<const Count> sizes) {
    sizes_.assign(sizes.begin(), sizes.end());
    offsets_.resize(sizes_.size());
    total_ = 0;
    for (std::size_t p = 0; p < sizes_.size(); ++p) {
      offsets_[p] = total_;
      total_ += (sizes_[p] + alignment - 1) / alignment * alignment;
    }
  }

  /// Bytes of the block.
  [[nodiscard]] std::size_t total() const noexcept { return total_; }
  /// Where buffer p starts.
  [[nodiscard]] std::size_t offset(std::size_t p) const noexcept { return offsets_[p]; }
  /// Bytes of buffer p.
  [[nodiscard]] std::size_t size(std::size_t p) const noexcept { return sizes_[p]; }
  /// Number of buffers.
  [[nodiscard]] std::size_t count() const noexcept { return sizes_.size(); }
  /// The view of `block` (at least `total()` bytes) with this layout.
  [[nodiscard]] received_bytes view(std::span<const std::byte> block) const noexcept {
    return {block.first(total_), offsets_, sizes_};
  }

 private:
  std::vector<std::size_t> sizes_;
  std::vector<std::size_t> offsets_;
  std::size_t total_ = 0;
};

}  // namespace detail
}  // namespace gradcomp
