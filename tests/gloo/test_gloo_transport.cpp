// The Gloo transport, one process per rank started by tests/support/run_ranks.sh on 2 and 4
// ranks: every collective and point-to-point call against the dense reference and the in-process
// transport (transport_checks.hpp), Gloo's failures as transport_failed, and deadlines: a rank that
// stops calling in the middle of a compressed collective (deadline_checks.hpp).
#define DOCTEST_CONFIG_IMPLEMENT
#include <gradcomp/transport/gloo.hpp>

#include <doctest/doctest.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "support/errors.hpp"
#include "collective/collective_checks.hpp"
#include "collective/deadline_checks.hpp"
#include "transport/transport_checks.hpp"

namespace gradcomp::test {
namespace {

static_assert(transport<gloo_transport>);
static_assert(transport_with_bitwise_or<gloo_transport>);
static_assert(transport_with_point_to_point<gloo_transport>);
static_assert(transport_with_all_to_all<gloo_transport>);
static_assert(transport_with_deadline<gloo_transport>);

// Where the ranks meet (run_ranks.sh's GRADCOMP_STORE), and the context connected there by main.
std::string store_path;
std::shared_ptr<gloo::Context> world;

// A context of every rank, connected through the store under `prefix` (collective).
std::shared_ptr<gloo::Context> connect_ranks(int rank, int size, const std::string& prefix,
                                             std::chrono::milliseconds timeout) {
  auto device = gloo::transport::tcp::CreateDevice("127.0.0.1");
  gloo::rendezvous::FileStore files(store_path);
  gloo::rendezvous::PrefixStore store(prefix, files);
  auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
  context->setTimeout(timeout);
  context->connectFullMesh(store, device);
  return context;
}

TEST_CASE("gloo all_reduce_sum equals the rank-order sum bit for bit, and the in-process transport") {
  gloo_transport t(world);
  transport_checks::all_reduce_sum(t);
}

TEST_CASE("gloo all_reduce_max takes NaN and signed zeros as the in-process transport does") {
  gloo_transport t(world);
  transport_checks::all_reduce_max(t);
}

TEST_CASE("gloo all_reduce_or") {
  gloo_transport t(world);
  transport_checks::all_reduce_or(t);
}

TEST_CASE("gloo reduce_sum to every root leaves the other ranks unchanged") {
  gloo_transport t(world);
  transport_checks::reduce_sum(t);
}

TEST_CASE("gloo reduce_scatter_sum") {
  gloo_transport t(world);
  transport_checks::reduce_scatter_sum(t);
}

TEST_CASE("gloo broadcast from every root") {
  gloo_transport t(world);
  transport_checks::broadcast(t);
}

TEST_CASE("gloo all_gather_bytes of different sizes, empty ones included") {
  gloo_transport t(world);
  transport_checks::all_gather_bytes(t);
}

TEST_CASE("gloo all_to_all_bytes of different sizes per pair, empty ones included") {
  gloo_transport t(world);
  transport_checks::all_to_all_bytes(t);
}

TEST_CASE("gloo point-to-point: a ring, ordered pairs, empty and 1 MiB messages, messages to itself") {
  gloo_transport t(world);
  transport_checks::point_to_point(t);
}

TEST_CASE(
    "gloo bad roots, peers, reduce-scatter sizes and all-to-all counts throw invalid_argument on every rank without hanging") {
  gloo_transport t(world);
  transport_checks::argument_errors(t);
  CHECK(thrown_by([] { gloo_transport none(nullptr); }) == named(errc::invalid_argument));
}

TEST_CASE("gloo compressed_all_reduce: every injected mismatch is the same named error on every rank") {
  gloo_transport t(world);
  check_agreement_scenarios(t);
}

TEST_CASE("gloo compressed_all_reduce and compressed_reduce_scatter with a lossless codec give the rank-order sum") {
  gloo_transport t(world);
  check_lossless_sums(t);
}

TEST_CASE("gloo a peer that never sends surfaces as transport_failed after the context's timeout") {
  // A context of its own, since Gloo leaves a context that failed in an unknown state.
  const auto context = connect_ranks(world->rank, world->size, "timeout", std::chrono::milliseconds(300));
  gloo_transport t(context);
  if (t.rank() == 0) {
    std::string what;
    try {
      (void)t.recv_bytes(1);
    } catch (const error& e) {
      CHECK(e.code() == errc::transport_failed);
      what = e.what();
    }
    INFO(what);
    CHECK(what.find("gloo_transport: recv_bytes failed: ") != std::string::npos);
  }
  // Every rank waits here for rank 0 to time out before the context goes.
  gloo_transport w(world);
  std::vector<std::uint64_t> one = {1};
  w.all_reduce_sum(std::span<std::uint64_t>(one));
  CHECK(one[0] == static_cast<std::uint64_t>(w.size()));
}

TEST_CASE(
    "gloo compressed collectives: one rank stops mid-call, every survivor fails within the deadline, at least one with timeout, data and state unchanged") {
  // Gloo closes a context's connections when one of its waits times out, so the other survivors of
  // the same collective may fail at once with transport_failed ("Connection closed by peer")
  // instead of reaching their own deadline. A receive from the stalled rank waits on that rank's
  // connection only: every survivor reaches its deadline.
  int index = 0;
  for (const deadline_case c : {deadline_case::all_reduce_error_feedback, deadline_case::reduce_scatter_tagc,
                                deadline_case::ring_all_reduce, deadline_case::send_recv}) {
    CAPTURE(static_cast<int>(c));
    const auto context =
        connect_ranks(world->rank, world->size, "deadline-" + std::to_string(index++), std::chrono::seconds(30));
    gloo_transport inner(context);
    const int victim = inner.size() - 1;
    // The victim keeps its context (its connections) open until the survivors are done: a rank
    // whose process exits is seen at once, not at the deadline.
    stalling_transport<gloo_transport> t(inner, victim, [] {
      std::this_thread::sleep_for(case_timeout + deadline_margin + std::chrono::milliseconds(500));
    });
    const deadline_outcome o = run_deadline_case(t, c);
    std::uint64_t code = 0;
    if (t.rank() == victim) {
      CHECK(o.stalled);
    } else if (o.thrown == named(errc::timeout) || c == deadline_case::send_recv) {
      check_survivor(o, c, t.rank(), t.size());
      code = static_cast<std::uint64_t>(errc::timeout);
    } else {
      INFO(o.what);
      CHECK(o.thrown == named(errc::transport_failed));
      CHECK(o.what.find(expected_prefix(c)) != std::string::npos);
      CHECK(o.seconds <= std::chrono::duration<double>(case_timeout + deadline_margin).count());
      CHECK(o.unchanged);
      code = static_cast<std::uint64_t>(errc::transport_failed);
    }
    // Over the world's context (this one is closed): the survivors' codes.
    gloo_transport w(world);
    std::vector<std::uint64_t> timeouts = {code == static_cast<std::uint64_t>(errc::timeout) ? 1u : 0u};
    w.all_reduce_sum(std::span<std::uint64_t>(timeouts));
    CHECK(timeouts[0] >= 1);
    if (c == deadline_case::send_recv) CHECK(timeouts[0] == static_cast<std::uint64_t>(t.size() - 1));
    if (t.rank() == 0)
      MESSAGE("case " << static_cast<int>(c) << ": " << timeouts[0] << " of " << t.size() - 1
                      << " survivors timed out; rank 0: " << o.thrown << " after " << o.seconds << " s (timeout 1 s)");
  }
}

}  // namespace
}  // namespace gradcomp::test

// Connects the ranks that run_ranks.sh started (GRADCOMP_RANK, GRADCOMP_SIZE, GRADCOMP_STORE),
// then runs doctest. Rank 0 prints the full report, the other ranks only their failures (each
// failure names its rank); each rank's exit code is its own result.
int main(int argc, char** argv) {
  const char* rank = std::getenv("GRADCOMP_RANK");
  const char* size = std::getenv("GRADCOMP_SIZE");
  const char* store = std::getenv("GRADCOMP_STORE");
  if (rank == nullptr || size == nullptr || store == nullptr) {
    std::fprintf(stderr,
                 "set GRADCOMP_RANK, GRADCOMP_SIZE and GRADCOMP_STORE, or run through tests/support/run_ranks.sh\n");
    return 2;
  }
  gradcomp::test::store_path = store;
  gradcomp::test::world =
      gradcomp::test::connect_ranks(std::atoi(rank), std::atoi(size), "world", std::chrono::seconds(30));
  doctest::Context context(argc, argv);
  if (gradcomp::test::world->rank != 0) {
    context.setOption("minimal", true);
    context.setOption("no-colors", true);
  }
  const int failed = context.run();
  gradcomp::test::world.reset();
  return failed != 0 ? 1 : 0;
}
