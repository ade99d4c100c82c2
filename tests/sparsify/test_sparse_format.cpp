// The sparse payload layout: the coding choice, exact sizes, and validation of hand-built
// payloads (including the list64 coding that only tensors above 2^32 elements get from encoders).
#include <gradcomp/sparsify/topk.hpp>

#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <vector>

#include "support/codec_io.hpp"

using namespace gradcomp;
using namespace gradcomp::test;

namespace {

// Builds a top-k float message by hand: envelope + u64 k + raw index section + values.
std::vector<std::byte> hand_message(std::uint64_t n, std::uint8_t coding, std::uint64_t k,
                                    const std::vector<std::uint8_t>& index_section, const std::vector<float>& values,
                                    std::uint64_t params_hash) {
  std::vector<std::byte> m(envelope::size + 8 + index_section.size() + values.size() * 4);
  std::memcpy(m.data() + envelope::size, &k, 8);
  if (!index_section.empty()) std::memcpy(m.data() + envelope::size + 8, index_section.data(), index_section.size());
  if (!values.empty())
    std::memcpy(m.data() + envelope::size + 8 + index_section.size(), values.data(), values.size() * 4);
  envelope e;
  e.codec = codec_id::topk;
  e.dtype = value_dtype::float32;
  e.layout = coding;
  e.elements = n;
  e.payload_bytes = m.size() - envelope::size;
  e.params_hash = params_hash;
  write_envelope(e, m);
  return m;
}

std::vector<std::uint8_t> le_words(const std::vector<std::uint64_t>& words, int width) {
  std::vector<std::uint8_t> bytes;
  for (const std::uint64_t w : words)
    for (int b = 0; b < width; ++b) bytes.push_back(static_cast<std::uint8_t>(w >> (8 * b)));
  while (bytes.size() % 8 != 0) bytes.push_back(0);
  return bytes;
}

errc decode_error(const topk_sparsifier<float>& codec, const std::vector<std::byte>& m, std::size_t n) {
  try {
    decode_values(codec, m, n);
  } catch (const error& e) {
    return e.code();
  }
  FAIL("the message was accepted");
  return errc::invalid_argument;
}

}  // namespace

TEST_CASE("the encoder picks the smallest index coding and list64 only above 2^32 elements") {
  // n = 1000: bitmap = 128 bytes; a u32 list is smaller up to k = 31 (124 → 128 bytes on k = 32: a tie goes to the list).
  CHECK(choose_index_coding(1000, 31) == index_coding::list32);
  CHECK(choose_index_coding(1000, 32) == index_coding::list32);
  CHECK(choose_index_coding(1000, 33) == index_coding::bitmap);
  CHECK(choose_index_coding(0, 0) == index_coding::list32);
  const std::uint64_t big = (std::uint64_t{1} << 32) + 1;
  CHECK(choose_index_coding(std::uint64_t{1} << 32, 1) == index_coding::list32);
  CHECK(choose_index_coding(big, 1) == index_coding::list64);
  CHECK(choose_index_coding(big, big / 8) == index_coding::bitmap);
  CHECK(index_section_bytes(index_coding::list32, 10, 3) == 16);
  CHECK(index_section_bytes(index_coding::list64, 10, 3) == 24);
  CHECK(index_section_bytes(index_coding::bitmap, 65, 3) == 16);
  CHECK(sparse_payload_bytes(index_coding::list32, 10, 3, 4) == 8 + 16 + 12);
  CHECK(max_sparse_payload_bytes(1000, 4) == 8 + 128 + 4000);
}

TEST_CASE("hand-built list32, list64 and bitmap payloads decode to the same tensor") {
  const topk_sparsifier<float> codec(sparsity{.k = 3});
  const std::uint64_t n = 20;
  const std::vector<float> values = {1.5f, -2.0f, 0.25f};
  std::vector<float> expected(n, 0.0f);
  expected[2] = 1.5f;
  expected[9] = -2.0f;
  expected[17] = 0.25f;
  const auto list32 = hand_message(n, 1, 3, le_words({2, 9, 17}, 4), values, codec.params_hash());
  const auto list64 = hand_message(n, 2, 3, le_words({2, 9, 17}, 8), values, codec.params_hash());
  // Bits 2, 9 and 17: bytes 0x04, 0x02, 0x02, padded to 8 bytes.
  const auto bitmap = hand_message(n, 3, 3, {0x04, 0x02, 0x02, 0, 0, 0, 0, 0}, values, codec.params_hash());
  CHECK(decode_values(codec, list32, n) == expected);
  CHECK(decode_values(codec, list64, n) == expected);
  CHECK(decode_values(codec, bitmap, n) == expected);
}

TEST_CASE("malformed sparse payloads are rejected with malformed_payload") {
  const topk_sparsifier<float> codec(sparsity{.k = 3});
  const std::uint64_t h = codec.params_hash();
  const std::vector<float> three = {1.0f, 2.0f, 3.0f};
  const auto expect_malformed = [&](const std::vector<std::byte>& m, std::uint64_t n) {
    CHECK(decode_error(codec, m, static_cast<std::size_t>(n)) == errc::malformed_payload);
  };
  expect_malformed(hand_message(20, 1, 3, le_words({9, 2, 17}, 4), three, h), 20);  // not ascending
  expect_malformed(hand_message(20, 1, 3, le_words({2, 2, 17}, 4), three, h), 20);  // duplicate
  expect_malformed(hand_message(20, 1, 3, le_words({2, 9, 20}, 4), three, h), 20);  // index == n
  expect_malformed(hand_message(20, 2, 3, le_words({2, 9, std::uint64_t{1} << 40}, 8), three, h), 20);
  expect_malformed(hand_message(20, 3, 3, {0x04, 0x02, 0x00, 0, 0, 0, 0, 0}, three, h), 20);  // 2 bits, k = 3
  expect_malformed(hand_message(20, 3, 3, {0x04, 0x02, 0x12, 0, 0, 0, 0, 0}, three, h), 20);  // bit 20 set
  expect_malformed(hand_message(20, 3, 3, {0x04, 0x02, 0x02, 0, 0, 0, 0, 1}, three, h), 20);  // padding
  std::vector<std::uint8_t> padded = le_words({2, 9, 17}, 4);
  padded.back() = 1;
  expect_malformed(hand_message(20, 1, 3, padded, three, h), 20);  // list padding
  expect_malformed(hand_message(20, 4, 3, le_words({2, 9, 17}, 4), three, h), 20);  // unknown coding
  expect_malformed(hand_message(2, 1, 3, le_words({0, 1, 1}, 4), three, h), 2);  // k > n
  expect_malformed(hand_message(20, 1, 4, le_words({2, 9, 17}, 4), three, h), 20);  // k vs size
  expect_malformed(hand_message(20, 1, 3, le_words({2, 9, 17}, 4),
                                {1.0f, std::numeric_limits<float>::quiet_NaN(), 3.0f}, h),
                   20);  // NaN value
  expect_malformed(hand_message(20, 1, 3, le_words({2, 9, 17}, 4), {1.0f, std::numeric_limits<float>::infinity(), 3.0f},
                                h),
                   20);
}

TEST_CASE("absurd sizes in a tiny message are rejected without overflow or huge reads") {
  const topk_sparsifier<float> codec(sparsity{.k = 3});
  const std::uint64_t h = codec.params_hash();
  // The envelope claims 2^60 elements and k = 2^61; the payload holds 16 bytes. Validation must
  // refuse the message before any size arithmetic could wrap, with the caller's cap or the layout.
  const std::uint64_t huge_n = std::uint64_t{1} << 60;
  const auto m = hand_message(huge_n, 3, std::uint64_t{1} << 61, {0, 0, 0, 0, 0, 0, 0, 0}, {}, h);
  const cpu_executor cpu;
  std::vector<float> out(4, 7.0f);
  try {
    codec.decode(cpu, m, std::span<float>(out), {}, {.max_elements = 1u << 20});
    FAIL("accepted a message beyond the cap");
  } catch (const error& e) {
    CHECK(e.code() == errc::too_large);
  }
  CHECK(out[0] == 7.0f);
  // Without a cap the size check refuses it (n differs from the output).
  try {
    codec.decode(cpu, m, std::span<float>(out), {});
    FAIL("accepted a message of another size");
  } catch (const error& e) {
    CHECK(e.code() == errc::size_mismatch);
  }
  // The payload parser itself, given such an envelope, refuses it as malformed.
  const envelope e = parse_envelope(m);
  try {
    (void)parse_sparse_payload<float>(e, payload_of(m));
    FAIL("parsed an impossible payload");
  } catch (const error& err) {
    CHECK(err.code() == errc::malformed_payload);
  }
}
