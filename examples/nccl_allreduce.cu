// nccl_allreduce: gradcomp's compressed all-reduce over NCCL, one rank per visible GPU, all in one
// process: ncclCommInitAll makes the communicators, and one thread per GPU drives its own
// communicator, stream and nccl_transport. Every rank all-reduces its own gradient of 2^20 floats
// with top-k 1% + error feedback and with the lossless MPC codec, for a few steps each. The program
// checks that every rank ends with the same bits and that MPC's result is the rank-order sum,
// ((0 + g₀) + g₁) + …, bit for bit, and prints the bytes each rank sent, the dense baseline and
// the time per call. One GPU runs too (P = 1).
//
// Exit status: 0 when every check passes, 1 when one fails, 77 (ctest's skip) without a GPU.
#include <gradcomp/collective/compressed_all_reduce.hpp>
#include <gradcomp/core/cpu_executor.hpp>
#include <gradcomp/feedback/error_feedback.hpp>
#include <gradcomp/lossless/mpc.hpp>
#include <gradcomp/sparsify/topk.hpp>
#include <gradcomp/transport/nccl.cuh>

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

static_assert(gradcomp::transport_with_point_to_point<gradcomp::nccl_transport>);
static_assert(!gradcomp::transport_with_bitwise_or<gradcomp::nccl_transport>);  // stock NCCL has no OR

namespace {

constexpr std::size_t n = std::size_t{1} << 20;  // values per gradient
constexpr int steps = 5;                         // calls per codec; the first one also connects the peers

const gradcomp::error_feedback<gradcomp::topk_sparsifier<float>> topk_ef(
    gradcomp::topk_sparsifier<float>(gradcomp::sparsity{.density = 0.01}));
const gradcomp::mpc_codec mpc;

void require_cuda(cudaError_t rc, const char* call) {
  if (rc != cudaSuccess) throw std::runtime_error(std::string(call) + " failed: " + cudaGetErrorString(rc));
}

void require_nccl(ncclResult_t rc, const char* call) {
  if (rc != ncclSuccess) throw std::runtime_error(std::string(call) + " failed: " + ncclGetErrorString(rc));
}

// Rank r's gradient, the same in every run.
std::vector<float> gradient_of(int rank) {
  std::mt19937 engine(static_cast<std::uint32_t>(rank) + 1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> g(n);
  for (float& v : g) v = normal(engine);
  return g;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// What one codec left on one rank: the result of the last step, its report and the mean time of
// the steps after the first.
struct codec_run {
  std::vector<float> result;
  gradcomp::compressed_report report;
  double milliseconds = 0.0;
};

// Runs `all_reduce(data)` for every step on a fresh copy of `gradient`.
template <class AllReduce>
codec_run run_steps(const std::vector<float>& gradient, AllReduce all_reduce) {
  codec_run run;
  double total = 0.0;
  for (int step = 0; step < steps; ++step) {
    run.result = gradient;
    const auto start = std::chrono::steady_clock::now();
    run.report = all_reduce(std::span<float>(run.result), static_cast<std::uint64_t>(step));
    const std::chrono::duration<double, std::milli> took = std::chrono::steady_clock::now() - start;
    if (step > 0) total += took.count();
  }
  run.milliseconds = total / (steps - 1);
  return run;
}

struct rank_result {
  codec_run topk;
  codec_run mpc;
  std::string failure;
};

// One rank: its device, its stream and its transport over `comm`.
void run_rank(ncclComm_t comm, int device, rank_result& out) {
  cudaStream_t stream = nullptr;
  try {
    require_cuda(cudaSetDevice(device), "cudaSetDevice");
    require_cuda(cudaStreamCreate(&stream), "cudaStreamCreate");
    gradcomp::nccl_transport t(comm, stream);
    const std::vector<float> gradient = gradient_of(t.rank());
    auto state = topk_ef.make_state(gradcomp::cpu_executor{}, n);
    out.topk = run_steps(gradient, [&](std::span<float> data, std::uint64_t step) {
      return gradcomp::compressed_all_reduce(gradcomp::cpu_executor{}, t, topk_ef, state, data, {.key = {.step = step}});
    });
    out.mpc = run_steps(gradient, [&](std::span<float> data, std::uint64_t step) {
      return gradcomp::compressed_all_reduce(gradcomp::cpu_executor{}, t, mpc, data, {.key = {.step = step}});
    });
  } catch (const std::exception& e) {
    out.failure = e.what();
  }
  if (stream != nullptr) cudaStreamDestroy(stream);
}

void print(const char* name, const codec_run& run) {
  const auto& r = run.report;
  std::printf("  %-16s sent %10llu bytes, dense %10llu bytes", name, static_cast<unsigned long long>(r.sent_bytes),
              static_cast<unsigned long long>(r.dense_bytes));
  if (r.dense_bytes > 0) std::printf(" (%.1f%% of dense)", 100.0 * static_cast<double>(r.sent_bytes) / static_cast<double>(r.dense_bytes));
  std::printf(", %.3f ms per call\n", run.milliseconds);
}

}  // namespace

int main() {
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus == 0) {  // no driver reads as an error, not as 0
    std::puts("no GPU: skipped");
    return 77;
  }
  try {
    std::vector<ncclComm_t> comms(static_cast<std::size_t>(gpus));
    require_nccl(ncclCommInitAll(comms.data(), gpus, nullptr), "ncclCommInitAll");  // rank r on device r
    std::vector<rank_result> results(comms.size());
    {
      std::vector<std::jthread> ranks;
      for (int r = 0; r < gpus; ++r) {
        const auto i = static_cast<std::size_t>(r);
        ranks.emplace_back(run_rank, comms[i], r, std::ref(results[i]));
      }
    }
    for (ncclComm_t comm : comms) ncclCommDestroy(comm);

    bool ok = true;
    for (std::size_t r = 0; r < results.size(); ++r) {
      if (!results[r].failure.empty()) {
        std::fprintf(stderr, "rank %zu failed: %s\n", r, results[r].failure.c_str());
        ok = false;
      }
    }
    if (!ok) return 1;
    for (std::size_t r = 1; r < results.size(); ++r) {
      if (!same_bits(results[r].topk.result, results[0].topk.result) || !same_bits(results[r].mpc.result, results[0].mpc.result)) {
        std::fprintf(stderr, "rank %zu holds other bits than rank 0\n", r);
        ok = false;
      }
    }
    std::vector<float> rank_order_sum(n, 0.0f);
    for (int r = 0; r < gpus; ++r) {
      const std::vector<float> g = gradient_of(r);
      for (std::size_t i = 0; i < n; ++i) rank_order_sum[i] += g[i];
    }
    if (!same_bits(results[0].mpc.result, rank_order_sum)) {
      std::fprintf(stderr, "MPC's result differs from the rank-order sum\n");
      ok = false;
    }
    std::printf("nccl_allreduce: %d rank(s), one per GPU, %zu floats per rank, %d steps per codec (rank 0's report)\n",
                gpus, n, steps);
    print("top-k 1% + EF", results[0].topk);
    print("MPC (lossless)", results[0].mpc);
    std::printf("%s\n", ok ? "every rank holds the same bits; MPC equals the rank-order sum bit for bit" : "FAILED");
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "nccl_allreduce: %s\n", e.what());
    return 1;
  }
}
