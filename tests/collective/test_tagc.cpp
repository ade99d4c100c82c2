// TAGC's compressed reduce-scatter (compressed_reduce_scatter with a tagc scheme) over the
// in-process transport. The oracle is the plain fp32 reduce-scatter mean (or sum), computed here in
// rank order over chunks cut independently of ring_chunk_of, of what each rank's sparsifier kept;
// the gradients are multiples of 2^-12 below 2^-2, so every sum in the sketches and the residuals is
// exact and the decoded chunks must match bit for bit.
#include <gradcomp/collective/tagc.hpp>
#include <gradcomp/transport/in_process.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <mutex>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "support/data.hpp"
#include "support/errors.hpp"

namespace gradcomp::test {
namespace {

using rank_states = std::vector<tagc_state<float, cpu_executor>>;
using residual_map = std::map<std::uint64_t, std::vector<float>>;

// Rank r's gradient at a step: N values k·2^-12 with |k| < 2^10, a different pattern per rank.
std::vector<float> exact_gradient(std::size_t N, int rank, std::uint64_t step) {
  std::mt19937_64 engine(1000 * step + static_cast<std::uint64_t>(rank) + 17);
  std::uniform_int_distribution<int> k(-1023, 1023);
  std::vector<float> g(N);
  for (float& v : g) v = std::ldexp(static_cast<float>(k(engine)), -12);
  return g;
}

// Equal values (+0 and −0 count as equal: the sketch decodes a zero sum as +0, while a dense sum of
// −0 contributions is −0); a NaN never equals anything.
bool same_values(std::span<const float> a, std::span<const float> b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (!(a[i] == b[i])) return false;
  return true;
}

// Chunk c of n values cut into P, written out independently of ring_chunk_of: the first n mod P
// chunks one longer. {offset, count}.
std::pair<std::size_t, std::size_t> chunk(std::size_t n, std::size_t P, std::size_t c) {
  const std::size_t base = n / P, extra = n % P;
  return {c * base + std::min(c, extra), base + (c < extra ? 1 : 0)};
}

// Where chunk s's kept values start in the state's `sparse` buffer: the block-aligned parts of the
// chunks before it, one after another.
std::size_t kept_offset(std::size_t n, std::size_t P, std::size_t s, std::size_t block) {
  std::size_t offset = 0;
  for (std::size_t q = 0; q < s; ++q) offset += chunk(n, P, q).second / block * block;
  return offset;
}

// The options of every call in these tests: tensor 7, the mean.
constexpr reduce_scatter_options mean_of_tensor_7{.key = {.tensor_id = 7}, .average = true};

// What one rank saw in one call: its gradient, its residuals before and after, what it kept
// (the state's sparsified chunks), its output chunk and its report.
struct rank_step {
  std::vector<float> grad;
  residual_map residuals_before, residuals_after;
  std::vector<float> kept;
  std::vector<float> shard;
  tagc_report report;
};

// Runs `steps` calls of the scheme on P in-process ranks over n values; returns the record of the
// last step.
template <class Transport = in_process_transport>
std::vector<rank_step> run_tagc(const tagc<float>& scheme, int P, std::size_t n, int steps,
                                rank_states* keep_states = nullptr, reduce_scatter_options options = mean_of_tensor_7) {
  std::vector<rank_step> last(static_cast<std::size_t>(P));
  rank_states states;
  for (int r = 0; r < P; ++r) states.push_back(scheme.make_state(cpu_executor{}));
  for (int step = 0; step < steps; ++step) {
    in_process_group(P).run([&](in_process_transport& base) {
      Transport t(base);
      auto& state = states[static_cast<std::size_t>(base.rank())];
      rank_step& rec = last[static_cast<std::size_t>(base.rank())];
      rec.grad = exact_gradient(n, base.rank(), static_cast<std::uint64_t>(step));
      rec.residuals_before = state.feedback.residuals;
      rec.shard.assign(chunk(n, static_cast<std::size_t>(P), static_cast<std::size_t>(base.rank())).second,
                       std::numeric_limits<float>::quiet_NaN());
      rec.report = compressed_reduce_scatter(cpu_executor{}, t, scheme, state, std::span<const float>(rec.grad),
                                             std::span<float>(rec.shard), options);
      rec.residuals_after = state.feedback.residuals;
      rec.kept.assign(state.sparse.span().begin(), state.sparse.span().end());
    });
  }
  if (keep_states) *keep_states = std::move(states);
  return last;
}

// Forwards every collective to an in-process rank; `all_reduce_or` only when `WithOr` (without it,
// the transport is like stock NCCL).
template <bool WithOr>
struct forwarding_transport {
  explicit forwarding_transport(in_process_transport& t) : inner(&t) {}
  in_process_transport* inner;
  [[nodiscard]] int rank() const { return inner->rank(); }
  [[nodiscard]] int size() const { return inner->size(); }
  template <class V>
  void all_reduce_sum(std::span<V> d) {
    inner->all_reduce_sum(d);
  }
  template <class V>
  void all_reduce_max(std::span<V> d) {
    inner->all_reduce_max(d);
  }
  void all_reduce_or(std::span<std::uint8_t> d)
    requires WithOr
  {
    inner->all_reduce_or(d);
  }
  template <class V>
  void reduce_sum(std::span<V> d, int root) {
    inner->reduce_sum(d, root);
  }
  template <class V>
  void reduce_scatter_sum(std::span<const V> in, std::span<V> out) {
    inner->reduce_scatter_sum(in, out);
  }
  void broadcast(std::span<std::byte> d, int root) { inner->broadcast(d, root); }
  std::vector<std::vector<std::byte>> all_gather_bytes(std::span<const std::byte> b) {
    return inner->all_gather_bytes(b);
  }
};
using sum_only_transport = forwarding_transport<false>;
using same_transport = forwarding_transport<true>;
static_assert(transport<sum_only_transport> && !transport_with_bitwise_or<sum_only_transport>);
static_assert(transport_with_bitwise_or<same_transport>);

tagc_params small_blocks(tagc_schedule schedule, double zero_fraction = 0.8) {
  tagc_params p;
  p.sparsify.zero_fraction = zero_fraction;
  p.sketch.block = 64;
  p.schedule = schedule;
  return p;
}

// Checks the last step of a run over n values against the oracle: per chunk, kept + new residual
// == gradient + old residual (bit for bit); each owner's chunk == (1/P)·Σ_p kept_p (rank order) on
// its block-aligned part and (1/P)·Σ_p grad_p on its tail (without the division when `summed`).
void check_against_oracle(const std::vector<rank_step>& ranks, std::size_t n, std::size_t block, bool summed = false) {
  const auto P = ranks.size();
  for (std::size_t p = 0; p < P; ++p) {
    const rank_step& rec = ranks[p];
    REQUIRE(rec.kept.size() == kept_offset(n, P, P, block));
    for (std::size_t s = 0; s < P; ++s) {
      const auto [offset, count] = chunk(n, P, s);
      const std::size_t aligned = count / block * block;
      const auto key = tagc<float>::residual_key(7, static_cast<int>(P), static_cast<int>(s));
      REQUIRE(rec.residuals_after.count(key) == 1);
      const auto& after = rec.residuals_after.at(key);
      REQUIRE(after.size() == aligned);
      const auto before_it = rec.residuals_before.find(key);
      std::size_t broken = 0;
      for (std::size_t i = 0; i < aligned; ++i) {
        const float old_residual = before_it == rec.residuals_before.end() ? 0.0f : before_it->second[i];
        const float lhs = rec.kept[kept_offset(n, P, s, block) + i] + after[i];
        const float rhs = rec.grad[offset + i] + old_residual;
        broken += lhs == rhs ? 0 : 1;
      }
      CHECK(broken == 0);
    }
  }
  for (std::size_t owner = 0; owner < P; ++owner) {
    const auto [offset, count] = chunk(n, P, owner);
    const std::size_t aligned = count / block * block;
    std::vector<float> expected(count);
    for (std::size_t i = 0; i < count; ++i) {
      float sum = 0.0f;
      for (std::size_t p = 0; p < P; ++p)
        sum += i < aligned ? ranks[p].kept[kept_offset(n, P, owner, block) + i] : ranks[p].grad[offset + i];
      expected[i] = summed ? sum : sum / static_cast<float>(P);
    }
    CAPTURE(owner);
    CHECK(same_values(ranks[owner].shard, expected));
  }
}

TEST_CASE("tagc owners get the fp32 reduce-scatter mean of the sparsified gradients, bit for bit") {
  constexpr std::size_t block = 64;
  for (int P : {2, 3, 4, 8}) {
    for (const auto schedule : {tagc_schedule::per_shard, tagc_schedule::fused}) {
      for (const std::size_t m : {std::size_t{5 * block + 17}, std::size_t{8 * block}, std::size_t{block - 3}}) {
        CAPTURE(P);
        CAPTURE(static_cast<int>(schedule));
        CAPTURE(m);
        const tagc<float> scheme(small_blocks(schedule));
        const std::size_t n = static_cast<std::size_t>(P) * m;
        const auto ranks = run_tagc(scheme, P, n, 3);
        check_against_oracle(ranks, n, block);
        for (const auto& rec : ranks) CHECK(rec.report.unrecovered == 0);
        // Each rank kept ⌊(1 − f*)…⌋: exactly ⌊0.8·aligned⌋ zeroed per shard when there are no ties
        // at the threshold; here values repeat, so at least that many survive.
        const std::size_t aligned = m / block * block;
        for (const auto& rec : ranks)
          CHECK(rec.report.kept >=
                static_cast<std::size_t>(P) * (aligned - static_cast<std::size_t>(0.8 * static_cast<double>(aligned))));
      }
    }
  }
}

TEST_CASE("tagc takes any n: chunks of the reduce-scatter's layout, each with its own block-aligned part and tail") {
  constexpr std::size_t block = 64;
  for (int P : {2, 3, 5}) {
    for (const std::size_t n : {std::size_t{7 * block * 3 + 11}, std::size_t{block * 4 + 1}, std::size_t{2}}) {
      for (const auto schedule : {tagc_schedule::per_shard, tagc_schedule::fused}) {
        CAPTURE(P);
        CAPTURE(n);
        CAPTURE(static_cast<int>(schedule));
        const auto ranks = run_tagc(tagc<float>(small_blocks(schedule)), P, n, 2);
        check_against_oracle(ranks, n, block);
      }
    }
  }
}

TEST_CASE("tagc without average gives the sum, and with it each value of the sum divided by P in float") {
  constexpr std::size_t block = 64, n = 3 * (4 * block + 9);
  const tagc<float> scheme(small_blocks(tagc_schedule::fused));
  const auto summed = run_tagc(scheme, 3, n, 2, nullptr, {.key = {.tensor_id = 7}});
  const auto averaged = run_tagc(scheme, 3, n, 2);
  check_against_oracle(summed, n, block, true);
  for (std::size_t r = 0; r < 3; ++r) {
    std::vector<float> divided = summed[r].shard;
    for (float& v : divided) v = v / 3.0f;
    CHECK(same_bits(divided, averaged[r].shard));
  }
}

TEST_CASE("tagc fused and per-shard schedules give identical shards, residuals and reports") {
  constexpr std::size_t m = 6 * 64 + 5;
  for (int P : {2, 4}) {
    CAPTURE(P);
    const std::size_t n = static_cast<std::size_t>(P) * m;
    const auto per_shard = run_tagc(tagc<float>(small_blocks(tagc_schedule::per_shard)), P, n, 4);
    const auto fused = run_tagc(tagc<float>(small_blocks(tagc_schedule::fused)), P, n, 4);
    for (std::size_t r = 0; r < per_shard.size(); ++r) {
      CHECK(same_bits(per_shard[r].shard, fused[r].shard));
      CHECK(per_shard[r].residuals_after == fused[r].residuals_after);
      CHECK(per_shard[r].report.sketch_values == fused[r].report.sketch_values);
      CHECK(per_shard[r].report.union_nonzeros == fused[r].report.union_nonzeros);
    }
  }
}

TEST_CASE("tagc over a transport without bitwise OR sums 4-bit index fields and gets the same result") {
  constexpr std::size_t m = 4 * 64 + 9, n = 4 * m;
  const tagc<float> scheme(small_blocks(tagc_schedule::fused));
  CHECK(scheme.index_coding<sum_only_transport>(4) == lhc_index_coding::sum4);
  CHECK(scheme.index_coding<sum_only_transport>(16) == lhc_index_coding::sum8);
  CHECK(scheme.index_coding<same_transport>(16) == lhc_index_coding::bitmap);
  CHECK(thrown_by([&] { (void)scheme.index_coding<sum_only_transport>(256); }) == named(errc::invalid_argument));
  const auto with_or = run_tagc<same_transport>(scheme, 4, n, 2);
  const auto sum_only = run_tagc<sum_only_transport>(scheme, 4, n, 2);
  for (std::size_t r = 0; r < 4; ++r) {
    CHECK(same_bits(with_or[r].shard, sum_only[r].shard));
    // The 4-bit index is four times the bitmap: 4·(N/2) bytes against N/8 per call.
    CHECK(sum_only[r].report.sent_bytes > with_or[r].report.sent_bytes);
  }
  check_against_oracle(sum_only, n, 64);
}

TEST_CASE("tagc reports its bytes: indexes, sketches and tails, fewer than dense when sparse enough") {
  constexpr std::size_t block = 64, m = 64 * block + 10, n = 2 * m;
  const tagc<float> scheme(small_blocks(tagc_schedule::fused, 0.95));
  const auto ranks = run_tagc(scheme, 2, n, 1);
  const lossless_homomorphic<float> lhc(scheme.params().sketch);
  for (const auto& rec : ranks) {
    CHECK(rec.report.dense_bytes == 2 * m * sizeof(float));
    CHECK(rec.report.sent_bytes < rec.report.dense_bytes / 2);
    CHECK(rec.report.sketch_values > 0);
    CHECK(rec.report.sketch_values < m / 4);
  }
  // Every rank contributes both indexes, then one segment per shard: the shard's sketch plus the
  // tail, padded to the longest of them (the fused schedule's reduce-scatter), then any shard
  // resent after a stall.
  std::uint64_t longest = 0;
  for (const auto& rec : ranks) longest = std::max<std::uint64_t>(longest, rec.report.sketch_values + (m % block));
  CHECK(ranks[0].report.sent_bytes == 2 * lhc.index_bytes(m / block * block) + 2 * longest * sizeof(float) +
                                          ranks[0].report.resent_shards * m * sizeof(float));
  // The same bytes by segment: both indexes; both sketches (this rank's own, plus the other
  // owner's, which every rank sizes alike from the aggregated index); both 10-value tails; the
  // shorter segment's padding up to the longest; resent shards.
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    const tagc_report& got = ranks[r].report;
    CHECK(got.index_bytes == 2 * lhc.index_bytes(m / block * block));
    CHECK(got.sketch_bytes == (ranks[0].report.sketch_values + ranks[1].report.sketch_values) * sizeof(float));
    CHECK(got.tail_bytes == 2 * (m % block) * sizeof(float));
    CHECK(got.sketch_bytes + got.tail_bytes + got.padding_bytes == 2 * longest * sizeof(float));
    CHECK(got.resent_bytes == got.resent_shards * m * sizeof(float));
    CHECK(got.sent_bytes == got.index_bytes + got.sketch_bytes + got.tail_bytes + got.padding_bytes + got.resent_bytes);
  }
  // The per-shard schedule sends no padding, and the same indexes, sketches and tails.
  const auto per_shard = run_tagc(tagc<float>(small_blocks(tagc_schedule::per_shard, 0.95)), 2, n, 1);
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    CHECK(per_shard[r].report.padding_bytes == 0);
    CHECK(per_shard[r].report.index_bytes == ranks[r].report.index_bytes);
    CHECK(per_shard[r].report.sketch_bytes == ranks[r].report.sketch_bytes);
    CHECK(per_shard[r].report.tail_bytes == ranks[r].report.tail_bytes);
  }
  check_against_oracle(ranks, n, block);
}

TEST_CASE("tagc warm-up: an uncompressed reduce-scatter mean while step < dense_steps, residuals untouched") {
  constexpr std::size_t n = 4 * (8 * 64) + 3;
  constexpr int P = 4;
  const tagc<float> scheme(small_blocks(tagc_schedule::fused, 0.95));
  rank_states states;
  // Two compressed steps give every rank residuals; then a warm-up step (step 1 < dense_steps 2).
  (void)run_tagc(scheme, P, n, 2, &states);
  const reduce_scatter_options warm{.key = {.step = 1, .tensor_id = 7}, .average = true, .dense_steps = 2};
  std::vector<std::vector<float>> grads(P), shards(P);
  std::vector<residual_map> before(P);
  std::vector<tagc_report> reports(P);
  in_process_group(P).run([&](in_process_transport& t) {
    const auto r = static_cast<std::size_t>(t.rank());
    grads[r] = exact_gradient(n, t.rank(), 9);
    before[r] = states[r].feedback.residuals;
    shards[r].assign(chunk(n, P, r).second, std::numeric_limits<float>::quiet_NaN());
    reports[r] = compressed_reduce_scatter(cpu_executor{}, t, scheme, states[r], std::span<const float>(grads[r]),
                                           std::span<float>(shards[r]), warm);
  });
  for (std::size_t r = 0; r < P; ++r) {
    CAPTURE(r);
    CHECK(states[r].feedback.residuals == before[r]);
    const auto [offset, count] = chunk(n, P, r);
    std::vector<float> expected(count);
    for (std::size_t i = 0; i < count; ++i) {
      float sum = 0.0f;
      for (std::size_t q = 0; q < P; ++q) sum += grads[q][offset + i];
      expected[i] = sum / static_cast<float>(P);
    }
    CHECK(same_bits(shards[r], expected));
    // A dense reduce-scatter of P blocks of ⌈n/P⌉ values: P − 1 of them leave this rank.
    CHECK(reports[r].sent_bytes == (P - 1) * chunk(n, P, 0).second * sizeof(float));
    CHECK(reports[r].index_bytes == 0);
  }
  // A rank that disagrees on the warm-up makes every rank throw, residuals untouched.
  std::vector<std::string> thrown(P);
  in_process_group(P).run([&](in_process_transport& t) {
    const auto r = static_cast<std::size_t>(t.rank());
    reduce_scatter_options mine = warm;
    if (r == 2) mine.dense_steps = 0;
    thrown[r] = thrown_by([&] {
      (void)compressed_reduce_scatter(cpu_executor{}, t, scheme, states[r], std::span<const float>(grads[r]),
                                      std::span<float>(shards[r]), mine);
    });
  });
  for (std::size_t r = 0; r < P; ++r) {
    CHECK(thrown[r] == named(errc::parameter_mismatch));
    CHECK(states[r].feedback.residuals == before[r]);
  }
}

TEST_CASE("tagc resends a shard whose sketch stalls under the report policy and is never wrong") {
  constexpr std::size_t block = 64, m = 16 * block, n = 4 * m;
  for (const auto schedule : {tagc_schedule::per_shard, tagc_schedule::fused}) {
    tagc_params p = small_blocks(schedule, 0.5);
    p.sketch.fixed_compress_ratio = 4;  // r·B = n/4 cells for a union of about 3/4 of n: peeling stalls
    const auto ranks = run_tagc(tagc<float>(p), 4, n, 1);
    for (const auto& rec : ranks) {
      CHECK(rec.report.unrecovered > 0);
      CHECK(rec.report.resent_shards == 4);
      CHECK(rec.report.estimated == 0);
      CHECK(rec.report.resent_bytes == 4 * m * sizeof(float));
      CHECK(rec.report.sent_bytes == rec.report.index_bytes + rec.report.sketch_bytes + rec.report.tail_bytes +
                                         rec.report.padding_bytes + rec.report.resent_bytes);
    }
    for (std::size_t owner = 0; owner < 4; ++owner) {
      std::vector<float> expected(m);
      for (std::size_t i = 0; i < m; ++i) {
        float sum = 0.0f;
        for (std::size_t q = 0; q < 4; ++q) sum += ranks[q].kept[owner * m + i];
        expected[i] = sum / 4.0f;
      }
      CHECK(same_values(ranks[owner].shard, expected));
    }
    // The explicit median policy keeps the estimates instead, and says how many.
    p.sketch.on_stall = lhc_stall_policy::median_estimate;
    const auto estimated = run_tagc(tagc<float>(p), 4, n, 1);
    for (const auto& rec : estimated) {
      CHECK(rec.report.resent_shards == 0);
      CHECK(rec.report.estimated == rec.report.unrecovered);
      CHECK(rec.report.estimated > 0);
    }
  }
}

TEST_CASE("tagc skips a step on every rank when any rank's gradient holds NaN or Inf, state untouched") {
  constexpr std::size_t m = 3 * 64 + 1, n = 3 * m;
  const tagc<float> scheme(small_blocks(tagc_schedule::fused));
  // Positions: inside shard 1's aligned part, and the tail value of shard 0; on states with
  // residuals (after two steps) and on fresh states (checked on the gradient alone).
  for (const int warm_steps : {2, 0})
    for (const std::size_t position : {m + 5, m - 1})
      for (const float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
        CAPTURE(warm_steps);
        CAPTURE(position);
        rank_states states;
        run_tagc(scheme, 3, n, warm_steps, &states);
        std::vector<residual_map> before;
        for (const auto& s : states) before.push_back(s.feedback.residuals);
        std::mutex mutex;
        std::vector<std::string> outcomes;
        in_process_group(3).run([&](in_process_transport& t) {
          auto grad = exact_gradient(n, t.rank(), 99);
          if (t.rank() == 1) grad[position] = bad;  // only rank 1 sees it
          std::vector<float> shard(m);
          const std::string outcome = thrown_by([&] {
            (void)compressed_reduce_scatter(cpu_executor{}, t, scheme, states[static_cast<std::size_t>(t.rank())],
                                            std::span<const float>(grad), std::span<float>(shard), mean_of_tensor_7);
          });
          const std::lock_guard lock(mutex);
          outcomes.push_back(outcome);
        });
        CHECK(outcomes == std::vector<std::string>(3, named(errc::non_finite_input)));
        for (std::size_t r = 0; r < 3; ++r) CHECK(states[r].feedback.residuals == before[r]);
      }
}

TEST_CASE("tagc state saved after two steps continues bit-identically") {
  constexpr std::size_t m = 4 * 64 + 3, n = 3 * m;
  const tagc<float> scheme(small_blocks(tagc_schedule::fused));
  rank_states states;
  run_tagc(scheme, 3, n, 2, &states);
  std::vector<std::vector<std::byte>> saved;
  for (const auto& s : states) {
    saved.emplace_back(tagc<float>::saved_state_bytes(s));
    CHECK(scheme.save_state(cpu_executor{}, s, saved.back()) == saved.back().size());
  }
  rank_states restored;
  for (const auto& bytes : saved) {
    restored.push_back(scheme.make_state(cpu_executor{}));
    scheme.load_state(cpu_executor{}, bytes, restored.back());
  }
  const auto step = [&](rank_states& st) {
    std::vector<std::vector<float>> shards(3, std::vector<float>(m));
    in_process_group(3).run([&](in_process_transport& t) {
      const auto grad = exact_gradient(n, t.rank(), 2);
      (void)compressed_reduce_scatter(cpu_executor{}, t, scheme, st[static_cast<std::size_t>(t.rank())],
                                      std::span<const float>(grad),
                                      std::span<float>(shards[static_cast<std::size_t>(t.rank())]), mean_of_tensor_7);
    });
    return shards;
  };
  const auto continued = step(states);
  const auto resumed = step(restored);
  for (std::size_t r = 0; r < 3; ++r) {
    CHECK(same_bits(continued[r], resumed[r]));
    CHECK(states[r].feedback.residuals == restored[r].feedback.residuals);
  }
}

TEST_CASE("tagc problems found on one rank stop every rank alike and leave every state as it was") {
  constexpr std::size_t m = 2 * 64 + 5, n = 2 * m;
  const tagc<float> scheme(small_blocks(tagc_schedule::fused));
  const auto key0 = tagc<float>::residual_key(7, 2, 0);
  const auto plain = [](int rank) { return exact_gradient(n, rank, 5); };
  const auto no_change = [](int, residual_map&) {};
  const auto own_chunk = [](int) { return m; };
  struct scenario {
    const char* name;
    std::function<void(int, residual_map&)> tamper;
    std::function<std::vector<float>(int)> grad_of;
    std::function<std::size_t(int)> out_size;
    reduce_scatter_plan plan;
    errc expected;
  };
  const std::vector<scenario> scenarios = {
      // Rank 1's residual plus its gradient overflows: found before any collective.
      {"residual overflow",
       [&](int rank, residual_map& r) {
         if (rank == 1) r.at(key0)[3] = std::numeric_limits<float>::max();
       },
       [&](int rank) {
         auto g = plain(rank);
         if (rank == 1) g[3] = std::numeric_limits<float>::max();
         return g;
       },
       own_chunk, reduce_scatter_plan::automatic, errc::non_finite_input},
      // Rank 0's residual of shard 0 has another size.
      {"residual size",
       [&](int rank, residual_map& r) {
         if (rank == 0) r.at(key0).resize(10);
       },
       plain, own_chunk, reduce_scatter_plan::tagc, errc::size_mismatch},
      // Both ranks keep 3e38 at element 0 of shard 0: the owner's sum overflows after the collectives.
      {"sum overflow", no_change,
       [&](int rank) {
         auto g = plain(rank);
         g[0] = 3e38f;
         return g;
       },
       own_chunk, reduce_scatter_plan::automatic, errc::non_finite_input},
      // Rank 1's output is not its chunk.
      {"output size", no_change, plain, [](int rank) { return rank == 1 ? m - 1 : m; }, reduce_scatter_plan::automatic,
       errc::invalid_argument},
      // A plan of the codecs' reduce-scatter.
      {"plan", no_change, plain, own_chunk, reduce_scatter_plan::all_to_all, errc::invalid_argument},
  };
  for (const scenario& sc : scenarios) {
    CAPTURE(sc.name);
    rank_states states;
    run_tagc(scheme, 2, n, 2, &states);
    // The tamper is applied inside the run; record the residuals as they will be when the call starts.
    std::vector<residual_map> before;
    for (int r = 0; r < 2; ++r) {
      before.push_back(states[static_cast<std::size_t>(r)].feedback.residuals);
      sc.tamper(r, before.back());
    }
    std::vector<std::string> outcomes(2);
    in_process_group(2).run([&](in_process_transport& t) {
      auto& state = states[static_cast<std::size_t>(t.rank())];
      sc.tamper(t.rank(), state.feedback.residuals);
      const std::vector<float> grad = sc.grad_of(t.rank());
      std::vector<float> shard(sc.out_size(t.rank()));
      outcomes[static_cast<std::size_t>(t.rank())] = thrown_by([&] {
        (void)compressed_reduce_scatter(cpu_executor{}, t, scheme, state, std::span<const float>(grad),
                                        std::span<float>(shard),
                                        {.key = {.tensor_id = 7}, .plan = sc.plan, .average = true});
      });
    });
    CHECK(outcomes == std::vector<std::string>(2, named(sc.expected)));
    for (std::size_t r = 0; r < 2; ++r) CHECK(states[r].feedback.residuals == before[r]);
  }
}

TEST_CASE("tagc rejects invalid parameters, and disagreeing ranks by the agreement's named errors") {
  tagc_params bad;
  bad.sketch.block = 0;
  CHECK(thrown_by([&] { tagc<float> x(bad); }) == named(errc::invalid_argument));
  const tagc<float> scheme(small_blocks(tagc_schedule::fused));
  const tagc<float> other(small_blocks(tagc_schedule::per_shard));
  std::vector<std::string> outcomes(2);
  for (const bool other_scheme : {true, false}) {
    in_process_group(2).run([&](in_process_transport& t) {
      auto state = scheme.make_state(cpu_executor{});
      const std::size_t n = other_scheme || t.rank() == 0 ? 200 : 202;  // n differs, or the schedule does
      const auto grad = exact_gradient(n, t.rank(), 0);
      std::vector<float> shard(n / 2);
      outcomes[static_cast<std::size_t>(t.rank())] = thrown_by([&] {
        (void)compressed_reduce_scatter(cpu_executor{}, t, other_scheme && t.rank() == 1 ? other : scheme, state,
                                        std::span<const float>(grad), std::span<float>(shard), mean_of_tensor_7);
      });
    });
    CHECK(outcomes ==
          std::vector<std::string>(2, named(other_scheme ? errc::parameter_mismatch : errc::size_mismatch)));
  }
}

TEST_CASE("tagc with the reference settings: threshold table, fixed compress ratio 2, two ranks") {
  constexpr std::size_t block = 64, m = 12 * block + 30, n = 2 * m;
  tagc_params p = small_blocks(tagc_schedule::per_shard);
  p.sparsify.mode = dynamic_threshold_mode::tagc_table;
  p.sketch.fixed_compress_ratio = 2;
  const auto ranks = run_tagc(tagc<float>(p), 2, n, 3);
  for (const auto& rec : ranks) CHECK(rec.report.sketch_values == 6 * block);  // ⌈12/2⌉ rows of B
  check_against_oracle(ranks, n, block);  // exact, peeled or (where the table kept too much) resent
}

TEST_CASE("tagc on double gradients") {
  constexpr std::size_t m = 2 * 64 + 3;
  const tagc<double> scheme(small_blocks(tagc_schedule::fused));
  std::vector<std::vector<double>> shards(2);
  std::vector<std::vector<double>> grads(2);
  in_process_group(2).run([&](in_process_transport& t) {
    auto state = scheme.make_state(cpu_executor{});
    const auto g = exact_gradient(2 * m, t.rank(), 0);
    auto& grad = grads[static_cast<std::size_t>(t.rank())];
    grad.assign(g.begin(), g.end());
    auto& shard = shards[static_cast<std::size_t>(t.rank())];
    shard.resize(m);
    (void)compressed_reduce_scatter(cpu_executor{}, t, scheme, state, std::span<const double>(grad),
                                    std::span<double>(shard), {.average = true});
  });
  // The tails are dense: the mean of the two ranks' tails.
  for (std::size_t owner = 0; owner < 2; ++owner)
    for (std::size_t i = 2 * 64; i < m; ++i)
      CHECK(shards[owner][i] == (grads[0][owner * m + i] + grads[1][owner * m + i]) / 2.0);
}

}  // namespace
}  // namespace gradcomp::test
