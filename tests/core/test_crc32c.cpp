// CRC-32C against published check values (the CRC catalogue's "123456789" and the RFC 3720
// appendix B.4 iSCSI vectors) and against an MSB-first bit-at-a-time reference written here, for
// each host path: the table, and SSE4.2's crc32 instruction where it is compiled in and the CPU has
// it; crc32c() itself (which picks one of them) too.

#include <doctest/doctest.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <random>
#include <span>
#include <string_view>
#include <vector>

#include <gradcomp/core/cpu_executor.hpp>
#include <gradcomp/core/crc32c.hpp>

namespace {

using gradcomp::crc32c;

/// One way the host computes a CRC-32C.
struct crc_path {
  const char* name;
  std::uint32_t (*checksum)(std::span<const std::byte> data);

  [[nodiscard]] std::uint32_t operator()(std::span<const std::byte> data) const { return checksum(data); }
};

/// The CRC-32C of `data` through one register update function.
template <auto Update>
std::uint32_t checksum_by(std::span<const std::byte> data) {
  return Update(0xFFFFFFFFu, data.data(), data.size()) ^ 0xFFFFFFFFu;
}

std::uint32_t checksum_as_called(std::span<const std::byte> data) { return crc32c(data); }

/// crc32c() as called, the table, and the SSE4.2 loop where this build and CPU have it.
std::vector<crc_path> host_paths() {
  std::vector<crc_path> paths{{"crc32c()", checksum_as_called},
                              {"table", checksum_by<gradcomp::detail::crc32c_update_portable>}};
#if defined(GRADCOMP_HAVE_SSE42)
  if (gradcomp::cpu_has_sse42()) paths.push_back({"sse4.2", checksum_by<gradcomp::detail::crc32c_update_sse42>});
  else
    MESSAGE("this CPU has no SSE4.2: the crc32 instruction's path is not run");
#endif
  return paths;
}

std::vector<std::byte> bytes_of(std::string_view text) {
  std::vector<std::byte> out;
  for (const char c : text) out.push_back(static_cast<std::byte>(c));
  return out;
}

std::vector<std::byte> bytes_of(std::initializer_list<unsigned> values) {
  std::vector<std::byte> out;
  for (const unsigned v : values) out.push_back(static_cast<std::byte>(v));
  return out;
}

std::uint32_t reflect(std::uint32_t value, int width) {
  std::uint32_t out = 0;
  for (int b = 0; b < width; ++b)
    if ((value >> b) & 1u) out |= 1u << (width - 1 - b);
  return out;
}

// The textbook, non-reflected form: normal polynomial 0x1EDC6F41 processed MSB first, with the
// input bytes and the final register reflected (RefIn = RefOut = true), init and xorout all ones.
std::uint32_t reference_crc32c(std::span<const std::byte> data) {
  std::uint32_t reg = 0xFFFFFFFFu;
  for (const std::byte b : data) {
    const std::uint32_t in = reflect(static_cast<std::uint32_t>(b), 8);
    for (int bit = 7; bit >= 0; --bit) {
      const bool feedback = (((reg >> 31) ^ (in >> bit)) & 1u) != 0;
      reg <<= 1;
      if (feedback) reg ^= 0x1EDC6F41u;
    }
  }
  return reflect(reg, 32) ^ 0xFFFFFFFFu;
}

constexpr std::array<std::byte, 9> check_string = {std::byte{'1'}, std::byte{'2'}, std::byte{'3'},
                                                   std::byte{'4'}, std::byte{'5'}, std::byte{'6'},
                                                   std::byte{'7'}, std::byte{'8'}, std::byte{'9'}};
static_assert(crc32c(check_string) == 0xE3069283u, "crc32c is usable in constant expressions");

}  // namespace

TEST_CASE("crc32c of \"123456789\" is the catalogue check value 0xE3069283") {
  for (const crc_path& crc : host_paths()) {
    CAPTURE(crc.name);
    CHECK(crc(bytes_of("123456789")) == 0xE3069283u);
  }
}

TEST_CASE("crc32c of no bytes is zero") {
  for (const crc_path& crc : host_paths()) {
    CAPTURE(crc.name);
    CHECK(crc(std::span<const std::byte>{}) == 0u);
  }
}

TEST_CASE("crc32c matches the RFC 3720 iSCSI test vectors") {
  std::vector<std::byte> zeros(32, std::byte{0x00});
  std::vector<std::byte> ones(32, std::byte{0xFF});
  std::vector<std::byte> ascending, descending;
  for (unsigned i = 0; i < 32; ++i) {
    ascending.push_back(static_cast<std::byte>(i));
    descending.push_back(static_cast<std::byte>(31 - i));
  }
  const std::vector<std::byte> read10_pdu =
      bytes_of({0x01, 0xc0, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
                0x14, 0x00, 0x00, 0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x00, 0x14, 0x00, 0x00, 0x00, 0x18,
                0x28, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00});
  for (const crc_path& crc : host_paths()) {
    CAPTURE(crc.name);
    CHECK(crc(zeros) == 0x8A9136AAu);
    CHECK(crc(ones) == 0x62A8AB43u);
    CHECK(crc(ascending) == 0x46DD794Eu);
    CHECK(crc(descending) == 0x113FDB5Cu);
    CHECK(crc(read10_pdu) == 0xD9963A56u);
  }
}

TEST_CASE("crc32c of single bytes and short strings matches published values") {
  for (const crc_path& crc : host_paths()) {
    CAPTURE(crc.name);
    CHECK(crc(bytes_of("a")) == 0xC1D04330u);
    CHECK(crc(bytes_of("abc")) == 0x364B3FB7u);
    CHECK(crc(bytes_of({0x00})) == 0x527D5351u);
  }
}

TEST_CASE("crc32c agrees with a bit-at-a-time reference on random inputs of every length up to 300") {
  std::mt19937 rng(20240601u);
  std::vector<std::byte> data;
  const std::vector<crc_path> paths = host_paths();
  for (std::size_t length = 0; length <= 300; ++length) {
    data.resize(length);
    for (std::byte& b : data) b = static_cast<std::byte>(rng() & 0xFFu);
    CAPTURE(length);
    const std::uint32_t expected = reference_crc32c(data);
    for (const crc_path& crc : paths) {
      CAPTURE(crc.name);
      REQUIRE(crc(data) == expected);
    }
  }
  // A sub-span that does not start at an aligned address.
  const std::span<const std::byte> inner = std::span<const std::byte>(data).subspan(3, 250);
  for (const crc_path& crc : paths) {
    CAPTURE(crc.name);
    CHECK(crc(inner) == reference_crc32c(inner));
  }
}

#if defined(GRADCOMP_HAVE_SSE42)
TEST_CASE("crc32c's SSE4.2 loop updates any register as the table does, at every length up to 1100 and offset 0-15") {
  if (!gradcomp::cpu_has_sse42()) {
    MESSAGE("this CPU has no SSE4.2: the crc32 instruction's path is not run");
    return;
  }
  // The table is the reference here (checked above against the bit-at-a-time one); the SSE4.2
  // loop's eight-byte steps and 0-7 byte tails meet every split, from registers drawn at random.
  std::mt19937 rng(33u);
  std::vector<std::byte> data(1100 + 16);
  for (std::byte& b : data) b = static_cast<std::byte>(rng() & 0xFFu);
  for (std::size_t offset = 0; offset < 16; ++offset) {
    for (std::size_t length = 0; length <= 1100; ++length) {
      const auto start = static_cast<std::uint32_t>(rng());
      CAPTURE(offset);
      CAPTURE(length);
      REQUIRE(gradcomp::detail::crc32c_update_sse42(start, data.data() + offset, length) ==
              gradcomp::detail::crc32c_update_portable(start, data.data() + offset, length));
    }
  }
  // One long buffer at an odd address, as a payload checksum sees it, through crc32c() itself.
  std::vector<std::byte> large((std::size_t{1} << 20) + 7);
  for (std::byte& b : large) b = static_cast<std::byte>(rng() & 0xFFu);
  const std::span<const std::byte> payload = std::span<const std::byte>(large).subspan(3);
  CHECK(crc32c(payload) == checksum_by<gradcomp::detail::crc32c_update_portable>(payload));
}
#endif

TEST_CASE("crc32c changes under every single-bit flip of a 52-byte buffer") {
  std::mt19937 rng(7u);
  std::vector<std::byte> data(52);
  for (std::byte& b : data) b = static_cast<std::byte>(rng() & 0xFFu);
  const std::uint32_t original = crc32c(data);
  REQUIRE(original == reference_crc32c(data));
  int undetected = 0;
  for (std::size_t byte = 0; byte < data.size(); ++byte) {
    for (unsigned bit = 0; bit < 8; ++bit) {
      std::vector<std::byte> flipped = data;
      flipped[byte] ^= static_cast<std::byte>(1u << bit);
      if (crc32c(flipped) == original) ++undetected;
    }
  }
  CHECK(undetected == 0);
}

TEST_CASE("crc32c detects random error bursts of up to 32 bits in a 52-byte buffer") {
  std::mt19937 rng(99u);
  std::vector<std::byte> data(52);
  for (std::byte& b : data) b = static_cast<std::byte>(rng() & 0xFFu);
  const std::uint32_t original = crc32c(data);
  constexpr unsigned total_bits = 52 * 8;
  int undetected = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const unsigned length = 1 + static_cast<unsigned>(rng() % 32);  // burst length in bits
    const unsigned start = static_cast<unsigned>(rng() % (total_bits - length + 1));
    std::vector<std::byte> corrupted = data;
    for (unsigned i = 0; i < length; ++i) {
      // A burst: its first and last bits are flipped, the ones between at random.
      const bool flip = i == 0 || i + 1 == length || (rng() & 1u) != 0;
      if (!flip) continue;
      const unsigned position = start + i;
      corrupted[position / 8] ^= static_cast<std::byte>(1u << (position % 8));
    }
    if (crc32c(corrupted) == original) ++undetected;
  }
  CHECK(undetected == 0);
}
