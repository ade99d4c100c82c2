// The hybrid scheme's compressed collectives (point-to-point, all-gather, per-hop ring
// reduce-scatter and all-reduce) over the in-process transport. Oracles written here: the
// uncompressed ring's sums (each chunk added in ring order), and a single-threaded replay of the
// ring that encodes and decodes each hop with the codec, which the lossy ring must match bit for
// bit; the accumulated error is checked against the reported bound and shown to grow with P.
#include <gradcomp/collective/compressed_all_gather.hpp>
#include <gradcomp/collective/compressed_point_to_point.hpp>
#include <gradcomp/collective/ring.hpp>
#include <gradcomp/lossless/mpc.hpp>
#include <gradcomp/lossless/zfp_fixed_rate.hpp>
#include <gradcomp/core/reference_executor.hpp>
#include <gradcomp/quantize/uniform.hpp>
#include <gradcomp/sparsify/topk.hpp>
#include <gradcomp/transport/in_process.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <mutex>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "support/data.hpp"
#include "support/errors.hpp"

namespace gradcomp::test {
namespace {

// Rank r's values: N(0, 1) with a per-rank seed, times 10^(r mod 3) so that ranks differ in scale.
std::vector<float> values_of(int rank, std::size_t n, std::uint64_t seed = 1) {
  std::mt19937_64 engine(seed * 1000 + static_cast<std::uint64_t>(rank));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const float scale = std::pow(10.0f, static_cast<float>(rank % 3));
  std::vector<float> v(n);
  for (float& x : v) x = scale * normal(engine);
  return v;
}

int wrap(int x, int P) { return ((x % P) + P) % P; }

// The chunk bounds written out independently of ring_chunk_of: the first n mod P chunks one longer.
std::pair<std::size_t, std::size_t> chunk(std::size_t n, int P, int c) {
  const std::size_t base = n / static_cast<std::size_t>(P), extra = n % static_cast<std::size_t>(P);
  const auto i = static_cast<std::size_t>(c);
  return {i * base + std::min(i, extra), base + (i < extra ? 1 : 0)};
}

// Replays the ring for chunk c on one thread: the partial sum starts with rank c+1's values and
// each hop `hop(partial, values of the next rank)` returns the next partial sum.
template <class Hop>
std::vector<float> replay_chunk(const std::vector<std::vector<float>>& x, int c, Hop hop) {
  const int P = static_cast<int>(x.size());
  const auto range = chunk(x[0].size(), P, c);
  const std::size_t offset = range.first, count = range.second;
  const auto part = [&](int r) {
    const auto& v = x[static_cast<std::size_t>(r)];
    return std::vector<float>(v.begin() + static_cast<std::ptrdiff_t>(offset),
                              v.begin() + static_cast<std::ptrdiff_t>(offset + count));
  };
  std::vector<float> partial = part(wrap(c + 1, P));
  for (int j = 2; j <= P; ++j) partial = hop(partial, part(wrap(c + j, P)));
  return partial;
}

// The uncompressed ring: plain float additions, own values + received partial sum.
std::vector<float> plain_hop(const std::vector<float>& partial, std::vector<float> own) {
  for (std::size_t i = 0; i < own.size(); ++i) own[i] += partial[i];
  return own;
}

// A lossy hop with `codec`: the partial sum is encoded, and decoded onto the receiver's values.
template <class C>
auto codec_hop(const C& codec) {
  return [&codec](const std::vector<float>& partial, std::vector<float> own) {
    const cpu_executor cpu;
    std::vector<std::byte> ws(codec.workspace_bytes(cpu, partial.size()));
    std::vector<std::byte> message(codec.max_encoded_bytes(partial.size()));
    const std::size_t bytes = codec.encode(cpu, std::span<const float>(partial), message, ws);
    codec.decode_accumulate(cpu, std::span<const std::byte>(message.data(), bytes), std::span<float>(own), ws);
    return own;
  };
}

// decode(encode(v)) with `codec`.
template <class C>
std::vector<float> round_trip(const C& codec, const std::vector<float>& v) {
  return codec_hop(codec)(v, std::vector<float>(v.size(), 0.0f));
}

double max_difference(std::span<const float> a, std::span<const float> b) {
  double worst = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(static_cast<double>(a[i]) - b[i]));
  return worst;
}

double max_magnitude(std::span<const float> a) {
  double worst = 0.0;
  for (float v : a) worst = std::max(worst, std::fabs(static_cast<double>(v)));
  return worst;
}

struct ring_run {
  std::vector<std::vector<float>> results;  // per rank: all-reduce result, or reduce-scatter chunk
  std::vector<compressed_report> reports;
};

template <class C>
ring_run run_all_reduce(int P, std::size_t n, const C& codec, std::uint64_t seed = 1) {
  ring_run run{std::vector<std::vector<float>>(static_cast<std::size_t>(P)),
               std::vector<compressed_report>(static_cast<std::size_t>(P))};
  in_process_group(P).run([&](in_process_transport& t) {
    auto data = values_of(t.rank(), n, seed);
    const auto report = ring_all_reduce(cpu_executor{}, t, codec, std::span<float>(data));
    run.results[static_cast<std::size_t>(t.rank())] = data;
    run.reports[static_cast<std::size_t>(t.rank())] = report;
  });
  return run;
}

template <class C>
ring_run run_reduce_scatter(int P, std::size_t n, const C& codec) {
  ring_run run{std::vector<std::vector<float>>(static_cast<std::size_t>(P)),
               std::vector<compressed_report>(static_cast<std::size_t>(P))};
  in_process_group(P).run([&](in_process_transport& t) {
    const auto data = values_of(t.rank(), n);
    std::vector<float> out(ring_chunk_of(n, P, t.rank()).count);
    const auto report =
        ring_reduce_scatter(cpu_executor{}, t, codec, std::span<const float>(data), std::span<float>(out));
    run.results[static_cast<std::size_t>(t.rank())] = out;
    run.reports[static_cast<std::size_t>(t.rank())] = report;
  });
  return run;
}

std::vector<std::vector<float>> inputs(int P, std::size_t n, std::uint64_t seed = 1) {
  std::vector<std::vector<float>> x;
  for (int r = 0; r < P; ++r) x.push_back(values_of(r, n, seed));
  return x;
}

const uniform_quantizer<float> lossy_codec(uniform_params{.bits = 4, .block = 64});

TEST_CASE("ring_chunk_of cuts n values into P chunks in order, the first n mod P one longer") {
  for (std::uint64_t n : {0u, 1u, 5u, 8u, 1000u, 1003u}) {
    for (int P : {1, 2, 3, 7, 8}) {
      std::uint64_t next = 0;
      for (int c = 0; c < P; ++c) {
        const ring_chunk k = ring_chunk_of(n, P, c);
        CHECK(k.offset == next);
        CHECK(k.count == chunk(static_cast<std::size_t>(n), P, c).second);
        next += k.count;
      }
      CHECK(next == n);
    }
  }
}

TEST_CASE("ring with a lossless codec (MPC) gives the uncompressed ring's sums bit for bit") {
  const mpc_codec<float> mpc;
  for (int P : {1, 2, 3, 4, 5, 8}) {
    for (std::size_t n : {std::size_t{0}, std::size_t{3}, std::size_t{1000}, std::size_t{4099}}) {
      CAPTURE(P);
      CAPTURE(n);
      const auto x = inputs(P, n);
      const auto all = run_all_reduce(P, n, mpc);
      const auto scattered = run_reduce_scatter(P, n, mpc);
      std::vector<float> expected;
      for (int c = 0; c < P; ++c) {
        const auto sum = replay_chunk(x, c, plain_hop);
        expected.insert(expected.end(), sum.begin(), sum.end());
        CHECK(same_bits(scattered.results[static_cast<std::size_t>(c)], sum));
      }
      for (int r = 0; r < P; ++r) {
        CHECK(same_bits(all.results[static_cast<std::size_t>(r)], expected));
        const auto& report = all.reports[static_cast<std::size_t>(r)];
        CHECK(report.error_bound == 0.0);
        CHECK(report.max_error == 0.0);
        // Reduce-scatter then all-gather: each phase moves P - 1 chunks of this rank's ring.
        if (P > 1 && n >= static_cast<std::size_t>(P)) CHECK(report.dense_bytes > 0);
      }
    }
  }
}

TEST_CASE("ring with a lossy codec re-encodes every hop: the replayed ring bit for bit, error within the bound") {
  for (const auto& ranks_and_n :
       {std::pair{2, std::size_t{4096}}, std::pair{3, std::size_t{4096}}, std::pair{4, std::size_t{4096}},
        std::pair{8, std::size_t{4096}}, std::pair{8, std::size_t{5}}}) {
    const int P = ranks_and_n.first;
    const std::size_t n = ranks_and_n.second;
    CAPTURE(P);
    CAPTURE(n);
    const auto x = inputs(P, n);
    const auto all = run_all_reduce(P, n, lossy_codec);
    const auto scattered = run_reduce_scatter(P, n, lossy_codec);
    std::vector<float> expected, exact;
    double worst_chunk_error = 0.0;
    for (int c = 0; c < P; ++c) {
      const auto partial = replay_chunk(x, c, codec_hop(lossy_codec));
      CHECK(same_bits(scattered.results[static_cast<std::size_t>(c)], partial));
      const auto final_chunk = round_trip(lossy_codec, partial);
      expected.insert(expected.end(), final_chunk.begin(), final_chunk.end());
      const auto plain = replay_chunk(x, c, plain_hop);
      exact.insert(exact.end(), plain.begin(), plain.end());
      worst_chunk_error = std::max(worst_chunk_error, max_difference(partial, plain));
    }
    const double slack = 1e-5 * max_magnitude(exact);  // float rounding of the additions
    for (int r = 0; r < P; ++r) {
      CHECK(same_bits(all.results[static_cast<std::size_t>(r)], expected));
      // Every rank reports the same bound, and the result is within it.
      CHECK(all.reports[static_cast<std::size_t>(r)].error_bound == all.reports[0].error_bound);
      CHECK(scattered.reports[static_cast<std::size_t>(r)].error_bound == scattered.reports[0].error_bound);
    }
    CHECK(worst_chunk_error <= scattered.reports[0].error_bound + slack);
    CHECK(max_difference(all.results[0], exact) <= all.reports[0].error_bound + slack);
    CHECK(all.reports[0].error_bound >= scattered.reports[0].error_bound);
    if (n > 1000) CHECK(scattered.reports[0].error_bound > 0.0);
  }
}

TEST_CASE("ring with ZFP fixed rate: the replayed ring bit for bit on every rank, error within the bound") {
  const zfp_fixed_rate_codec<float> zfp(zfp_params{.rate_bits = 8});
  constexpr std::size_t n = 4103;
  for (int P : {2, 4, 5}) {
    CAPTURE(P);
    const auto x = inputs(P, n);
    const auto all = run_all_reduce(P, n, zfp);
    std::vector<float> expected, exact;
    for (int c = 0; c < P; ++c) {
      const auto final_chunk = round_trip(zfp, replay_chunk(x, c, codec_hop(zfp)));
      expected.insert(expected.end(), final_chunk.begin(), final_chunk.end());
      const auto plain = replay_chunk(x, c, plain_hop);
      exact.insert(exact.end(), plain.begin(), plain.end());
    }
    for (int r = 0; r < P; ++r) CHECK(same_bits(all.results[static_cast<std::size_t>(r)], expected));
    CHECK(all.reports[0].error_bound > 0.0);
    CHECK(max_difference(all.results[0], exact) <= all.reports[0].error_bound + 1e-5 * max_magnitude(exact));
    // Fixed rate: every frame of a chunk has the same size, 16 + 56 + ⌈⌈count/4⌉·8/2⌉ bytes.
    CHECK(all.reports[0].sent_bytes < all.reports[0].dense_bytes / 3);
  }
}

TEST_CASE("ring lossy error grows with P: measured error and bound for P = 2, 4, 8") {
  // Every rank contributes N(0, 1) values of the same scale, so only the number of hops differs.
  constexpr std::size_t n = 8192;
  std::vector<double> errors, bounds;
  for (int P : {2, 4, 8}) {
    ring_run run{std::vector<std::vector<float>>(static_cast<std::size_t>(P)),
                 std::vector<compressed_report>(static_cast<std::size_t>(P))};
    std::vector<std::vector<float>> x(static_cast<std::size_t>(P));
    for (int r = 0; r < P; ++r) {
      std::mt19937_64 engine(77 + static_cast<std::uint64_t>(r));
      std::normal_distribution<float> normal(0.0f, 1.0f);
      x[static_cast<std::size_t>(r)].resize(n);
      for (float& v : x[static_cast<std::size_t>(r)]) v = normal(engine);
    }
    in_process_group(P).run([&](in_process_transport& t) {
      auto data = x[static_cast<std::size_t>(t.rank())];
      run.reports[static_cast<std::size_t>(t.rank())] =
          ring_all_reduce(cpu_executor{}, t, lossy_codec, std::span<float>(data));
      run.results[static_cast<std::size_t>(t.rank())] = data;
    });
    std::vector<float> exact;
    for (int c = 0; c < P; ++c) {
      const auto plain = replay_chunk(x, c, plain_hop);
      exact.insert(exact.end(), plain.begin(), plain.end());
    }
    errors.push_back(max_difference(run.results[0], exact));
    bounds.push_back(run.reports[0].error_bound);
    MESSAGE("uniform 4-bit ring all-reduce, P = " << P << ": max |error| " << errors.back() << ", reported bound "
                                                  << bounds.back());
    CHECK(errors.back() <= bounds.back() + 1e-5 * max_magnitude(exact));
  }
  CHECK(errors[0] < errors[1]);
  CHECK(errors[1] < errors[2]);
  CHECK(bounds[0] < bounds[1]);
  CHECK(bounds[1] < bounds[2]);
}

// ring_all_reduce with the lossy codec, checking that a failure leaves the data unchanged.
void all_reduce_keeping_data_on_error(in_process_transport& t, std::vector<float> data) {
  const auto before = data;
  try {
    ring_all_reduce(cpu_executor{}, t, lossy_codec, std::span<float>(data));
  } catch (...) {
    CHECK(same_bits(data, before));
    throw;
  }
}

TEST_CASE("ring failures reach every rank with the same error and leave the data unchanged") {
  constexpr std::size_t n = 1000;
  const auto expect_everywhere = [](int P, errc code, auto&& body) {
    std::atomic<int> matching{0};
    in_process_group(P).run([&](in_process_transport& t) {
      if (thrown_by([&] { body(t); }) == named(code)) ++matching;
    });
    CHECK(matching.load() == P);
  };
  for (int P : {2, 3, 5}) {
    CAPTURE(P);
    // A NaN on one rank, under a codec that does not carry NaN.
    expect_everywhere(P, errc::non_finite_input, [P](in_process_transport& t) {
      auto data = values_of(t.rank(), n);
      if (t.rank() == P - 1) data[n / 2] = std::numeric_limits<float>::quiet_NaN();
      all_reduce_keeping_data_on_error(t, data);
    });
    expect_everywhere(P, errc::non_finite_input, [P](in_process_transport& t) {
      auto data = values_of(t.rank(), n);
      if (t.rank() == 0) data[0] = std::numeric_limits<float>::infinity();
      std::vector<float> out(ring_chunk_of(n, P, t.rank()).count, 5.0f);
      try {
        ring_reduce_scatter(cpu_executor{}, t, lossy_codec, std::span<const float>(data), std::span<float>(out));
      } catch (...) {
        CHECK(std::all_of(out.begin(), out.end(), [](float v) { return v == 5.0f; }));
        throw;
      }
    });
    // The ranks disagree on n, or on the codec's parameters.
    expect_everywhere(P, errc::size_mismatch, [P](in_process_transport& t) {
      all_reduce_keeping_data_on_error(t, values_of(t.rank(), t.rank() == 1 ? n + static_cast<std::size_t>(P) : n));
    });
    expect_everywhere(P, errc::parameter_mismatch, [](in_process_transport& t) {
      auto data = values_of(t.rank(), n);
      const uniform_quantizer<float> other(uniform_params{.bits = 8, .block = 64});
      if (t.rank() == 0) ring_all_reduce(cpu_executor{}, t, other, std::span<float>(data));
      else
        ring_all_reduce(cpu_executor{}, t, lossy_codec, std::span<float>(data));
    });
  }
  // A wrong output size is the caller's error, reported before any communication.
  in_process_group(1).run([](in_process_transport& t) {
    const std::vector<float> data(10, 1.0f);
    std::vector<float> out(3);
    CHECK(thrown_by([&] {
            ring_reduce_scatter(cpu_executor{}, t, lossy_codec, std::span<const float>(data), std::span<float>(out));
          }) == named(errc::invalid_argument));
  });
}

TEST_CASE("compressed_all_gather decodes every block from the same bytes on every rank") {
  constexpr std::size_t m = 777;
  const mpc_codec<float> mpc;
  for (int P : {1, 2, 4}) {
    CAPTURE(P);
    std::vector<std::vector<float>> lossless(static_cast<std::size_t>(P)), lossy(static_cast<std::size_t>(P));
    std::vector<compressed_report> reports(static_cast<std::size_t>(P));
    in_process_group(P).run([&](in_process_transport& t) {
      const auto mine = values_of(t.rank(), m);
      std::vector<float> out(m * static_cast<std::size_t>(P));
      compressed_all_gather(cpu_executor{}, t, mpc, std::span<const float>(mine), std::span<float>(out));
      lossless[static_cast<std::size_t>(t.rank())] = out;
      reports[static_cast<std::size_t>(t.rank())] =
          compressed_all_gather(cpu_executor{}, t, lossy_codec, std::span<const float>(mine), std::span<float>(out));
      lossy[static_cast<std::size_t>(t.rank())] = out;
    });
    std::vector<float> exact, decoded;
    double worst = 0.0;
    for (int r = 0; r < P; ++r) {
      const auto v = values_of(r, m);
      exact.insert(exact.end(), v.begin(), v.end());
      const auto d = round_trip(lossy_codec, v);
      decoded.insert(decoded.end(), d.begin(), d.end());
      worst = std::max(worst, max_difference(v, d));
    }
    for (int r = 0; r < P; ++r) {
      CHECK(same_bits(lossless[static_cast<std::size_t>(r)], exact));
      CHECK(same_bits(lossy[static_cast<std::size_t>(r)], decoded));
      CHECK(reports[static_cast<std::size_t>(r)].error_bound == worst);
      CHECK(reports[static_cast<std::size_t>(r)].dense_bytes == m * sizeof(float) * static_cast<std::size_t>(P - 1));
    }
  }
  // Ranks that disagree on m all fail; a NaN on one rank stops every rank.
  std::atomic<int> failed{0};
  in_process_group(3).run([&](in_process_transport& t) {
    const auto mine = values_of(t.rank(), t.rank() == 2 ? m + 1 : m);
    std::vector<float> out(mine.size() * 3);
    if (thrown_by([&] {
          compressed_all_gather(cpu_executor{}, t, lossy_codec, std::span<const float>(mine), std::span<float>(out));
        }) == named(errc::size_mismatch))
      ++failed;
    auto nan = values_of(t.rank(), m);
    if (t.rank() == 1) nan[3] = std::numeric_limits<float>::quiet_NaN();
    std::vector<float> all(m * 3, 2.0f);
    if (thrown_by([&] {
          compressed_all_gather(cpu_executor{}, t, lossy_codec, std::span<const float>(nan), std::span<float>(all));
        }) == named(errc::non_finite_input))
      ++failed;
    CHECK(std::all_of(all.begin(), all.end(), [](float v) { return v == 2.0f; }));
  });
  CHECK(failed.load() == 6);
}

TEST_CASE(
    "compressed_send and compressed_recv: exact with MPC, bounded with a lossy codec, failures reach the receiver") {
  constexpr std::size_t n = 1500;
  const mpc_codec<float> mpc;
  in_process_group(2).run([&](in_process_transport& t) {
    if (t.rank() == 0) {
      const auto data = values_of(0, n);
      const auto lossless = compressed_send(cpu_executor{}, t, mpc, std::span<const float>(data), 1);
      CHECK(lossless.error_bound == 0.0);
      const auto lossy = compressed_send(cpu_executor{}, t, lossy_codec, std::span<const float>(data), 1);
      CHECK(lossy.error_bound == max_difference(data, round_trip(lossy_codec, data)));
      CHECK(lossy.sent_bytes < lossless.dense_bytes);
      auto bad = data;
      bad[7] = -std::numeric_limits<float>::infinity();
      CHECK(thrown_by([&] { compressed_send(cpu_executor{}, t, lossy_codec, std::span<const float>(bad), 1); }) ==
            named(errc::non_finite_input));
      compressed_send(cpu_executor{}, t, mpc, std::span<const float>(data), 1);
    } else {
      const auto data = values_of(0, n);
      std::vector<float> out(n);
      compressed_recv(cpu_executor{}, t, mpc, std::span<float>(out), 0);
      CHECK(same_bits(out, data));
      const auto report = compressed_recv(cpu_executor{}, t, lossy_codec, std::span<float>(out), 0);
      CHECK(same_bits(out, round_trip(lossy_codec, data)));
      CHECK(report.error_bound == max_difference(data, out));
      std::vector<float> untouched(n, 3.0f);
      CHECK(thrown_by([&] { compressed_recv(cpu_executor{}, t, lossy_codec, std::span<float>(untouched), 0); }) ==
            named(errc::non_finite_input));
      std::vector<float> wrong_size(n - 1, 3.0f);
      CHECK(thrown_by([&] { compressed_recv(cpu_executor{}, t, mpc, std::span<float>(wrong_size), 0); }) ==
            named(errc::size_mismatch));
      CHECK(std::all_of(untouched.begin(), untouched.end(), [](float v) { return v == 3.0f; }));
      CHECK(std::all_of(wrong_size.begin(), wrong_size.end(), [](float v) { return v == 3.0f; }));
    }
  });
}

TEST_CASE_TEMPLATE("compressed_all_gather and send/recv carry bf16 and fp16 blocks as their codecs decode them", H,
                   bf16, fp16) {
  // Every rank's block decoded into the 16-bit type (rounded once), on every rank, equals the
  // reference executor's decoding of that rank's own message; the measured error is over the
  // widened values. A NaN on one rank stops every rank with the output unchanged.
  constexpr std::size_t m = 515;
  const uniform_quantizer<H> q({.bits = 8, .block = 64});
  const topk_sparsifier<H> topk(sparsity{.density = 0.1});
  const auto block_of = [&](int rank) {
    std::vector<float> v = values_of(rank, m, 5);
    std::vector<H> h(m);
    for (std::size_t i = 0; i < m; ++i) h[i] = narrow<H>(v[i]);
    return h;
  };
  const auto decoded_by_reference = [](const auto& codec, const std::vector<H>& x) {
    std::vector<std::byte> message(codec.max_encoded_bytes(x.size()));
    std::vector<std::byte> ws(codec.workspace_bytes(reference_executor{}, x.size()));
    message.resize(codec.encode(reference_executor{}, std::span<const H>(x), message, ws, {}));
    std::vector<H> out(x.size());
    codec.decode(reference_executor{}, message, std::span<H>(out), ws);
    return out;
  };
  const auto patterns = [](const std::vector<H>& x) {
    std::vector<std::uint16_t> bits(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) bits[i] = x[i].bits;
    return bits;
  };
  constexpr int P = 3;
  std::vector<std::vector<H>> gathered(P), sparse(P);
  std::vector<double> bounds(P);
  in_process_group(P).run([&](in_process_transport& t) {
    const std::vector<H> mine = block_of(t.rank());
    std::vector<H> out(m * P);
    bounds[static_cast<std::size_t>(t.rank())] = compressed_all_gather(cpu_executor{}, t, q, std::span<const H>(mine),
                                                                       std::span<H>(out), {.measure_error = true})
                                                     .error_bound;
    gathered[static_cast<std::size_t>(t.rank())] = out;
    compressed_all_gather(cpu_executor{}, t, topk, std::span<const H>(mine), std::span<H>(out));
    sparse[static_cast<std::size_t>(t.rank())] = out;
  });
  std::vector<H> expected, expected_sparse;
  double worst = 0.0;
  for (int r = 0; r < P; ++r) {
    const std::vector<H> x = block_of(r);
    const std::vector<H> d = decoded_by_reference(q, x);
    expected.insert(expected.end(), d.begin(), d.end());
    const std::vector<H> s = decoded_by_reference(topk, x);
    expected_sparse.insert(expected_sparse.end(), s.begin(), s.end());
    for (std::size_t i = 0; i < m; ++i)
      worst = std::max(worst, std::fabs(static_cast<double>(widen(x[i])) - static_cast<double>(widen(d[i]))));
  }
  for (int r = 0; r < P; ++r) {
    CHECK(patterns(gathered[static_cast<std::size_t>(r)]) == patterns(expected));
    CHECK(patterns(sparse[static_cast<std::size_t>(r)]) == patterns(expected_sparse));
    CHECK(bounds[static_cast<std::size_t>(r)] == worst);
  }
  std::atomic<int> failed{0};
  in_process_group(P).run([&](in_process_transport& t) {
    std::vector<H> mine = block_of(t.rank());
    if (t.rank() == 1) mine[3] = H{static_cast<std::uint16_t>(float_traits<H>::infinity_key + 1)};  // a NaN
    std::vector<H> all(m * P, narrow<H>(2.0f));
    if (thrown_by([&] { compressed_all_gather(cpu_executor{}, t, q, std::span<const H>(mine), std::span<H>(all)); }) ==
        named(errc::non_finite_input))
      ++failed;
    CHECK(std::all_of(all.begin(), all.end(), [](H v) { return v.bits == narrow<H>(2.0f).bits; }));
  });
  CHECK(failed.load() == P);
  // Point to point: the receiver gets the reference's decoding of the sender's message.
  in_process_group(2).run([&](in_process_transport& t) {
    const std::vector<H> data = block_of(0);
    if (t.rank() == 0) {
      compressed_send(cpu_executor{}, t, q, std::span<const H>(data), 1);
    } else {
      std::vector<H> out(m);
      compressed_recv(cpu_executor{}, t, q, std::span<H>(out), 0);
      CHECK(patterns(out) == patterns(decoded_by_reference(q, data)));
    }
  });
}

TEST_CASE("compressed frames: hostile headers are rejected by name") {
  std::vector<std::byte> frame(16, std::byte{0});
  CHECK(detail::frame_header_bytes == 16);  // the codec message starts on an 8-byte boundary
  CHECK(thrown_by([&] { (void)detail::read_frame(std::span<const std::byte>(frame).first(15)); }) ==
        named(errc::truncated));
  frame[0] = std::byte{static_cast<unsigned char>(errc::non_finite_input)};
  CHECK(detail::read_frame(frame).status == static_cast<std::uint8_t>(errc::non_finite_input));
  frame.push_back(std::byte{1});  // a failed frame that carries bytes
  CHECK(thrown_by([&] { (void)detail::read_frame(frame); }) == named(errc::malformed_payload));
  frame.pop_back();
  frame[0] = std::byte{200};  // no such errc
  CHECK(thrown_by([&] { (void)detail::read_frame(frame); }) == named(errc::malformed_payload));
  frame[0] = std::byte{0};
  for (std::size_t i = 1; i < 8; ++i) {  // the reserved bytes must be zero
    frame[i] = std::byte{1};
    CHECK(thrown_by([&] { (void)detail::read_frame(frame); }) == named(errc::malformed_payload));
    frame[i] = std::byte{0};
  }
  // The bound is the float64 at byte 8.
  const double bound = 0.375;
  std::memcpy(frame.data() + 8, &bound, sizeof bound);
  CHECK(detail::read_frame(frame).bound == bound);
  CHECK(detail::read_frame(frame).message.empty());
}

}  // namespace
}  // namespace gradcomp::test
