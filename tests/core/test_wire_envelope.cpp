// The 56-byte wire envelope: its documented byte layout, parsing of untrusted bytes (every
// documented rejection, and no success or crash on corruption), validation against a decoder's
// expectation, the FNV-1a parameter hash, and the std::error_code integration of gradcomp::errc.

#include <doctest/doctest.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <initializer_list>
#include <ostream>  // doctest prints std::error_code operands through operator<<
#include <span>
#include <string>
#include <system_error>
#include <vector>

#include <gradcomp/core/error.hpp>
#include <gradcomp/core/wire_envelope.hpp>

#include "support/errors.hpp"

namespace {

using gradcomp::test::named;
using gradcomp::test::thrown_by;

using gradcomp::codec_id;
using gradcomp::envelope;
using gradcomp::errc;
using gradcomp::value_dtype;


// Bit-at-a-time CRC-32C (reflected polynomial 0x82F63B78), independent of gradcomp's table.
std::uint32_t reference_crc32c(const std::byte* data, std::size_t size) {
  std::uint32_t crc = 0xFFFFFFFFu;
  for (std::size_t i = 0; i < size; ++i) {
    crc ^= static_cast<std::uint32_t>(data[i]);
    for (int bit = 0; bit < 8; ++bit) crc = (crc & 1u) != 0 ? (crc >> 1) ^ 0x82F63B78u : crc >> 1;
  }
  return ~crc;
}

// FNV-1a 64 over a byte string, written from the published definition.
std::uint64_t reference_fnv1a(std::initializer_list<unsigned> bytes) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (const unsigned b : bytes) {
    h ^= b;
    h *= 0x100000001b3ull;
  }
  return h;
}

void put_le(std::vector<std::byte>& buf, std::size_t offset, std::uint64_t value, std::size_t width) {
  for (std::size_t i = 0; i < width; ++i) buf[offset + i] = static_cast<std::byte>((value >> (8 * i)) & 0xFFu);
}

std::uint64_t get_le(const std::vector<std::byte>& buf, std::size_t offset, std::size_t width) {
  std::uint64_t value = 0;
  for (std::size_t i = 0; i < width; ++i) value |= static_cast<std::uint64_t>(buf[offset + i]) << (8 * i);
  return value;
}

// Recomputes the header CRC at 52 over bytes 0..51, as a sender of a hostile header would.
void reseal(std::vector<std::byte>& buf) { put_le(buf, 52, reference_crc32c(buf.data(), 52), 4); }

// The payload "123456789", whose CRC-32C is the published check value 0xE3069283.
const std::array<std::byte, 9> check_payload = {std::byte{'1'}, std::byte{'2'}, std::byte{'3'},
                                                std::byte{'4'}, std::byte{'5'}, std::byte{'6'},
                                                std::byte{'7'}, std::byte{'8'}, std::byte{'9'}};

envelope sample_envelope() {
  envelope e;
  e.codec = codec_id::threshold;
  e.dtype = value_dtype::float64;
  e.layout = 0x5A;
  e.flags = gradcomp::flag_payload_checksum;
  e.key.tensor_id = 0x11223344u;
  e.key.step = 0xB1B2B3B4B5B6B7B8ull;
  e.elements = 0x0102030405060708ull;
  e.payload_bytes = check_payload.size();
  e.params_hash = 0xA1A2A3A4A5A6A7A8ull;
  e.payload_crc = 0xE3069283u;
  return e;
}

// Envelope written by write_envelope followed by `payload`.
std::vector<std::byte> message_of(const envelope& e, std::span<const std::byte> payload) {
  std::vector<std::byte> msg(envelope::size + payload.size(), std::byte{0xCD});
  gradcomp::write_envelope(e, std::span<std::byte>(msg).first(envelope::size));
  for (std::size_t i = 0; i < payload.size(); ++i) msg[envelope::size + i] = payload[i];
  return msg;
}

std::vector<std::byte> sample_message() { return message_of(sample_envelope(), check_payload); }

// An envelope without payload or payload checksum.
envelope bare_envelope() {
  envelope e = sample_envelope();
  e.flags = 0;
  e.payload_bytes = 0;
  e.payload_crc = 0;
  return e;
}

std::string parse_outcome(const std::vector<std::byte>& msg) {
  return thrown_by([&] { (void)gradcomp::parse_envelope(msg); });
}

static_assert(gradcomp::params_hasher{}.value() == 0xcbf29ce484222325ull);
static_assert(gradcomp::params_hasher{}.add(std::uint8_t{'a'}).value() == 0xaf63dc4c8601ec8cull);

}  // namespace

TEST_CASE("write_envelope puts every field at its documented offset, little-endian") {
  const std::vector<std::byte> msg = sample_message();
  REQUIRE(msg.size() == 65);
  const std::vector<unsigned> expected_header = {
      'G',  'C',  'M',  'P',                           // 0: magic
      0x01, 0x00,                                      // 4: version 1
      0x03, 0x00,                                      // 6: codec (threshold)
      0x02,                                            // 8: dtype (float64)
      0x5A,                                            // 9: layout
      0x01, 0x00,                                      // 10: flags (payload checksum)
      0x44, 0x33, 0x22, 0x11,                          // 12: tensor id
      0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01,  // 16: element count
      0x09, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,  // 24: payload bytes
      0xA8, 0xA7, 0xA6, 0xA5, 0xA4, 0xA3, 0xA2, 0xA1,  // 32: params hash
      0xB8, 0xB7, 0xB6, 0xB5, 0xB4, 0xB3, 0xB2, 0xB1,  // 40: step
      0x83, 0x92, 0x06, 0xE3,                          // 48: payload CRC-32C
  };
  REQUIRE(expected_header.size() == 52);
  for (std::size_t i = 0; i < expected_header.size(); ++i) {
    CAPTURE(i);
    CHECK(static_cast<unsigned>(msg[i]) == expected_header[i]);
  }
  CHECK(get_le(msg, 52, 4) == reference_crc32c(msg.data(), 52));  // 52: header CRC-32C of bytes 0..51
  CHECK(envelope::size == 56);
  CHECK(envelope::magic == 0x504D4347u);
  CHECK(envelope::version == 1);
}

TEST_CASE("write_envelope writes only the first 56 bytes and refuses a shorter buffer") {
  std::vector<std::byte> buf(60, std::byte{0xEE});
  gradcomp::write_envelope(bare_envelope(), buf);
  for (std::size_t i = 56; i < 60; ++i) CHECK(buf[i] == std::byte{0xEE});
  std::vector<std::byte> small(55);
  CHECK(thrown_by([&] { gradcomp::write_envelope(bare_envelope(), small); }) == named(errc::buffer_too_small));
}

TEST_CASE("parse_envelope returns every field that write_envelope wrote") {
  const std::vector<std::byte> msg = sample_message();
  const envelope e = gradcomp::parse_envelope(msg);
  CHECK(e.codec == codec_id::threshold);
  CHECK(e.dtype == value_dtype::float64);
  CHECK(e.layout == 0x5A);
  CHECK(e.flags == gradcomp::flag_payload_checksum);
  CHECK(e.key.tensor_id == 0x11223344u);
  CHECK(e.key.step == 0xB1B2B3B4B5B6B7B8ull);
  CHECK(e.elements == 0x0102030405060708ull);
  CHECK(e.payload_bytes == 9);
  CHECK(e.params_hash == 0xA1A2A3A4A5A6A7A8ull);
  CHECK(e.payload_crc == 0xE3069283u);
  const std::span<const std::byte> payload = gradcomp::payload_of(msg);
  REQUIRE(payload.size() == 9);
  CHECK(payload.data() == msg.data() + 56);

  // A second shape: float32, no checksum, empty payload, extreme values.
  envelope f;
  f.codec = codec_id::random_k;
  f.dtype = value_dtype::float32;
  f.layout = 0xFF;
  f.key = {0xFFFFFFFFFFFFFFFFull, 0xFFFFFFFFu};
  f.elements = 0xFFFFFFFFFFFFFFFFull;
  f.params_hash = 0;
  const envelope g = gradcomp::parse_envelope(message_of(f, {}));
  CHECK(g.codec == codec_id::random_k);
  CHECK(g.dtype == value_dtype::float32);
  CHECK(g.layout == 0xFF);
  CHECK(g.flags == 0);
  CHECK(g.key == gradcomp::message_key{0xFFFFFFFFFFFFFFFFull, 0xFFFFFFFFu});
  CHECK(g.elements == 0xFFFFFFFFFFFFFFFFull);
  CHECK(g.payload_bytes == 0);
  CHECK(g.params_hash == 0);
  CHECK(g.payload_crc == 0);
}

TEST_CASE("parse_envelope reads a hand-assembled envelope") {
  // Built byte by byte from the layout, not by write_envelope.
  std::vector<std::byte> msg(56 + 3, std::byte{0});
  put_le(msg, 0, 0x504D4347u, 4);
  put_le(msg, 4, 1, 2);
  put_le(msg, 6, 1, 2);        // topk
  put_le(msg, 8, 1, 1);        // float32
  put_le(msg, 9, 7, 1);        // layout
  put_le(msg, 12, 99, 4);      // tensor
  put_le(msg, 16, 1000, 8);    // elements
  put_le(msg, 24, 3, 8);       // payload bytes
  put_le(msg, 32, 0x1234, 8);  // params hash
  put_le(msg, 40, 77, 8);      // step
  reseal(msg);
  const envelope e = gradcomp::parse_envelope(msg);
  CHECK(e.codec == codec_id::topk);
  CHECK(e.dtype == value_dtype::float32);
  CHECK(e.layout == 7);
  CHECK(e.key.tensor_id == 99);
  CHECK(e.elements == 1000);
  CHECK(e.payload_bytes == 3);
  CHECK(e.params_hash == 0x1234);
  CHECK(e.key.step == 77);
}

TEST_CASE("parse_envelope rejects a message shorter than the envelope as truncated") {
  const std::vector<std::byte> msg = message_of(bare_envelope(), {});
  REQUIRE(parse_outcome(msg) == "no exception");
  for (const std::size_t length : {std::size_t{0}, std::size_t{1}, std::size_t{4}, std::size_t{52}, std::size_t{55}}) {
    CAPTURE(length);
    const std::vector<std::byte> shorter(msg.begin(), msg.begin() + static_cast<std::ptrdiff_t>(length));
    CHECK(parse_outcome(shorter) == named(errc::truncated));
  }
}

TEST_CASE("parse_envelope rejects a message without the GCMP magic as bad_magic") {
  std::vector<std::byte> msg = sample_message();
  msg[0] = std::byte{'X'};
  CHECK(parse_outcome(msg) == named(errc::bad_magic));
  msg = sample_message();
  msg[3] = std::byte{'p'};
  reseal(msg);
  CHECK(parse_outcome(msg) == named(errc::bad_magic));
}

TEST_CASE("parse_envelope rejects format version 2, even with a valid header CRC, as unsupported_version") {
  for (const std::uint64_t version : {0u, 2u, 0x0100u, 0xFFFFu}) {
    CAPTURE(version);
    std::vector<std::byte> msg = sample_message();
    put_le(msg, 4, version, 2);
    reseal(msg);
    CHECK(parse_outcome(msg) == named(errc::unsupported_version));
  }
}

TEST_CASE("parse_envelope rejects every single-bit corruption of the envelope with a gradcomp::error") {
  const std::vector<std::byte> original = sample_message();
  REQUIRE(parse_outcome(original) == "no exception");
  for (std::size_t byte = 0; byte < envelope::size; ++byte) {
    for (unsigned bit = 0; bit < 8; ++bit) {
      std::vector<std::byte> msg = original;
      msg[byte] ^= static_cast<std::byte>(1u << bit);
      CAPTURE(byte);
      CAPTURE(bit);
      // Checked in the documented order: magic, version, then the header CRC covers the rest.
      const errc expected = byte < 4 ? errc::bad_magic : byte < 6 ? errc::unsupported_version : errc::header_checksum;
      CHECK(parse_outcome(msg) == named(expected));
    }
  }
}

TEST_CASE("parse_envelope rejects a corrupted payload when the payload checksum is flagged") {
  const std::vector<std::byte> original = sample_message();
  for (std::size_t byte = envelope::size; byte < original.size(); ++byte) {
    for (unsigned bit = 0; bit < 8; ++bit) {
      std::vector<std::byte> msg = original;
      msg[byte] ^= static_cast<std::byte>(1u << bit);
      CAPTURE(byte);
      CAPTURE(bit);
      CHECK(parse_outcome(msg) == named(errc::payload_checksum));
    }
  }
}

TEST_CASE("parse_envelope rejects a flagged payload CRC that does not match as payload_checksum") {
  envelope e = sample_envelope();
  e.payload_crc = 0xE3069282u;
  CHECK(parse_outcome(message_of(e, check_payload)) == named(errc::payload_checksum));
  e.payload_crc = 0;
  CHECK(parse_outcome(message_of(e, check_payload)) == named(errc::payload_checksum));
}

TEST_CASE("parse_envelope rejects a payload shorter than declared as truncated and a longer one as trailing_bytes") {
  const std::vector<std::byte> msg = sample_message();
  const std::vector<std::byte> shorter(msg.begin(), msg.end() - 1);
  CHECK(parse_outcome(shorter) == named(errc::truncated));
  const std::vector<std::byte> header_only(msg.begin(), msg.begin() + 56);
  CHECK(parse_outcome(header_only) == named(errc::truncated));
  std::vector<std::byte> longer = msg;
  longer.push_back(std::byte{0});
  CHECK(parse_outcome(longer) == named(errc::trailing_bytes));
  std::vector<std::byte> bare = message_of(bare_envelope(), {});
  bare.push_back(std::byte{0});
  CHECK(parse_outcome(bare) == named(errc::trailing_bytes));
  // A declared length near 2^64 must not wrap around.
  std::vector<std::byte> huge = sample_message();
  put_le(huge, 24, 0xFFFFFFFFFFFFFFFFull, 8);
  reseal(huge);
  CHECK(parse_outcome(huge) == named(errc::truncated));
}

TEST_CASE("parse_envelope rejects unknown flag bits, even with a valid header CRC, as malformed_envelope") {
  for (unsigned bit = 1; bit < 16; ++bit) {
    CAPTURE(bit);
    std::vector<std::byte> msg = message_of(bare_envelope(), {});
    put_le(msg, 10, 1u << bit, 2);
    reseal(msg);
    CHECK(parse_outcome(msg) == named(errc::malformed_envelope));
  }
}

TEST_CASE("parse_envelope rejects an unknown dtype as malformed_envelope") {
  for (const unsigned dtype : {0u, 5u, 6u, 0x80u, 0xFFu}) {
    CAPTURE(dtype);
    std::vector<std::byte> msg = message_of(bare_envelope(), {});
    put_le(msg, 8, dtype, 1);
    reseal(msg);
    CHECK(parse_outcome(msg) == named(errc::malformed_envelope));
  }
}

TEST_CASE("parse_envelope rejects a payload CRC without its flag as malformed_envelope") {
  envelope e = sample_envelope();
  e.flags = 0;  // CRC field still 0xE3069283
  CHECK(parse_outcome(message_of(e, check_payload)) == named(errc::malformed_envelope));
  e.payload_crc = 0;
  CHECK(parse_outcome(message_of(e, check_payload)) == "no exception");
}

TEST_CASE("parse_envelope reads nothing past the span it is given") {
  // The message lives inside a larger buffer; garbage after it must be neither read as payload
  // nor make a short message parse.
  std::vector<std::byte> storage = sample_message();
  const std::size_t length = storage.size();
  storage.resize(length + 16, std::byte{0x5A});
  const std::span<const std::byte> exact(storage.data(), length);
  CHECK(thrown_by([&] { (void)gradcomp::parse_envelope(exact); }) == "no exception");
  CHECK(thrown_by([&] { (void)gradcomp::parse_envelope(exact.first(length - 1)); }) == named(errc::truncated));
}

namespace {
gradcomp::envelope_expectation expectation_for(const envelope& e) {
  return {e.codec, e.dtype, e.elements, e.params_hash};
}
}  // namespace

TEST_CASE("validate_envelope accepts a matching envelope and names each mismatch") {
  envelope e = sample_envelope();
  e.elements = 1000;
  const gradcomp::envelope_expectation want = expectation_for(e);
  const gradcomp::decode_limits no_limits{};
  auto validate = [](const envelope& env, const gradcomp::envelope_expectation& w, const gradcomp::decode_limits& l) {
    return thrown_by([&] { gradcomp::validate_envelope(env, w, l); });
  };
  CHECK(validate(e, want, no_limits) == "no exception");

  SUBCASE("another codec") {
    gradcomp::envelope_expectation w = want;
    w.codec = codec_id::topk;
    CHECK(validate(e, w, no_limits) == named(errc::codec_mismatch));
  }
  SUBCASE("another dtype") {
    gradcomp::envelope_expectation w = want;
    w.dtype = value_dtype::float32;
    CHECK(validate(e, w, no_limits) == named(errc::dtype_mismatch));
  }
  SUBCASE("more elements than the cap") {
    CHECK(validate(e, want, {999, false}) == named(errc::too_large));
    CHECK(validate(e, want, {1000, false}) == "no exception");
    CHECK(validate(e, want, {0, false}) == named(errc::too_large));
  }
  SUBCASE("another element count") {
    gradcomp::envelope_expectation w = want;
    w.elements = 1001;
    CHECK(validate(e, w, no_limits) == named(errc::size_mismatch));
    w.elements = 999;
    CHECK(validate(e, w, no_limits) == named(errc::size_mismatch));
  }
  SUBCASE("another parameter hash") {
    gradcomp::envelope_expectation w = want;
    w.params_hash ^= 1;
    CHECK(validate(e, w, no_limits) == named(errc::parameter_mismatch));
  }
  SUBCASE("a required checksum") {
    CHECK(validate(e, want, {UINT64_MAX, true}) == "no exception");
    envelope unchecked = e;
    unchecked.flags = 0;
    unchecked.payload_crc = 0;
    CHECK(validate(unchecked, want, {UINT64_MAX, true}) == named(errc::payload_checksum));
    CHECK(validate(unchecked, want, {UINT64_MAX, false}) == "no exception");
  }
}

TEST_CASE("params_hasher is 64-bit FNV-1a over the little-endian bytes of each field") {
  using gradcomp::params_hasher;
  SUBCASE("published FNV-1a 64 values") {
    CHECK(params_hasher{}.value() == 0xcbf29ce484222325ull);
    CHECK(params_hasher{}.add(std::uint8_t{'a'}).value() == 0xaf63dc4c8601ec8cull);
    // "foobar" = the 32-bit word "foob" then the 16-bit word "ar", little-endian.
    CHECK(params_hasher{}.add(std::uint32_t{0x626f6f66u}).add(std::uint16_t{0x7261u}).value() == 0x85944171f73967e8ull);
  }
  SUBCASE("fields of each width contribute their little-endian bytes") {
    CHECK(params_hasher{}.add(true).value() == reference_fnv1a({0x01}));
    CHECK(params_hasher{}.add(codec_id::topk).value() == reference_fnv1a({0x01, 0x00}));
    CHECK(params_hasher{}.add(value_dtype::float64).value() == reference_fnv1a({0x02}));
    CHECK(params_hasher{}.add(std::uint32_t{0x01020304u}).value() == reference_fnv1a({0x04, 0x03, 0x02, 0x01}));
    CHECK(params_hasher{}.add(1.0f).value() == reference_fnv1a({0x00, 0x00, 0x80, 0x3F}));
    CHECK(params_hasher{}.add(1.0).value() == reference_fnv1a({0, 0, 0, 0, 0, 0, 0xF0, 0x3F}));
    CHECK(params_hasher{}.add(std::uint64_t{0x0807060504030201ull}).value() ==
          reference_fnv1a({1, 2, 3, 4, 5, 6, 7, 8}));
    CHECK(params_hasher{}.add(std::int16_t{-2}).value() == reference_fnv1a({0xFE, 0xFF}));
  }
  SUBCASE("order and width of the fields matter") {
    CHECK(params_hasher{}.add(std::uint32_t{1}).add(std::uint32_t{2}).value() !=
          params_hasher{}.add(std::uint32_t{2}).add(std::uint32_t{1}).value());
    CHECK(params_hasher{}.add(std::uint32_t{1}).value() != params_hasher{}.add(std::uint64_t{1}).value());
    CHECK(params_hasher{}.add(0.5).value() != params_hasher{}.add(0.25).value());
  }
}

TEST_CASE("dtype_of, dtype_size and message_key follow the wire values") {
  CHECK(gradcomp::dtype_of<float> == value_dtype::float32);
  CHECK(gradcomp::dtype_of<double> == value_dtype::float64);
  CHECK(gradcomp::dtype_size(value_dtype::float32) == 4);
  CHECK(gradcomp::dtype_size(value_dtype::float64) == 8);
  CHECK(gradcomp::dtype_size(static_cast<value_dtype>(0)) == 0);
  CHECK(gradcomp::dtype_of<gradcomp::bf16> == value_dtype::bfloat16);
  CHECK(gradcomp::dtype_of<gradcomp::fp16> == value_dtype::float16);
  CHECK(static_cast<int>(value_dtype::bfloat16) == 3);
  CHECK(static_cast<int>(value_dtype::float16) == 4);
  CHECK(gradcomp::dtype_size(value_dtype::bfloat16) == 2);
  CHECK(gradcomp::dtype_size(value_dtype::float16) == 2);
  CHECK(gradcomp::dtype_size(static_cast<value_dtype>(5)) == 0);
  CHECK(static_cast<int>(codec_id::topk) == 1);
  CHECK(static_cast<int>(codec_id::random_k) == 2);
  CHECK(static_cast<int>(codec_id::threshold) == 3);
  CHECK(gradcomp::message_key{1, 2} == gradcomp::message_key{1, 2});
  CHECK_FALSE(gradcomp::message_key{1, 2} == gradcomp::message_key{1, 3});
  CHECK_FALSE(gradcomp::message_key{1, 2} == gradcomp::message_key{2, 2});
}

TEST_CASE("gradcomp::errc converts to std::error_code in the \"gradcomp\" category") {
  const std::error_code ec = errc::truncated;
  CHECK(std::string(ec.category().name()) == "gradcomp");
  CHECK(ec.value() == 4);
  CHECK(ec.message() == "truncated");
  CHECK(ec.message() == std::string(gradcomp::to_string(errc::truncated)));
  CHECK(ec == gradcomp::make_error_code(errc::truncated));
  CHECK(ec != gradcomp::make_error_code(errc::bad_magic));
  CHECK(&gradcomp::make_error_code(errc::header_checksum).category() == &gradcomp::error_category());
  CHECK(gradcomp::make_error_code(errc::too_large).message() == "too_large");
}

TEST_CASE("errc values and names are the documented stable ones") {
  struct entry {
    errc code;
    int value;
    const char* name;
  };
  const entry table[] = {
      {errc::invalid_argument, 1, "invalid_argument"},
      {errc::buffer_too_small, 2, "buffer_too_small"},
      {errc::workspace_too_small, 3, "workspace_too_small"},
      {errc::truncated, 4, "truncated"},
      {errc::trailing_bytes, 5, "trailing_bytes"},
      {errc::bad_magic, 6, "bad_magic"},
      {errc::unsupported_version, 7, "unsupported_version"},
      {errc::header_checksum, 8, "header_checksum"},
      {errc::payload_checksum, 9, "payload_checksum"},
      {errc::codec_mismatch, 10, "codec_mismatch"},
      {errc::dtype_mismatch, 11, "dtype_mismatch"},
      {errc::size_mismatch, 12, "size_mismatch"},
      {errc::too_large, 13, "too_large"},
      {errc::parameter_mismatch, 14, "parameter_mismatch"},
      {errc::malformed_payload, 15, "malformed_payload"},
      {errc::non_finite_input, 16, "non_finite_input"},
      {errc::step_mismatch, 17, "step_mismatch"},
      {errc::malformed_envelope, 18, "malformed_envelope"},
      {errc::peeling_stalled, 19, "peeling_stalled"},
      {errc::peer_failed, 20, "peer_failed"},
      {errc::transport_failed, 21, "transport_failed"},
      {errc::device_failed, 22, "device_failed"},
      {errc::timeout, 23, "timeout"},
      {errc::narrowing_overflow, 24, "narrowing_overflow"},
  };
  for (const entry& x : table) {
    CAPTURE(x.name);
    CHECK(static_cast<int>(x.code) == x.value);
    CHECK(std::string(gradcomp::to_string(x.code)) == x.name);
    CHECK(gradcomp::make_error_code(x.code).message() == x.name);
  }
  CHECK(std::string(gradcomp::to_string(static_cast<errc>(0))) == "unknown");
  CHECK(std::string(gradcomp::to_string(static_cast<errc>(200))) == "unknown");
}

TEST_CASE("gradcomp::error carries its errc and explains itself starting with the errc name") {
  const gradcomp::error e(errc::size_mismatch, "n is 3, expected 4");
  CHECK(e.code() == errc::size_mismatch);
  CHECK(std::string(e.what()) == "size_mismatch: n is 3, expected 4");
  CHECK(e.detail_text() == "n is 3, expected 4");
  const std::runtime_error& base = e;
  CHECK(std::string(base.what()).find("n is 3") != std::string::npos);
}
