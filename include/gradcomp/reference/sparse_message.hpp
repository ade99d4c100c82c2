#pragma once
/// @file
/// The sparse message of top-k and threshold (docs/wire-format.md §4), written and decoded to be
/// read: the count, the index section in the coding of docs/wire-format.md §4.2, then the values.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>

#include <gradcomp/core/error.hpp>
#include <gradcomp/core/float_bits.hpp>
#include <gradcomp/core/narrowing.hpp>
#include <gradcomp/core/wire_envelope.hpp>
#include <gradcomp/reference/values.hpp>
#include <gradcomp/sparsify/sparse_format.hpp>

namespace gradcomp::detail::reference {

/// Writes the sparse message of the `k` kept elements of `grad` into `out` and returns its size.
/// `for_each_kept(visit)` calls `visit(i)` for each kept index i in ascending order, exactly k
/// times; it is called once per section. `header` gives the envelope's codec, dtype, key and
/// parameter hash. @throws error `buffer_too_small`.
template <gradient_value T, class ForEachKept>
std::size_t write_sparse_message(envelope header, std::uint64_t k, bool payload_checksum, std::span<const T> grad,
                                 std::span<std::byte> out, ForEachKept&& for_each_kept) {
  const std::uint64_t n = grad.size();
  // docs/wire-format.md §4.2: the smallest index section, a list on ties.
  const index_coding coding = choose_index_coding(n, k);
  const std::uint64_t section = index_section_bytes(coding, n, k);
  const std::uint64_t payload = sparse_payload_bytes(coding, n, k, sizeof(T));
  begin_host_message(out, static_cast<std::size_t>(envelope::size + payload));
  std::byte* const count = out.data() + envelope::size;
  std::byte* const indices = count + 8;
  std::byte* const values = indices + section;

  // docs/wire-format.md §4.1: the count k.
  store_le(count, k);
  // docs/wire-format.md §4.1: the index section, zero-padded: ascending u32 or u64 indices, or one bit per element.
  std::memset(indices, 0, static_cast<std::size_t>(section));
  std::uint64_t j = 0;
  for_each_kept([&](std::uint64_t i) {
    if (coding == index_coding::list32) store_le(indices + 4 * j, static_cast<std::uint32_t>(i));
    if (coding == index_coding::list64) store_le(indices + 8 * j, i);
    if (coding == index_coding::bitmap) indices[i / 8] |= static_cast<std::byte>(1u << (i % 8));
    ++j;
  });
  // docs/wire-format.md §4.1: the k values, in ascending index order, the gradient's own bits.
  j = 0;
  for_each_kept([&](std::uint64_t i) { store_value(values, j++, grad[i]); });
  require(j == k, errc::invalid_argument, "sparse writer received a different count than announced");

  header.layout = static_cast<std::uint8_t>(coding);
  header.elements = n;
  header.payload_bytes = payload;
  seal_host_message(out, header, payload_checksum);
  return static_cast<std::size_t>(envelope::size + payload);
}

/// Decodes a sparse message of T values (docs/wire-format.md §4.3 validation first, so `dense` is
/// untouched on error) into `dense` of O values (T, or float32 for a 16-bit T): zeros, then each
/// kept value written, or each added when `accumulate`. A 16-bit value reaches a float32 output
/// widened exactly; a sum into a 16-bit output is taken in float32 and rounded once, after every
/// sum has been checked to fit (docs/half-precision.md §3; `narrowing_overflow` otherwise).
template <gradient_value T, gradient_value O = T>
void decode_sparse_message(std::span<const std::byte> message, const envelope_expectation& want,
                           const decode_limits& limits, std::span<O> dense, bool accumulate) {
  const envelope e = parse_envelope(message);
  validate_envelope(e, want, limits);
  const sparse_view<T> view = parse_sparse_payload<T>(e, payload_of(message));
  if constexpr (half_precision<T>) {
    if (accumulate && half_precision<O>) {
      view.for_each([&](std::uint64_t i, T v) { require_narrows<O>(i, widen(dense[i]) + widen(v)); });
    }
    if (!accumulate)
      for (O& v : dense) v = O{};
    view.for_each([&](std::uint64_t i, T v) {
      if constexpr (half_precision<O>) dense[i] = accumulate ? narrow<O>(widen(dense[i]) + widen(v)) : v;
      else
        dense[i] = accumulate ? dense[i] + widen(v) : widen(v);
    });
  } else {
    if (!accumulate)
      for (T& v : dense) v = T{0};
    view.for_each([&](std::uint64_t i, T v) { dense[i] = accumulate ? dense[i] + v : v; });
  }
}

}  // namespace gradcomp::detail::reference
