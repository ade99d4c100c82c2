// The MPI transport, run by mpirun on 2, 4 and 8 ranks: every collective and point-to-point call
// against the dense reference and the in-process transport (transport_checks.hpp), plus what only
// MPI has: the duplicated communicator, int counts, and MPI's errors as transport_failed.
#define DOCTEST_CONFIG_IMPLEMENT
#include <gradcomp/transport/mpi.hpp>

#include <doctest/doctest.h>
#include <sys/mman.h>

#include <climits>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "support/errors.hpp"
#include "collective/collective_checks.hpp"
#include "transport/transport_checks.hpp"

namespace gradcomp::test {
namespace {

static_assert(transport<mpi_transport>);
static_assert(transport_with_bitwise_or<mpi_transport>);
static_assert(transport_with_point_to_point<mpi_transport>);
static_assert(transport_with_all_to_all<mpi_transport>);

TEST_CASE("mpi all_reduce_sum equals the rank-order sum bit for bit, and the in-process transport") {
  mpi_transport t(MPI_COMM_WORLD);
  transport_checks::all_reduce_sum(t);
}

TEST_CASE("mpi all_reduce_max takes NaN and signed zeros as the in-process transport does") {
  mpi_transport t(MPI_COMM_WORLD);
  transport_checks::all_reduce_max(t);
}

TEST_CASE("mpi all_reduce_or") {
  mpi_transport t(MPI_COMM_WORLD);
  transport_checks::all_reduce_or(t);
}

TEST_CASE("mpi reduce_sum to every root leaves the other ranks unchanged") {
  mpi_transport t(MPI_COMM_WORLD);
  transport_checks::reduce_sum(t);
}

TEST_CASE("mpi reduce_scatter_sum") {
  mpi_transport t(MPI_COMM_WORLD);
  transport_checks::reduce_scatter_sum(t);
}

TEST_CASE("mpi broadcast from every root") {
  mpi_transport t(MPI_COMM_WORLD);
  transport_checks::broadcast(t);
}

TEST_CASE("mpi all_gather_bytes of different sizes, empty ones included") {
  mpi_transport t(MPI_COMM_WORLD);
  transport_checks::all_gather_bytes(t);
}

TEST_CASE("mpi all_to_all_bytes of different sizes per pair, empty ones included") {
  mpi_transport t(MPI_COMM_WORLD);
  transport_checks::all_to_all_bytes(t);
}

TEST_CASE("mpi point-to-point: a ring, ordered pairs, empty and 1 MiB messages, messages to itself") {
  mpi_transport t(MPI_COMM_WORLD);
  transport_checks::point_to_point(t);
}

TEST_CASE(
    "mpi bad roots, peers, reduce-scatter sizes and all-to-all counts throw invalid_argument on every rank without hanging") {
  mpi_transport t(MPI_COMM_WORLD);
  transport_checks::argument_errors(t);
}

TEST_CASE("mpi compressed_all_reduce: every injected mismatch is the same named error on every rank") {
  mpi_transport t(MPI_COMM_WORLD);
  check_agreement_scenarios(t);
}

TEST_CASE("mpi compressed_all_reduce and compressed_reduce_scatter with a lossless codec give the rank-order sum") {
  mpi_transport t(MPI_COMM_WORLD);
  check_lossless_sums(t);
}

TEST_CASE("mpi the transport's messages never match the user's communicator") {
  int world_rank = 0;
  int world_size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  mpi_transport t(MPI_COMM_WORLD);
  // A user message on MPI_COMM_WORLD with the transport's tag is still pending while the transport
  // exchanges its own message; each receive gets its own.
  const int next = (world_rank + 1) % world_size;
  const int prev = (world_rank + world_size - 1) % world_size;
  const int user = 1000 + world_rank;
  MPI_Request request = MPI_REQUEST_NULL;
  MPI_Isend(&user, 1, MPI_INT, next, 0, MPI_COMM_WORLD, &request);
  const std::vector<std::byte> mine(3, std::byte{static_cast<unsigned char>(world_rank)});
  const std::vector<std::byte> got = t.sendrecv_bytes(mine, next, prev);
  CHECK(got == std::vector<std::byte>(3, std::byte{static_cast<unsigned char>(prev)}));
  int received = 0;
  MPI_Recv(&received, 1, MPI_INT, prev, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  MPI_Wait(&request, MPI_STATUS_IGNORE);
  CHECK(received == 1000 + prev);
}

TEST_CASE("mpi a moved transport keeps working and the moved-from one is only destroyed") {
  mpi_transport a(MPI_COMM_WORLD);
  mpi_transport b(std::move(a));
  std::vector<std::uint64_t> one = {1};
  b.all_reduce_sum(std::span<std::uint64_t>(one));
  CHECK(one[0] == static_cast<std::uint64_t>(b.size()));
  mpi_transport c(MPI_COMM_WORLD);
  c = std::move(b);
  c.all_reduce_sum(std::span<std::uint64_t>(one));
  CHECK(one[0] == static_cast<std::uint64_t>(c.size()) * static_cast<std::uint64_t>(c.size()));
}

TEST_CASE("mpi counts above INT_MAX throw invalid_argument on every rank and touch nothing") {
  // An inaccessible reservation: a transport that read or wrote the buffer would crash.
  const std::size_t elements = std::size_t{INT_MAX} + 1;
  const std::size_t length = elements * sizeof(float);
  void* reserved = mmap(nullptr, length, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  REQUIRE(reserved != MAP_FAILED);
  mpi_transport t(MPI_COMM_WORLD);
  const std::span<float> floats(static_cast<float*>(reserved), elements);
  const std::span<std::uint8_t> small(static_cast<std::uint8_t*>(reserved), elements);
  const std::span<std::byte> bytes(static_cast<std::byte*>(reserved), elements);
  CHECK(thrown_by([&] { t.all_reduce_sum(floats); }) == named(errc::invalid_argument));
  CHECK(thrown_by([&] { t.all_reduce_max(floats); }) == named(errc::invalid_argument));
  CHECK(thrown_by([&] { t.reduce_sum(floats, 0); }) == named(errc::invalid_argument));
  CHECK(thrown_by([&] { t.all_reduce_sum(small); }) == named(errc::invalid_argument));
  CHECK(thrown_by([&] { t.all_reduce_or(small); }) == named(errc::invalid_argument));
  CHECK(thrown_by([&] { t.broadcast(bytes, 0); }) == named(errc::invalid_argument));
  CHECK(thrown_by([&] { t.send_bytes(bytes, (t.rank() + 1) % t.size()); }) == named(errc::invalid_argument));
  // The same call on every rank also fails when only the buffers together exceed INT_MAX bytes.
  const std::span<const std::byte> share(static_cast<const std::byte*>(reserved),
                                         elements / static_cast<std::size_t>(t.size()) + 1);
  CHECK(thrown_by([&] { (void)t.all_gather_bytes(share); }) == named(errc::invalid_argument));
  // An all-to-all whose buffers to one rank are small but add up past INT_MAX on the receiver.
  std::vector<std::span<const std::byte>> to_each(static_cast<std::size_t>(t.size()));
  to_each[0] = share;
  CHECK(thrown_by([&] { (void)t.all_to_all_bytes(to_each); }) == named(errc::invalid_argument));
  try {
    t.broadcast(bytes, 0);
  } catch (const error& e) {
    CHECK(std::string(e.what()).find("2147483648 elements exceed") != std::string::npos);
  }
  munmap(reserved, length);
  std::vector<std::uint64_t> one = {1};
  t.all_reduce_sum(std::span<std::uint64_t>(one));
  CHECK(one[0] == static_cast<std::uint64_t>(t.size()));
}

TEST_CASE("mpi a failing MPI call throws transport_failed naming the call and MPI's error") {
  // MPI_COMM_NULL cannot be duplicated; MPI reports that through MPI_COMM_WORLD's handler, which
  // must return for the transport to see it.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  std::string what;
  try {
    mpi_transport t(MPI_COMM_NULL);
  } catch (const error& e) {
    CHECK(e.code() == errc::transport_failed);
    what = e.what();
  }
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_ARE_FATAL);
  INFO(what);
  CHECK(what.find("MPI_Comm_dup failed: MPI_ERR_COMM") != std::string::npos);
}

}  // namespace
}  // namespace gradcomp::test

// MPI_Init and MPI_Finalize around doctest. Rank 0 prints the full report, the other ranks only
// their failures (each failure names its rank); the exit code is non-zero on every rank when any
// rank failed.
int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  doctest::Context context(argc, argv);
  if (rank != 0) {
    context.setOption("minimal", true);
    context.setOption("no-colors", true);
  }
  int failed = context.run() != 0 ? 1 : 0;
  int any_failed = 0;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return any_failed;
}
