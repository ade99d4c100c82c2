// The lane layouts of the CUDA kernels, checked on the CPU (no GPU needed): which elements each
// lane of a warp holds (quads, cuda/detail/lane_layout.cuh), which code words it stores and what they
// hold, which random words stochastic rounding gives each value, which elements the block-sum
// tiles stage, the decoders' block of a word and the check's items (their code bytes, each quad's
// block, the codes read from them), and the alignment decisions. Each is checked
// exhaustively over the layouts the kernels take, against independent oracles: the packed codes
// of core/bit_packing.hpp, the Philox stream's words, plain division.
//
// On a GPU the same paths run against the CPU reference (the "cuda:" cases): the quad kernels of
// the uniform quantizer, error feedback and LoCo and the word decoders, with gradients and outputs
// that start 16-byte aligned or not (the scalar fallback), sizes around quads, rows and blocks,
// blocks that fit the quads and blocks that do not, both roundings, tiny blocks (whose L/m
// overflows) and zero blocks.
#include <gradcomp/cuda.cuh>

#include <doctest/doctest.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <set>
#include <span>
#include <utility>
#include <vector>

#include "cuda/device_io.cuh"
#include "support/data.hpp"
#include "support/executor_io.hpp"

using namespace gradcomp;
using namespace gradcomp::detail::cuda;
using gradcomp::test::bit_patterns;
using gradcomp::test::input_kind;
using gradcomp::test::make_input;

namespace {

/// Block sizes that fit the quads, and some that do not.
constexpr std::uint64_t fitting_blocks[] = {8, 16, 24, 32, 64, 120, 128, 136, 200, 248, 256};

/// A made-up b-bit code of element i (any function of i does).
std::uint8_t code_of(std::uint64_t i, int bits) { return static_cast<std::uint8_t>((i * 37 + 11) % (1u << bits)); }

}  // namespace

TEST_CASE("kernel layout: quads_fit takes 8- and 4-bit codes in blocks of 8 to 256 values, a multiple of 8") {
  for (const int bits : {1, 2, 4, 8})
    for (std::uint64_t block = 1; block <= 1024; ++block) {
      CAPTURE(bits);
      CAPTURE(block);
      const bool fits = quads_fit(block, bits);
      if (fits) {
        // Whole code words per block (the one-kernel layout), whole Philox blocks (8 values), and
        // at most two quads per lane.
        CHECK(block * static_cast<unsigned>(bits) % 32 == 0);
        CHECK(block % 8 == 0);
        CHECK(block <= 32 * quad_values * quad_rows);
      }
      CHECK(fits == ((bits == 4 || bits == 8) && block % 8 == 0 && block <= 256));
    }
}

TEST_CASE("kernel layout: the lanes' quads hold every element of a block once, and nothing past it") {
  for (const std::uint64_t block : fitting_blocks)
    for (std::uint64_t count = 1; count <= block; ++count) {
      CAPTURE(block);
      CAPTURE(count);
      std::vector<int> held(block, 0);
      for (unsigned lane = 0; lane < 32; ++lane)
        for (unsigned row = 0; row < quad_rows; ++row) {
          const unsigned first = quad_offset(row, lane);
          CHECK(first % quad_values == 0);  // whole 128-bit accesses from an aligned block start
          const unsigned values = quad_count(count, first);
          CHECK(values <= quad_values);
          for (unsigned e = 0; e < values; ++e) {
            REQUIRE(first + e < count);
            ++held[first + e];
          }
          if (values < quad_values) CHECK(first + values >= count);  // a quad is cut only by the block's end
        }
      for (std::uint64_t i = 0; i < count; ++i) CHECK(held[i] == 1);
    }
}

TEST_CASE("kernel layout: the quads' code words are stored once each and hold the block's packed codes") {
  for (const int bits : {4, 8})
    for (const std::uint64_t block : fitting_blocks) {
      if (!quads_fit(block, bits)) continue;
      for (std::uint64_t count = 1; count <= block; ++count) {
        CAPTURE(bits);
        CAPTURE(block);
        CAPTURE(count);
        // The oracle: the block's codes packed by core/bit_packing.hpp, in whole words.
        std::vector<std::uint8_t> codes(count);
        for (std::uint64_t i = 0; i < count; ++i) codes[i] = code_of(i, bits);
        const std::uint64_t words = (count * static_cast<unsigned>(bits) + 31) / 32;
        std::vector<std::uint8_t> packed(4 * words, 0);
        pack_codes(codes, bits, packed);
        // Each lane's pieces: its quads' codes packed from bit 0, masked to the block.
        std::uint32_t pieces[32][quad_rows] = {};
        for (unsigned lane = 0; lane < 32; ++lane)
          for (unsigned row = 0; row < quad_rows; ++row) {
            std::uint32_t all = 0;
            for (unsigned e = 0; e < quad_values; ++e)
              all |= std::uint32_t{code_of(quad_offset(row, lane) + e, bits)} << (e * static_cast<unsigned>(bits));
            pieces[lane][row] = all & quad_piece_mask(quad_count(count, quad_offset(row, lane)), bits);
          }
        std::vector<int> stored(words, 0);
        for (unsigned lane = 0; lane < 32; ++lane)
          for (unsigned slot = 0; slot < quad_rows; ++slot) {
            const int index = quad_word_index(bits, lane, slot);
            if (index < 0 || static_cast<std::uint64_t>(index) >= words) continue;
            ++stored[static_cast<std::size_t>(index)];
            const std::uint32_t word = quad_word(bits, lane, slot, pieces[lane], pieces[lane ^ 1u]);
            std::uint32_t expected = 0;
            for (unsigned b = 0; b < 4; ++b)
              expected |= std::uint32_t{packed[4 * static_cast<unsigned>(index) + b]} << (8 * b);
            CHECK(word == expected);
          }
        for (std::uint64_t w = 0; w < words; ++w) CHECK(stored[w] == 1);
      }
    }
}

TEST_CASE("kernel layout: each lane computes one Philox block, and every value draws the CPU's stream half") {
  const random_stream stream{.seed = 0x1234'5678'9ABCull, .step = 77, .tensor_id = 5};
  for (const std::uint64_t block : fitting_blocks)
    for (const std::uint64_t j : {0ull, 1ull, 3ull, 1000ull, (1ull << 33) + 5}) {
      CAPTURE(block);
      CAPTURE(j);
      const std::uint64_t begin = j * block;
      philox_block own[32];
      word_pair sent[32];
      std::set<std::uint64_t> computed;
      for (unsigned lane = 0; lane < 32; ++lane) {
        const std::uint64_t b = quad_random_block(begin, lane);
        computed.insert(b);
        own[lane] = stream.block(b);
        sent[lane] = quad_random_sent(lane, own[lane]);
      }
      CHECK(computed.size() == 32);  // no block computed twice
      for (unsigned lane = 0; lane < 32; ++lane)
        for (unsigned row = 0; row < quad_rows; ++row) {
          const word_pair words = quad_random_words(lane, row, own[lane], sent[lane ^ 1u]);  // the shuffle
          for (unsigned e = 0; e < quad_values; ++e) {
            const std::uint64_t i = begin + quad_offset(row, lane) + e;
            if (i - begin >= block) continue;
            const std::uint32_t w = stream.word(i / 2);
            CHECK(quad_random_half(words, e) == (i % 2 == 0 ? (w & 0xFFFFu) : (w >> 16)));
          }
        }
    }
  // Why blocks must hold a multiple of 8 values: the pairing needs blocks on Philox block boundaries.
  const std::uint64_t begin = 100;  // block 1 of blocks of 100
  const philox_block own0 = stream.block(quad_random_block(begin, 0));
  const philox_block own1 = stream.block(quad_random_block(begin, 1));
  const word_pair words = quad_random_words(0, 0, own0, quad_random_sent(1, own1));
  CHECK(quad_random_half(words, 0) != (stream.word(begin / 2) & 0xFFFFu));
}

TEST_CASE(
    "kernel layout: the block-sum tiles stage every value of 32 blocks once per column chunk, and no empty chunk") {
  const auto check = [](auto zero, std::uint64_t n, std::uint64_t block) {
    using T = decltype(zero);
    constexpr unsigned columns = tile_columns<T>;
    CHECK(columns * sizeof(T) == 128);
    const std::uint64_t blocks = (n + block - 1) / block;
    for (std::uint64_t first = 0; first < blocks; first += 32) {
      std::vector<int> staged(n, 0);
      // The chunks run to the group's longest block, not to the block size: a block far larger
      // than n (one scale for the whole tensor) would otherwise take up to 2^27 empty chunks.
      for (std::uint64_t k = 0; k < tile_length(n, block, first); k += columns) {
        std::uint64_t in_chunk = 0;
        std::set<std::pair<unsigned, unsigned>> cells;
        for (unsigned step = 0; step < columns; ++step)
          for (unsigned lane = 0; lane < 32; ++lane) {
            const unsigned row = tile_row<T>(step, lane);
            const unsigned column = tile_column<T>(lane);
            REQUIRE(row < 32);
            REQUIRE(column < columns);
            cells.insert({row, column});
            const std::uint64_t i = tile_element(n, block, first, row, k, column);
            if (i == no_element) continue;
            REQUIRE(i < n);
            CHECK(i / block == first + row);  // the row's own block
            CHECK(i % block == k + column);   // in index order within it
            ++staged[i];
            ++in_chunk;
          }
        CHECK(cells.size() == 32 * columns);  // one load per cell
        CHECK(in_chunk > 0);
      }
      for (std::uint64_t i = first * block; i < n && i < (first + 32) * block; ++i) CHECK(staged[i] == 1);
    }
  };
  for (const std::uint64_t n : {1ull, 31ull, 256ull, 1000ull, 8195ull})
    for (const std::uint64_t block : {1ull, 7ull, 16ull, 33ull, 100ull, 256ull, 100'000ull, 0xFFFF'FFFFull}) {
      CAPTURE(n);
      CAPTURE(block);
      check(0.0f, n, block);
      check(0.0, n, block);
    }
}

TEST_CASE("kernel layout: index_divisor divides exactly by shift, 32-bit and 64-bit division") {
  const std::uint64_t xs[] = {0,
                              1,
                              2,
                              63,
                              64,
                              65,
                              1000,
                              4095,
                              65535,
                              1ull << 31,
                              (1ull << 32) - 1,
                              1ull << 32,
                              (1ull << 32) + 7,
                              0xDEAD'BEEF'1234ull,
                              ~0ull};
  for (std::uint64_t d = 1; d <= 600; ++d)
    for (const std::uint64_t x : xs) CHECK(index_divisor(d)(x) == x / d);
  for (const std::uint64_t d : {1ull << 32, (1ull << 32) + 1, 3ull << 40, 1ull << 63})
    for (const std::uint64_t x : xs) CHECK(index_divisor(d)(x) == x / d);
  CHECK(index_divisor(64).shift == 6);
  CHECK(index_divisor(100).shift == -1);
}

TEST_CASE("kernel layout: a decoder's quads lie in one word of one block, found by shifts and word_block") {
  for (const int bits : {1, 2, 4, 8})
    for (const std::uint64_t n : {0ull, 1ull, 31ull, 20011ull, (1ull << 33) + 5})
      for (const std::uint64_t block : {4ull, 8ull, 12ull, 32ull, 100ull, 256ull, 1000ull, 4096ull}) {
        const block_layout layout{n, block, bits, packed_bytes(n, bits)};
        CAPTURE(bits);
        CAPTURE(n);
        CAPTURE(block);
        // The division-free sizes equal the plain formulas.
        CHECK(layout.per_word() == 32u / static_cast<unsigned>(bits));
        CHECK(layout.words() == (n + 32u / static_cast<unsigned>(bits) - 1) / (32u / static_cast<unsigned>(bits)));
        if (!layout.whole_words() || n > 20011) continue;
        const index_divisor word_block = layout.word_block();
        for (std::uint64_t first = 0; first < n; first += quad_values) {  // decode_quads's mapping
          const std::uint64_t w = first * static_cast<unsigned>(bits) / 32;
          const std::uint64_t c = first & (layout.per_word() - 1);
          for (std::uint64_t i = first; i < first + quad_values && i < n; ++i) {
            CHECK(i / layout.per_word() == w);
            CHECK(i % layout.per_word() == c + (i - first));
            CHECK(i / block == word_block(w));
          }
        }
      }
}

TEST_CASE("kernel layout: the check's items hold 2b code bytes, and their quads lie in one block found by word_block") {
  for (const int bits : {4, 8})
    for (const std::uint64_t n : {1ull, 15ull, 16ull, 17ull, 20011ull})
      for (const std::uint64_t block : {4ull, 8ull, 12ull, 32ull, 100ull, 256ull, 1000ull, 4096ull}) {
        const block_layout layout{n, block, bits, packed_bytes(n, bits)};
        if (!layout.whole_words()) continue;
        CAPTURE(bits);
        CAPTURE(n);
        CAPTURE(block);
        const index_divisor word_block = layout.word_block();
        for (std::uint64_t first = 0; first < n; first += item_values) {  // check_items's mapping
          // The item's codes are the 2b bytes from byte 2b·t: whole bytes, inside the packed array
          // unless the item is the last.
          const std::uint64_t t = first / item_values;
          CHECK(first * static_cast<unsigned>(bits) / 8 == 2 * static_cast<unsigned>(bits) * t);
          if (first + item_values <= n) CHECK(2 * static_cast<unsigned>(bits) * (t + 1) <= layout.code_bytes);
          for (std::uint64_t q = first; q < first + item_values && q < n; q += quad_values)
            for (std::uint64_t i = q; i < q + quad_values && i < n; ++i)
              CHECK(i / block == word_block(q * static_cast<unsigned>(bits) / 32));
        }
      }
}

TEST_CASE("kernel layout: an item's codes are read in the packed array's order, padding found from any code") {
  // 16 random bytes as an item of each width, against the codes read one by one through words.
  std::uint64_t state = 0x9E3779B97F4A7C15ull;
  for (int round = 0; round < 200; ++round) {
    std::array<std::uint8_t, 16> bytes{};
    for (std::uint8_t& b : bytes) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      b = static_cast<std::uint8_t>(state >> 56);
    }
    item_codes c;
    for (unsigned k = 0; k < 16; ++k) (k < 8 ? c.lo : c.hi) |= std::uint64_t{bytes[k]} << (8 * (k % 8));
    for (const int bits : {4, 8}) {
      CAPTURE(bits);
      for (unsigned e = 0; e < item_values; ++e) {
        const unsigned bit = e * static_cast<unsigned>(bits);
        const std::uint32_t word = static_cast<std::uint32_t>(bytes[bit / 32 * 4]) |
                                   static_cast<std::uint32_t>(bytes[bit / 32 * 4 + 1]) << 8 |
                                   static_cast<std::uint32_t>(bytes[bit / 32 * 4 + 2]) << 16 |
                                   static_cast<std::uint32_t>(bytes[bit / 32 * 4 + 3]) << 24;
        CHECK(c.code(e, bits) == ((word >> (bit % 32)) & ((1u << bits) - 1u)));
      }
    }
    for (unsigned used = 0; used < 128; ++used) {
      bool any = false;
      for (unsigned bit = used; bit < 128; ++bit) any = any || ((bytes[bit / 8] >> (bit % 8)) & 1u) != 0;
      CHECK(c.any_from(used) == any);
    }
  }
  alignas(16) std::byte buffer[32] = {};
  CHECK(code_alignment(buffer) == 16);
  CHECK(code_alignment(buffer + 4) == 4);
  CHECK(code_alignment(buffer + 8) == 8);
  CHECK(code_alignment(buffer + 12) == 4);
}

TEST_CASE("kernel layout: 128-bit accesses are taken only for 16-byte aligned pointers") {
  alignas(16) float values[12] = {};
  for (unsigned offset = 0; offset < 8; ++offset) CHECK(vector_aligned(values + offset) == (offset % 4 == 0));
  alignas(16) double wide[6] = {};
  for (unsigned offset = 0; offset < 6; ++offset) CHECK(vector_aligned(wide + offset) == (offset % 2 == 0));
}

TEST_CASE("kernel layout: the LoCo check's quads cover a gradient of any size once") {
  for (std::uint64_t n = 0; n <= 70; ++n) {
    std::vector<int> seen(n, 0);
    const loco_check_gradient<float> check{nullptr, n, false, nullptr, nullptr};
    for (std::uint64_t q = 0; q < check.items(); ++q)
      for (unsigned e = 0; e < quad_count(n, q * quad_values); ++e) ++seen[q * quad_values + e];
    for (std::uint64_t i = 0; i < n; ++i) CHECK(seen[i] == 1);
  }
}

namespace {

/// Host values in device memory from element `offset` of an allocation (cudaMalloc aligns it to
/// 256 bytes, so the span starts offset·sizeof(T) bytes past a 16-byte boundary).
template <class T>
struct offset_span {
  device_array<T> memory;
  std::span<T> span;

  offset_span(const cuda_executor& exec, const std::vector<T>& host, std::size_t offset)
      : memory(test::poisoned<T>(exec, host.size() + offset)), span(memory.span().subspan(offset, host.size())) {
    if (!host.empty())
      GRADCOMP_CUDA_CHECK(cudaMemcpyAsync(span.data(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice,
                                          exec.native_stream()));
  }
  [[nodiscard]] std::vector<T> to_host(const cuda_executor& exec) const {
    std::vector<T> host(span.size());
    if (!host.empty())
      GRADCOMP_CUDA_CHECK(cudaMemcpyAsync(host.data(), span.data(), host.size() * sizeof(T), cudaMemcpyDeviceToHost,
                                          exec.native_stream()));
    exec.synchronize();
    return host;
  }
};

/// The GPU's message of x read from element `offset` of its allocation.
template <class Codec, class T>
std::vector<std::byte> encode_at(const Codec& codec, const std::vector<T>& x, std::size_t offset, message_key key) {
  const cuda_executor exec = test::test_gpu();
  const offset_span<T> g(exec, x, offset);
  device_array<std::byte> out = test::poisoned<std::byte>(exec, codec.max_encoded_bytes(x.size()));
  device_array<std::byte> ws = test::poisoned<std::byte>(exec, codec.workspace_bytes(exec, x.size()));
  const std::size_t size = codec.encode(exec, std::span<const T>(g.span), out.span(), ws.span(), key);
  return test::to_host(exec, out, size);
}

/// The GPU's decoding of `message` into (or onto) `start` held from element `offset` of its allocation.
template <class Codec, class T>
std::vector<T> decode_at(const Codec& codec, const std::vector<std::byte>& message, const std::vector<T>& start,
                         std::size_t offset, bool accumulate) {
  const cuda_executor exec = test::test_gpu();
  const device_array<std::byte> m = test::to_device(exec, message);
  const offset_span<T> out(exec, start, offset);
  device_array<std::byte> ws = test::poisoned<std::byte>(exec, codec.workspace_bytes(exec, start.size()));
  if (accumulate) codec.decode_accumulate(exec, m.span(), out.span, ws.span());
  else
    codec.decode(exec, m.span(), out.span, ws.span());
  return out.to_host(exec);
}

/// Encodes and decodes with the gradient and the output at every offset, against the CPU.
template <class Codec>
void check_offsets_match_cpu(const Codec& codec, std::size_t n, input_kind kind, std::uint64_t seed) {
  using T = typename Codec::value_type;
  CAPTURE(n);
  CAPTURE(test::name(kind));
  const std::vector<T> x = make_input<T>(kind, n, seed);
  const message_key key{.step = seed % 89, .tensor_id = 3};
  const std::vector<std::byte> cpu = test::encode_on(cpu_executor{}, codec, x, key);
  const std::vector<T> start = make_input<T>(input_kind::normal, n, seed + 1);
  const std::vector<T> decoded = test::decode_on(cpu_executor{}, codec, cpu, std::vector<T>(n));
  const std::vector<T> summed = test::decode_on(cpu_executor{}, codec, cpu, start, true);
  for (std::size_t offset = 0; offset < 16 / sizeof(T); ++offset) {
    CAPTURE(offset);
    CHECK(encode_at(codec, x, offset, key) == cpu);
    CHECK(bit_patterns(decode_at(codec, cpu, std::vector<T>(n), offset, false)) == bit_patterns(decoded));
    CHECK(bit_patterns(decode_at(codec, cpu, start, offset, true)) == bit_patterns(summed));
  }
}

/// Steps a wrapper on the GPU with each gradient read from element `offset` of its allocation,
/// and on the CPU, comparing every message and carried error.
template <class Wrapper>
void check_offset_steps_match_cpu(const Wrapper& wrapper, std::size_t n, std::size_t offset) {
  using T = typename Wrapper::value_type;
  CAPTURE(n);
  CAPTURE(offset);
  const cuda_executor exec = test::test_gpu();
  test::stepper<cpu_executor, Wrapper> cpu({}, wrapper, n);
  auto state = wrapper.make_state(exec, n);
  device_array<std::byte> out = test::poisoned<std::byte>(exec, wrapper.max_encoded_bytes(n));
  device_array<std::byte> ws = test::poisoned<std::byte>(exec, wrapper.workspace_bytes(exec, n));
  device_array<T> carried = test::poisoned<T>(exec, n);
  const input_kind kinds[] = {input_kind::normal, input_kind::subnormals, input_kind::signed_zeros, input_kind::ties};
  for (std::uint64_t t = 0; t < 8; ++t) {
    CAPTURE(t);
    const std::vector<T> x = make_input<T>(kinds[t % 4], n, 900 + t);
    const message_key key{.step = t, .tensor_id = 2};
    const offset_span<T> g(exec, x, offset);
    const std::size_t size = wrapper.encode(exec, std::span<const T>(g.span), state, out.span(), ws.span(), key);
    CHECK(test::to_host(exec, out, size) == cpu.step(x, key));
    wrapper.carried_error(exec, state, carried.span());
    CHECK(bit_patterns(test::to_host(exec, carried)) == bit_patterns(cpu.carried_error()));
  }
}

}  // namespace

GRADCOMP_CUDA_TEST_CASE("uniform quad kernels and word decoders equal the CPU on aligned and misaligned spans") {
  const auto sweep = [](const auto& codec) {
    // 15, 16, 17: around the check's items of 16 values (a partial last item and its padding).
    for (const std::size_t n : {5u, 15u, 16u, 17u, 129u, 257u, 1000u, 4099u})
      for (const input_kind kind : {input_kind::normal, input_kind::subnormals, input_kind::signed_zeros})
        check_offsets_match_cpu(codec, n, kind, 77 + n);
  };
  for (const int bits : {8, 4})
    for (const std::uint32_t block : {8u, 136u, 256u, 512u})  // 512: the two-read kernel
      for (const rounding mode : {rounding::nearest_even, rounding::stochastic}) {
        CAPTURE(bits);
        CAPTURE(block);
        CAPTURE(static_cast<int>(mode));
        sweep(uniform_quantizer<float>({.bits = bits, .block = block, .round = mode, .seed = 31}));
        sweep(uniform_quantizer<double>({.bits = bits, .block = block, .round = mode, .seed = 32}));
      }
  sweep(uniform_quantizer<float>({.bits = 8, .block = 100}));  // whole words, but not on Philox blocks
  sweep(qsgd_quantizer<float>({.levels = 7, .bucket = 64, .seed = 3}));  // 4-bit word decoder
  sweep(qsgd_quantizer<double>({.levels = 127, .bucket = 256, .seed = 4}));  // 8-bit word decoder
  sweep(sign_quantizer<float>({.block = 100}));  // 1-bit codes, words across blocks: word by word
  sweep(sign_quantizer<float>({.block = 64}));  // 1-bit codes by quads, 8 to a word
  sweep(uniform_quantizer<float>({.bits = 2, .block = 48}));  // 2-bit codes by quads, 4 to a word
  sweep(uniform_quantizer<double>({.bits = 1, .block = 32}));
}

GRADCOMP_CUDA_TEST_CASE(
    "error feedback and LoCo quad kernels equal the CPU on misaligned gradients, tiny and zero blocks included") {
  for (const std::size_t offset : {0u, 1u, 3u})
    for (const std::size_t n : {257u, 4099u}) {
      check_offset_steps_match_cpu(error_feedback(uniform_quantizer<float>({.bits = 8})), n, offset);
      check_offset_steps_match_cpu(error_feedback(uniform_quantizer<float>(
                                       {.bits = 4, .block = 128, .round = rounding::stochastic, .seed = 6})),
                                   n, offset);
      check_offset_steps_match_cpu(loco(uniform_quantizer<float>({.bits = 4}), {.beta = 0.7f, .reset_period = 3}), n,
                                   offset);
      check_offset_steps_match_cpu(loco(uniform_quantizer<float>(
                                            {.bits = 8, .block = 64, .round = rounding::stochastic, .seed = 8}),
                                        {.beta = 0.5f, .reset_period = 5, .error_group = 64}),
                                   n, offset);
      if (offset == 3) continue;  // double: offset 0 is aligned, 1 is not (3 adds nothing)
      check_offset_steps_match_cpu(error_feedback(uniform_quantizer<double>({.bits = 8, .block = 136})), n, offset);
      check_offset_steps_match_cpu(loco(uniform_quantizer<double>({.bits = 4})), n, offset);
    }
}
