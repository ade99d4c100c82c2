// ZFP fixed-rate codec against libzfp itself (built only where libzfp is found; see
// tests/CMakeLists.txt): for every rate and several input distributions the payload equals
// zfp_compress's output byte for byte (libzfp with 8-bit stream words, as Debian builds it; with
// 64-bit words libzfp appends zero bytes up to a whole word, which is checked too), and the
// decoded floats equal zfp_decompress's bit for bit. The golden file's payload is libzfp's
// output for its input; a bf16 or fp16 gradient's payload is libzfp's stream of its widened
// values. Blocks below 2^−98, where libzfp's cast overflows (zfp issue #119), are
// the documented difference and do not occur in these inputs.
#include <gradcomp/lossless/zfp_fixed_rate.hpp>

#include <doctest/doctest.h>
#include <zfp.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "support/codec_io.hpp"
#include "support/data.hpp"
#include "support/golden_cases.hpp"
#include "support/zfp_inputs.hpp"

using namespace gradcomp;
using namespace gradcomp::test;

namespace {

struct libzfp_result {
  std::vector<std::byte> stream;  ///< zfp_compress's output, `zfp_compress`'s size.
  std::vector<float> values;      ///< zfp_decompress of that stream.
};

// libzfp in fixed-rate mode, unaligned: zfp_stream_set_rate(zfp, R, zfp_type_float, 1, zfp_false).
libzfp_result libzfp_round_trip(std::vector<float> x, unsigned rate) {
  const std::size_t n = x.size();
  zfp_field* field = zfp_field_1d(x.data(), zfp_type_float, n);
  zfp_stream* zfp = zfp_stream_open(nullptr);
  zfp_stream_set_rate(zfp, rate, zfp_type_float, 1, zfp_false);
  std::vector<unsigned char> buffer(zfp_stream_maximum_size(zfp, field) + 64);
  bitstream* stream = stream_open(buffer.data(), buffer.size());
  zfp_stream_set_bit_stream(zfp, stream);
  zfp_stream_rewind(zfp);
  const std::size_t size = zfp_compress(zfp, field);
  zfp_stream_flush(zfp);
  libzfp_result result;
  result.stream.resize(size);
  std::memcpy(result.stream.data(), buffer.data(), size);
  result.values.assign(n, 0.0f);
  zfp_field* decoded = zfp_field_1d(result.values.data(), zfp_type_float, n);
  zfp_stream_rewind(zfp);
  const std::size_t read = zfp_decompress(zfp, decoded);
  CHECK(read == size);
  zfp_field_free(decoded);
  zfp_field_free(field);
  zfp_stream_close(zfp);
  stream_close(stream);
  return result;
}

// The codec's payload equals libzfp's stream, whose length is ⌈bits / stream word⌉ words.
bool payload_matches(std::span<const std::byte> payload, const std::vector<std::byte>& stream) {
  const std::size_t word = stream_word_bits / 8;
  if (stream.size() != (payload.size() + word - 1) / word * word) return false;
  if (!std::equal(payload.begin(), payload.end(), stream.begin())) return false;
  return std::all_of(stream.begin() + static_cast<std::ptrdiff_t>(payload.size()), stream.end(),
                     [](std::byte b) { return b == std::byte{0}; });
}

}  // namespace

TEST_CASE("libzfp: zfp payloads equal zfp_compress's stream and decode to zfp_decompress's floats") {
  MESSAGE("libzfp ", std::string(zfp_version_string), ", stream words of ", stream_word_bits, " bits");
  std::vector<std::size_t> sizes;
  for (std::size_t n = 1; n <= 17; ++n) sizes.push_back(n);  // libzfp does not take an empty field
  sizes.push_back(1003);
  for (unsigned rate = 3; rate <= 32; ++rate) {
    const zfp_fixed_rate_codec<float> q({.rate_bits = rate});
    for (const zfp_input kind : all_zfp_inputs) {
      for (const std::size_t n : sizes) {
        CAPTURE(rate);
        CAPTURE(static_cast<int>(kind));
        CAPTURE(n);
        const std::vector<float> x = zfp_test_input(kind, n, 31 * n + rate);
        const libzfp_result reference = libzfp_round_trip(x, rate);
        const std::vector<std::byte> m = encode_bytes(q, x);
        CHECK(payload_matches(std::span<const std::byte>(m).subspan(envelope::size), reference.stream));
        CHECK(same_bits(decode_values(q, m, n), reference.values));
      }
    }
  }
}

TEST_CASE("libzfp: the golden zfp file's payload is libzfp's stream for its input") {
  const std::vector<std::byte> m = read_golden("zfp_fixed_rate_r8_f32.bin");
  REQUIRE(m.size() > envelope::size);
  const libzfp_result reference = libzfp_round_trip(golden_input<float>(1000), 8);
  CHECK(payload_matches(std::span<const std::byte>(m).subspan(envelope::size), reference.stream));
  CHECK(same_bits(decode_values(zfp_fixed_rate_codec<float>({.rate_bits = 8}), m, 1000), reference.values));
}

TEST_CASE_TEMPLATE("libzfp: a 16-bit gradient's payload is zfp_compress's stream of its widened values", H, bf16,
                   fp16) {
  // 1537 values: three of the CPU encoder's 512-value stages and a partial block.
  for (const unsigned rate : {3u, 8u, 12u, 17u, 32u}) {
    CAPTURE(rate);
    const std::vector<H> x = make_half_input<H>(input_kind::normal, 1537, rate, 50.0f);
    const libzfp_result reference = libzfp_round_trip(widened(x), rate);
    const zfp_fixed_rate_codec<H> q({.rate_bits = rate});
    const std::vector<std::byte> m = encode_bytes(q, x);
    CHECK(payload_matches(std::span<const std::byte>(m).subspan(envelope::size), reference.stream));
    std::vector<float> as_float(x.size());
    q.decode(cpu_executor{}, m, std::span<float>(as_float), {});
    CHECK(same_bits(as_float, reference.values));
  }
  const std::vector<std::byte> golden = read_golden("zfp_fixed_rate_r12_fp16.bin");
  CHECK(payload_matches(std::span<const std::byte>(golden).subspan(envelope::size),
                        libzfp_round_trip(widened(golden_input<fp16>(1000)), 12).stream));
}
