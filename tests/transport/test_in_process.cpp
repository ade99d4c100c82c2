// The in-process transport against sums, maxima and ORs computed by the test in rank order, an
// all-to-all of bytes, and its failure behaviour: disagreeing ranks and failing ranks stop every rank with a named error,
// never a hang; point-to-point messages in order, and receives that can never complete.
#include <gradcomp/transport/in_process.hpp>

#include <doctest/doctest.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <stdexcept>
#include <vector>

#include "support/errors.hpp"

namespace gradcomp::test {
namespace {

constexpr int group_sizes[] = {1, 2, 3, 4, 8};

// Rank r's value for element i: distinct per rank, with magnitudes far apart so that a float sum
// taken in another order would round differently.
float value_of(int rank, std::size_t i) {
  const float magnitude = rank % 2 == 0 ? 1.0f : 1e-7f;
  return magnitude * static_cast<float>((static_cast<int>(i) * 7 + rank * 13) % 29 - 14) / 3.0f;
}

std::vector<float> values_of(int rank, std::size_t n) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = value_of(rank, i);
  return v;
}

// The sum over ranks 0..P-1 of element i, added in rank order.
float rank_order_sum(int ranks, std::size_t i) {
  float sum = value_of(0, i);
  for (int p = 1; p < ranks; ++p) sum += value_of(p, i);
  return sum;
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

TEST_CASE("in_process all_reduce_sum of floats equals the rank-order sum bit for bit on every rank") {
  constexpr std::size_t n = 1000;
  for (int P : group_sizes) {
    CAPTURE(P);
    std::vector<std::vector<float>> results(static_cast<std::size_t>(P));
    in_process_group(P).run([&](in_process_transport& t) {
      auto data = values_of(t.rank(), n);
      t.all_reduce_sum(std::span<float>(data));
      results[static_cast<std::size_t>(t.rank())] = data;
    });
    for (int r = 0; r < P; ++r) {
      std::size_t wrong = 0;
      for (std::size_t i = 0; i < n; ++i)
        wrong += same_bits(results[static_cast<std::size_t>(r)][i], rank_order_sum(P, i)) ? 0u : 1u;
      CHECK(wrong == 0);
    }
  }
}

TEST_CASE("in_process all_reduce_sum of uint8 wraps and of uint64 is exact") {
  in_process_group(4).run([](in_process_transport& t) {
    std::vector<std::uint8_t> bytes = {200, 1, static_cast<std::uint8_t>(t.rank())};
    t.all_reduce_sum(std::span<std::uint8_t>(bytes));
    CHECK(bytes[0] == static_cast<std::uint8_t>(800 % 256));
    CHECK(bytes[1] == 4);
    CHECK(bytes[2] == 0 + 1 + 2 + 3);
    std::vector<std::uint64_t> words = {std::uint64_t{1} << 62, static_cast<std::uint64_t>(t.rank()) << 40};
    t.all_reduce_sum(std::span<std::uint64_t>(words));
    CHECK(words[0] == 0);  // 4 * 2^62 wraps to 0
    CHECK(words[1] == (std::uint64_t{6} << 40));
  });
}

TEST_CASE("in_process all_reduce_max and all_reduce_or") {
  in_process_group(5).run([](in_process_transport& t) {
    std::vector<double> maxima = {static_cast<double>(t.rank()), -static_cast<double>(t.rank()),
                                  t.rank() == 3 ? 9.5 : 0.0};
    t.all_reduce_max(std::span<double>(maxima));
    CHECK(maxima == std::vector<double>{4.0, 0.0, 9.5});
    std::vector<std::uint8_t> bits = {static_cast<std::uint8_t>(1u << t.rank()), 0x80};
    t.all_reduce_or(std::span<std::uint8_t>(bits));
    CHECK(bits[0] == 0x1F);
    CHECK(bits[1] == 0x80);
  });
}

TEST_CASE("in_process reduce_sum leaves the sum on the root only") {
  constexpr std::size_t n = 300;
  for (int P : group_sizes) {
    for (int root = 0; root < P; ++root) {
      CAPTURE(P);
      CAPTURE(root);
      std::atomic<int> wrong{0};
      in_process_group(P).run([&](in_process_transport& t) {
        auto data = values_of(t.rank(), n);
        t.reduce_sum(std::span<float>(data), root);
        for (std::size_t i = 0; i < n; ++i) {
          const float expected = t.rank() == root ? rank_order_sum(P, i) : value_of(t.rank(), i);
          if (!same_bits(data[i], expected)) ++wrong;
        }
      });
      CHECK(wrong.load() == 0);
    }
  }
}

TEST_CASE("in_process reduce_scatter_sum gives rank r the rank-order sum of block r") {
  constexpr std::size_t block = 37;
  for (int P : group_sizes) {
    CAPTURE(P);
    std::atomic<int> wrong{0};
    in_process_group(P).run([&](in_process_transport& t) {
      const auto in = values_of(t.rank(), block * static_cast<std::size_t>(P));
      std::vector<float> out(block, -1.0f);
      t.reduce_scatter_sum(std::span<const float>(in), std::span<float>(out));
      for (std::size_t i = 0; i < block; ++i)
        if (!same_bits(out[i], rank_order_sum(P, static_cast<std::size_t>(t.rank()) * block + i))) ++wrong;
    });
    CHECK(wrong.load() == 0);
  }
}

TEST_CASE("in_process broadcast and all_gather_bytes of different sizes") {
  in_process_group(4).run([](in_process_transport& t) {
    std::vector<std::byte> data(5, std::byte{static_cast<unsigned char>(t.rank())});
    t.broadcast(std::span<std::byte>(data), 2);
    CHECK(data == std::vector<std::byte>(5, std::byte{2}));
    const std::vector<std::byte> mine(static_cast<std::size_t>(t.rank()) * 3,
                                      std::byte{static_cast<unsigned char>(10 + t.rank())});
    const auto all = t.all_gather_bytes(mine);
    REQUIRE(all.size() == 4);
    for (int p = 0; p < 4; ++p)
      CHECK(all[static_cast<std::size_t>(p)] ==
            std::vector<std::byte>(static_cast<std::size_t>(p) * 3, std::byte{static_cast<unsigned char>(10 + p)}));
  });
}

TEST_CASE("in_process ranks that disagree on a count all throw size_mismatch and the group is reusable") {
  std::atomic<int> mismatches{0};
  const in_process_group group(3);
  CHECK(thrown_by([&] {
          group.run([&](in_process_transport& t) {
            std::vector<float> data(t.rank() == 1 ? 4 : 5, 1.0f);
            try {
              t.all_reduce_sum(std::span<float>(data));
            } catch (const error& e) {
              if (e.code() == errc::size_mismatch) ++mismatches;
              throw;
            }
          });
        }) == named(errc::size_mismatch));
  CHECK(mismatches.load() == 3);
  // A disagreement on the root, and a reduce-scatter whose input is not P blocks, are caught alike.
  CHECK(thrown_by([&] {
          group.run([](in_process_transport& t) {
            std::vector<float> data(4, 1.0f);
            t.reduce_sum(std::span<float>(data), t.rank() == 0 ? 0 : 1);
          });
        }) == named(errc::size_mismatch));
  CHECK(thrown_by([&] {
          group.run([](in_process_transport& t) {
            const std::vector<float> in(7, 1.0f);
            std::vector<float> out(2);
            t.reduce_scatter_sum(std::span<const float>(in), std::span<float>(out));
          });
        }) == named(errc::size_mismatch));
  // The same group runs again after the failures.
  group.run([](in_process_transport& t) {
    std::vector<std::uint64_t> one = {1};
    t.all_reduce_sum(std::span<std::uint64_t>(one));
    CHECK(one[0] == 3);
  });
}

TEST_CASE("in_process a collective that one rank never makes fails instead of hanging") {
  std::atomic<int> stopped{0};
  CHECK(thrown_by([&] {
          in_process_group(3).run([&](in_process_transport& t) {
            std::vector<float> data(4, 1.0f);
            t.all_reduce_sum(std::span<float>(data));
            if (t.rank() != 0) return;  // ranks 1 and 2 are done; rank 0 makes one more call
            try {
              t.all_reduce_sum(std::span<float>(data));
            } catch (const error&) {
              ++stopped;
              throw;
            }
          });
        }) == named(errc::size_mismatch));
  CHECK(stopped.load() == 1);
}

TEST_CASE("in_process a rank that fails stops the others with peer_failed and run rethrows its error") {
  std::atomic<int> peers_stopped{0};
  CHECK(thrown_by([&] {
          in_process_group(4).run([&](in_process_transport& t) {
            if (t.rank() == 2) throw error(errc::invalid_argument, "rank 2 gives up");
            std::vector<float> data(8, 1.0f);
            try {
              t.all_reduce_sum(std::span<float>(data));
              t.all_reduce_sum(std::span<float>(data));
            } catch (const error& e) {
              if (e.code() == errc::peer_failed) ++peers_stopped;
              throw;
            }
          });
        }) == named(errc::invalid_argument));
  CHECK(peers_stopped.load() == 3);
  CHECK(thrown_by([] { in_process_group(0); }) == named(errc::invalid_argument));
  CHECK(thrown_by([] {
          in_process_group(2).run([](in_process_transport& t) {
            if (t.rank() == 0) throw std::runtime_error("not a gradcomp error");
            std::vector<float> data(1);
            t.all_reduce_sum(std::span<float>(data));
          });
        }) == "foreign exception: not a gradcomp error");
}

std::vector<std::byte> bytes_of(std::size_t count, int tag) {
  return std::vector<std::byte>(count, std::byte{static_cast<unsigned char>(tag)});
}

TEST_CASE("in_process point-to-point messages arrive whole and in order per source") {
  in_process_group(3).run([](in_process_transport& t) {
    const int next = (t.rank() + 1) % 3;
    const int prev = (t.rank() + 2) % 3;
    // Three messages of different sizes to the successor, one to itself, then receive them.
    for (int m = 0; m < 3; ++m) t.send_bytes(bytes_of(static_cast<std::size_t>(m) * 100, 10 * t.rank() + m), next);
    t.send_bytes(bytes_of(7, 99), t.rank());
    for (int m = 0; m < 3; ++m) CHECK(t.recv_bytes(prev) == bytes_of(static_cast<std::size_t>(m) * 100, 10 * prev + m));
    CHECK(t.recv_bytes(t.rank()) == bytes_of(7, 99));
    // A ring of sendrecv: every rank passes its tag on P - 1 times and ends with every tag seen.
    std::vector<std::byte> token = bytes_of(5, t.rank());
    int seen = 1 << t.rank();
    for (int hop = 0; hop < 2; ++hop) {
      token = t.sendrecv_bytes(token, next, prev);
      REQUIRE(token.size() == 5);
      seen |= 1 << std::to_integer<int>(token[0]);
    }
    CHECK(seen == 7);
    CHECK(thrown_by([&] { t.send_bytes(token, 3); }) == named(errc::invalid_argument));
    CHECK(thrown_by([&] { (void)t.recv_bytes(-1); }) == named(errc::invalid_argument));
  });
}

TEST_CASE("in_process all_to_all_bytes hands rank r buffer r of every rank, sizes differing per pair") {
  // Rank f's buffer to rank d: (f + 2d) mod 4 times 3 bytes (some empty), every byte 16f + d.
  const auto buffer = [](int from, int to) {
    return bytes_of(static_cast<std::size_t>((from + 2 * to) % 4) * 3, 16 * from + to);
  };
  for (int P : group_sizes) {
    CAPTURE(P);
    std::atomic<int> wrong{0};
    in_process_group(P).run([&](in_process_transport& t) {
      std::vector<std::vector<std::byte>> to_each;
      for (int p = 0; p < P; ++p) to_each.push_back(buffer(t.rank(), p));
      const std::vector<std::span<const std::byte>> spans(to_each.begin(), to_each.end());
      const auto received = t.all_to_all_bytes(spans);
      if (received.size() != static_cast<std::size_t>(P)) ++wrong;
      for (int p = 0; p < P && p < static_cast<int>(received.size()); ++p)
        if (received[static_cast<std::size_t>(p)] != buffer(p, t.rank())) ++wrong;
    });
    CHECK(wrong.load() == 0);
  }
}

TEST_CASE("in_process all_to_all_bytes with other than P buffers makes every rank throw size_mismatch") {
  const in_process_group group(3);
  // One rank passes two buffers and the others three; then every rank passes the same wrong four.
  for (const bool all_wrong : {false, true}) {
    CAPTURE(all_wrong);
    std::atomic<int> mismatches{0};
    CHECK(thrown_by([&] {
            group.run([&](in_process_transport& t) {
              const std::vector<std::span<const std::byte>> spans(all_wrong ? 4 : (t.rank() == 1 ? 2 : 3));
              try {
                (void)t.all_to_all_bytes(spans);
              } catch (const error& e) {
                if (e.code() == errc::size_mismatch) ++mismatches;
                throw;
              }
            });
          }) == named(errc::size_mismatch));
    CHECK(mismatches.load() == 3);
  }
  // The group runs again afterwards.
  group.run([](in_process_transport& t) {
    const std::vector<std::span<const std::byte>> none(3);
    const auto received = t.all_to_all_bytes(none);
    CHECK(received == std::vector<std::vector<std::byte>>(3));
  });
}

TEST_CASE("in_process receives that can never complete fail instead of hanging") {
  // Both ranks receive first: nobody runs who could send.
  std::atomic<int> mismatches{0};
  CHECK(thrown_by([&] {
          in_process_group(2).run([&](in_process_transport& t) {
            try {
              (void)t.recv_bytes(1 - t.rank());
            } catch (const error& e) {
              if (e.code() == errc::size_mismatch) ++mismatches;
              throw;
            }
          });
        }) == named(errc::size_mismatch));
  CHECK(mismatches.load() == 2);
  // Rank 1 returns without sending; a message it sent before returning is still received.
  CHECK(thrown_by([] {
          in_process_group(2).run([](in_process_transport& t) {
            if (t.rank() == 1) {
              t.send_bytes(bytes_of(3, 1), 0);
              return;
            }
            CHECK(t.recv_bytes(1) == bytes_of(3, 1));
            (void)t.recv_bytes(1);
          });
        }) == named(errc::size_mismatch));
  // One rank waits in a collective while the other waits in a receive.
  CHECK(thrown_by([] {
          in_process_group(2).run([](in_process_transport& t) {
            if (t.rank() == 0) {
              (void)t.recv_bytes(1);
            } else {
              std::vector<float> data(2);
              t.all_reduce_sum(std::span<float>(data));
            }
          });
        }) == named(errc::size_mismatch));
  // A rank that fails wakes a receiver with peer_failed.
  CHECK(thrown_by([] {
          in_process_group(3).run([](in_process_transport& t) {
            if (t.rank() == 2) throw error(errc::invalid_argument, "rank 2 gives up");
            (void)t.recv_bytes(t.rank() == 0 ? 1 : 0);
          });
        }) == named(errc::invalid_argument));
}

}  // namespace
}  // namespace gradcomp::test
