// workspace_arena: measuring mode adds up 64-byte aligned requests; over a caller's buffer it
// hands out aligned, disjoint arrays inside that buffer, whatever the buffer's own alignment.

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <span>
#include <string>
#include <vector>

#include <gradcomp/core/error.hpp>
#include <gradcomp/core/workspace.hpp>

#include "support/errors.hpp"

namespace {

using gradcomp::test::named;
using gradcomp::test::thrown_by;

using gradcomp::errc;
using gradcomp::workspace_arena;


std::uintptr_t address(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }

// A fixed sequence of requests, as a codec's carving code would make: float[10], double[3],
// uint32[0], uint8[65], uint64[16].
struct carved {
  std::span<float> a;
  std::span<double> b;
  std::span<std::uint32_t> c;
  std::span<std::uint8_t> d;
  std::span<std::uint64_t> e;
};

carved carve(workspace_arena& arena) {
  carved out;
  out.a = arena.take<float>(10);
  out.b = arena.take<double>(3);
  out.c = arena.take<std::uint32_t>(0);
  out.d = arena.take<std::uint8_t>(65);
  out.e = arena.take<std::uint64_t>(16);
  return out;
}

// By hand: float[10] at 0..40; double[3] at 64..88; uint32[0] at 128; uint8[65] at 128..193;
// uint64[16] at 256..384. Requested 384 bytes, plus 64 bytes of alignment slack.
constexpr std::size_t carve_requested = 384;
constexpr std::size_t carve_needed = carve_requested + 64;

}  // namespace

TEST_CASE("a measuring arena adds up requests rounded to 64-byte boundaries, plus 64 bytes of slack") {
  CHECK(workspace_arena::alignment == 64);
  workspace_arena nothing = workspace_arena::measure();
  CHECK(nothing.bytes_needed() == 0);

  workspace_arena one = workspace_arena::measure();
  CHECK(one.take<float>(1).empty());  // measuring arrays have no storage
  CHECK(one.bytes_needed() == 4 + 64);

  workspace_arena two = workspace_arena::measure();
  (void)two.take<std::uint8_t>(64);
  (void)two.take<std::uint8_t>(1);  // starts exactly at 64
  CHECK(two.bytes_needed() == 65 + 64);

  workspace_arena three = workspace_arena::measure();
  (void)three.take<std::uint8_t>(65);
  (void)three.take<double>(1);  // starts at 128
  CHECK(three.bytes_needed() == 136 + 64);

  workspace_arena seq = workspace_arena::measure();
  const carved spans = carve(seq);
  CHECK(spans.a.empty());
  CHECK(spans.e.empty());
  CHECK(seq.bytes_needed() == carve_needed);
}

TEST_CASE("an arena hands out 64-byte aligned, disjoint arrays inside a buffer of any alignment") {
  // One allocation, the arena's buffer starting at every offset 0..63 into it.
  std::vector<std::byte> storage(carve_needed + 64 + 64);
  for (std::size_t offset = 0; offset < 64; ++offset) {
    CAPTURE(offset);
    const std::span<std::byte> buffer(storage.data() + offset, carve_needed);
    workspace_arena arena(buffer);
    const carved s = carve(arena);
    REQUIRE(s.a.size() == 10);
    REQUIRE(s.b.size() == 3);
    REQUIRE(s.c.size() == 0);
    REQUIRE(s.d.size() == 65);
    REQUIRE(s.e.size() == 16);

    struct range {
      std::uintptr_t begin, end;
    };
    const range ranges[] = {
        {address(s.a.data()), address(s.a.data() + s.a.size())},
        {address(s.b.data()), address(s.b.data() + s.b.size())},
        {address(s.d.data()), address(s.d.data() + s.d.size())},
        {address(s.e.data()), address(s.e.data() + s.e.size())},
    };
    const std::uintptr_t lo = address(buffer.data());
    const std::uintptr_t hi = address(buffer.data() + buffer.size());
    for (const range& r : ranges) {
      CHECK(r.begin % 64 == 0);
      CHECK(r.begin >= lo);
      CHECK(r.end <= hi);
    }
    CHECK(address(s.c.data()) % 64 == 0);
    for (std::size_t i = 0; i < 4; ++i)
      for (std::size_t j = i + 1; j < 4; ++j)
        CHECK((ranges[i].end <= ranges[j].begin || ranges[j].end <= ranges[i].begin));
    // Arrays come in request order at the hand-computed distances from the first.
    CHECK(ranges[1].begin - ranges[0].begin == 64);
    CHECK(ranges[2].begin - ranges[0].begin == 128);
    CHECK(ranges[3].begin - ranges[0].begin == 256);

    // The memory is usable: write a distinct pattern into each array and read it all back.
    for (float& x : s.a) x = 1.5f;
    for (double& x : s.b) x = -2.25;
    for (std::uint8_t& x : s.d) x = 0x5A;
    for (std::uint64_t& x : s.e) x = 0x0123456789ABCDEFull;
    bool intact = true;
    for (const float x : s.a) intact = intact && x == 1.5f;
    for (const double x : s.b) intact = intact && x == -2.25;
    for (const std::uint8_t x : s.d) intact = intact && x == 0x5A;
    for (const std::uint64_t x : s.e) intact = intact && x == 0x0123456789ABCDEFull;
    CHECK(intact);
  }
}

TEST_CASE("bytes_needed of a measuring arena suffices for a buffer at any misalignment") {
  workspace_arena measuring = workspace_arena::measure();
  (void)carve(measuring);
  const std::size_t needed = measuring.bytes_needed();
  std::vector<std::byte> storage(needed + 64);
  for (std::size_t offset = 0; offset < 64; ++offset) {
    CAPTURE(offset);
    workspace_arena arena(std::span<std::byte>(storage.data() + offset, needed));
    CHECK(thrown_by([&] { (void)carve(arena); }) == "no exception");
  }
}

TEST_CASE("an arena over a buffer too small for the requests throws workspace_too_small") {
  std::vector<std::byte> storage(512);
  SUBCASE("empty workspace") {
    workspace_arena arena(std::span<std::byte>{});
    CHECK(thrown_by([&] { (void)arena.take<float>(1); }) == named(errc::workspace_too_small));
  }
  SUBCASE("one byte short at an aligned start") {
    // Find a 64-byte aligned start inside the storage.
    std::size_t offset = 0;
    while (address(storage.data() + offset) % 64 != 0) ++offset;
    workspace_arena arena(std::span<std::byte>(storage.data() + offset, carve_requested - 1));
    CHECK(thrown_by([&] { (void)carve(arena); }) == named(errc::workspace_too_small));
    workspace_arena exact(std::span<std::byte>(storage.data() + offset, carve_requested));
    CHECK(thrown_by([&] { (void)carve(exact); }) == "no exception");
  }
  SUBCASE("enough bytes but not after aligning a misaligned start") {
    std::size_t offset = 0;
    while (address(storage.data() + offset) % 64 != 1) ++offset;  // 63 bytes lost to alignment
    workspace_arena arena(std::span<std::byte>(storage.data() + offset, carve_requested + 62));
    CHECK(thrown_by([&] { (void)carve(arena); }) == named(errc::workspace_too_small));
    workspace_arena enough(std::span<std::byte>(storage.data() + offset, carve_requested + 63));
    CHECK(thrown_by([&] { (void)carve(enough); }) == "no exception");
  }
}
