// The compressed collectives on the GPU: device buffers on a cuda_executor, over nccl_transport
// (one rank per process: world size 1 is the only NCCL size one GPU allows) and over the
// in-process transport staged for device buffers (P = 2 and 4 ranks sharing the GPU). The oracle
// is the CPU path (cpu_executor over the in-process transport, itself checked against independent
// oracles in tests/collective/) on the same inputs: every codec whose GPU encoding is the CPU's
// gives the same bits, for the all-reduce and the reduce-scatter, every plan, the stateful wrappers
// over several steps (their saved states too), the ring, the all-gather and point-to-point. The
// count sketch, whose GPU cells round in arrival order, is given inputs whose cell sums are exact
// (docs/cuda.md §4). Also: NCCL copies no payload to the host (a counted bound), a NaN on one rank
// stops every rank with its device data untouched, and an executor on another stream than the
// transport's is refused. Without a GPU only the stream check runs (it makes no CUDA call).
#include <gradcomp/cuda.cuh>
#include <gradcomp/transport/in_process.hpp>
#include <gradcomp/transport/nccl.cuh>
#include <gradcomp/transport/staged.cuh>

#include <doctest/doctest.h>

#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "collective/collective_checks.hpp"
#include "collective/every_collective.hpp"
#include "cuda/device_io.cuh"
#include "support/errors.hpp"

namespace gradcomp::test {
namespace {

using staged_in_process = staged_transport<in_process_transport>;

/// A host copy of `device`, once `exec`'s stream has done its work.
template <class T>
std::vector<T> downloaded(const cuda_executor& exec, const device_array<T>& device) {
  return to_host(exec, device);
}

/// Runs `body(t, gpu)` on P in-process ranks sharing GPU 0, each with its own stream, a
/// `staged_transport` over its in-process rank and a `cuda_executor` on the same stream.
template <class Body>
void on_staged_ranks(int P, Body body) {
  in_process_group(P).run([&](in_process_transport& host) {
    GRADCOMP_CUDA_CHECK(cudaSetDevice(0));
    const test_stream stream;
    const cuda_executor gpu = stream.executor();
    staged_in_process t(host, gpu.native_stream());
    body(t, gpu);
    gpu.synchronize();
  });
}

/// Runs `body(t, gpu)` on an NCCL communicator of one rank on GPU 0.
template <class Body>
void on_nccl_world_of_one(Body body) {
  int device = 0;
  ncclComm_t comm = nullptr;
  REQUIRE(ncclCommInitAll(&comm, 1, &device) == ncclSuccess);
  {
    const test_stream stream;
    const cuda_executor gpu = stream.executor();
    nccl_transport t(comm, gpu.native_stream());
    body(t, gpu);
    gpu.synchronize();
  }
  ncclCommDestroy(comm);
}

/// Runs `body(t, gpu)` over staged in-process ranks (P ≥ 1) or, for `nccl`, over NCCL (P = 1).
template <class Body>
void on_gpu_ranks(int P, bool nccl, Body body) {
  if (nccl) on_nccl_world_of_one(body);
  else
    on_staged_ranks(P, body);
}

/// Rank r's input: N(0, 1)·10^(r mod 3), or for `exact_sums` the dyadic sparse values whose sums
/// are exact in float (count-sketch cells add them in any order to the same bits).
std::vector<float> input_of(int rank, std::size_t n, std::uint64_t step, bool exact_sums) {
  return exact_sums ? dyadic_sparse_gradient(rank, n, 0.3, step) : gradient_of(rank, n, step);
}

/// What every rank got from the CPU path: `call(cpu_executor{}, t, data, out)` on P in-process
/// ranks, `data` rank r's input and `out` its chunk (as large as `out_count(rank)`).
template <class OutCount, class Call>
std::vector<std::vector<float>> cpu_path(int P, std::size_t n, bool exact_sums, OutCount out_count, Call call) {
  std::vector<std::vector<float>> results(static_cast<std::size_t>(P));
  in_process_group(P).run([&](in_process_transport& t) {
    auto data = input_of(t.rank(), n, 0, exact_sums);
    std::vector<float> out(out_count(t.rank()), -1.0f);
    call(cpu_executor{}, t, std::span<float>(data), std::span<float>(out));
    results[static_cast<std::size_t>(t.rank())] = out.empty() ? data : out;
  });
  return results;
}

/// The same on the GPU (device spans), over staged in-process ranks or NCCL.
template <class OutCount, class Call>
std::vector<std::vector<float>> gpu_path(int P, bool nccl, std::size_t n, bool exact_sums, OutCount out_count,
                                         Call call) {
  std::vector<std::vector<float>> results(static_cast<std::size_t>(P));
  std::mutex mutex;
  on_gpu_ranks(P, nccl, [&](auto& t, const cuda_executor& gpu) {
    auto data = to_device(gpu, input_of(t.rank(), n, 0, exact_sums));
    auto out = to_device(gpu, std::vector<float>(out_count(t.rank()), -1.0f));
    call(gpu, t, data.span(), out.span());
    const std::lock_guard lock(mutex);
    results[static_cast<std::size_t>(t.rank())] = out.size() == 0 ? downloaded(gpu, data) : downloaded(gpu, out);
  });
  return results;
}

/// CHECKs that the GPU path gives every rank the CPU path's bits.
template <class OutCount, class Call>
void check_same_as_cpu(int P, bool nccl, std::size_t n, bool exact_sums, OutCount out_count, Call call) {
  const auto cpu = cpu_path(P, n, exact_sums, out_count, call);
  const auto gpu = gpu_path(P, nccl, n, exact_sums, out_count, call);
  for (int r = 0; r < P; ++r) {
    CAPTURE(r);
    CHECK(same_bits<float>(gpu[static_cast<std::size_t>(r)], cpu[static_cast<std::size_t>(r)]));
  }
}

/// The transports of a device test: NCCL with one rank, and the staged in-process transport with
/// two and four.
struct device_group {
  int P;
  bool nccl;
};
constexpr device_group device_groups[] = {{1, true}, {2, false}, {4, false}};

/// The all-reduce (every plan `codec` runs over the group) and the reduce-scatter (every plan) of
/// `codec` on the GPU equal the CPU's, for the default options and with `average`.
template <class C>
void check_codec(const C& codec, bool exact_sums = false) {
  constexpr std::size_t n = 5003;
  for (const device_group g : device_groups) {
    CAPTURE(g.P);
    CAPTURE(g.nccl);
    const auto whole = [](int) { return std::size_t{0}; };
    const auto chunk = [&](int r) { return static_cast<std::size_t>(ring_chunk_of(n, g.P, r).count); };
    for (const bool average : {false, true}) {
      CAPTURE(average);
      check_same_as_cpu(g.P, g.nccl, n, exact_sums, whole,
                        [&](const auto& e, auto& t, std::span<float> data, std::span<float>) {
                          (void)compressed_all_reduce(e, t, codec, data,
                                                      {.key = {.step = 3, .tensor_id = 2}, .average = average});
                        });
      for (const auto plan : {reduce_scatter_plan::all_to_all, reduce_scatter_plan::gather_decode}) {
        CAPTURE(static_cast<int>(plan));
        check_same_as_cpu(g.P, g.nccl, n, exact_sums, chunk,
                          [&](const auto& e, auto& t, std::span<float> data, std::span<float> out) {
                            (void)compressed_reduce_scatter(e, t, codec, std::span<const float>(data), out,
                                                            {.key = {.step = 3}, .plan = plan, .average = average});
                          });
      }
    }
    if constexpr (!summable_encoding<C>) {  // the gather plan, forced, and the ring
      check_same_as_cpu(g.P, g.nccl, n, exact_sums, whole,
                        [&](const auto& e, auto& t, std::span<float> data, std::span<float>) {
                          (void)compressed_all_reduce(e, t, codec, data,
                                                      {.plan = all_reduce_plan::ring, .measure_error = true});
                        });
    }
  }
}

GRADCOMP_CUDA_TEST_CASE(
    "compressed all-reduce and reduce-scatter of device buffers equal the CPU path, codec by codec") {
  SUBCASE("top-k") { check_codec(topk_sparsifier<float>(sparsity{.density = 0.02})); }
  SUBCASE("random-k") {
    check_codec(randomk_sparsifier<float>(randomk_params{.amount = {.density = 0.05}, .seed = 9}));
  }
  SUBCASE("threshold") { check_codec(threshold_sparsifier<float>()); }
  SUBCASE("uniform 8-bit") { check_codec(uniform_quantizer<float>(uniform_params{.bits = 8})); }
  SUBCASE("uniform 4-bit, stochastic rounding") {
    check_codec(
        uniform_quantizer<float>(uniform_params{.bits = 4, .block = 64, .round = rounding::stochastic, .seed = 3}));
  }
  SUBCASE("sign") { check_codec(sign_quantizer<float>()); }
  SUBCASE("QSGD") { check_codec(qsgd_quantizer<float>()); }
  SUBCASE("shared scale (summed encodings)") {
    check_codec(shared_scale_quantizer<float>(shared_scale_params{.bits = 8, .block = 64, .headroom_bits = 3}));
  }
  SUBCASE("count sketch (summed encodings), exact cell sums") {
    check_codec(count_sketch<float>(
                    count_sketch_params{.rows = 3, .columns = 1024, .seed = 5, .heavy_hitters = {.density = 0.02}}),
                true);
  }
  SUBCASE("MPC") { check_codec(mpc_codec<float>()); }
  SUBCASE("ZFP fixed rate") { check_codec(zfp_fixed_rate_codec<float>(zfp_params{.rate_bits = 8})); }
  SUBCASE("pipeline top-k + uniform 8-bit") {
    check_codec(pipeline(topk_sparsifier<float>(sparsity{.density = 0.05}),
                         uniform_quantizer<float>(uniform_params{.bits = 8})));
  }
}

/// Steps of a stateful wrapper on the GPU and on the CPU: the all-reduce (one state per rank) and
/// the reduce-scatter (one state per chunk) give the same bits every step, and the states save to
/// the same bytes at the end.
template <class W>
void check_stateful(const W& wrapper) {
  constexpr std::size_t n = 4099;
  constexpr std::uint64_t steps = 4;
  for (const device_group g : device_groups) {
    CAPTURE(g.P);
    CAPTURE(g.nccl);
    const auto P = static_cast<std::size_t>(g.P);
    // [rank][step] results and [rank] saved states, CPU then GPU.
    std::vector<std::vector<std::vector<float>>> cpu_sums(P), gpu_sums(P), cpu_chunks(P), gpu_chunks(P);
    std::vector<std::vector<std::byte>> cpu_saved(P), gpu_saved(P);
    in_process_group(g.P).run([&](in_process_transport& t) {
      const cpu_executor cpu;
      const auto r = static_cast<std::size_t>(t.rank());
      auto state = wrapper.make_state(cpu, n);
      std::vector<state_type_of<W, cpu_executor>> chunk_states;
      for (int j = 0; j < g.P; ++j) chunk_states.push_back(wrapper.make_state(cpu, ring_chunk_of(n, g.P, j).count));
      for (std::uint64_t s = 0; s < steps; ++s) {
        auto data = gradient_of(t.rank(), n, s);
        std::vector<float> out(ring_chunk_of(n, g.P, t.rank()).count);
        (void)compressed_reduce_scatter(cpu, t, wrapper, std::span(chunk_states), std::span<const float>(data),
                                        std::span<float>(out), {.key = {.step = s}, .average = true});
        (void)compressed_all_reduce(cpu, t, wrapper, state, std::span<float>(data), {.key = {.step = s}});
        cpu_sums[r].push_back(data);
        cpu_chunks[r].push_back(out);
      }
      cpu_saved[r].resize(wrapper.saved_state_bytes(n));
      cpu_saved[r].resize(wrapper.save_state(cpu, state, cpu_saved[r]));
    });
    std::mutex mutex;
    on_gpu_ranks(g.P, g.nccl, [&](auto& t, const cuda_executor& gpu) {
      const auto r = static_cast<std::size_t>(t.rank());
      auto state = wrapper.make_state(gpu, n);
      std::vector<state_type_of<W, cuda_executor>> chunk_states;
      for (int j = 0; j < g.P; ++j) chunk_states.push_back(wrapper.make_state(gpu, ring_chunk_of(n, g.P, j).count));
      std::vector<std::vector<float>> sums, chunks;
      for (std::uint64_t s = 0; s < steps; ++s) {
        auto data = to_device(gpu, gradient_of(t.rank(), n, s));
        auto out = to_device(gpu, std::vector<float>(ring_chunk_of(n, g.P, t.rank()).count));
        (void)compressed_reduce_scatter(gpu, t, wrapper, std::span(chunk_states), std::span<const float>(data.span()),
                                        out.span(), {.key = {.step = s}, .average = true});
        (void)compressed_all_reduce(gpu, t, wrapper, state, data.span(), {.key = {.step = s}});
        sums.push_back(downloaded(gpu, data));
        chunks.push_back(downloaded(gpu, out));
      }
      std::vector<std::byte> saved(wrapper.saved_state_bytes(n));
      saved.resize(wrapper.save_state(gpu, state, saved));
      const std::lock_guard lock(mutex);
      gpu_sums[r] = std::move(sums);
      gpu_chunks[r] = std::move(chunks);
      gpu_saved[r] = std::move(saved);
    });
    for (std::size_t r = 0; r < P; ++r) {
      CAPTURE(r);
      for (std::uint64_t s = 0; s < steps; ++s) {
        CAPTURE(s);
        CHECK(same_bits<float>(gpu_sums[r][s], cpu_sums[r][s]));
        CHECK(same_bits<float>(gpu_chunks[r][s], cpu_chunks[r][s]));
      }
      CHECK(gpu_saved[r] == cpu_saved[r]);
    }
  }
}

GRADCOMP_CUDA_TEST_CASE(
    "error feedback and LoCo on the GPU: every step's sums and chunks and the saved states equal the CPU's") {
  SUBCASE("top-k 2% + error feedback") {
    check_stateful(error_feedback(topk_sparsifier<float>(sparsity{.density = 0.02})));
  }
  SUBCASE("4-bit LoCo") { check_stateful(loco(uniform_quantizer<float>(uniform_params{.bits = 4, .block = 64}))); }
  SUBCASE("8-bit LoCo") { check_stateful(loco(uniform_quantizer<float>(uniform_params{.bits = 8}))); }
}

GRADCOMP_CUDA_TEST_CASE(
    "ring, all-gather and point-to-point of device buffers over the staged transport equal the CPU's") {
  const uniform_quantizer<float> q(uniform_params{.bits = 4, .block = 64});
  constexpr std::size_t n = 3001;
  for (const int P : {2, 4}) {
    CAPTURE(P);
    const auto whole = [](int) { return std::size_t{0}; };
    check_same_as_cpu(P, false, n, false, whole, [&](const auto& e, auto& t, std::span<float> data, std::span<float>) {
      (void)ring_all_reduce(e, t, q, data, {.key = {.step = 1}});
    });
    check_same_as_cpu(
        P, false, n, false, [&](int r) { return static_cast<std::size_t>(ring_chunk_of(n, P, r).count); },
        [&](const auto& e, auto& t, std::span<float> data, std::span<float> out) {
          (void)ring_reduce_scatter(e, t, mpc_codec<float>(), std::span<const float>(data), out, {.average = true});
        });
    check_same_as_cpu(
        P, false, n, false, [&](int) { return n * static_cast<std::size_t>(P); },
        [&](const auto& e, auto& t, std::span<float> data, std::span<float> out) {
          (void)compressed_all_gather(e, t, q, std::span<const float>(data), out);
        });
    // Rank r sends its values to rank r + 1, which decodes them.
    check_same_as_cpu(
        P, false, n, false, [&](int) { return n; },
        [&](const auto& e, auto& t, std::span<float> data, std::span<float> out) {
          (void)compressed_send(e, t, q, std::span<const float>(data), (t.rank() + 1) % t.size());
          (void)compressed_recv(e, t, q, out, (t.rank() + t.size() - 1) % t.size());
        });
  }
}

GRADCOMP_CUDA_TEST_CASE("a NaN on one rank stops every rank of a device all-reduce, its device data untouched") {
  constexpr std::size_t n = 2000;
  const error_feedback ef(topk_sparsifier<float>(sparsity{.density = 0.05}));
  for (const int P : {2, 4}) {
    CAPTURE(P);
    std::atomic<int> matching{0}, untouched{0};
    on_staged_ranks(P, [&](staged_in_process& t, const cuda_executor& gpu) {
      auto host = gradient_of(t.rank(), n);
      if (t.rank() == P - 1) host[n / 2] = std::numeric_limits<float>::quiet_NaN();
      auto data = to_device(gpu, host);
      auto state = ef.make_state(gpu, n);
      if (thrown_by([&] { (void)compressed_all_reduce(gpu, t, ef, state, data.span()); }) ==
          named(errc::non_finite_input))
        ++matching;
      if (same_bits<float>(downloaded(gpu, data), host) && state.steps == 0) ++untouched;
    });
    CHECK(matching.load() == P);
    CHECK(untouched.load() == P);
  }
}

GRADCOMP_CUDA_TEST_CASE("an all-reduce over NCCL copies no payload to the host, only size and control words") {
  constexpr std::size_t n = std::size_t{1} << 20;
  const error_feedback ef(topk_sparsifier<float>(sparsity{.density = 0.01}));
  on_nccl_world_of_one([&](nccl_transport& t, const cuda_executor& gpu) {
    auto data = to_device(gpu, gradient_of(0, n));
    auto state = ef.make_state(gpu, n);
    const std::uint64_t before = t.host_copy_bytes();
    (void)compressed_all_reduce(gpu, t, ef, state, data.span(), {.average = true});
    const std::uint64_t copied = t.host_copy_bytes() - before;
    MESSAGE("bytes nccl_transport copied to the host for a top-k 1% + EF all-reduce of 2^20 floats: " << copied);
    CHECK(copied > 0);      // the agreement record and the frame sizes do cross
    CHECK(copied < 1024);   // 4 MiB of gradient and 84 KiB of frame did not
    auto uniform_data = to_device(gpu, gradient_of(0, n));
    const std::uint64_t again = t.host_copy_bytes();
    (void)compressed_all_reduce(gpu, t, shared_scale_quantizer<float>(), uniform_data.span());
    CHECK(t.host_copy_bytes() - again < 1024);
  });
}

/// TAGC and the LHC two-stage all-reduce on the GPU against the CPU, on executor E (cuda_executor).
template <class E>
void check_lhc_collectives_on_gpu() {
  constexpr std::size_t n = 3 * (40 * 64 + 17);
  tagc_params params;
  params.sketch.block = 64;
  for (const auto schedule : {tagc_schedule::fused, tagc_schedule::per_shard}) {
    params.schedule = schedule;
    const tagc<float> scheme(params);
    for (const device_group g : device_groups) {
      CAPTURE(g.P);
      CAPTURE(static_cast<int>(schedule));
      const auto P = static_cast<std::size_t>(g.P);
      std::vector<std::vector<float>> cpu(P), gpu(P);
      std::vector<std::vector<std::byte>> cpu_saved(P), gpu_saved(P);
      in_process_group(g.P).run([&](in_process_transport& t) {
        auto state = scheme.make_state(cpu_executor{});
        std::vector<float> out(ring_chunk_of(n, g.P, t.rank()).count);
        for (std::uint64_t s = 0; s < 3; ++s) {
          const auto data = dyadic_sparse_gradient(t.rank(), n, 0.5, s);
          (void)compressed_reduce_scatter(cpu_executor{}, t, scheme, state, std::span<const float>(data),
                                          std::span<float>(out), {.key = {.step = s, .tensor_id = 4}, .average = true});
        }
        const auto r = static_cast<std::size_t>(t.rank());
        cpu[r] = out;
        cpu_saved[r].resize(tagc<float>::saved_state_bytes(state));
        (void)scheme.save_state(cpu_executor{}, state, cpu_saved[r]);
      });
      std::mutex mutex;
      on_gpu_ranks(g.P, g.nccl, [&](auto& t, const E& device) {
        auto state = scheme.make_state(device);
        auto out = to_device(device, std::vector<float>(ring_chunk_of(n, g.P, t.rank()).count));
        for (std::uint64_t s = 0; s < 3; ++s) {
          const auto data = to_device(device, dyadic_sparse_gradient(t.rank(), n, 0.5, s));
          (void)compressed_reduce_scatter(device, t, scheme, state, std::span<const float>(data.span()), out.span(),
                                          {.key = {.step = s, .tensor_id = 4}, .average = true});
        }
        std::vector<std::byte> saved(tagc<float>::saved_state_bytes(state));
        (void)scheme.save_state(device, state, saved);
        const std::lock_guard lock(mutex);
        gpu[static_cast<std::size_t>(t.rank())] = downloaded(device, out);
        gpu_saved[static_cast<std::size_t>(t.rank())] = std::move(saved);
      });
      for (std::size_t r = 0; r < P; ++r) {
        CHECK(same_bits<float>(gpu[r], cpu[r]));
        CHECK(gpu_saved[r] == cpu_saved[r]);
      }
    }
  }
  const lossless_homomorphic<float> lhc({.block = 128});
  for (const device_group g : device_groups)
    check_same_as_cpu(
        g.P, g.nccl, 20000, true, [](int) { return std::size_t{0}; },
        [&](const auto& e, auto& t, std::span<float> data, std::span<float>) {
          (void)compressed_all_reduce(e, t, lhc, data, {.average = true});
        });
}

GRADCOMP_CUDA_TEST_CASE("TAGC and the LHC two-stage all-reduce on the GPU equal the CPU's") {
  check_lhc_collectives_on_gpu<cuda_executor>();
}

TEST_CASE("cuda: a cuda_executor on another stream than its device transport is refused before anything runs") {
  // No CUDA call is made: the check comes first, so this runs without a GPU too.
  const auto stream_of = [](std::uintptr_t handle) { return reinterpret_cast<cudaStream_t>(handle); };
  in_process_group(1).run([&](in_process_transport& host) {
    staged_in_process t(host, stream_of(0x10));
    const cuda_executor gpu{.stream = stream_of(0x20)};
    CHECK(thrown_by([&] { (void)compressed_all_reduce(gpu, t, mpc_codec<float>(), std::span<float>()); }) ==
          named(errc::invalid_argument));
    CHECK(thrown_by([&] {
            (void)compressed_reduce_scatter(gpu, t, mpc_codec<float>(), std::span<const float>(), std::span<float>());
          }) == named(errc::invalid_argument));
  });
}

}  // namespace
}  // namespace gradcomp::test
