// replay_mpi: checks a DDP hook run against gradcomp's own collectives over MPI. Every rank reads
// what the gradcomp package's hook recorded on the same rank (DIR/rank<r>.bin: each bucket's input, its mean, and
// the hook's saved bucket state before the call), runs gradcomp::compressed_all_reduce over MPI on
// the same input with the same codec (by its name in hook_codecs.hpp, or its spec: codec_spec.hpp), plan (bucket_state.hpp: the
// library's `automatic_plan`, so `scatter_reduce` with its chunk and server states where that
// sends less, as at P >= 3), message key and states, divides by P as the hook does, and compares
// the mean bit for bit. The state is its
// own from call to call and must save to the bytes the hook saved; it is loaded from the record
// only where the hook made it for that call (a new bucket, or one re-laid after DDP rebuilt its
// buckets). A bucket whose input holds NaN or Inf must fail with non_finite_input on every rank,
// as the hook's did (its mean is then zeros).
//
//     mpirun -np 2 replay_mpi DIR "top-k 1% + EF"
//
// Exit status: 0 when every call matches, 1 when one does not, 2 on bad arguments or records.
#include <gradcomp/gradcomp.hpp>
#include <gradcomp/transport/mpi.hpp>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <mpi.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "../../python/csrc/bucket_state.hpp"
#include "../../python/csrc/codec_spec.hpp"
#include "../../python/csrc/hook_codecs.hpp"

namespace {

/// One bucket call as GradcompHookState._record (python/gradcomp/ddp.py) wrote it.
struct bucket_call {
  std::uint64_t step = 0;
  std::uint32_t bucket = 0;
  std::uint64_t key = 0;
  bool new_state = false;
  std::vector<std::byte> state;
  std::vector<float> input, mean;
};

std::vector<bucket_call> read_calls(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::size_t at = 0;
  const auto take = [&](void* to, std::size_t size) {
    if (bytes.size() - at < size) throw std::runtime_error(path + " ends inside a record");
    std::memcpy(to, bytes.data() + at, size);
    at += size;
  };
  std::vector<bucket_call> calls;
  while (at < bytes.size()) {
    bucket_call c;
    std::uint32_t flags = 0;
    std::uint64_t n = 0, state_bytes = 0;
    take(&c.step, 8);
    take(&c.bucket, 4);
    take(&c.key, 8);
    take(&flags, 4);
    take(&n, 8);
    take(&state_bytes, 8);
    if (n > bytes.size() || state_bytes > bytes.size()) throw std::runtime_error(path + " holds an impossible size");
    c.new_state = flags != 0;
    c.state.resize(static_cast<std::size_t>(state_bytes));
    c.input.resize(static_cast<std::size_t>(n));
    c.mean.resize(static_cast<std::size_t>(n));
    take(c.state.data(), c.state.size());
    take(c.input.data(), c.input.size() * sizeof(float));
    take(c.mean.data(), c.mean.size() * sizeof(float));
    calls.push_back(std::move(c));
  }
  return calls;
}

/// Replays the calls with the codec named `wanted` (visit_hook_codecs calls `codec` per row, or
/// visit_codec_spec once for a spec).
struct replayer {
  std::string wanted;
  gradcomp::mpi_transport& t;
  const std::vector<bucket_call>& calls;
  bool found = false;
  std::size_t mismatches = 0;
  std::size_t skipped = 0;
  std::set<std::string> plans;  ///< The plans the buckets ran.

  void dense(const char*) {}
  template <class C>
  void ring(const char*, const C&) {}
  void sketched_sgd(const char*, const gradcomp::count_sketch<float>&) {}
  void tagc(const char*, const gradcomp::tagc_params&, std::optional<double> = {}) {}
  void gravac(const char*, const gradcomp::gravac_options&, std::size_t) {}
  void gravac_ladder(const char*, const gradcomp::gravac_options&, std::uint32_t, const std::map<int, std::string>&) {}
  void powersgd(const char*, const gradcomp::powersgd_params&, bool = false) {}

  template <class C>
  void codec(const char* name, const C& c) {
    if (name != wanted) return;
    found = true;
    const gradcomp::cpu_executor cpu;
    std::map<std::uint64_t, gradcomp_torch::bucket_state<C>> states;
    for (const bucket_call& call : calls) {
      std::vector<float> data = call.input;
      const gradcomp::all_reduce_options options{.key = {.step = call.step, .tensor_id = call.bucket}};
      try {
        auto it = states.find(call.key);
        if (call.new_state) {
          it = states
                   .insert_or_assign(call.key, gradcomp_torch::load_bucket_state(cpu, c, call.state, data.size(),
                                                                                 t.size(), t.rank()))
                   .first;
        } else if (it == states.end() || gradcomp_torch::save_bucket_state(cpu, c, it->second) != call.state) {
          fmt::print(stderr, "rank {}: step {} bucket {}: the state differs from the hook's\n", t.rank(), call.step,
                     call.bucket);
          ++mismatches;
          if (it == states.end())
            it = states.emplace(call.key, gradcomp_torch::make_bucket_state(cpu, c, data.size(), t.size(), t.rank()))
                     .first;
        }
        plans.insert(gradcomp_torch::plan_name(it->second.plan));
        gradcomp_torch::bucket_all_reduce(cpu, t, c, it->second, std::span<float>(data), options);
        for (float& v : data) v /= static_cast<float>(t.size());
      } catch (const gradcomp::error& e) {
        if (e.code() != gradcomp::errc::non_finite_input) throw;
        std::fill(data.begin(), data.end(), 0.0f);  // the hook's answer: the bucket sends nothing
        ++skipped;
      }
      if (std::memcmp(data.data(), call.mean.data(), data.size() * sizeof(float)) != 0) {
        fmt::print(stderr, "rank {}: step {} bucket {}: the mean differs from the hook's\n", t.rank(), call.step,
                   call.bucket);
        ++mismatches;
      }
    }
  }
};

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int status = 0;
  {
    gradcomp::mpi_transport t(MPI_COMM_WORLD);
    try {
      if (argc != 3) throw std::invalid_argument("usage: replay_mpi DIR CODEC");
      const std::vector<bucket_call> calls =
          read_calls(std::string(argv[1]) + "/rank" + std::to_string(t.rank()) + ".bin");
      std::vector<std::uint64_t> counts{calls.size()};
      std::vector<std::uint64_t> most = counts;
      MPI_Allreduce(counts.data(), most.data(), 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
      if (most[0] != counts[0]) throw std::runtime_error("the ranks recorded different numbers of bucket calls");
      replayer r{argv[2], t, calls, false, 0, 0, {}};
      gradcomp_torch::visit_hook_codecs(r);
      if (!r.found) gradcomp_torch::visit_codec_spec(argv[2], r);  // a typed constructor's spec
      if (!r.found) throw std::invalid_argument(std::string("no codec named \"") + argv[2] + "\"");
      std::array<std::uint64_t, 1> bad{r.mismatches};
      t.all_reduce_sum(std::span<std::uint64_t>(bad));
      if (t.rank() == 0)
        fmt::print(
            "replay_mpi: {} bucket calls of [{}] on {} ranks over MPI (plans {}; {} skipped as non-finite): {}\n",
            calls.size(), argv[2], t.size(), fmt::join(r.plans, ", "), r.skipped,
            bad[0] == 0 ? "every mean and state bit-identical to the hook's" : fmt::format("{} mismatches", bad[0]));
      status = bad[0] == 0 ? 0 : 1;
    } catch (const std::exception& e) {
      fmt::print(stderr, "replay_mpi (rank {}): {}\n", t.rank(), e.what());
      status = 2;
    }
  }
  MPI_Finalize();
  return status;
}
