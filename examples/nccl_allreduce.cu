// nccl_allreduce: gradcomp's compressed collectives with the gradient on the GPU: encode, NCCL and
// decode (or aggregate) without the payload leaving the device. One rank per visible GPU, all in
// one process: ncclCommInitAll makes the communicators, and one thread per GPU drives its own
// communicator, stream, nccl_transport and cuda_executor (with a memory pool of its own for the
// collectives' per-step scratch). Every rank reduces its own gradient of 2^20 floats for a few
// steps with
//
//   - top-k 1% + error feedback (compressed_all_reduce, the mean),
//   - 4-bit LoCo (compressed_all_reduce, the mean),
//   - TAGC's sharded scheme (compressed_reduce_scatter, each rank its chunk of the mean),
//
// and times a plain ncclAllReduce of the same buffer as the baseline. It prints the bytes each rank
// sent, the time per step against the baseline and the bytes nccl_transport copied to the host,
// and checks that every rank ends each scheme with the bits of the CPU path on the same inputs and
// steps (cpu_executor over the in-process transport, P threads). One GPU runs too (P = 1).
//
// Exit status: 0 when every check passes, 1 when one fails, 77 (ctest's skip) without a GPU, by
// the tests' rule (tests/cuda/gpu_presence.hpp: a failing driver, or GRADCOMP_REQUIRE_GPU=1 without
// a GPU, is 1).
#include <gradcomp/cuda.cuh>
#include <gradcomp/transport/in_process.hpp>
#include <gradcomp/transport/nccl.cuh>

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <limits>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "cuda/gpu_presence.hpp"

namespace {

constexpr std::size_t n = std::size_t{1} << 20;  // values per gradient
constexpr int steps = 5;                         // calls per scheme; the first one also connects the peers

const gradcomp::error_feedback<gradcomp::topk_sparsifier<float>> topk_ef(
    gradcomp::topk_sparsifier<float>(gradcomp::sparsity{.density = 0.01}));
const gradcomp::loco<gradcomp::uniform_quantizer<float>> loco4(gradcomp::uniform_quantizer<float>({.bits = 4}));
const gradcomp::tagc<float> tagc_scheme(gradcomp::tagc_params{.sparsify = {.zero_fraction = 0.95},
                                                              .sketch = {.block = 1024}});

void require_cuda(cudaError_t rc, const char* call) {
  if (rc != cudaSuccess) throw std::runtime_error(std::string(call) + " failed: " + cudaGetErrorString(rc));
}

void require_nccl(ncclResult_t rc, const char* call) {
  if (rc != ncclSuccess) throw std::runtime_error(std::string(call) + " failed: " + ncclGetErrorString(rc));
}

// Rank r's gradient at a step: normal values, and TAGC-style exact ones (multiples of 2^-12, so
// that every sum of a sketch cell is exact), the same in every run.
std::vector<float> gradient_of(int rank, int step) {
  std::mt19937 engine(static_cast<std::uint32_t>(rank * 1000 + step + 1));
  std::uniform_int_distribution<int> k(-1023, 1023);
  std::vector<float> g(n);
  for (float& v : g) v = std::ldexp(static_cast<float>(k(engine)), -12);
  return g;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The schemes, in the order they run.
enum scheme { topk_ef_scheme, loco4_scheme, tagc_scheme_run, scheme_count };
constexpr const char* scheme_names[scheme_count] = {"top-k 1% + EF", "LoCo 4-bit", "TAGC f*=0.95"};

// What one scheme left on one rank: its result after the last step (the whole mean, or TAGC's
// chunk), the last step's report, the mean time of the steps after the first, and the bytes the
// transport copied to the host per step.
struct scheme_run {
  std::vector<float> result;
  gradcomp::compressed_report report;
  double milliseconds = 0.0;
  std::uint64_t host_bytes_per_step = 0;
};

struct rank_result {
  scheme_run schemes[scheme_count];
  double nccl_milliseconds = 0.0;
  std::string failure;
};

// The reduction of one scheme on executor E: `data` (the gradient, in E's memory) becomes the
// mean, or `out` this rank's chunk of it (TAGC).
template <class E, class X, class State>
gradcomp::compressed_report reduce(scheme which, const E& e, X& t, State& state, std::span<float> data,
                                   std::span<float> out, int step) {
  const gradcomp::message_key key{.step = static_cast<std::uint64_t>(step)};
  if (which == topk_ef_scheme)
    return gradcomp::compressed_all_reduce(e, t, topk_ef, state.ef, data, {.key = key, .average = true});
  if (which == loco4_scheme)
    return gradcomp::compressed_all_reduce(e, t, loco4, state.loco, data, {.key = key, .average = true});
  return gradcomp::compressed_reduce_scatter(e, t, tagc_scheme, state.tagc, std::span<const float>(data), out,
                                             {.key = key, .average = true});
}

// The states of every scheme on one rank.
template <class E>
struct rank_states {
  gradcomp::state_type_of<decltype(topk_ef), E> ef;
  gradcomp::state_type_of<decltype(loco4), E> loco;
  gradcomp::tagc_state<float, E> tagc;

  explicit rank_states(const E& e)
      : ef(topk_ef.make_state(e, n)), loco(loco4.make_state(e, n)), tagc(tagc_scheme.make_state(e)) {}
};

// The CPU path: every scheme on P in-process ranks with cpu_executor, the same steps; the result of
// the last step of rank r, scheme s, at [r][s].
std::vector<std::vector<std::vector<float>>> cpu_path(int P) {
  std::vector<std::vector<std::vector<float>>> results(static_cast<std::size_t>(P));
  gradcomp::in_process_group(P).run([&](gradcomp::in_process_transport& t) {
    const gradcomp::cpu_executor cpu;
    rank_states<gradcomp::cpu_executor> states(cpu);
    auto& mine = results[static_cast<std::size_t>(t.rank())];
    for (int s = 0; s < scheme_count; ++s) {
      std::vector<float> data, out(gradcomp::ring_chunk_of(n, P, t.rank()).count);
      for (int step = 0; step < steps; ++step) {
        data = gradient_of(t.rank(), step);
        (void)reduce(static_cast<scheme>(s), cpu, t, states, std::span<float>(data), std::span<float>(out), step);
      }
      mine.push_back(s == tagc_scheme_run ? out : data);
    }
  });
  return results;
}

// A CUDA stream, a memory pool for the collectives' scratch (kept across steps: its release
// threshold is the largest), and the device buffers of one rank.
struct device_rank {
  cudaStream_t stream = nullptr;
  cudaMemPool_t pool = nullptr;

  explicit device_rank(int device) {
    require_cuda(cudaSetDevice(device), "cudaSetDevice");
    require_cuda(cudaStreamCreate(&stream), "cudaStreamCreate");
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device;
    require_cuda(cudaMemPoolCreate(&pool, &props), "cudaMemPoolCreate");
    std::uint64_t keep_all = std::numeric_limits<std::uint64_t>::max();
    require_cuda(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep_all), "cudaMemPoolSetAttribute");
  }
  ~device_rank() {
    cudaStreamSynchronize(stream);
    cudaMemPoolDestroy(pool);
    cudaStreamDestroy(stream);
  }
  device_rank(const device_rank&) = delete;
  device_rank& operator=(const device_rank&) = delete;
};

// One GPU rank: every scheme for every step on its device, then the baseline.
void run_rank(ncclComm_t comm, int device, rank_result& out) {
  try {
    const device_rank dev(device);
    {
      gradcomp::nccl_transport t(comm, dev.stream);
      const gradcomp::cuda_executor gpu{.stream = dev.stream, .memory_pool = dev.pool};
      const int P = t.size();
      rank_states<gradcomp::cuda_executor> states(gpu);
      gradcomp::device_array<float> data(n);
      gradcomp::device_array<float> chunk(gradcomp::ring_chunk_of(n, P, t.rank()).count);
      const auto upload = [&](int step) {
        const std::vector<float> g = gradient_of(t.rank(), step);
        require_cuda(cudaMemcpy(data.data(), g.data(), n * sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy");
      };
      const auto download = [&](const gradcomp::device_array<float>& from) {
        std::vector<float> host(from.size());
        require_cuda(cudaStreamSynchronize(dev.stream), "cudaStreamSynchronize");
        require_cuda(cudaMemcpy(host.data(), from.data(), from.size() * sizeof(float), cudaMemcpyDeviceToHost),
                     "cudaMemcpy");
        return host;
      };
      for (int s = 0; s < scheme_count; ++s) {
        scheme_run& run = out.schemes[s];
        double total = 0.0;
        std::uint64_t copied = 0;
        for (int step = 0; step < steps; ++step) {
          upload(step);
          const std::uint64_t before = t.host_copy_bytes();
          const auto start = std::chrono::steady_clock::now();
          run.report = reduce(static_cast<scheme>(s), gpu, t, states, data.span(), chunk.span(), step);
          gpu.synchronize();
          const std::chrono::duration<double, std::milli> took = std::chrono::steady_clock::now() - start;
          if (step > 0) total += took.count();
          copied = t.host_copy_bytes() - before;
        }
        run.milliseconds = total / (steps - 1);
        run.host_bytes_per_step = copied;
        run.result = download(s == tagc_scheme_run ? chunk : data);
      }
      double total = 0.0;  // the baseline: NCCL's own all-reduce of the same buffer (uncompressed, its order)
      for (int step = 0; step < steps; ++step) {
        upload(step);
        const auto start = std::chrono::steady_clock::now();
        require_nccl(ncclAllReduce(data.data(), data.data(), n, ncclFloat32, ncclSum, comm, dev.stream),
                     "ncclAllReduce");
        gpu.synchronize();
        const std::chrono::duration<double, std::milli> took = std::chrono::steady_clock::now() - start;
        if (step > 0) total += took.count();
      }
      out.nccl_milliseconds = total / (steps - 1);
    }
  } catch (const std::exception& e) {
    out.failure = e.what();
  }
}

void print(const char* name, const scheme_run& run, double baseline) {
  const auto& r = run.report;
  std::printf(
      "  %-16s sent %10llu bytes (dense %10llu), %.3f ms per step (ncclAllReduce %.3f ms: %.2fx), %llu bytes to the host\n",
      name, static_cast<unsigned long long>(r.sent_bytes), static_cast<unsigned long long>(r.dense_bytes),
      run.milliseconds, baseline, baseline / run.milliseconds,
      static_cast<unsigned long long>(run.host_bytes_per_step));
}

}  // namespace

int main() {
  const gradcomp::test::gpu_presence& presence = gradcomp::test::gpu_presence_here();
  if (presence.verdict == gradcomp::test::gpu_verdict::skip) {
    std::printf("nccl_allreduce: %s; skipped\n", presence.reason.c_str());
    return 77;
  }
  if (presence.verdict == gradcomp::test::gpu_verdict::fail) {
    std::fprintf(stderr, "nccl_allreduce: %s\n", presence.reason.c_str());
    return 1;
  }
  int gpus = 0;
  require_cuda(cudaGetDeviceCount(&gpus), "cudaGetDeviceCount");
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
    const auto cpu = cpu_path(gpus);
    for (int s = 0; s < scheme_count; ++s) {
      for (std::size_t r = 0; r < results.size(); ++r) {
        if (same_bits(results[r].schemes[s].result, cpu[r][static_cast<std::size_t>(s)])) continue;
        std::fprintf(stderr, "%s: rank %zu's result on the GPU differs from the CPU path's\n", scheme_names[s], r);
        ok = false;
      }
    }
    std::printf("nccl_allreduce: %d rank(s), one per GPU, %zu floats per rank, %d steps per scheme (rank 0's report)\n",
                gpus, n, steps);
    for (int s = 0; s < scheme_count; ++s) {
      print(scheme_names[s], results[0].schemes[s], results[0].nccl_milliseconds);
    }
    std::printf("%s\n", ok ? "every rank's result on the GPU equals the CPU path's bit for bit" : "FAILED");
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "nccl_allreduce: %s\n", e.what());
    return 1;
  }
}
