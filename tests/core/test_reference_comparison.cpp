// compare_encoding and compare_decoding (reference/comparison.hpp): bytes written by another
// backend compare equal to the reference's; a changed byte is found at its offset and named with
// the field and elements that docs/wire-format.md gives for it (the expected fields are worked out
// here from the documented layouts, not asked of the code under test); truncated and overlong
// messages, inputs the reference rejects, and decoded tensors that differ by one bit; the pipeline's
// nested message, MPC's groups and ZFP's blocks.
#include <gradcomp/gradcomp.hpp>

#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "support/data.hpp"

using namespace gradcomp;
using namespace gradcomp::test;

namespace {

constexpr message_key comparison_key{.step = 11, .tensor_id = 5};

/// The message `codec` writes on the CPU backend for `x`.
template <class Codec>
std::vector<std::byte> cpu_message(const Codec& codec, const std::vector<typename Codec::value_type>& x) {
  const cpu_executor cpu;
  std::vector<std::byte> out(codec.max_encoded_bytes(x.size()));
  std::vector<std::byte> ws(codec.workspace_bytes(cpu, x.size()));
  out.resize(codec.encode(cpu, std::span<const typename Codec::value_type>(x), out, ws, comparison_key));
  return out;
}

/// `message` with byte `at` changed.
std::vector<std::byte> flipped(std::vector<std::byte> message, std::size_t at) {
  message[at] ^= std::byte{0x10};
  return message;
}

/// Compares `given` with the reference's encoding of `x` and checks the reported position and field.
template <class Codec>
encoding_comparison expect_field(const Codec& codec, const std::vector<typename Codec::value_type>& x,
                                 const std::vector<std::byte>& given, std::size_t at, const std::string& name,
                                 std::size_t first_byte, std::size_t bytes, std::uint64_t first_element,
                                 std::uint64_t elements) {
  const encoding_comparison c = compare_encoding(codec, std::span<const typename Codec::value_type>(x), comparison_key,
                                                 std::span<const std::byte>(given));
  INFO(c.describe());
  CHECK_FALSE(c.same);
  CHECK(c.reference_error.empty());
  CHECK(c.first_difference == at);
  CHECK(c.field.name == name);
  CHECK(c.field.first_byte == first_byte);
  CHECK(c.field.bytes == bytes);
  CHECK(c.field.first_element == first_element);
  CHECK(c.field.elements == elements);
  return c;
}

}  // namespace

TEST_CASE("compare_encoding: the CPU backend's messages are the reference's, for every codec it lays out") {
  const std::vector<float> x = make_input<float>(input_kind::normal, 1000, 3);
  const std::vector<double> xd = make_input<double>(input_kind::ties, 777, 4);
  const auto same = [](const auto& codec, const auto& input) {
    const auto message = cpu_message(codec, input);
    using T = typename std::decay_t<decltype(codec)>::value_type;
    const encoding_comparison c =
        compare_encoding(codec, std::span<const T>(input), comparison_key, std::span<const std::byte>(message));
    INFO(c.describe());
    CHECK(c.same);
    CHECK(c.reference_bytes == message.size());
    CHECK(c.describe() == "same as the reference (" + std::to_string(message.size()) + " bytes)");
  };
  same(uniform_quantizer<float>(uniform_params{.bits = 4}), x);
  same(uniform_quantizer<double>(uniform_params{.bits = 2, .round = rounding::stochastic, .seed = 9}), xd);
  same(sign_quantizer<float>(), x);
  same(qsgd_quantizer<double>(qsgd_params{.levels = 7, .seed = 2}), xd);
  same(topk_sparsifier<float>(sparsity{.density = 0.01}), x);
  same(randomk_sparsifier<double>(randomk_params{.amount = sparsity{.density = 0.1}, .seed = 5}), xd);
  same(threshold_sparsifier<float>(), x);
  same(count_sketch<double>({.rows = 4, .columns = 50, .seed = 3}), xd);
  same(pipeline(topk_sparsifier<float>(sparsity{.density = 0.05}), uniform_quantizer<float>(uniform_params{.bits = 4})),
       x);
  same(mpc_codec<float>(mpc_params{.dim = 3}), x);
  same(zfp_fixed_rate_codec<float>(zfp_params{.rate_bits = 7}), x);
}

TEST_CASE("compare_encoding: the uniform quantizer's envelope fields, scales, codes, truncation and overlong bytes") {
  // n = 1000 in blocks of 256: 4 float scales (payload bytes 0..15), then 4-bit codes, two per byte
  // (docs/wire-format.md §9.1): message bytes 56..71 scales, 72..571 codes.
  const uniform_quantizer<float> q(uniform_params{.bits = 4});
  const std::vector<float> x = make_input<float>(input_kind::normal, 1000, 3);
  const std::vector<std::byte> m = cpu_message(q, x);
  REQUIRE(m.size() == 56 + 16 + 500);

  expect_field(q, x, flipped(m, 35), 35, "envelope params_hash", 32, 8, 0, 0);
  expect_field(q, x, flipped(m, 12), 12, "envelope tensor_id", 12, 4, 0, 0);
  expect_field(q, x, flipped(m, 53), 53, "envelope header_crc", 52, 4, 0, 0);
  expect_field(q, x, flipped(m, 56 + 5), 61, "scale of block 1", 60, 4, 256, 256);
  expect_field(q, x, flipped(m, 56 + 12), 68, "scale of block 3", 68, 4, 768, 232);  // the last block: 768..999
  const encoding_comparison code = expect_field(q, x, flipped(m, 72 + 10), 82, "code of elements", 82, 1, 20, 2);
  CHECK(code.reference_byte == static_cast<std::uint8_t>(m[82]));
  CHECK(code.given_byte == static_cast<std::uint8_t>(m[82] ^ std::byte{0x10}));
  CHECK(code.describe().find("first difference at byte 82 (reference 0x") == 0);
  CHECK(code.describe().find("), in code of elements (bytes 82..82), elements 20..21") != std::string::npos);

  // Truncated: the first missing byte is the difference, in the reference's last code byte.
  std::vector<std::byte> shorter(m.begin(), m.end() - 1);
  const encoding_comparison cut = expect_field(q, x, shorter, m.size() - 1, "code of elements", 571, 1, 998, 2);
  CHECK_FALSE(cut.given_byte.has_value());
  CHECK(cut.reference_byte.has_value());
  CHECK(cut.describe().find("sizes differ: reference 572 bytes, given 571") != std::string::npos);
  // One byte too many: past the reference's end.
  std::vector<std::byte> longer = m;
  longer.push_back(std::byte{0});
  const encoding_comparison extra =
      expect_field(q, x, longer, m.size(), "bytes after the end of the reference's message", 572, 1, 0, 0);
  CHECK_FALSE(extra.reference_byte.has_value());

  // 3 values at 4 bits: the codes end inside byte 1; its high nibble is padding.
  const std::vector<float> three = {1.0f, -2.0f, 0.5f};
  const std::vector<std::byte> small = cpu_message(q, three);
  REQUIRE(small.size() == 56 + 4 + 2);
  expect_field(q, three, flipped(small, 61), 61, "code of element", 61, 1, 2, 1);
  const std::vector<std::byte> padded = [&] {
    std::vector<std::byte> b = small;
    b[61] ^= std::byte{0x80};
    return b;
  }();
  expect_field(q, three, padded, 61, "code of element", 61, 1, 2, 1);  // byte 1 holds element 2 and padding
}

TEST_CASE("compare_encoding: sign bits, QSGD codes and norms") {
  const std::vector<float> x = make_input<float>(input_kind::normal, 600, 8);
  // Sign, blocks of 256: 3 scales (bytes 56..67), then one bit per element (docs/wire-format.md §10.1).
  const sign_quantizer<float> s;
  const std::vector<std::byte> ms = cpu_message(s, x);
  REQUIRE(ms.size() == 56 + 12 + 75);
  expect_field(s, x, flipped(ms, 68 + 5), 73, "sign bit of elements", 73, 1, 40, 8);
  expect_field(s, x, flipped(ms, 64), 64, "scale of block 2", 64, 4, 512, 88);
  // QSGD with 15 levels: 8-bit codes (docs/wire-format.md §11.1); buckets of 100: 6 norms.
  const qsgd_quantizer<float> g(qsgd_params{.levels = 15, .bucket = 100, .seed = 1});
  const std::vector<std::byte> mg = cpu_message(g, x);
  REQUIRE(mg.size() == 56 + 24 + 600);
  expect_field(g, x, flipped(mg, 80 + 3), 83, "code of element", 83, 1, 3, 1);
  expect_field(g, x, flipped(mg, 56 + 21), 77, "norm of bucket 5", 76, 4, 500, 100);
}

TEST_CASE("compare_encoding: top-k and threshold name the kept element of an index or a value") {
  const std::vector<float> x = make_input<float>(input_kind::normal, 1000, 5);
  // k = 10 of 1000: a u32 list (40 bytes, a multiple of 8), then 10 values (docs/wire-format.md §4.1).
  const topk_sparsifier<float> topk(sparsity{.density = 0.01});
  const std::vector<std::byte> m = cpu_message(topk, x);
  REQUIRE(m.size() == 56 + 8 + 40 + 40);
  const auto index_in_message = [&](std::size_t j) {
    std::uint32_t i;
    std::memcpy(&i, m.data() + 64 + 4 * j, 4);
    return std::uint64_t{i};
  };
  expect_field(topk, x, flipped(m, 58), 58, "count k", 56, 8, 0, 0);
  expect_field(topk, x, flipped(m, 64 + 9), 73, "index of kept value 2", 72, 4, index_in_message(2), 1);
  const encoding_comparison value =
      expect_field(topk, x, flipped(m, 104 + 3 * 4 + 1), 117, "kept value 3", 116, 4, index_in_message(3), 1);
  float kept;
  std::memcpy(&kept, m.data() + 116, 4);
  CHECK(kept == x[value.field.first_element]);  // the element named holds the value sent

  // Half of 1000 kept: the bitmap (125 bytes, padded to 128) is smaller than a list.
  const topk_sparsifier<float> half(sparsity{.density = 0.5});
  const std::vector<std::byte> mh = cpu_message(half, x);
  REQUIRE(mh.size() == 56 + 8 + 128 + 500 * 4);
  expect_field(half, x, flipped(mh, 64 + 5), 69, "bitmap byte 5", 69, 1, 40, 8);
  expect_field(half, x, flipped(mh, 64 + 126), 190, "index section padding", 190, 1, 0, 0);

  // Threshold's message is the same sparse layout.
  const threshold_sparsifier<float> th;
  const std::vector<std::byte> mt = cpu_message(th, x);
  expect_field(th, x, flipped(mt, 57), 57, "count k", 56, 8, 0, 0);
}

TEST_CASE("compare_encoding: random-k's value j names element pi(j), whose value it holds") {
  const std::vector<double> x = make_input<double>(input_kind::normal, 500, 6);
  const randomk_sparsifier<double> rk(randomk_params{.amount = sparsity{.density = 0.1}, .seed = 3});
  const std::vector<std::byte> m = cpu_message(rk, x);
  REQUIRE(m.size() == 56 + 50 * 8);
  const encoding_comparison c = compare_encoding(rk, std::span<const double>(x), comparison_key,
                                                 std::span<const std::byte>(flipped(m, 56 + 7 * 8 + 2)));
  CHECK(c.field.name == "value 7");
  CHECK(c.field.first_byte == 56 + 56);
  CHECK(c.field.elements == 1);
  double sent;
  std::memcpy(&sent, m.data() + 56 + 56, 8);
  REQUIRE(c.field.first_element < x.size());
  CHECK(sent == x[c.field.first_element]);
}

TEST_CASE("compare_encoding: a count sketch's cell b of row j") {
  // r = 3 rows of c = 10 float cells: cell b of row j at message offset 56 + 4·(10·j + b) (docs/wire-format.md §16.1).
  const count_sketch<float> cs({.rows = 3, .columns = 10, .seed = 4});
  const std::vector<float> x = make_input<float>(input_kind::normal, 200, 1);
  const std::vector<std::byte> m = cpu_message(cs, x);
  REQUIRE(m.size() == 56 + 120);
  expect_field(cs, x, flipped(m, 56 + 4 * 17 + 2), 56 + 70, "cell 7 of row 1", 56 + 68, 4, 0, 0);
}

TEST_CASE("compare_encoding: a pipeline's index section, then its nested message's fields by kept value") {
  // k = 10 of 1000: count and a u32 list (8 + 40 bytes), then the 8-bit quantizer's message of the
  // 10 kept values: its 56-byte envelope, one float scale (block 256), 10 codes (docs/wire-format.md §12.1).
  const std::vector<float> x = make_input<float>(input_kind::normal, 1000, 8);
  const pipeline p(topk_sparsifier<float>(sparsity{.density = 0.01}),
                   uniform_quantizer<float>(uniform_params{.bits = 8}));
  const std::vector<std::byte> m = cpu_message(p, x);
  REQUIRE(m.size() == 56 + 48 + 56 + 4 + 10);
  const auto index_in_message = [&](std::size_t j) {
    std::uint32_t i;
    std::memcpy(&i, m.data() + 64 + 4 * j, 4);
    return std::uint64_t{i};
  };
  expect_field(p, x, flipped(m, 60), 60, "count k", 56, 8, 0, 0);
  expect_field(p, x, flipped(m, 64 + 4 * 6), 88, "index of kept value 6", 88, 4, index_in_message(6), 1);
  expect_field(p, x, flipped(m, 104 + 33), 137, "nested envelope params_hash", 104 + 32, 8, 0, 0);
  expect_field(p, x, flipped(m, 160 + 1), 161, "nested scale of block 0 (kept values 0..9)", 160, 4,
               index_in_message(0), 1);
  expect_field(p, x, flipped(m, 164 + 4), 168, "nested code of element (kept value 4)", 168, 1, index_in_message(4), 1);
}

TEST_CASE("compare_encoding: MPC's bitmaps and kept words name their group, ZFP's bytes their blocks") {
  // MPC, n = 100: 4 groups (the last of 4 elements), bitmaps at payload words 0..3, then the kept
  // words group after group (docs/wire-format.md §17).
  const std::vector<float> x = make_input<float>(input_kind::normal, 100, 9);
  const mpc_codec<float> mpc;
  const std::vector<std::byte> m = cpu_message(mpc, x);
  std::uint32_t bitmap[4];
  std::memcpy(bitmap, m.data() + 56, 16);
  expect_field(mpc, x, flipped(m, 56 + 4 * 3 + 1), 69, "bitmap of group 3", 68, 4, 96, 4);
  const auto in_group0 = static_cast<std::size_t>(std::popcount(bitmap[0]));
  const std::size_t word = 4 + in_group0;  // the first kept word of group 1
  expect_field(mpc, x, flipped(m, 56 + 4 * word), 56 + 4 * word, "kept word 0 of group 1", 56 + 4 * word, 4, 32, 32);

  // ZFP at R = 7: 28 bits per block of 4; payload byte 7 holds stream bits 56..63, all of block 2
  // (bits 56..83); byte 10 holds bits 80..87, blocks 2 and 3 (docs/wire-format.md §18).
  const zfp_fixed_rate_codec<float> zfp(zfp_params{.rate_bits = 7});
  const std::vector<std::byte> z = cpu_message(zfp, x);
  expect_field(zfp, x, flipped(z, 56 + 7), 63, "stream bits of block 2", 63, 1, 8, 4);
  expect_field(zfp, x, flipped(z, 56 + 10), 66, "stream bits of blocks 2..3", 66, 1, 8, 8);
}

TEST_CASE("compare_encoding: an input the reference rejects is reported, not compared") {
  std::vector<float> x(100, 1.0f);
  x[17] = std::numeric_limits<float>::quiet_NaN();
  const uniform_quantizer<float> q;
  const std::vector<std::byte> anything(56);
  const encoding_comparison c =
      compare_encoding(q, std::span<const float>(x), comparison_key, std::span<const std::byte>(anything));
  CHECK_FALSE(c.same);
  CHECK(c.reference_error.find("non_finite_input") == 0);
  CHECK(c.describe().find("the reference rejects this input: non_finite_input") == 0);
}

TEST_CASE("compare_decoding: the first element whose bits differ, -0 against +0 included") {
  const std::vector<float> x = make_input<float>(input_kind::signed_zeros, 300, 2);
  const topk_sparsifier<float> topk(sparsity{.density = 0.5});
  const std::vector<std::byte> m = cpu_message(topk, x);
  const cpu_executor cpu;
  std::vector<float> decoded(x.size());
  std::vector<std::byte> ws(topk.workspace_bytes(cpu, x.size()));
  topk.decode(cpu, std::span<const std::byte>(m), std::span<float>(decoded), ws);
  CHECK(compare_decoding(topk, m, std::span<const float>(decoded)).same);

  std::vector<float> off = decoded;
  std::size_t zero = 0;
  while (zero < off.size() && !(off[zero] == 0.0f)) ++zero;
  REQUIRE(zero < off.size());
  off[zero] = std::signbit(off[zero]) ? 0.0f : -0.0f;  // equal as floats, different bits
  off[299] = std::nextafter(off[299], 1.0f);
  const decoding_comparison<float> c = compare_decoding(topk, m, std::span<const float>(off));
  CHECK_FALSE(c.same);
  CHECK(c.first_difference == zero);
  CHECK(c.differing == (zero == 299 ? 1 : 2));
  CHECK(c.describe().find("element " + std::to_string(zero)) != std::string::npos);

  // A message the reference rejects (a changed envelope byte fails the header CRC) is reported as such.
  const decoding_comparison<float> bad = compare_decoding(topk, flipped(m, 20), std::span<const float>(decoded));
  CHECK(bad.reference_error.find("header_checksum") == 0);
}
