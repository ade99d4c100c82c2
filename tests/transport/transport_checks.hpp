#pragma once
// The checks that the MPI and Gloo transport tests share, templated on the transport. Every rank
// runs the same calls on inputs it can generate for any rank from a seed, and compares what it got
// bit for bit with a dense reference it computes alone (ranks combined in order 0, 1, …, P−1) and
// with an in-process group of P threads run on the same inputs. Sizes include 0, 1, P−1, P+1 and
// sizes not divisible by P (some blocks empty); sums mix 1e8, 1 and −1e8 (1e17 for double) so that
// any other summation order gives other bits; maxima meet NaN, ±0 and ±Inf.
//
// The calls are collective: every rank of the transport calls the same check in the same order.
#include <gradcomp/transport/in_process.hpp>
#include <gradcomp/transport/transport.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "support/errors.hpp"

namespace gradcomp::test::transport_checks {

// ---- results: what a rank's calls returned, as named byte strings -------------------------------

struct result {
  std::string what;
  std::vector<std::byte> bytes;
};
using results = std::vector<result>;

template <class V>
void record(results& out, std::string what, const std::vector<V>& values) {
  std::vector<std::byte> bytes(values.size() * sizeof(V));
  if (!bytes.empty()) std::memcpy(bytes.data(), values.data(), bytes.size());
  out.push_back({std::move(what), std::move(bytes)});
}

// Records one byte buffer per rank, as a collective that returns P buffers gives them: "<what>
// count" (the number of buffers), then "<what> from p" = buffer_of(p) for every p.
template <class BufferOf>
void record_buffers(results& out, const std::string& what, std::size_t count, BufferOf buffer_of) {
  record(out, what + " count", std::vector<std::size_t>{count});
  for (std::size_t p = 0; p < count; ++p) record(out, what + " from " + std::to_string(p), buffer_of(p));
}

// Index of the first byte where `a` and `b` differ, or -1 when they are equal bit for bit.
inline long long first_difference(const std::vector<std::byte>& a, const std::vector<std::byte>& b) {
  if (a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size()) == 0)) return -1;
  const std::size_t common = std::min(a.size(), b.size());
  std::size_t i = 0;
  while (i < common && a[i] == b[i]) ++i;
  return static_cast<long long>(i);
}

inline void compare(const results& got, const results& expected, int rank, const std::string& against) {
  INFO("rank ", rank, ", against ", against);
  CHECK(got.size() == expected.size());
  for (std::size_t k = 0; k < std::min(got.size(), expected.size()); ++k) {
    INFO(got[k].what);
    CHECK(got[k].what == expected[k].what);
    CHECK(first_difference(got[k].bytes, expected[k].bytes) == -1);
  }
}

// ---- inputs: any rank's values from (seed, rank, index) -----------------------------------------

inline std::uint64_t mix(std::uint64_t x) {  // splitmix64's finalizer
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

inline std::uint64_t draw(std::uint64_t seed, int rank, std::size_t i) {
  return mix(seed ^ mix((static_cast<std::uint64_t>(rank) << 40) ^ static_cast<std::uint64_t>(i)));
}

// Summands far apart in magnitude: (big + 1) − big depends on the order the ranks are added in.
template <class V>
V sum_value(std::uint64_t seed, int rank, std::size_t i) {
  const std::uint64_t r = draw(seed, rank, i);
  if constexpr (std::is_floating_point_v<V>) {
    const V big = sizeof(V) == sizeof(float) ? V(1e8) : V(1e17);
    const V table[] = {big, V(1), -big, V(0.5), V(-3), V(1e-3), big / V(3), V(-7.25)};
    return table[r % 8];
  } else {
    return static_cast<V>(r);
  }
}

// Values where `a < b ? b : a` is easy to get wrong: NaN of both signs and two payloads, ±0, ±Inf.
template <class V>
V max_value(std::uint64_t seed, int rank, std::size_t i) {
  using bits = std::conditional_t<sizeof(V) == 4, std::uint32_t, std::uint64_t>;
  constexpr bits sign = bits{1} << (sizeof(V) * 8 - 1);
  const V nan = std::numeric_limits<V>::quiet_NaN();
  const V payload_nan = std::bit_cast<V>(static_cast<bits>(std::bit_cast<bits>(nan) | bits{5}));
  const V table[] = {nan,
                     std::bit_cast<V>(static_cast<bits>(std::bit_cast<bits>(payload_nan) | sign)),
                     V(0),
                     -V(0),
                     std::numeric_limits<V>::infinity(),
                     -std::numeric_limits<V>::infinity(),
                     V(1),
                     V(-2.5),
                     V(1e-30),
                     V(3)};
  return table[draw(seed, rank, i) % 10];
}

template <class V>
std::vector<V> sums_of(std::uint64_t seed, int rank, std::size_t n) {
  std::vector<V> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = sum_value<V>(seed, rank, i);
  return v;
}

template <class V>
std::vector<V> maxima_of(std::uint64_t seed, int rank, std::size_t n) {
  std::vector<V> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = max_value<V>(seed, rank, i);
  return v;
}

inline std::vector<std::byte> bytes_of(std::uint64_t seed, int rank, std::size_t n) {
  std::vector<std::byte> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::byte>(draw(seed, rank, i));
  return v;
}

// The element-wise combination of every rank's input in rank order: the reference.
template <class V, class Input, class Op>
std::vector<V> rank_order(int ranks, Input input, Op op) {
  std::vector<V> acc = input(0);
  for (int p = 1; p < ranks; ++p) {
    const std::vector<V> x = input(p);
    for (std::size_t i = 0; i < acc.size(); ++i) acc[i] = op(acc[i], x[i]);
  }
  return acc;
}

inline constexpr auto add = [](auto a, auto b) { return static_cast<decltype(a)>(a + b); };
inline constexpr auto larger = [](auto a, auto b) { return a < b ? b : a; };  // the in-process rule
inline constexpr auto bit_or = [](auto a, auto b) { return static_cast<decltype(a)>(a | b); };

inline std::vector<std::size_t> sizes_for(int ranks) {
  const auto p = static_cast<std::size_t>(ranks);
  return {0, 1, p - 1, p + 1, 1000, 100003};
}

inline std::string label(const char* call, const char* type, std::size_t n) {
  return std::string(call) + " " + type + " n=" + std::to_string(n);
}

template <class V>
const char* type_name() {
  if constexpr (std::is_same_v<V, float>) return "float";
  else if constexpr (std::is_same_v<V, double>)
    return "double";
  else if constexpr (std::is_same_v<V, std::uint8_t>)
    return "uint8";
  else
    return "uint64";
}

// Runs `calls` on an in-process group of `ranks` threads and returns rank `rank`'s results.
template <class Calls>
results on_in_process(int ranks, int rank, Calls calls) {
  results mine;
  in_process_group(ranks).run([&](in_process_transport& t) {
    results r = calls(t);
    if (t.rank() == rank) mine = std::move(r);
  });
  return mine;
}

// Runs `calls` on `t`, and compares with `expected(P, rank)` and with the in-process transport.
template <class X, class Calls, class Expected>
void check_calls(X& t, Calls calls, Expected expected) {
  const results got = calls(t);
  compare(got, expected(t.size(), t.rank()), t.rank(), "the reference");
  compare(got, on_in_process(t.size(), t.rank(), calls), t.rank(), "in_process");
}

// ---- the collectives ----------------------------------------------------------------------------

constexpr std::uint64_t seed = 0x67726164636F6D70ull;

template <class V, class T>
void all_reduce_sums_of(T& t, results& out) {
  for (const std::size_t n : sizes_for(t.size())) {
    std::vector<V> data = sums_of<V>(seed, t.rank(), n);
    t.all_reduce_sum(std::span<V>(data));
    record(out, label("all_reduce_sum", type_name<V>(), n), data);
  }
}

template <class V>
void expected_sums_of(int ranks, results& out) {
  for (const std::size_t n : sizes_for(ranks))
    record(out, label("all_reduce_sum", type_name<V>(), n),
           rank_order<V>(
               ranks, [&](int p) { return sums_of<V>(seed, p, n); }, add));
}

/// all_reduce_sum on float, double, uint8 and uint64.
template <class X>
void all_reduce_sum(X& t) {
  const auto calls = [](auto& tr) {
    results out;
    all_reduce_sums_of<float>(tr, out);
    all_reduce_sums_of<double>(tr, out);
    all_reduce_sums_of<std::uint8_t>(tr, out);
    all_reduce_sums_of<std::uint64_t>(tr, out);
    return out;
  };
  check_calls(t, calls, [](int ranks, int) {
    results out;
    expected_sums_of<float>(ranks, out);
    expected_sums_of<double>(ranks, out);
    expected_sums_of<std::uint8_t>(ranks, out);
    expected_sums_of<std::uint64_t>(ranks, out);
    return out;
  });
  // The inputs are order-sensitive: from three ranks on, the reverse order gives other bits.
  if (t.size() >= 3) {
    const std::size_t n = 1000;
    const int ranks = t.size();
    const auto forward = rank_order<float>(
        ranks, [&](int p) { return sums_of<float>(seed, p, n); }, add);
    const auto reverse = rank_order<float>(
        ranks, [&](int p) { return sums_of<float>(seed, ranks - 1 - p, n); }, add);
    CHECK(std::memcmp(forward.data(), reverse.data(), n * sizeof(float)) != 0);
  }
}

template <class V, class T>
void all_reduce_maxima_of(T& t, results& out) {
  for (const std::size_t n : sizes_for(t.size())) {
    std::vector<V> data = maxima_of<V>(seed + 1, t.rank(), n);
    t.all_reduce_max(std::span<V>(data));
    record(out, label("all_reduce_max", type_name<V>(), n), data);
  }
}

template <class V>
void expected_maxima_of(int ranks, results& out) {
  for (const std::size_t n : sizes_for(ranks))
    record(out, label("all_reduce_max", type_name<V>(), n),
           rank_order<V>(
               ranks, [&](int p) { return maxima_of<V>(seed + 1, p, n); }, larger));
}

/// all_reduce_max on float and double, NaN and ±0 included.
template <class X>
void all_reduce_max(X& t) {
  const auto calls = [](auto& tr) {
    results out;
    all_reduce_maxima_of<float>(tr, out);
    all_reduce_maxima_of<double>(tr, out);
    return out;
  };
  check_calls(t, calls, [](int ranks, int) {
    results out;
    expected_maxima_of<float>(ranks, out);
    expected_maxima_of<double>(ranks, out);
    return out;
  });
}

/// all_reduce_or on uint8.
template <class X>
void all_reduce_or(X& t) {
  const auto calls = [](auto& tr) {
    results out;
    for (const std::size_t n : sizes_for(tr.size())) {
      std::vector<std::uint8_t> data = sums_of<std::uint8_t>(seed + 2, tr.rank(), n);
      for (auto& v : data) v = static_cast<std::uint8_t>(v & (v >> 3));  // sparse bits, so OR ≠ all ones
      tr.all_reduce_or(std::span<std::uint8_t>(data));
      record(out, label("all_reduce_or", "uint8", n), data);
    }
    return out;
  };
  check_calls(t, calls, [](int ranks, int) {
    results out;
    for (const std::size_t n : sizes_for(ranks)) {
      const auto input = [&](int p) {
        std::vector<std::uint8_t> data = sums_of<std::uint8_t>(seed + 2, p, n);
        for (auto& v : data) v = static_cast<std::uint8_t>(v & (v >> 3));
        return data;
      };
      record(out, label("all_reduce_or", "uint8", n), rank_order<std::uint8_t>(ranks, input, bit_or));
    }
    return out;
  });
}

// reduce_sum's sizes for `root`: the largest for the last root only, which keeps P = 8 quick.
inline std::vector<std::size_t> reduce_sizes_for(int ranks, int root) {
  std::vector<std::size_t> sizes = sizes_for(ranks);
  if (root != ranks - 1) sizes.pop_back();
  return sizes;
}

template <class V, class T>
void reduce_sums_of(T& t, results& out) {
  for (int root = 0; root < t.size(); ++root)
    for (const std::size_t n : reduce_sizes_for(t.size(), root)) {
      std::vector<V> data = sums_of<V>(seed + 3, t.rank(), n);
      t.reduce_sum(std::span<V>(data), root);
      record(out, label("reduce_sum", type_name<V>(), n) + " root=" + std::to_string(root), data);
    }
}

template <class V>
void expected_reduce_sums_of(int ranks, int rank, results& out) {
  for (int root = 0; root < ranks; ++root)
    for (const std::size_t n : reduce_sizes_for(ranks, root))
      record(out, label("reduce_sum", type_name<V>(), n) + " root=" + std::to_string(root),
             rank == root ? rank_order<V>(
                                ranks, [&](int p) { return sums_of<V>(seed + 3, p, n); }, add)
                          : sums_of<V>(seed + 3, rank, n));
}

/// reduce_sum of float and double to every root; the other ranks' data stays as it was.
template <class X>
void reduce_sum(X& t) {
  const auto calls = [](auto& tr) {
    results out;
    reduce_sums_of<float>(tr, out);
    reduce_sums_of<double>(tr, out);
    return out;
  };
  check_calls(t, calls, [](int ranks, int rank) {
    results out;
    expected_reduce_sums_of<float>(ranks, rank, out);
    expected_reduce_sums_of<double>(ranks, rank, out);
    return out;
  });
}

inline constexpr std::size_t scatter_blocks[] = {0, 1, 3, 1000, 12501};

template <class V, class T>
void reduce_scatters_of(T& t, results& out) {
  for (const std::size_t m : scatter_blocks) {
    const std::vector<V> in = sums_of<V>(seed + 4, t.rank(), m * static_cast<std::size_t>(t.size()));
    std::vector<V> block(m, V(42));
    t.reduce_scatter_sum(std::span<const V>(in), std::span<V>(block));
    record(out, label("reduce_scatter_sum", type_name<V>(), m), block);
  }
}

template <class V>
void expected_reduce_scatters_of(int ranks, int rank, results& out) {
  for (const std::size_t m : scatter_blocks) {
    const std::size_t n = m * static_cast<std::size_t>(ranks);
    const auto all = rank_order<V>(
        ranks, [&](int p) { return sums_of<V>(seed + 4, p, n); }, add);
    const auto first = all.begin() + static_cast<std::ptrdiff_t>(m * static_cast<std::size_t>(rank));
    record(out, label("reduce_scatter_sum", type_name<V>(), m),
           std::vector<V>(first, first + static_cast<std::ptrdiff_t>(m)));
  }
}

/// reduce_scatter_sum of float and double, blocks of 0 to 12501 values.
template <class X>
void reduce_scatter_sum(X& t) {
  const auto calls = [](auto& tr) {
    results out;
    reduce_scatters_of<float>(tr, out);
    reduce_scatters_of<double>(tr, out);
    return out;
  };
  check_calls(t, calls, [](int ranks, int rank) {
    results out;
    expected_reduce_scatters_of<float>(ranks, rank, out);
    expected_reduce_scatters_of<double>(ranks, rank, out);
    return out;
  });
}

inline constexpr std::size_t broadcast_sizes[] = {0, 1, 1000, 100003};

/// broadcast from every root.
template <class X>
void broadcast(X& t) {
  const auto calls = [](auto& tr) {
    results out;
    for (int root = 0; root < tr.size(); ++root)
      for (const std::size_t n : broadcast_sizes) {
        // One byte more than is broadcast: in_process's broadcast hands data() to memcpy even for
        // n = 0, so the pointer must not be null.
        std::vector<std::byte> data = bytes_of(seed + 5, tr.rank(), n + 1);
        tr.broadcast(std::span<std::byte>(data).first(n), root);
        data.pop_back();
        record(out, label("broadcast", "bytes", n) + " root=" + std::to_string(root), data);
      }
    return out;
  };
  check_calls(t, calls, [](int ranks, int) {
    results out;
    for (int root = 0; root < ranks; ++root)
      for (const std::size_t n : broadcast_sizes)
        record(out, label("broadcast", "bytes", n) + " root=" + std::to_string(root), bytes_of(seed + 5, root, n));
    return out;
  });
  std::vector<std::byte> none;  // an empty buffer without storage
  t.broadcast(std::span<std::byte>(none), t.size() - 1);
  CHECK(none.empty());
}

// Rank p's buffer in round `round` of the all-gather: rank 0 empty in round 0, every rank empty in
// round 1, only the last rank non-empty in round 2, sizes up to 100003 bytes.
inline std::size_t gathered_size(int round, int rank, int ranks) {
  const auto r = static_cast<std::size_t>(rank);
  if (round == 0) return r == 0 ? 0 : (r * 7919) % 5000 + (r == 1 ? 100003 : 1);
  if (round == 1) return 0;
  return rank == ranks - 1 ? 4099 : 0;
}

/// all_gather_bytes with a different size on every rank, empty buffers included.
template <class X>
void all_gather_bytes(X& t) {
  const auto calls = [](auto& tr) {
    results out;
    for (int round = 0; round < 3; ++round) {
      const auto mine =
          bytes_of(seed + 6 + static_cast<std::uint64_t>(round), tr.rank(), gathered_size(round, tr.rank(), tr.size()));
      const std::vector<std::vector<std::byte>> all = tr.all_gather_bytes(mine);
      record_buffers(out, "all_gather_bytes round " + std::to_string(round), all.size(),
                     [&](std::size_t p) { return all[p]; });
    }
    return out;
  };
  check_calls(t, calls, [](int ranks, int) {
    results out;
    for (int round = 0; round < 3; ++round) {
      record_buffers(out, "all_gather_bytes round " + std::to_string(round), static_cast<std::size_t>(ranks),
                     [&](std::size_t p) {
                       const int from = static_cast<int>(p);
                       return bytes_of(seed + 6 + static_cast<std::uint64_t>(round), from,
                                       gathered_size(round, from, ranks));
                     });
    }
    return out;
  });
}

// Rank `from`'s buffer to rank `to` in round `round`: sizes that differ per pair, some empty (rank
// 0's to itself among them) in round 0; every buffer empty in round 1; only the last rank's to
// rank 0 non-empty (100003 bytes) in round 2.
inline std::size_t exchanged_size(int round, int from, int to, int ranks) {
  const auto f = static_cast<std::size_t>(from);
  const auto d = static_cast<std::size_t>(to);
  if (round == 1) return 0;
  if (round == 2) return from == ranks - 1 && to == 0 ? 100003 : 0;
  return (f * 7 + d * 3) % 5 == 0 ? 0 : (f * 7919 + d * 6151) % 9000 + 1;
}

// The bytes of that buffer, which every rank can generate for any pair.
inline std::vector<std::byte> exchanged_bytes(int round, int from, int to, int ranks) {
  return bytes_of(seed + 20 + static_cast<std::uint64_t>(round), from * 1024 + to,
                  exchanged_size(round, from, to, ranks));
}

/// all_to_all_bytes with a different size for every pair of ranks, empty buffers included.
template <class X>
void all_to_all_bytes(X& t) {
  const auto calls = [](auto& tr) {
    results out;
    for (int round = 0; round < 3; ++round) {
      std::vector<std::vector<std::byte>> to_each;
      for (int p = 0; p < tr.size(); ++p) to_each.push_back(exchanged_bytes(round, tr.rank(), p, tr.size()));
      const std::vector<std::span<const std::byte>> spans(to_each.begin(), to_each.end());
      const std::vector<std::vector<std::byte>> received = tr.all_to_all_bytes(spans);
      record_buffers(out, "all_to_all_bytes round " + std::to_string(round), received.size(),
                     [&](std::size_t p) { return received[p]; });
    }
    return out;
  };
  check_calls(t, calls, [](int ranks, int rank) {
    results out;
    for (int round = 0; round < 3; ++round) {
      record_buffers(out, "all_to_all_bytes round " + std::to_string(round), static_cast<std::size_t>(ranks),
                     [&](std::size_t p) { return exchanged_bytes(round, static_cast<int>(p), rank, ranks); });
    }
    return out;
  });
}

// ---- point-to-point ------------------------------------------------------------------------------

// Message k from rank `from`: sizes 0, 1, 4 KiB, 1 MiB (past MPI's eager limit) and 7 bytes.
inline constexpr std::size_t message_sizes[] = {0, 1, 4096, std::size_t{1} << 20, 7};

inline std::vector<std::byte> message(int from, std::size_t k) {
  return bytes_of(seed + 10 + k, from, message_sizes[k]);
}

// Rank r's partner: r xor 1, or r itself when that is outside the group.
inline int partner_of(int rank, int ranks) { return (rank ^ 1) < ranks ? rank ^ 1 : rank; }

/// Point-to-point: a ring of sendrecv_bytes in which every rank passes tokens of different sizes
/// (one empty) P − 1 times; pairs of ranks exchanging several messages, which arrive in order; and
/// messages to the rank itself.
template <class X>
void point_to_point(X& t) {
  const auto calls = [](auto& tr) {
    results out;
    const int ranks = tr.size();
    const int rank = tr.rank();
    // The ring.
    std::vector<std::byte> token = bytes_of(seed + 9, rank, static_cast<std::size_t>(rank) * 1000 % 3001);
    for (int hop = 1; hop < ranks; ++hop) {
      token = tr.sendrecv_bytes(token, (rank + 1) % ranks, (rank + ranks - 1) % ranks);
      record(out, "ring hop " + std::to_string(hop), token);
    }
    // The pairs: the even rank sends first, then receives; a rank without partner talks to itself.
    const int partner = partner_of(rank, ranks);
    const auto send_all = [&] {
      for (std::size_t k = 0; k < std::size(message_sizes); ++k) tr.send_bytes(message(rank, k), partner);
    };
    const auto receive_all = [&] {
      for (std::size_t k = 0; k < std::size(message_sizes); ++k)
        record(out, "pair message " + std::to_string(k), tr.recv_bytes(partner));
    };
    if (rank % 2 == 0 || partner == rank) {
      send_all();
      receive_all();
    } else {
      receive_all();
      send_all();
    }
    // Messages to itself, in order, and a sendrecv with itself.
    tr.send_bytes(message(rank, 2), rank);
    tr.send_bytes(message(rank, 0), rank);
    record(out, "self message 0", tr.recv_bytes(rank));
    record(out, "self message 1", tr.recv_bytes(rank));
    record(out, "self sendrecv", tr.sendrecv_bytes(message(rank, 4), rank, rank));
    return out;
  };
  check_calls(t, calls, [](int ranks, int rank) {
    results out;
    for (int hop = 1; hop < ranks; ++hop) {
      const int from = (rank + ranks - hop) % ranks;
      record(out, "ring hop " + std::to_string(hop),
             bytes_of(seed + 9, from, static_cast<std::size_t>(from) * 1000 % 3001));
    }
    for (std::size_t k = 0; k < std::size(message_sizes); ++k)
      record(out, "pair message " + std::to_string(k), message(partner_of(rank, ranks), k));
    record(out, "self message 0", message(rank, 2));
    record(out, "self message 1", message(rank, 0));
    record(out, "self sendrecv", message(rank, 4));
    return out;
  });
}

// ---- arguments a rank checks alone ---------------------------------------------------------------

/// Every rank passes the same bad argument, so every rank throws invalid_argument and none waits;
/// the transport works on afterwards.
template <class X>
void argument_errors(X& t) {
  const int ranks = t.size();
  std::vector<float> data(5, 1.0f);
  std::vector<std::byte> bytes(3);
  for (const int root : {-1, ranks}) {
    CHECK(thrown_by([&] { t.reduce_sum(std::span<float>(data), root); }) == named(errc::invalid_argument));
    CHECK(thrown_by([&] { t.broadcast(std::span<std::byte>(bytes), root); }) == named(errc::invalid_argument));
    CHECK(thrown_by([&] { t.send_bytes(bytes, root); }) == named(errc::invalid_argument));
    CHECK(thrown_by([&] { (void)t.recv_bytes(root); }) == named(errc::invalid_argument));
    CHECK(thrown_by([&] { (void)t.sendrecv_bytes(bytes, 0, root); }) == named(errc::invalid_argument));
    CHECK(thrown_by([&] { (void)t.sendrecv_bytes(bytes, root, 0); }) == named(errc::invalid_argument));
  }
  const std::vector<double> in(static_cast<std::size_t>(ranks) * 2 + 1, 1.0);
  std::vector<double> out(2);
  CHECK(thrown_by([&] { t.reduce_scatter_sum(std::span<const double>(in), std::span<double>(out)); }) ==
        named(errc::invalid_argument));
  const std::vector<std::span<const std::byte>> too_few(static_cast<std::size_t>(ranks) - 1,
                                                        std::span<const std::byte>(bytes));
  CHECK(thrown_by([&] { (void)t.all_to_all_bytes(too_few); }) == named(errc::invalid_argument));
  // Nothing was sent to this rank itself: that receive could never complete.
  CHECK(thrown_by([&] { (void)t.recv_bytes(t.rank()); }) == named(errc::size_mismatch));
  std::vector<std::uint64_t> one = {1};
  t.all_reduce_sum(std::span<std::uint64_t>(one));
  CHECK(one[0] == static_cast<std::uint64_t>(ranks));
}

}  // namespace gradcomp::test::transport_checks
