#pragma once
/// @file
/// Payload layout shared by the sparsifiers that send indices (top-k, threshold), and its
/// validation. Layout, after the envelope (whose `layout` byte holds the `index_coding`):
///
///     offset 0   u64  k, the number of kept elements (k ≤ n)
///     offset 8        index section: k × u32 (list32), k × u64 (list64) or ⌈n/8⌉ bitmap bytes,
///                     zero-padded to a multiple of 8 bytes
///     then            k values (float32 or float64), in ascending index order
///
/// Lists are strictly ascending; bit i of the bitmap (byte i/8, bit i%8) marks element i. The
/// encoder picks the smallest section (a list on ties); list64 is needed only above 2^32 elements.

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>

#include <gradcomp/core/error.hpp>
#include <gradcomp/core/float_bits.hpp>
#include <gradcomp/core/wire_envelope.hpp>

namespace gradcomp {

/// How a sparse payload names its elements; stored in the envelope's `layout` byte.
enum class index_coding : std::uint8_t {
  list32 = 1,  ///< Ascending u32 indices (n ≤ 2^32).
  list64 = 2,  ///< Ascending u64 indices.
  bitmap = 3,  ///< One bit per element.
};

namespace detail {
[[nodiscard]] constexpr std::uint64_t round_up8(std::uint64_t bytes) noexcept { return (bytes + 7) / 8 * 8; }
}  // namespace detail

/// Bytes of the index section (padding included) for `k` of `n` elements.
[[nodiscard]] constexpr std::uint64_t index_section_bytes(index_coding coding, std::uint64_t n,
                                                          std::uint64_t k) noexcept {
  switch (coding) {
    case index_coding::list32: return detail::round_up8(4 * k);
    case index_coding::list64: return 8 * k;
    case index_coding::bitmap: return detail::round_up8(n / 8 + (n % 8 != 0 ? 1 : 0));
  }
  return 0;
}

/// The smallest index coding for `k` of `n` elements (a list on ties).
[[nodiscard]] constexpr index_coding choose_index_coding(std::uint64_t n, std::uint64_t k) noexcept {
  const index_coding list = n <= (std::uint64_t{1} << 32) ? index_coding::list32 : index_coding::list64;
  return index_section_bytes(index_coding::bitmap, n, k) < index_section_bytes(list, n, k) ? index_coding::bitmap
                                                                                           : list;
}

/// Payload bytes of `k` kept elements of `n`, each value `value_size` bytes, in a given coding.
[[nodiscard]] constexpr std::uint64_t sparse_payload_bytes(index_coding coding, std::uint64_t n, std::uint64_t k,
                                                           std::size_t value_size) noexcept {
  return 8 + index_section_bytes(coding, n, k) + k * value_size;
}

/// Payload bytes of `k` kept elements of `n` in the coding the encoder chooses for them
/// (`choose_index_coding`): exactly what the encoders write for k of n.
[[nodiscard]] constexpr std::uint64_t chosen_sparse_payload_bytes(std::uint64_t n, std::uint64_t k,
                                                                  std::size_t value_size) noexcept {
  return sparse_payload_bytes(choose_index_coding(n, k), n, k, value_size);
}

/// Largest payload any k ≤ n produces with the encoder's choice of coding (it grows with k).
[[nodiscard]] constexpr std::uint64_t max_sparse_payload_bytes(std::uint64_t n, std::size_t value_size) noexcept {
  return chosen_sparse_payload_bytes(n, n, value_size);
}

/// The validated count field and index section at the start of a sparse payload: every index is
/// below n and strictly ascending, the counts agree and the padding is zero.
struct sparse_indices {
  index_coding coding{};               ///< How indices are stored.
  std::uint64_t elements = 0;          ///< n.
  std::uint64_t kept = 0;              ///< k.
  const std::byte* indices = nullptr;  ///< Start of the index section.

  /// Bytes of the count field and the index section (where what follows begins).
  [[nodiscard]] std::uint64_t bytes() const noexcept { return 8 + index_section_bytes(coding, elements, kept); }

  /// Calls `f(j, index)` for each kept element j in ascending index order.
  template <class F>
  void for_each(F&& f) const {
    switch (coding) {
      case index_coding::list32:
        for (std::uint64_t j = 0; j < kept; ++j) f(j, std::uint64_t{detail::load_le<std::uint32_t>(indices + 4 * j)});
        break;
      case index_coding::list64:
        for (std::uint64_t j = 0; j < kept; ++j) f(j, detail::load_le<std::uint64_t>(indices + 8 * j));
        break;
      case index_coding::bitmap: {
        std::uint64_t j = 0;
        const std::uint64_t bytes = elements / 8 + (elements % 8 != 0 ? 1 : 0);
        for (std::uint64_t base = 0; base < bytes; base += 8) {
          std::uint64_t word = 0;
          std::memcpy(&word, indices + base, 8);  // the section is padded to 8 bytes
          while (word != 0) {
            f(j++, base * 8 + static_cast<std::uint64_t>(std::countr_zero(word)));
            word &= word - 1;
          }
        }
        break;
      }
    }
  }
};

/// A validated sparse payload: its indices, and k finite values in ascending index order.
template <gradient_value T>
struct sparse_view {
  sparse_indices index;                ///< The kept positions.
  const std::byte* values = nullptr;   ///< Start of the k values.

  /// Value j (unaligned-safe).
  [[nodiscard]] T value(std::uint64_t j) const noexcept {
    T v;
    std::memcpy(&v, values + j * sizeof(T), sizeof v);
    return v;
  }

  /// Calls `f(index, value)` for each kept element in ascending index order.
  template <class F>
  void for_each(F&& f) const {
    index.for_each([&](std::uint64_t j, std::uint64_t i) { f(i, value(j)); });
  }
};

/// Checks the sizes of a sparse payload of `payload_bytes` bytes whose count field holds `k`
/// (envelope `e`), where each kept element needs at least `bytes_per_kept` more bytes after the
/// index section (0: no bound): a known coding, k ≤ n, and an index section that fits. Reads no
/// payload byte (every backend's decoder calls it before looking at the indices); the view's
/// `indices` is null. @throws error `malformed_payload` on any inconsistency.
[[nodiscard]] inline sparse_indices check_sparse_sizes(const envelope& e, std::uint64_t payload_bytes, std::uint64_t k,
                                                       std::uint64_t bytes_per_kept) {
  using detail::require;
  const auto coding = static_cast<index_coding>(e.layout);
  require(coding == index_coding::list32 || coding == index_coding::list64 || coding == index_coding::bitmap,
          errc::malformed_payload, [&] { return "unknown index coding " + std::to_string(e.layout); });
  require(payload_bytes >= 8, errc::malformed_payload, "sparse payload shorter than its count field");
  const std::uint64_t n = e.elements;
  require(k <= n, errc::malformed_payload,
          [&] { return "kept count " + std::to_string(k) + " exceeds n = " + std::to_string(n); });
  // Bound k and n by the bytes present before multiplying, so no size computation can overflow.
  const std::uint64_t room = payload_bytes - 8;
  require(coding == index_coding::bitmap ? n / 8 <= room : k <= room / 4, errc::malformed_payload,
          "index section does not fit the payload");
  require(bytes_per_kept == 0 || k <= room / bytes_per_kept, errc::malformed_payload,
          "kept count does not fit the payload");
  const sparse_indices view{coding, n, k, nullptr};
  require(view.bytes() <= payload_bytes, errc::malformed_payload, "index section does not fit the payload");
  return view;
}

/// Validates the count field and index section at the start of `payload` (envelope `e`), where
/// each kept element needs at least `bytes_per_kept` more bytes after the section (0: no bound). Checks sizes
/// before reading, so no byte outside `payload` is touched.
/// @throws error `malformed_payload` on any inconsistency.
[[nodiscard]] inline sparse_indices parse_sparse_indices(const envelope& e, std::span<const std::byte> payload,
                                                         std::uint64_t bytes_per_kept) {
  using detail::require;
  const std::uint64_t k = payload.size() >= 8 ? detail::load_le<std::uint64_t>(payload.data()) : 0;
  sparse_indices view = check_sparse_sizes(e, payload.size(), k, bytes_per_kept);
  view.indices = payload.data() + 8;
  const auto coding = view.coding;
  const std::uint64_t n = view.elements;

  const std::byte* const section_end = payload.data() + view.bytes();
  const std::byte* padding = nullptr;
  if (coding == index_coding::bitmap) {
    const std::uint64_t bytes = n / 8 + (n % 8 != 0 ? 1 : 0);
    std::uint64_t count = 0;
    for (std::uint64_t b = 0; b < bytes; ++b)
      count += static_cast<std::uint64_t>(std::popcount(std::to_integer<unsigned>(view.indices[b])));
    require(count == k, errc::malformed_payload,
            [&] { return "bitmap marks " + std::to_string(count) + " elements, k = " + std::to_string(k); });
    if (n % 8 != 0)
      require((std::to_integer<unsigned>(view.indices[bytes - 1]) >> (n % 8)) == 0, errc::malformed_payload,
              "bitmap marks elements beyond n");
    padding = view.indices + bytes;
  } else {
    const std::uint64_t width = coding == index_coding::list32 ? 4 : 8;
    std::uint64_t next_allowed = 0;
    for (std::uint64_t j = 0; j < k; ++j) {
      const std::uint64_t index = width == 4 ? detail::load_le<std::uint32_t>(view.indices + 4 * j)
                                             : detail::load_le<std::uint64_t>(view.indices + 8 * j);
      require(index >= next_allowed && index < n, errc::malformed_payload, [&] {
        return "index " + std::to_string(index) + " at position " + std::to_string(j) +
               " is out of range or not ascending";
      });
      next_allowed = index + 1;
    }
    padding = view.indices + width * k;
  }
  for (const std::byte* p = padding; p < section_end; ++p)
    require(*p == std::byte{0}, errc::malformed_payload, "non-zero padding in the index section");
  return view;
}

/// Validates the payload of a sparse message with envelope `e` (indices, then exactly k finite
/// values) and returns a view of it. @throws error `malformed_payload` on any inconsistency.
template <gradient_value T>
[[nodiscard]] sparse_view<T> parse_sparse_payload(const envelope& e, std::span<const std::byte> payload) {
  const sparse_indices index = parse_sparse_indices(e, payload, sizeof(T));
  detail::require(index.bytes() + index.kept * sizeof(T) == payload.size(), errc::malformed_payload, [&] {
    return "payload of " + std::to_string(payload.size()) + " bytes does not match k = " + std::to_string(index.kept);
  });
  const sparse_view<T> view{index, payload.data() + index.bytes()};
  for (std::uint64_t j = 0; j < index.kept; ++j)
    detail::require(is_finite(view.value(j)), errc::malformed_payload,
                    [&] { return "non-finite value at position " + std::to_string(j); });
  return view;
}

}  // namespace gradcomp
