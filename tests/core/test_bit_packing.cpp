// Packing of 1-, 2-, 4- and 8-bit codes: the documented bit layout (code j at bit j*b of the
// stream, least significant first), round trips, sizes, and the errors of bad arguments.

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <gradcomp/core/bit_packing.hpp>
#include <gradcomp/core/error.hpp>

#include "support/errors.hpp"

namespace {

using gradcomp::test::named;
using gradcomp::test::thrown_by;

using gradcomp::errc;


// Bit-at-a-time packer following the header's layout description: bit t of code j is bit
// (j*b + t) of the byte stream, bit k of the stream being bit k%8 of byte k/8.
std::vector<std::uint8_t> reference_pack(const std::vector<std::uint8_t>& codes, int bits) {
  const std::size_t width = static_cast<std::size_t>(bits);
  std::vector<std::uint8_t> out((codes.size() * width + 7) / 8, 0);
  for (std::size_t j = 0; j < codes.size(); ++j)
    for (std::size_t t = 0; t < width; ++t)
      if (((static_cast<unsigned>(codes[j]) >> t) & 1u) != 0) {
        const std::size_t k = j * width + t;
        out[k / 8] = static_cast<std::uint8_t>(out[k / 8] | (1u << (k % 8)));
      }
  return out;
}

std::vector<std::uint8_t> random_codes(std::mt19937& rng, std::size_t count, int bits) {
  std::vector<std::uint8_t> codes(count);
  for (std::uint8_t& c : codes) c = static_cast<std::uint8_t>(rng() & ((1u << bits) - 1u));
  return codes;
}

constexpr std::uint8_t example_2bit[] = {0x39, 0x01};  // codes {1, 2, 3, 0, 1}
static_assert(gradcomp::packed_code(example_2bit, 0, 2) == 1 && gradcomp::packed_code(example_2bit, 2, 2) == 3 &&
              gradcomp::packed_code(example_2bit, 4, 2) == 1);
static_assert(gradcomp::packed_bytes(9, 1) == 2);

}  // namespace

TEST_CASE("is_packable_width accepts exactly 1, 2, 4 and 8 bits") {
  for (int bits = -2; bits <= 17; ++bits) {
    CAPTURE(bits);
    CHECK(gradcomp::is_packable_width(bits) == (bits == 1 || bits == 2 || bits == 4 || bits == 8));
  }
}

TEST_CASE("packed_bytes is the number of bytes the codes' bits round up to") {
  using gradcomp::packed_bytes;
  CHECK(packed_bytes(0, 1) == 0);
  CHECK(packed_bytes(0, 8) == 0);
  CHECK(packed_bytes(1, 1) == 1);
  CHECK(packed_bytes(8, 1) == 1);
  CHECK(packed_bytes(9, 1) == 2);
  CHECK(packed_bytes(4, 2) == 1);
  CHECK(packed_bytes(5, 2) == 2);
  CHECK(packed_bytes(1, 4) == 1);
  CHECK(packed_bytes(3, 4) == 2);
  CHECK(packed_bytes(7, 8) == 7);
  CHECK(packed_bytes(1000, 2) == 250);
  CHECK(packed_bytes(1001, 2) == 251);
  CHECK(packed_bytes(std::uint64_t{1} << 40, 4) == std::uint64_t{1} << 39);
}

TEST_CASE("pack_codes lays codes out least significant first, as in hand-computed examples") {
  struct example {
    int bits;
    std::vector<std::uint8_t> codes;
    std::vector<std::uint8_t> bytes;
  };
  const example examples[] = {
      {2, {1, 2, 3, 0, 1}, {0x39, 0x01}},
      {1, {1, 0, 1, 1, 0, 0, 0, 1, 1}, {0x8D, 0x01}},
      {1, {0, 0, 0, 0, 0, 0, 0, 1}, {0x80}},
      {4, {0xA, 0x3, 0xF}, {0x3A, 0x0F}},
      {4, {0x0, 0x1}, {0x10}},
      {2, {3, 3, 3, 3, 2}, {0xFF, 0x02}},
      {8, {0x00, 0xFF, 0x7E}, {0x00, 0xFF, 0x7E}},
  };
  for (const example& ex : examples) {
    CAPTURE(ex.bits);
    std::vector<std::uint8_t> packed(ex.bytes.size(), 0xAA);
    gradcomp::pack_codes(ex.codes, ex.bits, packed);
    CHECK(packed == ex.bytes);
    std::vector<std::uint8_t> codes(ex.codes.size(), 0xEE);
    gradcomp::unpack_codes(ex.bytes, ex.bits, codes);
    CHECK(codes == ex.codes);
  }
}

TEST_CASE("pack_codes then unpack_codes returns the codes for every width and many lengths") {
  std::mt19937 rng(1234u);
  const std::size_t lengths[] = {0, 1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 33, 63, 64, 65, 1000, 1001, 4099};
  for (const int bits : {1, 2, 4, 8}) {
    for (const std::size_t n : lengths) {
      CAPTURE(bits);
      CAPTURE(n);
      const std::vector<std::uint8_t> codes = random_codes(rng, n, bits);
      const std::vector<std::uint8_t> expected = reference_pack(codes, bits);
      REQUIRE(expected.size() == gradcomp::packed_bytes(n, bits));
      // Pre-filled with ones, so stale bits would show; one spare byte must stay untouched.
      std::vector<std::uint8_t> packed(expected.size() + 1, 0xFF);
      gradcomp::pack_codes(codes, bits, packed);
      CHECK(std::vector<std::uint8_t>(packed.begin(), packed.end() - 1) == expected);
      CHECK(packed.back() == 0xFF);
      std::vector<std::uint8_t> decoded(n, 0xEE);
      gradcomp::unpack_codes(std::span<const std::uint8_t>(packed).first(expected.size()), bits, decoded);
      CHECK(decoded == codes);
      for (std::size_t j = 0; j < n; j += 1 + n / 17) CHECK(gradcomp::packed_code(packed.data(), j, bits) == codes[j]);
    }
  }
}

TEST_CASE("pack_codes leaves the unused high bits of the last byte zero") {
  // Codes of all ones, so any bit beyond the last code that is set was not cleared.
  for (const int bits : {1, 2, 4}) {
    const int per_byte = 8 / bits;
    for (int count = 1; count < per_byte; ++count) {
      CAPTURE(bits);
      CAPTURE(count);
      const std::vector<std::uint8_t> codes(static_cast<std::size_t>(count),
                                            static_cast<std::uint8_t>((1u << bits) - 1u));
      std::vector<std::uint8_t> packed(1, 0xFF);
      gradcomp::pack_codes(codes, bits, packed);
      CHECK(packed[0] == static_cast<std::uint8_t>((1u << (count * bits)) - 1u));
    }
  }
}

TEST_CASE("pack_codes rejects widths other than 1, 2, 4, 8 with invalid_argument") {
  const std::vector<std::uint8_t> codes = {1, 0, 1};
  std::vector<std::uint8_t> packed(8, 0);
  for (const int bits : {0, 3, 5, 7, 16, -1}) {
    CAPTURE(bits);
    CHECK(thrown_by([&] { gradcomp::pack_codes(codes, bits, packed); }) == named(errc::invalid_argument));
    std::vector<std::uint8_t> out(3);
    CHECK(thrown_by([&] { gradcomp::unpack_codes(packed, bits, out); }) == named(errc::invalid_argument));
  }
}

TEST_CASE("pack_codes rejects a code that does not fit its width with invalid_argument") {
  std::vector<std::uint8_t> packed(4, 0);
  CHECK(thrown_by([&] {
          gradcomp::pack_codes(std::vector<std::uint8_t>{0, 1, 4}, 2, packed);
        }) == named(errc::invalid_argument));
  CHECK(thrown_by([&] { gradcomp::pack_codes(std::vector<std::uint8_t>{2}, 1, packed); }) ==
        named(errc::invalid_argument));
  CHECK(thrown_by([&] {
          gradcomp::pack_codes(std::vector<std::uint8_t>{15, 16}, 4, packed);
        }) == named(errc::invalid_argument));
  // The largest codes that do fit are accepted.
  CHECK(thrown_by([&] { gradcomp::pack_codes(std::vector<std::uint8_t>{3, 1, 2}, 2, packed); }) == "no exception");
  CHECK(thrown_by([&] { gradcomp::pack_codes(std::vector<std::uint8_t>{255}, 8, packed); }) == "no exception");
}

TEST_CASE("pack_codes into a short buffer throws buffer_too_small, unpack_codes from one throws truncated") {
  const std::vector<std::uint8_t> codes(9, 1);  // 9 one-bit codes need 2 bytes
  std::vector<std::uint8_t> one_byte(1, 0);
  CHECK(thrown_by([&] { gradcomp::pack_codes(codes, 1, one_byte); }) == named(errc::buffer_too_small));
  std::vector<std::uint8_t> out(9);
  CHECK(thrown_by([&] { gradcomp::unpack_codes(one_byte, 1, out); }) == named(errc::truncated));
  std::vector<std::uint8_t> four(4);
  CHECK(thrown_by([&] { gradcomp::unpack_codes(std::span<const std::uint8_t>{}, 8, four); }) == named(errc::truncated));
  // Exactly packed_bytes is enough.
  std::vector<std::uint8_t> two_bytes(2, 0);
  CHECK(thrown_by([&] { gradcomp::pack_codes(codes, 1, two_bytes); }) == "no exception");
  CHECK(thrown_by([&] { gradcomp::unpack_codes(two_bytes, 1, out); }) == "no exception");
}
