/// @file
/// gradcomp-bench-cuda: throughput of gradcomp's CUDA codecs on one GPU, measured against a
/// device-to-device copy of the same gradient in the same run.
///
/// A float32 gradient of n values (default 2^28) is drawn from N(0, σ = 1e-3) with the CPU
/// bench's seed and copied to the device once. Every operation runs `--warmup` untimed and
/// `--reps` timed times; each run is timed with CUDA events around its work on one stream, and
/// best and median are reported. Encoders that allow it run with deferred errors (no host
/// synchronisation inside); the rest (error feedback, LoCo, threshold, decoders) include their
/// synchronisations, as a caller sees them. Records:
///
///   copy/d2d             cudaMemcpyAsync of the n·4 gradient bytes (the ceiling)
///   radix_sort/sort      |x| keys and indices, then cub::DeviceRadixSort::SortPairsDescending
///   topk/encode          exact top-k, density 1%; baseline radix_sort/sort; /decode
///   threshold/encode     sampled threshold, target density 1% (achieved density recorded); /decode
///   randomk/encode       random-k, density 1%; /decode
///   uniform8_rtn/encode  8-bit uniform, blocks of 256, round to nearest; /decode
///   uniform8_sr/encode   the same with stochastic rounding
///   uniform4_rtn/encode  4-bit round to nearest; /decode
///   sign/encode          sign with mean-magnitude scales; /decode
///   qsgd/encode          QSGD, 15 levels, buckets of 256; /decode
///   atomics3/add         3 float atomicAdds of x_i per element into a 3 × 2^20 table, at cells
///                        from a multiplicative hash of i (the count sketch's yardstick)
///   count_sketch/encode  3 rows × 2^20 columns, MurmurHash3 on the fly; baseline atomics3/add;
///                        /decode (estimates, heavy hitters at 1%, the dense output)
///   mpc/encode           MPC, d = 1 (one warp per chunk of 1024 words, two passes); /decode
///   zfp8/encode        ZFP fixed rate, R = 8 (one thread per block); /decode
///   zfp16/encode       ZFP fixed rate, R = 16; /decode
///   dynamic/threshold    TAGC's exact threshold for f* = 0.8 (radix selection, waits for τ*)
///   dynamic/sparsify     one step of the dynamic sparsifier with error feedback (τ*, ã, R)
///   ef_uniform8/encode   error feedback around 8-bit round to nearest (one kernel)
///   loco_uniform4/encode LoCo around 4-bit round to nearest (check kernel + one kernel)
///
/// Where NCCL is found (GRADCOMP_BENCH_NCCL), the compressed collectives on one rank of NCCL: the
/// whole gradient reduced on the GPU through nccl_transport, against NCCL's own all-reduce of the
/// same buffer in the same run (each run restores the gradient with a device copy first, the
/// baseline's too); compression_ratio is the gradient's bytes over the bytes one rank puts on each
/// link, and the run prints the bytes nccl_transport copied to the host per step:
///
///   nccl/allreduce          ncclAllReduce (sum) of the n floats, in place
///   ef_topk1/allreduce      compressed_all_reduce, top-k 1% + error feedback, average; baseline nccl/allreduce
///   loco_uniform8/allreduce compressed_all_reduce, LoCo around 8-bit; baseline nccl/allreduce
///   loco_uniform4/allreduce compressed_all_reduce, LoCo around 4-bit; baseline nccl/allreduce
///   tagc/reduce_scatter     TAGC (f* = 0.95), where LHC decodes on the GPU; baseline nccl/allreduce
///
/// gradient_gbps = n·4 bytes / median seconds; copy_gbps is the copy's figure for the same n
/// (bytes copied per second, not read + write); ratio_to_copy is their quotient, as in the CPU
/// bench. Before timing, each codec's message for the first 2^20 values is compared with the CPU
/// reference's bytes (`--no-check` skips it); the count sketch, whose atomic adds round in no fixed
/// order, is left out of that check (tests/cuda/test_sketch_device.cu bounds its cells instead). torch.topk is timed by bench/torch_topk.py, which
/// reads this program's JSON for the comparison. Exit status 77 when there is no GPU to run on (no
/// CUDA driver, or no device), 1 when the driver is present but fails, or when GRADCOMP_REQUIRE_GPU
/// is set and there is no GPU: the tests' rule (tests/cuda/gpu_presence.hpp, docs/cuda.md §6).

#include <gradcomp/cuda.cuh>
#if defined(GRADCOMP_BENCH_NCCL)
#  include <gradcomp/transport/nccl.cuh>
#  include <nccl.h>
#endif

#include <cub/device/device_radix_sort.cuh>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "bench_report.hpp"
#include "cuda/gpu_presence.hpp"

namespace {

using namespace gradcomp_bench;
using gradcomp::cuda_executor;
using gradcomp::device_array;

constexpr double target_density = 0.01;
constexpr double gradient_stddev = 1e-3;
constexpr std::uint64_t gradient_seed = 0x9E3779B97F4A7C15ull;
constexpr std::uint64_t check_n = std::uint64_t{1} << 20;

constexpr std::string_view usage_text = R"(usage: gradcomp-bench-cuda [options]

Times gradcomp's CUDA codecs on the current GPU on a float32 gradient drawn from N(0, sigma=1e-3),
next to a device-to-device copy of the same gradient and, for exact top-k, CUB's radix sort.

options:
  --n N         n = N elements (decimal, or 2^K); default 2^28
  --quick       n = 2^20, one warm-up and three timed runs (smoke test)
  --reps N      timed runs per operation (default 20); best and median are reported
  --warmup N    untimed runs before the timed ones (default 3)
  --json FILE   also write the records (with the device name) as a JSON array to FILE
  --no-check    skip the comparison of each codec's bytes with the CPU reference
  --help        print this text and exit

Targets are printed as PASS/FAIL lines after the table; they do not change the exit status: 0,
or 77 when there is no CUDA driver or no device (1 instead with GRADCOMP_REQUIRE_GPU=1 in the
environment), or 1 when the driver is present but fails.
)";

struct options {
  std::uint64_t n = std::uint64_t{1} << 28;
  int warmup = 3;
  int reps = 20;
  std::string json;
  bool check = true;
  bool help = false;
};

options parse_options(int argc, char** argv) {
  options opt;
  const std::vector<std::string_view> args(argv + 1, argv + argc);
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string_view arg = args[i];
    const auto value = [&]() -> std::string_view {
      if (i + 1 >= args.size()) throw usage_error(fmt::format("{} needs a value", arg));
      return args[++i];
    };
    if (arg == "--help" || arg == "-h") opt.help = true;
    else if (arg == "--quick") {
      opt.n = check_n;
      opt.warmup = 1;
      opt.reps = 3;
    } else if (arg == "--n")
      opt.n = parse_size(value(), std::uint64_t{1} << 31);
    else if (arg == "--reps")
      opt.reps = parse_count(value(), "--reps", 1);
    else if (arg == "--warmup")
      opt.warmup = parse_count(value(), "--warmup", 0);
    else if (arg == "--json")
      opt.json = std::string(value());
    else if (arg == "--no-check")
      opt.check = false;
    else
      throw usage_error(fmt::format("unknown argument '{}'", arg));
  }
  return opt;
}

/// Times `run` (work queued on `stream`) with CUDA events: warmup + reps runs, the last reps timed.
timing measure(const options& opt, cudaStream_t stream, const std::function<void()>& run) {
  cudaEvent_t start = nullptr, stop = nullptr;
  GRADCOMP_CUDA_CHECK(cudaEventCreate(&start));
  GRADCOMP_CUDA_CHECK(cudaEventCreate(&stop));
  for (int i = 0; i < opt.warmup; ++i) run();
  std::vector<double> seconds;
  for (int i = 0; i < opt.reps; ++i) {
    GRADCOMP_CUDA_CHECK(cudaEventRecord(start, stream));
    run();
    GRADCOMP_CUDA_CHECK(cudaEventRecord(stop, stream));
    GRADCOMP_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0.0f;
    GRADCOMP_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    seconds.push_back(static_cast<double>(ms) * 1e-3);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(seconds.begin(), seconds.end());
  const std::size_t mid = seconds.size() / 2;
  return {seconds.front(), seconds.size() % 2 == 1 ? seconds[mid] : 0.5 * (seconds[mid - 1] + seconds[mid])};
}

template <class T>
device_array<T> upload(std::span<const T> host) {
  device_array<T> d(host.size());
  GRADCOMP_CUDA_CHECK(cudaMemcpy(d.data(), host.data(), host.size_bytes(), cudaMemcpyHostToDevice));
  return d;
}

template <class T>
std::vector<T> download(const T* device, std::size_t count) {
  std::vector<T> host(count);
  GRADCOMP_CUDA_CHECK(cudaMemcpy(host.data(), device, count * sizeof(T), cudaMemcpyDeviceToHost));
  return host;
}

/// Requires the GPU's message of the first `check_n` values to equal the CPU reference's.
template <class Codec>
void check_against_cpu(const std::string& name, const Codec& codec, std::span<const float> head) {
  const gradcomp::cpu_executor cpu;
  std::vector<std::byte> expected(codec.max_encoded_bytes(head.size()));
  std::vector<std::byte> cpu_ws(codec.workspace_bytes(cpu, head.size()));
  expected.resize(codec.encode(cpu, head, expected, cpu_ws, {.step = 1}));
  const cuda_executor gpu;
  const device_array<float> g = upload(head);
  device_array<std::byte> out(codec.max_encoded_bytes(head.size()));
  device_array<std::byte> ws(codec.workspace_bytes(gpu, head.size()));
  const std::size_t size = codec.encode(gpu, std::span<const float>(g.span()), out.span(), ws.span(), {.step = 1});
  require_check(download(out.data(), size) == expected, name + ": the GPU's message differs from the CPU reference's");
}

/// |x| keys and their indices, the radix-sort baseline's input (one thread per element).
struct magnitude_pairs {
  const float* x;
  std::uint32_t* keys;
  std::uint32_t* indices;

  __device__ void operator()(std::uint64_t i) const {
    keys[i] = gradcomp::magnitude_key(x[i]);
    indices[i] = static_cast<std::uint32_t>(i);
  }
};

/// Columns of the count sketch and of its yardstick.
constexpr std::uint64_t sketch_columns = std::uint64_t{1} << 20;

/// The count sketch's yardstick: table[j·c + (h_j(i)·c >> 32)] += x_i for rows j < 3, where h_j(i) is
/// a multiplicative hash of i (one multiply, against the sketch's three MurmurHash3 evaluations).
__global__ void random_atomics_kernel(const float* x, std::uint64_t n, float* table) {
  constexpr std::uint32_t multipliers[3] = {0x9E3779B1u, 0x85EBCA77u, 0xC2B2AE3Du};
  for (std::uint64_t i = gradcomp::detail::cuda::thread_id(); i < n; i += gradcomp::detail::cuda::thread_count()) {
    const float value = x[i];
#pragma unroll
    for (std::uint32_t j = 0; j < 3; ++j) {
      const std::uint32_t h = static_cast<std::uint32_t>(i) * multipliers[j];
      atomicAdd(table + j * sketch_columns + ((std::uint64_t{h} * sketch_columns) >> 32), value);
    }
  }
}

struct bench_run {
  const options& opt;
  cudaStream_t stream;
  std::uint64_t n;
  const device_array<float>& gradient;
  std::vector<record>& records;
  checksum& sum;

  record& add(const std::string& name, const std::function<void()>& run, double compression_ratio = 1.0) {
    record r;
    r.name = name;
    r.n = n;
    r.time = measure(opt, stream, run);
    r.compression_ratio = compression_ratio;
    records.push_back(r);
    return records.back();
  }

  /// Encode and decode records of a stateless codec (deferred errors for the encode).
  template <class Codec>
  void codec_records(const std::string& name, const Codec& codec, bool decode_too, std::uint32_t* errors) {
    const cuda_executor deferred{.stream = stream, .deferred_errors = errors};
    const cuda_executor checked{.stream = stream};
    device_array<std::byte> out(codec.max_encoded_bytes(n));
    device_array<std::byte> ws(codec.workspace_bytes(checked, n));
    const std::span<const float> g(gradient.span());
    std::size_t size = 0;
    add(name + "/encode", [&] { size = codec.encode(deferred, g, out.span(), ws.span(), {.step = 1}); });
    gradcomp::check_deferred_errors(deferred);
    records.back().compression_ratio = static_cast<double>(n * sizeof(float)) / static_cast<double>(size);
    sum.add(std::uint64_t{size});
    if (!decode_too) return;
    device_array<float> dense(n);
    const std::span<const std::byte> message(out.data(), size);
    add(name + "/decode", [&] { codec.decode(checked, message, dense.span(), ws.span()); });
    sum.add_sample(download(dense.data(), n));
  }
};

std::string device_name() {
  int device = 0;
  GRADCOMP_CUDA_CHECK(cudaGetDevice(&device));
  cudaDeviceProp props{};
  GRADCOMP_CUDA_CHECK(cudaGetDeviceProperties(&props, device));
  return props.name;
}

void print_targets(const std::vector<record>& records, std::uint64_t n, const std::string& device) {
  fmt::print("\ntargets (informational; the exit status does not depend on them):\n");
  const std::pair<std::string_view, double> ratios[] = {
      {"uniform8_rtn/encode", 0.8}, {"uniform8_rtn/decode", 0.8},  {"uniform8_sr/encode", 0.7},
      {"ef_uniform8/encode", 0.5},  {"loco_uniform4/encode", 0.4}, {"threshold/encode", 0.5},
  };
  for (const auto& [name, ratio] : ratios)
    if (const record* r = find_record(records, name, n); r != nullptr)
      target_line(r->ratio_to_copy() >= ratio,
                  fmt::format("{} n={}: ratio_to_copy {:.3f} >= {}", name, n, r->ratio_to_copy(), ratio));
  if (const record* r = find_record(records, "topk/encode", n); r != nullptr && r->speedup)
    target_line(*r->speedup >= 5.0,
                fmt::format("topk/encode n={}: {:.2f}x faster than the full radix sort (>= 5)", n, *r->speedup));
  // MPC: 300 GB/s compress and 400 GB/s decompress on an H100; on another card scaled by this
  // run's copy against an H100's (taken as 1,500 GB/s copied until an H100 run records its own).
  if (const record* copy = find_record(records, "copy/d2d", n); copy != nullptr) {
    const double scale = device.find("H100") != std::string::npos ? 1.0 : copy->gradient_gbps() / 1500.0;
    for (const auto& [name, gbps] : {std::pair<std::string_view, double>{"mpc/encode", 300}, {"mpc/decode", 400}})
      if (const record* r = find_record(records, name, n); r != nullptr)
        target_line(r->gradient_gbps() >= gbps * scale,
                    fmt::format("{} n={}: {:.0f} GB/s of input >= {:.0f} (H100's {} scaled by "
                                "this copy)",
                                name, n, r->gradient_gbps(), gbps * scale, gbps));
  }
  for (const std::string_view name : {"zfp8/encode", "zfp8/decode", "zfp16/encode", "zfp16/decode"})
    if (const record* r = find_record(records, name, n); r != nullptr)
      target_line(r->gradient_gbps() >= 300,
                  fmt::format("{} n={}: {:.0f} GB/s of input >= 300", name, n, r->gradient_gbps()));
  if (const record* r = find_record(records, "count_sketch/encode", n); r != nullptr && r->speedup)
    target_line(*r->speedup >= 1 / 1.5,
                fmt::format("count_sketch/encode n={}: {:.2f}x the time of 3 random atomicAdds per element "
                            "(<= 1.5)",
                            n, 1 / *r->speedup));
  if (const record* r = find_record(records, "threshold/encode", n); r != nullptr && r->achieved_density) {
    const double density = *r->achieved_density;
    target_line(density >= 0.8 * target_density && density <= 1.25 * target_density,
                fmt::format("threshold/encode n={}: achieved_density {:.5f} within [{:.4f}, {:.4f}]", n, density,
                            0.8 * target_density, 1.25 * target_density));
  }
  fmt::print("torch.topk: run bench/torch_topk.py --gradcomp-json FILE with this run's JSON (target: >= 2x faster)\n");
}

#if defined(GRADCOMP_BENCH_NCCL)
/// TAGC's collective record (f* = 0.95, blocks of 1024; the reduce-scatter of one rank is its whole
/// sum). Its wire bytes are those a first call reports (indexes and segments).
template <class Restore, class Collective>
void tagc_record(const cuda_executor& exec, gradcomp::nccl_transport& t, device_array<float>& data, Restore& restore,
                 Collective& collective) {
  const gradcomp::tagc<float> scheme(gradcomp::tagc_params{.sparsify = {.zero_fraction = 0.95}});
  auto state = scheme.make_state(exec);
  device_array<float> out(data.size());
  std::uint64_t step = 0;
  const auto reduce = [&] {
    return gradcomp::compressed_reduce_scatter(exec, t, scheme, state, std::span<const float>(data.span()), out.span(),
                                               {.key = {.step = step++}, .average = true});
  };
  restore();
  const std::uint64_t wire_bytes = reduce().sent_bytes;
  collective("tagc/reduce_scatter", wire_bytes, [&] { (void)reduce(); });
}

/// The collective records: one-rank NCCL reductions of the whole gradient, compressed, aggregated
/// and decoded on the GPU (nccl_transport on the bench's stream, a cuda_executor with a memory pool
/// of the bench's that keeps the per-step scratch), against NCCL's own all-reduce of the same buffer
/// in the same run. Every run first restores the gradient with a device copy (the baseline's too),
/// since the reductions work in place. `wire_bytes` is what one rank puts on each link per step (its
/// frame; TAGC: its indexes and segments); `host_bytes` what nccl_transport copied to the host in
/// the last run (size and control words: never payload).
void collective_records(bench_run& bench) {
  using namespace gradcomp;
  const std::uint64_t n = bench.n;
  int device = 0;
  GRADCOMP_CUDA_CHECK(cudaGetDevice(&device));
  ncclComm_t comm = nullptr;
  require_check(ncclCommInitAll(&comm, 1, &device) == ncclSuccess, "ncclCommInitAll of one rank");
  cudaMemPool_t pool = nullptr;
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = device;
  GRADCOMP_CUDA_CHECK(cudaMemPoolCreate(&pool, &props));
  std::uint64_t keep_all = std::numeric_limits<std::uint64_t>::max();
  GRADCOMP_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep_all));
  {
    nccl_transport t(comm, bench.stream);
    const cuda_executor exec{.stream = bench.stream, .memory_pool = pool};
    device_array<float> data(n);
    const auto restore = [&] {
      GRADCOMP_CUDA_CHECK(cudaMemcpyAsync(data.data(), bench.gradient.data(), n * sizeof(float),
                                          cudaMemcpyDeviceToDevice, bench.stream));
    };
    bench.add("nccl/allreduce", [&] {
      restore();
      require_check(ncclAllReduce(data.data(), data.data(), n, ncclFloat32, ncclSum, comm, bench.stream) == ncclSuccess,
                    "ncclAllReduce");
    });
    std::vector<std::string> lines;
    // One record: `reduce()` on the restored gradient, with NCCL's all-reduce as its baseline.
    const auto collective = [&](const std::string& name, std::uint64_t wire_bytes,
                                const std::function<void()>& reduce) {
      std::uint64_t host_bytes = 0;
      bench.add(name, [&] {
        restore();
        const std::uint64_t before = t.host_copy_bytes();
        reduce();
        host_bytes = t.host_copy_bytes() - before;
      });
      record& r = bench.records.back();
      r.baseline = "nccl/allreduce";
      r.compression_ratio = static_cast<double>(n * sizeof(float)) / static_cast<double>(wire_bytes);
      lines.push_back(
          fmt::format("  {:<26} {:>12} wire bytes per rank and link, {:>6} bytes copied to the host per step", name,
                      wire_bytes, host_bytes));
    };
    // A wrapper's frame: its message (the size of a first step's, which these codecs keep) and the header.
    const auto frame_bytes = [&](const auto& wrapper) {
      auto scratch = wrapper.make_state(exec, n);
      device_array<std::byte> out(wrapper.max_encoded_bytes(n));
      device_array<std::byte> ws(wrapper.workspace_bytes(exec, n));
      return detail::frame_header_bytes +
             wrapper.encode(exec, std::span<const float>(bench.gradient.span()), scratch, out.span(), ws.span(), {});
    };
    const auto all_reduce = [&](const std::string& name, const auto& wrapper) {
      auto state = wrapper.make_state(exec, n);
      std::uint64_t step = 0;
      collective(name, frame_bytes(wrapper), [&] {
        (void)compressed_all_reduce(exec, t, wrapper, state, data.span(), {.key = {.step = step++}, .average = true});
      });
    };
    all_reduce("ef_topk1/allreduce", error_feedback(topk_sparsifier<float>(sparsity{.density = target_density})));
    all_reduce("loco_uniform8/allreduce", loco(uniform_quantizer<float>({.bits = 8})));
    all_reduce("loco_uniform4/allreduce", loco(uniform_quantizer<float>({.bits = 4})));
    tagc_record(exec, t, data, restore, collective);
    fmt::print("collectives over nccl_transport (one rank; baseline nccl/allreduce):\n");
    for (const std::string& line : lines) fmt::print("{}\n", line);
    fmt::print("\n");
  }
  GRADCOMP_CUDA_CHECK(cudaStreamSynchronize(bench.stream));
  GRADCOMP_CUDA_CHECK(cudaMemPoolDestroy(pool));
  ncclCommDestroy(comm);
}
#endif

void run(const options& opt) {
  const std::uint64_t n = opt.n;
  std::vector<float> host(n);
  fill_gradient(host, gradient_seed, gradient_stddev);
  if (opt.check) {
    const std::span<const float> head(host.data(), std::min(n, check_n));
    using namespace gradcomp;
    check_against_cpu("topk", topk_sparsifier<float>(sparsity{.density = target_density}), head);
    check_against_cpu("threshold", threshold_sparsifier<float>({.target = {.density = target_density}}), head);
    check_against_cpu("randomk", randomk_sparsifier<float>({.amount = {.density = target_density}, .seed = 1}), head);
    check_against_cpu("uniform8_rtn", uniform_quantizer<float>({.bits = 8}), head);
    check_against_cpu("uniform8_sr", uniform_quantizer<float>({.bits = 8, .round = rounding::stochastic, .seed = 1}),
                      head);
    check_against_cpu("uniform4_rtn", uniform_quantizer<float>({.bits = 4}), head);
    check_against_cpu("sign", sign_quantizer<float>(), head);
    check_against_cpu("qsgd", qsgd_quantizer<float>({.seed = 1}), head);
    check_against_cpu("mpc", mpc_codec<float>(), head);
    check_against_cpu("zfp8", zfp_fixed_rate_codec<float>({.rate_bits = 8}), head);
    check_against_cpu("zfp16", zfp_fixed_rate_codec<float>({.rate_bits = 16}), head);
  }

  cudaStream_t stream = nullptr;
  GRADCOMP_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const device_array<float> gradient = upload(std::span<const float>(host));
  device_array<std::uint32_t> errors(1);
  std::vector<record> records;
  checksum sum;
  bench_run bench{opt, stream, n, gradient, records, sum};

  device_array<float> copy(n);
  bench.add("copy/d2d", [&] {
    GRADCOMP_CUDA_CHECK(
        cudaMemcpyAsync(copy.data(), gradient.data(), n * sizeof(float), cudaMemcpyDeviceToDevice, stream));
  });

  {  // the radix-sort baseline of exact top-k
    device_array<std::uint32_t> keys(n), indices(n), sorted_keys(n), sorted_indices(n);
    std::size_t temp_bytes = 0;
    GRADCOMP_CUDA_CHECK(cub::DeviceRadixSort::SortPairsDescending(nullptr, temp_bytes, keys.data(), sorted_keys.data(),
                                                                  indices.data(), sorted_indices.data(), n));
    device_array<std::byte> temp(temp_bytes);
    bench.add("radix_sort/sort", [&] {
      gradcomp::detail::cuda::for_each_item(cuda_executor{.stream = stream}, n,
                                            magnitude_pairs{gradient.data(), keys.data(), indices.data()});
      std::size_t bytes = temp.size();
      GRADCOMP_CUDA_CHECK(cub::DeviceRadixSort::SortPairsDescending(temp.data(), bytes, keys.data(), sorted_keys.data(),
                                                                    indices.data(), sorted_indices.data(), n, 0, 32,
                                                                    stream));
    });
  }

  using namespace gradcomp;
  bench.codec_records("topk", topk_sparsifier<float>(sparsity{.density = target_density}), true, errors.data());
  for (record& r : records)
    if (r.name == "topk/encode") r.baseline = "radix_sort/sort";
  bench.codec_records("randomk", randomk_sparsifier<float>({.amount = {.density = target_density}, .seed = 1}), true,
                      errors.data());
  {
    const threshold_sparsifier<float> threshold({.target = {.density = target_density}});
    const cuda_executor exec{.stream = stream};
    device_array<std::byte> out(threshold.max_encoded_bytes(n));
    device_array<std::byte> ws(threshold.workspace_bytes(exec, n));
    threshold_report<float> report;
    bench.add("threshold/encode", [&] {
      report = threshold.encode_with_report(exec, std::span<const float>(gradient.span()), out.span(), ws.span(),
                                            {.step = 1});
    });
    records.back().achieved_density = report.density;
    records.back().compression_ratio = static_cast<double>(n * sizeof(float)) / static_cast<double>(report.bytes);
    device_array<float> dense(n);
    bench.add("threshold/decode", [&] {
      threshold.decode(exec, std::span<const std::byte>(out.data(), report.bytes), dense.span(), ws.span());
    });
  }
  bench.codec_records("uniform8_rtn", uniform_quantizer<float>({.bits = 8}), true, errors.data());
  bench.codec_records("uniform8_sr", uniform_quantizer<float>({.bits = 8, .round = rounding::stochastic, .seed = 1}),
                      false, errors.data());
  bench.codec_records("uniform4_rtn", uniform_quantizer<float>({.bits = 4}), true, errors.data());
  bench.codec_records("sign", sign_quantizer<float>(), true, errors.data());
  bench.codec_records("qsgd", qsgd_quantizer<float>({.seed = 1}), true, errors.data());
  {
    device_array<float> table(3 * sketch_columns);
    bench.add("atomics3/add", [&] {
      GRADCOMP_CUDA_CHECK(cudaMemsetAsync(table.data(), 0, table.size() * sizeof(float), stream));
      detail::cuda::launch(cuda_executor{.stream = stream}, detail::cuda::grid_for(n), detail::cuda::block_threads,
                           random_atomics_kernel, static_cast<const float*>(gradient.data()), n, table.data());
    });
  }
  bench.codec_records("count_sketch", count_sketch<float>({.rows = 3, .columns = sketch_columns}), true, errors.data());
  for (record& r : records)
    if (r.name == "count_sketch/encode") r.baseline = "atomics3/add";
  bench.codec_records("mpc", mpc_codec<float>(), true, errors.data());
  bench.codec_records("zfp8", zfp_fixed_rate_codec<float>({.rate_bits = 8}), true, errors.data());
  bench.codec_records("zfp16", zfp_fixed_rate_codec<float>({.rate_bits = 16}), true, errors.data());
  {
    const dynamic_sparsifier<float> dynamic({.zero_fraction = 0.8});
    const cuda_executor exec{.stream = stream};
    device_array<std::byte> ws(dynamic.workspace_bytes(exec, n));
    const std::span<const float> g(gradient.span());
    float tau = 0;
    bench.add("dynamic/threshold", [&] { tau = dynamic.threshold(exec, g, ws.span()); });
    sum.add(std::uint64_t{gradcomp::to_bits(tau)});
    auto state = dynamic.make_state(exec);
    device_array<float> sparse(n);
    bench.add("dynamic/sparsify", [&] { (void)dynamic.sparsify(exec, state, 0, g, sparse.span(), ws.span()); });
  }
  const auto feedback_record = [&](const std::string& name, const auto& wrapper) {
    const cuda_executor exec{.stream = stream};
    auto state = wrapper.make_state(exec, n);
    device_array<std::byte> out(wrapper.max_encoded_bytes(n));
    device_array<std::byte> ws(wrapper.workspace_bytes(exec, n));
    std::uint64_t step = 0;
    std::size_t size = 0;
    bench.add(name, [&] {
      size =
          wrapper.encode(exec, std::span<const float>(gradient.span()), state, out.span(), ws.span(), {.step = step++});
    });
    records.back().compression_ratio = static_cast<double>(n * sizeof(float)) / static_cast<double>(size);
  };
  feedback_record("ef_uniform8/encode", error_feedback(uniform_quantizer<float>({.bits = 8})));
  feedback_record("loco_uniform4/encode", loco(uniform_quantizer<float>({.bits = 4})));
#if defined(GRADCOMP_BENCH_NCCL)
  collective_records(bench);
#endif

  const record& copy_record = records.front();
  for (record& r : records) r.copy_median = copy_record.time.median;
  for (record& r : records)
    if (!r.baseline.empty())
      if (const record* b = find_record(records, r.baseline, n); b != nullptr)
        r.speedup = b->time.median / r.time.median;

  const std::string device = device_name();
  fmt::print(
      "gradcomp-bench-cuda on {}: float32 ~ N(0, sigma={}), seed {:#x}, density {}, {} warm-up + {} timed runs; "
      "GB/s = 1e9 bytes of gradient (n*4) per second at the median time\n\n",
      device, gradient_stddev, gradient_seed, target_density, opt.warmup, opt.reps);
  print_table(records, cuda_executor::name);
  print_targets(records, n, device);
  fmt::print("\nchecksum {:016x}\n", sum.value());
  if (!opt.json.empty()) {
    write_file(opt.json, to_json(records, cuda_executor::name, device));
    fmt::print("wrote {} records to {}\n", records.size(), opt.json);
  }
  cudaStreamDestroy(stream);
}

}  // namespace

int main(int argc, char** argv) {
  return bench_main("gradcomp-bench-cuda", usage_text, argc, argv, parse_options, [](const options& opt) {
    const gradcomp::test::gpu_presence& presence = gradcomp::test::gpu_presence_here();
    if (presence.verdict == gradcomp::test::gpu_verdict::skip) {
      fmt::print("gradcomp-bench-cuda: {}; nothing measured\n", presence.reason);
      return 77;
    }
    if (presence.verdict == gradcomp::test::gpu_verdict::fail) throw std::runtime_error(presence.reason);
    run(opt);
    return 0;
  });
}
