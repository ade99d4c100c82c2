#pragma once
/// @file
/// Writing and decoding the index-carrying sparse payload (layout in sparsify/sparse_format.hpp)
/// on the CPU.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>

#include <gradcomp/core/crc32c.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/wire_envelope.hpp>
#include <gradcomp/cpu/detail/message.hpp>
#include <gradcomp/reference/sparse_message.hpp>
#include <gradcomp/sparsify/sparse_format.hpp>

namespace gradcomp::detail::cpu {

/// Appends (index, value) pairs in ascending index order to a sparse payload of one coding.
template <gradient_value T, index_coding Coding>
class sparse_sink {
 public:
  /// A sink writing the index section at `indices` and the values at `values`.
  sparse_sink(std::byte* indices, std::byte* values) noexcept : indices_(indices), values_(values) {}

  /// Appends one element; indices must ascend.
  void push(std::uint64_t index, T value) noexcept {
    if constexpr (Coding == index_coding::list32) {
      detail::store_le(indices_ + 4 * count_, static_cast<std::uint32_t>(index));
    } else if constexpr (Coding == index_coding::list64) {
      detail::store_le(indices_ + 8 * count_, index);
    } else {
      indices_[index / 8] |= static_cast<std::byte>(1u << (index % 8));
    }
    std::memcpy(values_ + count_ * sizeof(T), &value, sizeof value);
    ++count_;
  }

  /// Elements appended so far.
  [[nodiscard]] std::uint64_t count() const noexcept { return count_; }

 private:
  std::byte* indices_;
  std::byte* values_;
  std::uint64_t count_ = 0;
};

/// Writes a complete sparse message of `k` elements of an `n`-element tensor into `out`: the
/// envelope from `header` (its size fields and CRCs are filled in), then the payload, whose
/// elements `fill(sink)` pushes in ascending index order, exactly `k` of them. If `fill` throws,
/// `out` holds no valid message (its envelope bytes are zero).
/// @returns the message size in bytes.
/// @throws error `buffer_too_small` when `out` cannot hold the message.
template <gradient_value T, class Fill>
std::size_t write_sparse_message(envelope header, std::uint64_t k, bool payload_checksum, std::span<std::byte> out,
                                 Fill&& fill) {
  const std::uint64_t n = header.elements;
  const index_coding coding = choose_index_coding(n, k);
  const std::uint64_t payload = sparse_payload_bytes(coding, n, k, sizeof(T));
  begin_message(out, static_cast<std::size_t>(envelope::size + payload));
  std::byte* const body = out.data() + envelope::size;
  const std::uint64_t section = index_section_bytes(coding, n, k);
  detail::store_le(body, k);
  std::byte* const indices = body + 8;
  std::byte* const values = indices + section;
  // Zero the padding (and the whole bitmap, which is or-ed into).
  const std::uint64_t filled = coding == index_coding::bitmap ? 0 : (coding == index_coding::list32 ? 4 * k : 8 * k);
  std::memset(indices + filled, 0, section - filled);
  std::uint64_t written = 0;
  switch (coding) {
    case index_coding::list32: {
      sparse_sink<T, index_coding::list32> sink(indices, values);
      fill(sink);
      written = sink.count();
      break;
    }
    case index_coding::list64: {
      sparse_sink<T, index_coding::list64> sink(indices, values);
      fill(sink);
      written = sink.count();
      break;
    }
    case index_coding::bitmap: {
      sparse_sink<T, index_coding::bitmap> sink(indices, values);
      fill(sink);
      written = sink.count();
      break;
    }
  }
  detail::require(written == k, errc::invalid_argument, "sparse writer received a different count than announced");
  header.layout = static_cast<std::uint8_t>(coding);
  header.payload_bytes = payload;
  seal_message(out, header, payload_checksum);
  return static_cast<std::size_t>(envelope::size + payload);
}

/// Decodes a sparse message into `dense` (overwriting, or adding when `accumulate`), validated
/// first: the reference's decoder (reference/sparse_message.hpp), a scatter with nothing to
/// vectorise.
using detail::reference::decode_sparse_message;

}  // namespace gradcomp::detail::cpu
