#pragma once
/// @file
/// Checking a kernel of your own against the reference (docs/design.md §3.2): `compare_encoding`
/// encodes an input with `reference_executor` and compares the bytes your kernel wrote for the same
/// codec, input and `message_key`; where they differ, it names the first differing byte, the field
/// of the message it belongs to (an envelope field, a scale, a code, an index, a value) and the
/// elements of the tensor that field concerns, as docs/wire-format.md lays the message out.
/// `compare_decoding` does the same for a decoded tensor: the first element whose bits differ
/// from the reference's decode of the same message.
///
/// Fields are named for the codecs that have a reference backend and the plain `encode`
/// interface: the uniform quantizer, QSGD, sign, top-k, random-k, threshold, the count sketch, the
/// pipeline, MPC and ZFP fixed rate.

#include <algorithm>
#include <bit>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <iomanip>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include <gradcomp/core/concepts.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/reference_executor.hpp>
#include <gradcomp/core/wire_envelope.hpp>
#include <gradcomp/lossless/mpc.hpp>
#include <gradcomp/lossless/zfp_fixed_rate.hpp>
#include <gradcomp/pipeline.hpp>
#include <gradcomp/quantize/qsgd.hpp>
#include <gradcomp/sketch/count_sketch.hpp>
#include <gradcomp/quantize/sign.hpp>
#include <gradcomp/quantize/uniform.hpp>
#include <gradcomp/reference/count_sketch.hpp>
#include <gradcomp/reference/mpc.hpp>
#include <gradcomp/reference/pipeline.hpp>
#include <gradcomp/reference/qsgd.hpp>
#include <gradcomp/reference/randomk.hpp>
#include <gradcomp/reference/sign.hpp>
#include <gradcomp/reference/threshold.hpp>
#include <gradcomp/reference/topk.hpp>
#include <gradcomp/reference/uniform.hpp>
#include <gradcomp/reference/zfp_fixed_rate.hpp>
#include <gradcomp/sparsify/randomk.hpp>
#include <gradcomp/sparsify/sparse_format.hpp>
#include <gradcomp/sparsify/threshold.hpp>
#include <gradcomp/sparsify/topk.hpp>

namespace gradcomp {

/// A field of a message: where its bytes lie and which elements of the dense tensor it concerns.
struct message_field {
  std::string name;                 ///< What the bytes hold, e.g. "envelope params_hash", "scale of block 3".
  std::size_t first_byte = 0;       ///< Its first byte, from the start of the message.
  std::size_t bytes = 0;            ///< Its size in bytes.
  std::uint64_t first_element = 0;  ///< The first element of the tensor it concerns.
  std::uint64_t elements = 0;       ///< How many elements it concerns (0: none, as for the envelope).
};

/// How bytes compare with the reference's encoding of the same input (`compare_encoding`).
struct encoding_comparison {
  bool same = false;                 ///< The bytes equal the reference's, length included.
  std::string reference_error;  ///< The reference's error when it rejects the input (then nothing was compared).
  std::size_t reference_bytes = 0;  ///< Size of the reference's message.
  std::size_t given_bytes = 0;  ///< Size of the bytes compared.
  std::size_t first_difference = 0;  ///< Offset of the first differing byte (the shorter size when one is a prefix).
  std::optional<std::uint8_t> reference_byte;  ///< The reference's byte there (none past its end).
  std::optional<std::uint8_t> given_byte;  ///< The given byte there (none past its end).
  message_field field;  ///< The field of the reference's message holding the first difference.

  /// One line for a log: "same as the reference", the reference's error, or where they differ.
  [[nodiscard]] std::string describe() const {
    if (!reference_error.empty()) return "the reference rejects this input: " + reference_error;
    if (same) return "same as the reference (" + std::to_string(reference_bytes) + " bytes)";
    std::ostringstream s;
    s << "first difference at byte " << first_difference << " (reference " << byte_text(reference_byte) << ", given "
      << byte_text(given_byte) << "), in " << field.name << " (bytes " << field.first_byte << ".."
      << field.first_byte + field.bytes - (field.bytes > 0 ? 1 : 0) << ")";
    if (field.elements > 0) {
      s << ", element" << (field.elements > 1 ? "s " : " ") << field.first_element;
      if (field.elements > 1) s << ".." << field.first_element + field.elements - 1;
    }
    if (reference_bytes != given_bytes)
      s << "; sizes differ: reference " << reference_bytes << " bytes, given " << given_bytes;
    return s.str();
  }

 private:
  static std::string byte_text(const std::optional<std::uint8_t>& b) {
    if (!b) return "none";
    std::ostringstream s;
    s << "0x" << std::hex << std::setw(2) << std::setfill('0') << static_cast<unsigned>(*b);
    return s.str();
  }
};

/// How a decoded tensor compares with the reference's decode of the same message (`compare_decoding`).
template <gradient_value T>
struct decoding_comparison {
  bool same = false;  ///< Every element has the reference's bits (sizes equal).
  std::string reference_error;  ///< The reference's error when it rejects the message.
  std::uint64_t first_difference = 0;  ///< The first element whose bits differ.
  T reference_value{};  ///< The reference's value there.
  T given_value{};  ///< The given value there.
  std::uint64_t differing = 0;  ///< How many elements differ.

  /// One line for a log.
  [[nodiscard]] std::string describe() const {
    if (!reference_error.empty()) return "the reference rejects this message: " + reference_error;
    if (same) return "same bits as the reference";
    std::ostringstream s;
    s << std::setprecision(9) << differing << " element(s) differ, the first is element " << first_difference
      << " (reference " << reference_value << ", given " << given_value << ")";
    return s.str();
  }
};

namespace detail::comparison {

/// The envelope field holding byte `offset` < envelope::size (docs/wire-format.md §1).
[[nodiscard]] inline message_field envelope_field(std::size_t offset) {
  struct entry {
    std::size_t first, bytes;
    const char* name;
  };
  static constexpr entry fields[] = {{0, 4, "magic"},        {4, 2, "version"},   {6, 2, "codec"},
                                     {8, 1, "dtype"},        {9, 1, "layout"},    {10, 2, "flags"},
                                     {12, 4, "tensor_id"},   {16, 8, "elements"}, {24, 8, "payload_bytes"},
                                     {32, 8, "params_hash"}, {40, 8, "step"},     {48, 4, "payload_crc"},
                                     {52, 4, "header_crc"}};
  for (const entry& f : fields)
    if (offset < f.first + f.bytes) return {std::string("envelope ") + f.name, f.first, f.bytes, 0, 0};
  return {"envelope", 0, envelope::size, 0, 0};
}

/// A field of bytes after the payload's end.
[[nodiscard]] inline message_field past_the_end(std::size_t message_bytes, std::size_t offset) {
  return {"bytes after the end of the reference's message", message_bytes, offset + 1 - message_bytes, 0, 0};
}

/// Value `j` of an array of `count` values of `size` bytes starting at payload offset `start`:
/// "<what> j", concerning elements [j·per, min(n, (j + 1)·per)).
[[nodiscard]] inline message_field per_block(const char* what, std::uint64_t j, std::size_t start, std::size_t size,
                                             std::uint64_t per, std::uint64_t n) {
  const std::uint64_t first = j * per;
  return {std::string(what) + " " + std::to_string(j), envelope::size + start + j * size, size, first,
          std::min(n, first + per) - first};
}

/// Byte `b` of a section of `bits`-bit codes (element i at bit i·bits) starting at payload offset
/// `start`: the codes whose bits lie in that byte.
[[nodiscard]] inline message_field packed_codes(const char* what, std::uint64_t b, std::size_t start, int bits,
                                                std::uint64_t n) {
  const auto w = static_cast<std::uint64_t>(bits);
  const std::uint64_t first = b * 8 / w;
  if (first >= n) return {"padding bits after the last code", envelope::size + start + b, 1, 0, 0};
  const std::uint64_t last = std::min(n - 1, (b * 8 + 7) / w);
  return {std::string(what) + (last > first ? "s" : ""), envelope::size + start + b, 1, first, last - first + 1};
}

/// A block-scaled payload: `blocks` scales of `T` (block j covers `per` elements), then `bits`-bit
/// codes (docs/wire-format.md §9, §10, §11).
template <gradient_value T>
[[nodiscard]] message_field scales_then_codes(std::size_t p, std::uint64_t n, std::uint64_t blocks, std::uint64_t per,
                                              const char* scale, const char* code, int bits) {
  const std::size_t scale_bytes = static_cast<std::size_t>(blocks) * sizeof(T);
  if (p < scale_bytes) return per_block(scale, p / sizeof(T), 0, sizeof(T), per, n);
  return packed_codes(code, p - scale_bytes, scale_bytes, bits, n);
}

template <gradient_value T>
[[nodiscard]] message_field payload_field(const uniform_quantizer<T>& c, std::span<const std::byte>, const envelope& e,
                                          std::size_t p) {
  return scales_then_codes<T>(p, e.elements, c.block_count(e.elements), c.params().block, "scale of block",
                              "code of element", c.bits());
}

template <gradient_value T>
[[nodiscard]] message_field payload_field(const sign_quantizer<T>& c, std::span<const std::byte>, const envelope& e,
                                          std::size_t p) {
  return scales_then_codes<T>(p, e.elements, c.block_count(e.elements), c.params().block, "scale of block",
                              "sign bit of element", 1);
}

template <gradient_value T>
[[nodiscard]] message_field payload_field(const qsgd_quantizer<T>& c, std::span<const std::byte>, const envelope& e,
                                          std::size_t p) {
  return scales_then_codes<T>(p, e.elements, c.bucket_count(e.elements), c.params().bucket, "norm of bucket",
                              "code of element", c.bits());
}

/// Random-k (docs/wire-format.md §5): value j is element π(j) of the keyed permutation.
template <gradient_value T>
[[nodiscard]] message_field payload_field(const randomk_sparsifier<T>& c, std::span<const std::byte>, const envelope& e,
                                          std::size_t p) {
  const std::uint64_t j = p / sizeof(T);
  return {"value " + std::to_string(j), envelope::size + j * sizeof(T), sizeof(T), c.permutation(e.elements, e.key)(j),
          1};
}

/// The element of the tensor that kept value j of `index` is.
[[nodiscard]] inline std::uint64_t kept_element(const sparse_indices& index, std::uint64_t wanted) {
  std::uint64_t element = 0;
  index.for_each([&](std::uint64_t j, std::uint64_t i) {
    if (j == wanted) element = i;
  });
  return element;
}

/// Payload byte p < index.bytes() of a sparse message or a pipeline (docs/wire-format.md §4.1,
/// §12.1): the count, then the index section in the coding the reference chose.
[[nodiscard]] inline message_field index_field(const sparse_indices& index, std::uint64_t n, std::size_t p) {
  if (p < 8) return {"count k", envelope::size, 8, 0, 0};
  const std::size_t q = p - 8;
  if (index.coding == index_coding::bitmap) {
    if (q * 8 >= n) return {"index section padding", envelope::size + p, 1, 0, 0};
    return {"bitmap byte " + std::to_string(q), envelope::size + p, 1, q * 8, std::min<std::uint64_t>(8, n - q * 8)};
  }
  const std::size_t width = index.coding == index_coding::list32 ? 4 : 8;
  const std::uint64_t j = q / width;
  if (j >= index.kept) return {"index section padding", envelope::size + p, 1, 0, 0};
  return {"index of kept value " + std::to_string(j), envelope::size + 8 + j * width, width, kept_element(index, j), 1};
}

/// Top-k and threshold (docs/wire-format.md §4.1): the count and index section, then the values;
/// indices and values name the element they keep.
template <gradient_value T>
[[nodiscard]] message_field sparse_field(std::span<const std::byte> message, const envelope& e, std::size_t p) {
  const sparse_indices index = parse_sparse_payload<T>(e, message.subspan(envelope::size)).index;
  const auto head = static_cast<std::size_t>(index.bytes());
  if (p < head) return index_field(index, e.elements, p);
  const std::uint64_t j = (p - head) / sizeof(T);
  return {"kept value " + std::to_string(j), envelope::size + head + j * sizeof(T), sizeof(T), kept_element(index, j),
          1};
}

template <gradient_value T>
[[nodiscard]] message_field payload_field(const topk_sparsifier<T>&, std::span<const std::byte> message,
                                          const envelope& e, std::size_t p) {
  return sparse_field<T>(message, e, p);
}

template <gradient_value T>
[[nodiscard]] message_field payload_field(const threshold_sparsifier<T>&, std::span<const std::byte> message,
                                          const envelope& e, std::size_t p) {
  return sparse_field<T>(message, e, p);
}

/// Count sketch (docs/wire-format.md §16.1): cell b of row j at payload offset (j·c + b)·v. The
/// elements hashed into a cell are scattered over the tensor, so the field names none.
template <gradient_value T>
[[nodiscard]] message_field payload_field(const count_sketch<T>& c, std::span<const std::byte>, const envelope&,
                                          std::size_t p) {
  constexpr std::size_t v = sizeof(compute_type<T>);
  const std::uint64_t cell = p / v;
  return {"cell " + std::to_string(cell % c.columns()) + " of row " + std::to_string(cell / c.columns()),
          envelope::size + cell * v, v, 0, 0};
}

/// MPC (docs/wire-format.md §17): bitmap g covers the 32 elements of group g; kept word k belongs
/// to the group whose bitmap marks it (the transforms spread each word over its whole group).
template <gradient_value T>
[[nodiscard]] message_field payload_field(const mpc_codec<T>&, std::span<const std::byte> message, const envelope& e,
                                          std::size_t p) {
  const std::uint64_t n = e.elements, groups = mpc_codec<T>::group_count(n);
  const std::uint64_t word = p / 4;
  const auto group_elements = [&](std::uint64_t g) { return std::min<std::uint64_t>(32, n - 32 * g); };
  if (word < groups)
    return {"bitmap of group " + std::to_string(word), envelope::size + 4 * word, 4, 32 * word, group_elements(word)};
  std::uint64_t k = word - groups;
  for (std::uint64_t g = 0; g < groups; ++g) {
    std::uint32_t bitmap;
    std::memcpy(&bitmap, message.data() + envelope::size + 4 * g, 4);
    const auto marked = static_cast<std::uint64_t>(std::popcount(bitmap));
    if (k < marked)
      return {"kept word " + std::to_string(k) + " of group " + std::to_string(g), envelope::size + 4 * word, 4, 32 * g,
              group_elements(g)};
    k -= marked;
  }
  return {"payload", envelope::size + p, 1, 0, 0};
}

/// ZFP fixed rate (docs/wire-format.md §18): block b of four elements takes stream bits
/// [b·4R, (b + 1)·4R); a byte names the blocks whose bits it holds.
template <gradient_value T>
[[nodiscard]] message_field payload_field(const zfp_fixed_rate_codec<T>& c, std::span<const std::byte>,
                                          const envelope& e, std::size_t p) {
  const std::uint64_t bits = c.block_bits(), blocks = zfp_fixed_rate_codec<T>::block_count(e.elements);
  const std::uint64_t first = p * 8 / bits;
  if (first >= blocks) return {"padding bits after the last block", envelope::size + p, 1, 0, 0};
  const std::uint64_t last = std::min(blocks - 1, (p * 8 + 7) / bits);
  const std::uint64_t begin = 4 * first, end = std::min(e.elements, 4 * (last + 1));
  return {std::string("stream bits of block") + (last > first ? "s " : " ") + std::to_string(first) +
              (last > first ? ".." + std::to_string(last) : ""),
          envelope::size + p, 1, begin, end - begin};
}

/// A pipeline (docs/wire-format.md §12.1): the sparsifier's count and index section, then the
/// quantizer's complete message of the k kept values, whose fields are named as the quantizer's
/// with "kept values" for elements: its element j is kept value j, element `kept_element(j)`.
template <class S, class Q>
[[nodiscard]] message_field payload_field(const pipeline<S, Q>& c, std::span<const std::byte> message,
                                          const envelope& e, std::size_t p);

/// The field of the reference's `message` holding byte `offset`.
template <class Codec>
[[nodiscard]] message_field field_at(const Codec& codec, std::span<const std::byte> message, std::size_t offset) {
  if (offset >= message.size()) return past_the_end(message.size(), offset);
  if (offset < envelope::size) return envelope_field(offset);
  return payload_field(codec, message, parse_envelope(message), offset - envelope::size);
}

template <class S, class Q>
[[nodiscard]] message_field payload_field(const pipeline<S, Q>& c, std::span<const std::byte> message,
                                          const envelope& e, std::size_t p) {
  const std::span<const std::byte> payload = message.subspan(envelope::size);
  const sparse_indices index = parse_sparse_indices(e, payload, 0);
  const auto head = static_cast<std::size_t>(index.bytes());
  if (p < head) return index_field(index, e.elements, p);
  const std::span<const std::byte> nested = payload.subspan(head);
  message_field f = field_at(c.quantize_stage(), nested, p - head);
  f.name = "nested " + f.name;
  f.first_byte += envelope::size + head;
  if (f.elements > 0) {
    f.name += " (kept value" + std::string(f.elements > 1 ? "s " : " ") + std::to_string(f.first_element) +
              (f.elements > 1 ? ".." + std::to_string(f.first_element + f.elements - 1) : "") + ")";
    f.first_element = kept_element(index, f.first_element);
    f.elements = 1;  // the first of them; kept values lie anywhere in the tensor
  }
  return f;
}

}  // namespace detail::comparison

/// A codec whose messages `compare_encoding` can lay out field by field: it runs on the reference
/// executor and its payload layout is described in this file.
template <class Codec>
concept comparable_with_reference =
    codec_for<Codec, reference_executor> &&
    requires(const Codec& c, std::span<const std::byte> m, const envelope& e, std::size_t p) {
      { detail::comparison::payload_field(c, m, e, p) } -> std::same_as<message_field>;
    };

/// Encodes `input` with the reference backend of `codec` under `key`, and compares `given`, the
/// message your own kernel wrote for the same codec (same parameters), input and key, copied to
/// the host. Never throws for a mismatch: a difference, and an input the reference rejects, are
/// reported in the result (`describe()` prints it).
/// @throws error `invalid_argument` only when `input` is too large to encode on the host.
template <comparable_with_reference Codec>
[[nodiscard]] encoding_comparison compare_encoding(const Codec& codec,
                                                   std::span<const typename Codec::value_type> input, message_key key,
                                                   std::span<const std::byte> given) {
  const reference_executor ref;
  encoding_comparison result;
  result.given_bytes = given.size();
  std::vector<std::byte> expected(codec.max_encoded_bytes(input.size()));
  std::vector<std::byte> workspace(codec.workspace_bytes(ref, input.size()));
  try {
    expected.resize(codec.encode(ref, input, expected, workspace, key));
  } catch (const error& e) {
    result.reference_error = e.what();
    return result;
  }
  result.reference_bytes = expected.size();
  const auto at = std::mismatch(expected.begin(), expected.end(), given.begin(), given.end()).first;
  result.first_difference = static_cast<std::size_t>(at - expected.begin());
  result.same = expected.size() == given.size() && result.first_difference == expected.size();
  if (result.same) return result;
  const std::size_t d = result.first_difference;
  if (d < expected.size()) result.reference_byte = static_cast<std::uint8_t>(expected[d]);
  if (d < given.size()) result.given_byte = static_cast<std::uint8_t>(given[d]);
  result.field = detail::comparison::field_at(codec, std::span<const std::byte>(expected), d);
  return result;
}

/// Decodes `message` with the reference backend of `codec` and compares the bits of `given`, the
/// tensor your own decoder produced from it (on the host). Never throws for a mismatch.
template <class Codec>
  requires codec_for<Codec, reference_executor>
[[nodiscard]] decoding_comparison<typename Codec::value_type> compare_decoding(
    const Codec& codec, std::span<const std::byte> message, std::span<const typename Codec::value_type> given) {
  using T = typename Codec::value_type;
  const reference_executor ref;
  decoding_comparison<T> result;
  std::vector<T> expected(given.size());
  std::vector<std::byte> workspace(codec.workspace_bytes(ref, given.size()));
  try {
    codec.decode(ref, message, std::span<T>(expected), workspace);
  } catch (const error& e) {
    result.reference_error = e.what();
    return result;
  }
  for (std::uint64_t i = 0; i < expected.size(); ++i) {
    if (std::memcmp(&expected[i], &given[i], sizeof(T)) == 0) continue;
    if (result.differing++ == 0) {
      result.first_difference = i;
      result.reference_value = expected[i];
      result.given_value = given[i];
    }
  }
  result.same = result.differing == 0;
  return result;
}

}  // namespace gradcomp
