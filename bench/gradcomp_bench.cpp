/// @file
/// gradcomp-bench: single-thread CPU throughput of gradcomp's codecs, measured against a memcpy of
/// the same gradient in the same run.
///
/// For each size n (default 2^24 and 2^26) a float32 gradient is drawn from N(0, σ = 1e-3) with a
/// fixed seed. Every operation runs `--warmup` untimed and `--reps` timed times on buffers that are
/// allocated and pre-touched once, outside timing; best and median wall times (steady_clock) are
/// reported. Records are named `<codec>[_<variant>]/<operation>`:
///
///   memcpy/copy          std::memcpy of the n·4 gradient bytes into a dense buffer
///   nth_element/select   std::nth_element on a copy of |x| (the copy is timed), same k as top-k
///   topk/encode          exact top-k, density 1%; baseline nth_element/select
///   topk/decode          decode into a dense buffer (zero fill + scatter)
///   randomk/encode       random-k, density 1%
///   randomk/decode
///   threshold/encode     sampled threshold, target density 1% (achieved density recorded)
///   threshold/decode
///   uniform8_rtn/encode  8-bit uniform quantization, blocks of 256, round to nearest; /decode
///   uniform8_sr/encode   the same with stochastic rounding
///   uniform4_rtn/encode  4-bit round to nearest; /decode
///   sign/encode          sign quantization, blocks of 256 (one bit and a mean-magnitude scale); /decode
///   qsgd/encode          QSGD, 15 levels (8-bit codes), buckets of 256; /decode
///   shared_scale8/encode shared-scale 8-bit quantization, single-stage encode (own maxima); /decode
///   memcpy_bf16/copy     std::memcpy of the gradient rounded to bf16 (n·2 bytes): the baseline of
///                        the bf16 records, whose gradient_gbps count n·2 bytes (value_bytes 2)
///   uniform8_rtn_bf16/encode  8-bit round to nearest of the bf16 gradient (widened inside the
///                        encoder; its payload is checked to equal uniform8_rtn's of the widened
///                        values); /decode into bf16, /decode_f32 into float32
///   nth_element_bf16/select  the bf16 gradient's magnitudes widened to float32 into a buffer, then
///                        std::nth_element (both timed), k = 1%
///   topk_bf16/encode     exact top-k 1% of the bf16 gradient (its 16-bit keys); baseline
///                        nth_element_bf16/select, whose k-th magnitude it must keep
///   (backend reference)  topk, randomk, threshold, uniform8_rtn, uniform8_sr, uniform4_rtn, sign,
///                        qsgd and shared_scale8 again on reference_executor, under the same names
///                        with backend "reference": baseline the CPU record, speedup CPU median /
///                        reference median (informational: the reference is written to be read);
///                        each reference message is checked to equal the CPU backend's; likewise
///                        ef_topk, ef_uniform8 and loco_uniform4 (a first step from a fresh state
///                        checked, later steps timed), lhc, count_sketch, mpc, zfp8 and zfp16
///   ef_topk/encode       error feedback around top-k 1% (one step: residual in, residual out)
///   ef_uniform8/encode   error feedback around 8-bit round to nearest
///   loco_uniform4/encode LoCo around 4-bit round to nearest (8-bit error state)
///   dynamic/threshold    TAGC dynamic sparsification, exact threshold for f* = 0.8 (one histogram
///                        pass plus the chosen bucket)
///   dynamic_table/threshold  the reference's table bisection (a full pass per probe), f* = 0.8
///   dynamic/sparsify     a full step: threshold, dense output and residual update (keyed by id)
///   lhc/encode           lossless homomorphic compression of the gradient sparsified to 5%
///                        (|x| > 1.96σ), one rank: encode_index + plan + encode_sketch, bitmap index
///   lhc/decode           its peeling decode at 1.3 cells per non-zero
///   count_sketch/encode  count sketch, 3 rows of 2^20 columns (12 MiB of float cells); the target
///                        line reports ns per element-row update (median / (3·n))
///   count_sketch/decode  its heavy-hitter decode: estimate every element (median of 3), top 1%
///   mpc/encode           MPC lossless (dim 1) of the gradient; /decode (compression ratio achieved)
///   mpc_smooth/encode    MPC lossless (dim 1) of sin(1e-4·i), a smooth signal; /decode
///   zfp8/encode          ZFP fixed rate, 8 bits per value (compression ratio 4); /decode (the
///                        largest error is checked against lossless.md §2's bound and reported)
///   zfp16/encode         ZFP fixed rate, 16 bits per value; /decode
///   powersgd_r4/step     one step of PowerSGD's all-reduce at r = 4 on one in-process rank, the
///                        gradient viewed as a matrix (4096 × 4096 at 2^24): compensate, both
///                        products, orthonormalise, error and result; checked against the
///                        reference backend; compression ratio a·b / ((a + b)·r)
///   powersgd_r4/compress the compression alone: P = G·Q, orthonormalise, Q = Gᵀ·P̂ (two passes over
///                        the matrix and the small products; no error feedback, no result)
///   crc32c/checksum      CRC-32C of the n·4 gradient bytes as the envelope's payload checksum
///                        computes it (SSE4.2's crc32 instruction where the CPU has it); baseline
///                        crc32c_table/checksum, the byte-wise table
///
/// The CPU executor is the default one (AVX2 where the CPU has it, streamed stores for outputs of
/// 8 MiB and more).
///
/// gradient_gbps = n·4 bytes / median seconds (1 GB = 1e9 bytes); copy_gbps is memcpy's figure
/// for the same n (bytes copied per second, not read + write); ratio_to_copy is their quotient.
///
/// `--json FILE` writes the records with the run's machine and build (bench_report.hpp);
/// `--compare A.json B.json` prints each record's ratio_to_copy in both files and its change.

#include <gradcomp/gradcomp.hpp>

#include "bench_report.hpp"

#include <fmt/core.h>
#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <iterator>
#include <limits>
#include <new>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace {

using namespace gradcomp_bench;

using clock_type = std::chrono::steady_clock;

constexpr double target_density = 0.01;               // k = 1% of n for every sparsifier
constexpr double gradient_stddev = 1e-3;               // N(0, σ = 1e-3)
constexpr std::uint64_t gradient_seed = 0x9E3779B97F4A7C15ull;
constexpr std::uint64_t quick_n = std::uint64_t{1} << 20;
constexpr std::uint64_t topk_target_n = std::uint64_t{1} << 24;
constexpr double topk_speedup_target = 3.0;  // top-k over nth_element, float32 and bf16 alike
constexpr double ratio_to_copy_target = 0.5;
constexpr double density_low = 0.8;
constexpr double density_high = 1.25;
constexpr double loco_state_bytes_target = 1.1;
constexpr double dynamic_zero_fraction = 0.8;         // TAGC's f*

/// Throughput targets of the quantizer, feedback and LHC records (ratio_to_copy at least this).
struct ratio_target {
  std::string_view name;
  double ratio;
};
constexpr ratio_target quantizer_targets[] = {
    {"uniform8_rtn/encode", 1.0}, {"uniform8_rtn/decode", 1.0},  {"uniform8_sr/encode", 0.4},
    {"ef_uniform8/encode", 0.5},  {"loco_uniform4/encode", 0.3}, {"lhc/encode", 0.15},
    {"lhc/decode", 0.1},          {"mpc/encode", 0.25},          {"mpc/decode", 0.3},
    {"zfp8/encode", 0.1},         {"zfp8/decode", 0.1},          {"zfp16/encode", 0.1},
    {"zfp16/decode", 0.1},        {"powersgd_r4/compress", 0.4}, {"uniform8_rtn_bf16/encode", 0.8},
};
constexpr std::uint32_t powersgd_bench_rank = 4;  // PowerSGD's rank r in powersgd_r4/step

/// The gradient of n values as PowerSGD's matrix: rows the largest divisor of n up to √n (4096 ×
/// 4096 at n = 2^24, 8192 × 8192 at 2^26).
gradcomp::matrix_shape powersgd_bench_shape(std::uint64_t n) {
  auto rows = static_cast<std::uint64_t>(std::sqrt(static_cast<double>(n)));
  while (rows > 1 && n % rows != 0) --rows;
  return {rows, n / rows};
}

constexpr double lhc_cut_sigmas = 1.959964;  // |x| > 1.96σ keeps 5% of a normal gradient
constexpr std::uint32_t sketch_rows = 3;                        // count sketch: r
constexpr std::uint64_t sketch_columns = std::uint64_t{1} << 20;  // count sketch: c
constexpr double sketch_update_ns_target = 4.0;                 // ns per element-row update
constexpr double crc32c_gbps_target = 1.0;                      // CRC-32C, single thread

constexpr std::string_view usage_text = R"(usage: gradcomp-bench [options]

Times gradcomp's CPU codecs (single thread) on a float32 gradient drawn from N(0, sigma=1e-3)
with a fixed seed, next to a memcpy of the same gradient and, for exact top-k, std::nth_element.
Every sparsifier keeps 1% of the elements.

options:
  --n N         run only n = N elements (decimal, or 2^K); default: 2^24 and 2^26
  --quick       run only n = 2^20 (smoke test)
  --reps N      timed runs per operation (default 7); best and median are reported
  --warmup N    untimed runs before the timed ones (default 2)
  --json FILE   also write the records as a JSON array to FILE, each with the run's machine
                (CPU model, logical CPUs), compiler, flags, gradcomp version and commit
  --compare A.json B.json
                run nothing: print every record's ratio to memcpy in file A and in file B and
                its change (files of gradcomp-bench or gradcomp-bench-cuda)
  --help        print this text and exit

Targets are printed as PASS/FAIL lines after the table; they are informational and do not
change the exit status (0 unless the run itself fails).
)";

// ---- command line -----------------------------------------------------------------------------

struct options {
  std::vector<std::uint64_t> sizes{std::uint64_t{1} << 24, std::uint64_t{1} << 26};
  int warmup = 2;
  int reps = 7;
  std::string json;
  std::vector<std::string> compare;  ///< --compare A.json B.json
  bool help = false;
};

options parse_options(int argc, char** argv) {
  options opt;
  const std::vector<std::string_view> args(argv + 1, argv + argc);
  for (std::size_t i = 0; i < args.size(); ++i) {
    std::string_view arg = args[i];
    std::optional<std::string_view> inline_value;
    if (const std::size_t eq = arg.find('='); arg.starts_with("--") && eq != std::string_view::npos) {
      inline_value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
    }
    const auto value = [&]() -> std::string_view {
      if (inline_value) return *inline_value;
      if (i + 1 >= args.size()) throw usage_error(fmt::format("{} needs a value", arg));
      return args[++i];
    };
    const auto no_value = [&] {
      if (inline_value) throw usage_error(fmt::format("{} takes no value", arg));
    };
    if (arg == "--help" || arg == "-h") {
      no_value();
      opt.help = true;
    } else if (arg == "--quick") {
      no_value();
      opt.sizes = {quick_n};
    } else if (arg == "--n") {
      opt.sizes = {parse_size(value(), std::uint64_t{1} << 32)};
    } else if (arg == "--reps") {
      opt.reps = parse_count(value(), "--reps", 1);
    } else if (arg == "--warmup") {
      opt.warmup = parse_count(value(), "--warmup", 0);
    } else if (arg == "--json") {
      opt.json = std::string(value());
      if (opt.json.empty()) throw usage_error("--json needs a file name");
    } else if (arg == "--compare") {
      if (inline_value || i + 2 >= args.size()) throw usage_error("--compare needs two files: --compare A.json B.json");
      opt.compare = {std::string(args[i + 1]), std::string(args[i + 2])};
      i += 2;
    } else {
      throw usage_error(fmt::format("unknown argument '{}'", arg));
    }
  }
  return opt;
}

// ---- buffers, gradient, checksum --------------------------------------------------------------

/// A 64-byte aligned array, zero-filled (so every page is touched) when it is made.
template <class T>
class buffer {
 public:
  explicit buffer(std::size_t count) : count_(count) {
    if (count_ == 0) return;
    data_ = static_cast<T*>(::operator new(count_ * sizeof(T), std::align_val_t{alignment}));
    std::memset(static_cast<void*>(data_), 0, count_ * sizeof(T));
  }
  ~buffer() {
    if (data_ != nullptr) ::operator delete(static_cast<void*>(data_), std::align_val_t{alignment});
  }
  buffer(const buffer&) = delete;
  buffer& operator=(const buffer&) = delete;

  [[nodiscard]] T* data() noexcept { return data_; }
  [[nodiscard]] const T* data() const noexcept { return data_; }
  [[nodiscard]] std::size_t size() const noexcept { return count_; }
  [[nodiscard]] std::span<T> span() noexcept { return {data_, count_}; }
  [[nodiscard]] std::span<const T> span() const noexcept { return {data_, count_}; }

 private:
  static constexpr std::size_t alignment = 64;
  std::size_t count_ = 0;
  T* data_ = nullptr;
};

// ---- timing -----------------------------------------------------------------------------------

/// Runs `run` warmup + reps times, timing the last reps; `observe` runs after each, untimed.
template <class Run, class Observe>
timing measure(const options& opt, Run&& run, Observe&& observe) {
  for (int i = 0; i < opt.warmup; ++i) {
    run();
    observe();
  }
  std::vector<double> seconds;
  seconds.reserve(static_cast<std::size_t>(opt.reps));
  for (int i = 0; i < opt.reps; ++i) {
    const clock_type::time_point start = clock_type::now();
    run();
    const clock_type::time_point stop = clock_type::now();
    seconds.push_back(std::chrono::duration<double>(stop - start).count());
    observe();
  }
  std::sort(seconds.begin(), seconds.end());
  const std::size_t mid = seconds.size() / 2;
  const double median = seconds.size() % 2 == 1 ? seconds[mid] : 0.5 * (seconds[mid - 1] + seconds[mid]);
  return {seconds.front(), median};
}

// ---- records ----------------------------------------------------------------------------------

std::size_t count_nonzero(std::span<const float> dense, float& smallest_magnitude) {
  std::size_t count = 0;
  float smallest = std::numeric_limits<float>::infinity();
  for (const float v : dense) {
    if (v != 0.0f) {
      ++count;
      smallest = std::min(smallest, std::fabs(v));
    }
  }
  smallest_magnitude = smallest;
  return count;
}

/// Measures every operation at one size and appends its records.
void run_size(std::uint64_t n, const options& opt, std::vector<record>& records, checksum& sum) {
  using namespace gradcomp;
  const cpu_executor cpu;
  const topk_sparsifier<float> topk(sparsity{.density = target_density});
  const randomk_sparsifier<float> randomk(randomk_params{.amount = sparsity{.density = target_density}, .seed = 1});
  const threshold_sparsifier<float> threshold(threshold_params{.target = sparsity{.density = target_density}});
  const uniform_quantizer<float> uniform8({.bits = 8});
  const uniform_quantizer<float> uniform8_sr({.bits = 8, .round = rounding::stochastic, .seed = 1});
  const uniform_quantizer<float> uniform4({.bits = 4});
  const sign_quantizer<float> sign({.block = 256});
  const qsgd_quantizer<float> qsgd({.levels = 15, .bucket = 256, .seed = 1});
  const shared_scale_quantizer<float> shared_scale({.bits = 8});
  const error_feedback<topk_sparsifier<float>> ef_topk(topk);
  const error_feedback<uniform_quantizer<float>> ef_uniform8(uniform8);
  const loco<uniform_quantizer<float>> loco4(uniform4);
  const dynamic_sparsifier<float> dynamic({.zero_fraction = dynamic_zero_fraction});
  const dynamic_sparsifier<float> dynamic_table(
      {.zero_fraction = dynamic_zero_fraction, .mode = dynamic_threshold_mode::tagc_table});
  const message_key key{.step = 1, .tensor_id = 0};

  const auto size = static_cast<std::size_t>(n);
  const auto k = static_cast<std::size_t>(topk.k(n));
  const mpc_codec<float> mpc;
  const std::size_t message_bytes =
      std::max({topk.max_encoded_bytes(n), randomk.max_encoded_bytes(n), threshold.max_encoded_bytes(n),
                uniform8.max_encoded_bytes(n), sign.max_encoded_bytes(n), qsgd.max_encoded_bytes(n),
                shared_scale.max_encoded_bytes(n), mpc.max_encoded_bytes(n)});
  const std::size_t workspace_bytes = std::max(
      {topk.workspace_bytes(cpu, n), topk_sparsifier<bf16>().workspace_bytes(cpu, n), randomk.workspace_bytes(cpu, n),
       threshold.workspace_bytes(cpu, n), ef_topk.workspace_bytes(cpu, n), ef_uniform8.workspace_bytes(cpu, n),
       loco4.workspace_bytes(cpu, n), dynamic.workspace_bytes(cpu, n), shared_scale.workspace_bytes(cpu, n),
       topk.workspace_bytes(reference_executor{}, n), threshold.workspace_bytes(reference_executor{}, n),
       ef_topk.workspace_bytes(reference_executor{}, n), ef_uniform8.workspace_bytes(reference_executor{}, n),
       loco4.workspace_bytes(reference_executor{}, n), mpc.workspace_bytes(reference_executor{}, n), std::size_t{1}});

  fmt::print(stderr, "gradcomp-bench: n = {}, k = {}: allocating and filling buffers\n", n, k);
  std::fflush(stderr);
  buffer<float> gradient_buffer(size);
  buffer<float> dense_buffer(size);
  buffer<float> magnitude_buffer(size);
  buffer<std::byte> message_buffer(message_bytes);
  buffer<std::byte> workspace_buffer(workspace_bytes);
  fill_gradient(gradient_buffer.span(), gradient_seed, gradient_stddev);

  const std::span<const float> gradient = gradient_buffer.span();
  const std::span<float> dense = dense_buffer.span();
  const std::span<std::byte> out = message_buffer.span();
  const std::span<std::byte> ws = workspace_buffer.span();
  const double dense_bytes = static_cast<double>(n) * sizeof(float);
  const auto message = [&](std::size_t bytes) { return std::span<const std::byte>(out.data(), bytes); };

  const std::size_t first = records.size();
  const auto add = [&](std::string name, timing t, double compression_ratio) -> record& {
    record r;
    r.name = std::move(name);
    r.n = n;
    r.time = t;
    r.compression_ratio = compression_ratio;
    records.push_back(std::move(r));
    return records.back();
  };

  // memcpy of the same gradient buffer: the reference every throughput is compared with.
  fmt::print(stderr, "gradcomp-bench: n = {}: memcpy/copy, nth_element/select\n", n);
  std::fflush(stderr);
  const timing copy = measure(
      opt, [&] { std::memcpy(dense.data(), gradient.data(), size * sizeof(float)); }, [&] { sum.add_sample(dense); });
  add("memcpy/copy", copy, 1.0);

  // Baseline of exact top-k: copy |x| into a preallocated buffer, then std::nth_element (both timed).
  float* const magnitudes = magnitude_buffer.data();
  const timing select = measure(
      opt,
      [&] {
        std::transform(gradient.begin(), gradient.end(), magnitudes, [](float v) { return std::fabs(v); });
        std::nth_element(magnitudes, magnitudes + (k - 1), magnitudes + size, std::greater<float>{});
      },
      [&] { sum.add(magnitudes[k - 1]); });
  const float kth_magnitude = magnitudes[k - 1];
  add("nth_element/select", select, 1.0);

  // Exact top-k.
  fmt::print(stderr, "gradcomp-bench: n = {}: topk\n", n);
  std::fflush(stderr);
  std::size_t topk_bytes = 0;
  const timing topk_encode = measure(
      opt, [&] { topk_bytes = topk.encode(cpu, gradient, out, ws, key); },
      [&] { sum.add_message(message(topk_bytes)); });
  {
    record& r = add("topk/encode", topk_encode, dense_bytes / static_cast<double>(topk_bytes));
    r.baseline = "nth_element/select";
    r.speedup = select.median / topk_encode.median;
  }
  const timing topk_decode = measure(
      opt, [&] { topk.decode(cpu, message(topk_bytes), dense, ws); }, [&] { sum.add_sample(dense); });
  add("topk/decode", topk_decode, dense_bytes / static_cast<double>(topk_bytes));
  {
    float smallest = 0.0f;
    const std::size_t kept = count_nonzero(dense, smallest);
    require_check(kept == k, fmt::format("topk kept {} elements, expected {}", kept, k));
    require_check(smallest == kth_magnitude, fmt::format("topk's smallest kept magnitude {} differs from "
                                                         "nth_element's k-th largest {}",
                                                         smallest, kth_magnitude));
  }

  // Random-k.
  fmt::print(stderr, "gradcomp-bench: n = {}: randomk\n", n);
  std::fflush(stderr);
  std::size_t randomk_bytes = 0;
  const timing randomk_encode = measure(
      opt, [&] { randomk_bytes = randomk.encode(cpu, gradient, out, ws, key); },
      [&] { sum.add_message(message(randomk_bytes)); });
  add("randomk/encode", randomk_encode, dense_bytes / static_cast<double>(randomk_bytes));
  const timing randomk_decode = measure(
      opt, [&] { randomk.decode(cpu, message(randomk_bytes), dense, ws); }, [&] { sum.add_sample(dense); });
  add("randomk/decode", randomk_decode, dense_bytes / static_cast<double>(randomk_bytes));
  {
    float smallest = 0.0f;
    const std::size_t kept = count_nonzero(dense, smallest);
    require_check(kept == static_cast<std::size_t>(randomk.k(n)),
                  fmt::format("randomk decoded {} non-zeros, expected {}", kept, randomk.k(n)));
  }

  // Sampled threshold. The sample is keyed by the fixed message key, so every run keeps the same
  // elements; the achieved density recorded is the last run's.
  fmt::print(stderr, "gradcomp-bench: n = {}: threshold\n", n);
  std::fflush(stderr);
  threshold_report<float> report{};
  const timing threshold_encode = measure(
      opt, [&] { report = threshold.encode_with_report(cpu, gradient, out, ws, key); },
      [&] {
        sum.add_message(message(report.bytes));
        sum.add(report.kept);
      });
  {
    record& r = add("threshold/encode", threshold_encode, dense_bytes / static_cast<double>(report.bytes));
    r.achieved_density = report.density;
  }
  const timing threshold_decode = measure(
      opt, [&] { threshold.decode(cpu, message(report.bytes), dense, ws); }, [&] { sum.add_sample(dense); });
  {
    record& r = add("threshold/decode", threshold_decode, dense_bytes / static_cast<double>(report.bytes));
    r.achieved_density = report.density;
  }
  {
    float smallest = 0.0f;
    const std::size_t kept = count_nonzero(dense, smallest);
    require_check(kept == report.kept,
                  fmt::format("threshold decoded {} non-zeros, report says {}", kept, report.kept));
  }

  // Uniform quantization: 8-bit round-to-nearest and stochastic, 4-bit round-to-nearest.
  fmt::print(stderr, "gradcomp-bench: n = {}: uniform\n", n);
  std::fflush(stderr);
  const auto quantizer_records = [&](const auto& q, const std::string& name, bool with_decode) {
    std::size_t bytes = 0;
    const timing encode = measure(
        opt, [&] { bytes = q.encode(cpu, gradient, out, ws, key); }, [&] { sum.add_message(message(bytes)); });
    add(name + "/encode", encode, dense_bytes / static_cast<double>(bytes));
    if (!with_decode) return;
    const timing decode = measure(
        opt, [&] { q.decode(cpu, message(bytes), dense, ws); }, [&] { sum.add_sample(dense); });
    add(name + "/decode", decode, dense_bytes / static_cast<double>(bytes));
  };
  quantizer_records(uniform8, "uniform8_rtn", true);
  quantizer_records(uniform8_sr, "uniform8_sr", false);
  quantizer_records(uniform4, "uniform4_rtn", true);
  quantizer_records(sign, "sign", true);
  quantizer_records(qsgd, "qsgd", true);
  quantizer_records(shared_scale, "shared_scale8", true);

  // bf16: the gradient rounded to bf16 (outside timing), its own memcpy the baseline (n·2 bytes),
  // 8-bit round to nearest read straight from the 16-bit values.
  fmt::print(stderr, "gradcomp-bench: n = {}: bf16\n", n);
  std::fflush(stderr);
  double copy16_median = 0.0;
  {
    buffer<bf16> gradient16_buffer(size);
    buffer<bf16> dense16_buffer(size);
    for (std::size_t i = 0; i < size; ++i) gradient16_buffer.data()[i] = narrow<bf16>(gradient[i]);
    const std::span<const bf16> gradient16 = gradient16_buffer.span();
    const std::span<bf16> dense16 = dense16_buffer.span();
    const double dense16_bytes = static_cast<double>(n) * sizeof(bf16);
    const auto add16 = [&](std::string name, timing t, double compression_ratio) {
      add(std::move(name), t, compression_ratio).value_bytes = sizeof(bf16);
    };
    const timing copy16 = measure(
        opt, [&] { std::memcpy(dense16.data(), gradient16.data(), size * sizeof(bf16)); },
        [&] { sum.add(std::uint64_t{dense16[size / 2].bits}); });
    copy16_median = copy16.median;
    add16("memcpy_bf16/copy", copy16, 1.0);
    const uniform_quantizer<bf16> uniform8_bf16({.bits = 8});
    std::size_t bytes = 0;
    const timing encode = measure(
        opt, [&] { bytes = uniform8_bf16.encode(cpu, gradient16, out, ws, key); },
        [&] { sum.add_message(message(bytes)); });
    add16("uniform8_rtn_bf16/encode", encode, dense16_bytes / static_cast<double>(bytes));
    {
      // The payload equals the float32 quantizer's of the widened values (docs/half-precision.md §2).
      for (std::size_t i = 0; i < size; ++i) dense[i] = widen(gradient16[i]);
      const std::span<std::byte> other(reinterpret_cast<std::byte*>(magnitude_buffer.data()), size * sizeof(float));
      const std::size_t float_bytes = uniform8.encode(cpu, std::span<const float>(dense), other, ws, key);
      const auto payload = [&](std::span<std::byte> m) { return m.subspan(envelope::size, bytes - envelope::size); };
      require_check(float_bytes == bytes && std::ranges::equal(payload(out), payload(other)),
                    "uniform8_rtn_bf16: the payload differs from uniform8_rtn's of the widened gradient");
    }
    const timing decode = measure(
        opt, [&] { uniform8_bf16.decode(cpu, message(bytes), dense16, ws); },
        [&] { sum.add(std::uint64_t{dense16[size / 3].bits}); });
    add16("uniform8_rtn_bf16/decode", decode, dense16_bytes / static_cast<double>(bytes));
    const timing decode_f32 = measure(
        opt, [&] { uniform8_bf16.decode(cpu, message(bytes), dense, ws); }, [&] { sum.add_sample(dense); });
    add16("uniform8_rtn_bf16/decode_f32", decode_f32, dense16_bytes / static_cast<double>(bytes));

    // Top-k 1% of the bf16 gradient, against std::nth_element over its widened magnitudes.
    const timing select16 = measure(
        opt,
        [&] {
          std::transform(gradient16.begin(), gradient16.end(), magnitudes, [](bf16 v) { return std::fabs(widen(v)); });
          std::nth_element(magnitudes, magnitudes + (k - 1), magnitudes + size, std::greater<float>{});
        },
        [&] { sum.add(magnitudes[k - 1]); });
    const float kth16 = magnitudes[k - 1];
    add16("nth_element_bf16/select", select16, 1.0);
    const topk_sparsifier<bf16> topk16(sparsity{.density = target_density});
    std::size_t topk16_bytes = 0;
    const timing topk16_encode = measure(
        opt, [&] { topk16_bytes = topk16.encode(cpu, gradient16, out, ws, key); },
        [&] { sum.add_message(message(topk16_bytes)); });
    add16("topk_bf16/encode", topk16_encode, dense16_bytes / static_cast<double>(topk16_bytes));
    records.back().baseline = "nth_element_bf16/select";
    records.back().speedup = select16.median / topk16_encode.median;
    topk16.decode(cpu, message(topk16_bytes), dense, ws);
    float smallest = 0.0f;
    const std::size_t kept = count_nonzero(dense, smallest);
    require_check(kept == k && smallest == kth16,
                  fmt::format("topk_bf16 kept {} values, smallest {}; expected {} and nth_element's {}", kept, smallest,
                              k, kth16));
  }

  // The reference tier: each operation above run on reference_executor, the plain scalar backends
  // that specify the bytes, recorded next to the CPU backend's record (baseline: the CPU record;
  // speedup: CPU median / reference median, below 1, informational). Each reference message must
  // equal the CPU backend's. The reference is slow, so it runs at most 1 warmup and 3 timed reps.
  fmt::print(stderr, "gradcomp-bench: n = {}: reference backends\n", n);
  std::fflush(stderr);
  const reference_executor ref;
  options reference_opt = opt;
  reference_opt.warmup = std::min(opt.warmup, 1);
  reference_opt.reps = std::min(opt.reps, 3);
  // The reference's record of `name` (the CPU backend's record of the same name must exist): its
  // baseline is that record, its speedup the CPU median over the reference's.
  const auto add_reference = [&](const std::string& name, const timing& t, double ratio) {
    const double cpu_median = find_record(records, name, n)->time.median;
    record& r = add(name, t, ratio);
    r.backend = reference_executor::name;
    r.baseline = name;
    r.speedup = cpu_median / t.median;
  };
  const auto reference_records = [&](const auto& codec, const std::string& name, bool with_decode) {
    const std::size_t cpu_bytes = codec.encode(cpu, gradient, out, ws, key);
    const std::vector<std::byte> expected(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(cpu_bytes));
    std::size_t bytes = 0;
    const timing encode = measure(
        reference_opt, [&] { bytes = codec.encode(ref, gradient, out, ws, key); },
        [&] { sum.add_message(message(bytes)); });
    require_check(bytes == cpu_bytes && std::equal(expected.begin(), expected.end(), out.begin()),
                  fmt::format("{}: the reference's message differs from the CPU backend's", name));
    add_reference(name + "/encode", encode, dense_bytes / static_cast<double>(bytes));
    if (!with_decode) return;
    const timing decode = measure(
        reference_opt, [&] { codec.decode(ref, message(bytes), dense, ws); }, [&] { sum.add_sample(dense); });
    add_reference(name + "/decode", decode, dense_bytes / static_cast<double>(bytes));
  };
  reference_records(topk, "topk", true);
  reference_records(randomk, "randomk", true);
  reference_records(threshold, "threshold", true);
  reference_records(uniform8, "uniform8_rtn", true);
  reference_records(uniform8_sr, "uniform8_sr", false);
  reference_records(uniform4, "uniform4_rtn", true);
  reference_records(sign, "sign", true);
  reference_records(qsgd, "qsgd", true);
  reference_records(shared_scale, "shared_scale8", true);

  // Error feedback around top-k (the generic wrapper: add residual, encode, decode, subtract).
  fmt::print(stderr, "gradcomp-bench: n = {}: ef_topk\n", n);
  std::fflush(stderr);
  auto ef_state = ef_topk.make_state(cpu, n);
  std::size_t ef_bytes = 0;
  const timing ef_encode = measure(
      opt, [&] { ef_bytes = ef_topk.encode(cpu, gradient, ef_state, out, ws, key); },
      [&] { sum.add_message(message(ef_bytes)); });
  add("ef_topk/encode", ef_encode, dense_bytes / static_cast<double>(ef_bytes));

  // Error feedback around 8-bit uniform quantization.
  fmt::print(stderr, "gradcomp-bench: n = {}: ef_uniform8\n", n);
  std::fflush(stderr);
  auto ef8_state = ef_uniform8.make_state(cpu, n);
  std::size_t ef8_bytes = 0;
  const timing ef8_encode = measure(
      opt, [&] { ef8_bytes = ef_uniform8.encode(cpu, gradient, ef8_state, out, ws, key); },
      [&] { sum.add_message(message(ef8_bytes)); });
  add("ef_uniform8/encode", ef8_encode, dense_bytes / static_cast<double>(ef8_bytes));

  // LoCo around 4-bit uniform quantization (8-bit compensation state, about 1 byte per element).
  fmt::print(stderr, "gradcomp-bench: n = {}: loco_uniform4 (state {:.4f} bytes per element)\n", n,
             loco4.state_bytes_per_element(n));
  std::fflush(stderr);
  require_check(loco4.state_bytes_per_element(n) <= loco_state_bytes_target,
                fmt::format("LoCo state takes {:.4f} bytes per element, above {}", loco4.state_bytes_per_element(n),
                            loco_state_bytes_target));
  auto loco_state = loco4.make_state(cpu, n);
  std::size_t loco_bytes = 0;
  const timing loco_encode = measure(
      opt, [&] { loco_bytes = loco4.encode(cpu, gradient, loco_state, out, ws, key); },
      [&] { sum.add_message(message(loco_bytes)); });
  add("loco_uniform4/encode", loco_encode, dense_bytes / static_cast<double>(loco_bytes));

  // The wrappers on the reference: a first step from a fresh state must send the CPU's first
  // message (the CPU's fused paths against the plain steps); later steps are timed.
  fmt::print(stderr, "gradcomp-bench: n = {}: reference backends of the feedback wrappers\n", n);
  std::fflush(stderr);
  const auto reference_step_records = [&](const auto& wrapper, const std::string& name) {
    auto cpu_state = wrapper.make_state(cpu, n);
    const std::size_t cpu_bytes = wrapper.encode(cpu, gradient, cpu_state, out, ws, key);
    const std::vector<std::byte> expected(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(cpu_bytes));
    auto state = wrapper.make_state(ref, n);
    std::size_t bytes = wrapper.encode(ref, gradient, state, out, ws, key);
    require_check(bytes == cpu_bytes && std::equal(expected.begin(), expected.end(), out.begin()),
                  fmt::format("{}: the reference's first message differs from the CPU backend's", name));
    const timing encode = measure(
        reference_opt, [&] { bytes = wrapper.encode(ref, gradient, state, out, ws, key); },
        [&] { sum.add_message(message(bytes)); });
    add_reference(name + "/encode", encode, dense_bytes / static_cast<double>(bytes));
  };
  reference_step_records(ef_topk, "ef_topk");
  reference_step_records(ef_uniform8, "ef_uniform8");
  reference_step_records(loco4, "loco_uniform4");

  // Dynamic sparsification (TAGC), f* = 0.8. The thresholds are checked outside timing: exactly
  // ⌊f*·n⌋ magnitudes lie below the exact one, ties aside. Densities recorded are kept / n.
  fmt::print(stderr, "gradcomp-bench: n = {}: dynamic\n", n);
  std::fflush(stderr);
  const auto density_at = [&](float tau) {
    std::uint64_t kept = 0;
    for (const float v : gradient) kept += std::fabs(v) >= tau ? 1u : 0u;
    return static_cast<double>(kept) / static_cast<double>(n);
  };
  float tau = 0.0f;
  const timing dynamic_threshold = measure(
      opt, [&] { tau = dynamic.threshold(cpu, gradient, ws); }, [&] { sum.add(tau); });
  {
    std::uint64_t below = 0, at_most = 0;
    for (const float v : gradient) {
      below += std::fabs(v) < tau ? 1u : 0u;
      at_most += std::fabs(v) <= tau ? 1u : 0u;
    }
    const std::uint64_t z = dynamic.zeroed_count(n);
    require_check(below <= z && at_most > z,
                  fmt::format("dynamic threshold {} has {} magnitudes below and {} at most, z = {}", tau, below,
                              at_most, z));
    record& r = add("dynamic/threshold", dynamic_threshold, 1.0);
    r.achieved_density = density_at(tau);
  }
  const timing dynamic_table_threshold = measure(
      opt, [&] { tau = dynamic_table.threshold(cpu, gradient, ws); }, [&] { sum.add(tau); });
  {
    record& r = add("dynamic_table/threshold", dynamic_table_threshold, 1.0);
    r.achieved_density = density_at(tau);
  }
  dynamic_state<float> dynamic_residuals = dynamic.make_state(cpu);
  dynamic_result<float> dynamic_step{};
  const timing dynamic_sparsify = measure(
      opt, [&] { dynamic_step = dynamic.sparsify(cpu, dynamic_residuals, 0, gradient, dense, ws); },
      [&] {
        sum.add_sample(dense);
        sum.add(dynamic_step.kept);
      });
  {
    record& r = add("dynamic/sparsify", dynamic_sparsify, 1.0);
    r.achieved_density = static_cast<double>(dynamic_step.kept) / static_cast<double>(n);
  }

  // Lossless homomorphic compression of the gradient sparsified to 5%, as one rank (P = 1): the
  // decode must recover every non-zero.
  fmt::print(stderr, "gradcomp-bench: n = {}: lhc\n", n);
  std::fflush(stderr);
  {
    const lossless_homomorphic<float> lhc;
    buffer<float> sparse_buffer(size);
    const float cut = static_cast<float>(lhc_cut_sigmas * gradient_stddev);
    std::transform(gradient.begin(), gradient.end(), sparse_buffer.data(),
                   [cut](float v) { return std::fabs(v) > cut ? v : 0.0f; });
    const std::span<const float> sparse = sparse_buffer.span();
    buffer<std::byte> index_buffer(static_cast<std::size_t>(lhc.index_bytes(n)));
    const std::span<std::byte> index = index_buffer.span();
    lhc.encode_index(cpu, sparse, index);
    lhc_plan plan = lhc.plan(cpu, index, n, 1);
    buffer<float> sketch_buffer(static_cast<std::size_t>(plan.sketch_values()));
    buffer<std::byte> lhc_workspace(std::max<std::size_t>(lhc.workspace_bytes(cpu, plan), 1));
    const double lhc_bytes = static_cast<double>(index.size() + sketch_buffer.size() * sizeof(float));
    const timing lhc_encode = measure(
        opt,
        [&] {
          lhc.encode_index(cpu, sparse, index);
          plan = lhc.plan(cpu, index, n, 1);
          lhc.encode_sketch(cpu, sparse, index, plan, sketch_buffer.span());
        },
        [&] { sum.add_sample(sketch_buffer.span()); });
    add("lhc/encode", lhc_encode, dense_bytes / lhc_bytes).achieved_density =
        static_cast<double>(plan.union_nonzeros) / static_cast<double>(n);
    lhc_decode_result decoded{};
    const timing lhc_decode = measure(
        opt, [&] { decoded = lhc.decode(cpu, index, plan, sketch_buffer.span(), dense, lhc_workspace.span()); },
        [&] { sum.add_sample(dense); });
    add("lhc/decode", lhc_decode, dense_bytes / lhc_bytes).achieved_density =
        static_cast<double>(plan.union_nonzeros) / static_cast<double>(n);
    float smallest = 0.0f;
    require_check(decoded.recovered == plan.union_nonzeros && count_nonzero(dense, smallest) == plan.union_nonzeros,
                  fmt::format("lhc recovered {} of {} non-zeros", decoded.recovered, plan.union_nonzeros));

    // The same on the reference: its sketch and its decode must be the CPU backend's.
    const std::vector<float> cpu_sketch(sketch_buffer.data(), sketch_buffer.data() + sketch_buffer.size());
    const std::vector<float> cpu_decoded(dense.begin(), dense.end());
    buffer<std::byte> reference_workspace(std::max<std::size_t>(lhc.workspace_bytes(ref, plan), 1));
    const timing reference_encode = measure(
        reference_opt,
        [&] {
          lhc.encode_index(ref, sparse, index);
          plan = lhc.plan(ref, index, n, 1);
          lhc.encode_sketch(ref, sparse, index, plan, sketch_buffer.span());
        },
        [&] { sum.add_sample(sketch_buffer.span()); });
    require_check(std::memcmp(cpu_sketch.data(), sketch_buffer.data(), cpu_sketch.size() * sizeof(float)) == 0,
                  "lhc: the reference's sketch differs from the CPU backend's");
    const timing reference_decode = measure(
        reference_opt,
        [&] { decoded = lhc.decode(ref, index, plan, sketch_buffer.span(), dense, reference_workspace.span()); },
        [&] { sum.add_sample(dense); });
    require_check(std::memcmp(cpu_decoded.data(), dense.data(), cpu_decoded.size() * sizeof(float)) == 0,
                  "lhc: the reference's decode differs from the CPU backend's");
    add_reference("lhc/encode", reference_encode, dense_bytes / lhc_bytes);
    add_reference("lhc/decode", reference_decode, dense_bytes / lhc_bytes);
  }

  // Count sketch: encode, then the heavy-hitter decode (every estimate, radix-selected top 1%).
  fmt::print(stderr, "gradcomp-bench: n = {}: count_sketch\n", n);
  std::fflush(stderr);
  {
    const count_sketch<float> sketch(
        {.rows = sketch_rows, .columns = sketch_columns, .seed = 1, .heavy_hitters = {.density = target_density}});
    buffer<std::byte> sketch_buffer(sketch.max_encoded_bytes(n));
    buffer<std::byte> sketch_workspace(std::max<std::size_t>(sketch.workspace_bytes(cpu, n), 1));
    const std::span<const std::byte> sketch_message = sketch_buffer.span();
    const timing sketch_encode = measure(
        opt, [&] { (void)sketch.encode(cpu, gradient, sketch_buffer.span(), sketch_workspace.span(), key); },
        [&] { sum.add_message(sketch_message); });
    add("count_sketch/encode", sketch_encode, dense_bytes / static_cast<double>(sketch_message.size()));
    const timing sketch_decode = measure(
        opt, [&] { sketch.decode(cpu, sketch_message, dense, sketch_workspace.span()); },
        [&] { sum.add_sample(dense); });
    add("count_sketch/decode", sketch_decode, dense_bytes / static_cast<double>(sketch_message.size()));
    float smallest = 0.0f;
    const std::size_t kept = count_nonzero(dense, smallest);
    require_check(kept <= sketch.heavy_hitter_count(n) && kept + 16 >= sketch.heavy_hitter_count(n),
                  fmt::format("count sketch decoded {} non-zeros, expected {}", kept, sketch.heavy_hitter_count(n)));

    // The same on the reference: its message and its decode must be the CPU backend's.
    const std::vector<std::byte> cpu_message(sketch_message.begin(), sketch_message.end());
    const std::vector<float> cpu_decoded(dense.begin(), dense.end());
    buffer<std::byte> reference_workspace(std::max<std::size_t>(sketch.workspace_bytes(ref, n), 1));
    const timing reference_encode = measure(
        reference_opt,
        [&] { (void)sketch.encode(ref, gradient, sketch_buffer.span(), reference_workspace.span(), key); },
        [&] { sum.add_message(sketch_message); });
    require_check(std::equal(cpu_message.begin(), cpu_message.end(), sketch_message.begin()),
                  "count_sketch: the reference's message differs from the CPU backend's");
    const timing reference_decode = measure(
        reference_opt, [&] { sketch.decode(ref, sketch_message, dense, reference_workspace.span()); },
        [&] { sum.add_sample(dense); });
    require_check(std::memcmp(cpu_decoded.data(), dense.data(), cpu_decoded.size() * sizeof(float)) == 0,
                  "count_sketch: the reference's decode differs from the CPU backend's");
    add_reference("count_sketch/encode", reference_encode, dense_bytes / static_cast<double>(sketch_message.size()));
    add_reference("count_sketch/decode", reference_decode, dense_bytes / static_cast<double>(sketch_message.size()));
  }

  // Encode of `input` into a buffer of the codec's size, then decode into `dense`: the records
  // `<name>/encode` and `<name>/decode`, the latter returned.
  const auto round_trip_records = [&](const auto& codec, std::span<const float> input,
                                      const std::string& name) -> record& {
    buffer<std::byte> encoded_buffer(codec.max_encoded_bytes(n));
    std::size_t bytes = 0;
    const timing encode = measure(
        opt, [&] { bytes = codec.encode(cpu, input, encoded_buffer.span(), ws, key); },
        [&] { sum.add_message(std::span<const std::byte>(encoded_buffer.data(), bytes)); });
    add(name + "/encode", encode, dense_bytes / static_cast<double>(bytes));
    const std::span<const std::byte> encoded(encoded_buffer.data(), bytes);
    const timing decode = measure(
        opt, [&] { codec.decode(cpu, encoded, dense, ws); }, [&] { sum.add_sample(dense); });
    return add(name + "/decode", decode, dense_bytes / static_cast<double>(bytes));
  };

  // MPC lossless on the gradient and on a smooth signal; the decode must give back every bit.
  fmt::print(stderr, "gradcomp-bench: n = {}: mpc\n", n);
  std::fflush(stderr);
  {
    buffer<float> smooth_buffer(size);
    for (std::size_t i = 0; i < size; ++i)
      smooth_buffer.data()[i] = static_cast<float>(std::sin(1e-4 * static_cast<double>(i)));
    const std::pair<std::span<const float>, std::string> inputs[] = {{gradient, "mpc"},
                                                                     {smooth_buffer.span(), "mpc_smooth"}};
    for (const auto& [input, name] : inputs) {
      round_trip_records(mpc, input, name);
      require_check(std::memcmp(dense.data(), input.data(), size * sizeof(float)) == 0,
                    name + " did not decode to the encoded bits");
    }
  }
  reference_records(mpc, "mpc", true);

  // ZFP fixed rate at 8 and 16 bits per value. The decode is checked against the documented error
  // bound, |x − g| ≤ (2^(8 − R) + 2^−23)·2^emax per block of 4 (lossless.md §2); the largest error
  // and its ratio to the bound are recorded.
  fmt::print(stderr, "gradcomp-bench: n = {}: zfp\n", n);
  std::fflush(stderr);
  for (const std::uint32_t rate : {8u, 16u}) {
    const std::string name = fmt::format("zfp{}", rate);
    record& r = round_trip_records(zfp_fixed_rate_codec<float>({.rate_bits = rate}), gradient, name);
    double worst = 0.0, largest_error = 0.0;
    for (std::size_t b = 0; b < size; b += 4) {
      float largest = 0.0f;
      for (std::size_t i = b; i < std::min(size, b + 4); ++i) largest = std::max(largest, std::fabs(gradient[i]));
      if (largest == 0.0f) continue;
      int emax = 0;
      std::frexp(largest, &emax);
      const double bound = (std::ldexp(1.0, 8 - static_cast<int>(rate)) + std::ldexp(1.0, -23)) * std::ldexp(1.0, emax);
      for (std::size_t i = b; i < std::min(size, b + 4); ++i) {
        const double error = std::fabs(static_cast<double>(gradient[i]) - static_cast<double>(dense[i]));
        largest_error = std::max(largest_error, error);
        worst = std::max(worst, error / bound);
      }
    }
    r.max_error = largest_error;
    r.error_to_bound = worst;
    require_check(worst <= 1.0, fmt::format("{} decoded outside its error bound (ratio {})", name, worst));
    reference_records(zfp_fixed_rate_codec<float>({.rate_bits = rate}), name, true);
  }

  // PowerSGD at rank 4 on the gradient viewed as a matrix (4096 × 4096 at n = 2^24): one step of its
  // all-reduce on one in-process rank, in place (compensate, P = M·Q, orthonormalise, Q = Mᵀ·P̂,
  // the error and the result; with one rank the all-reduces copy nothing). In place, the matrix a
  // step starts from stays G + E0 step after step (the result plus the new error), so every timed
  // step does the same work. The first step's result must equal the reference backend's.
  fmt::print(stderr, "gradcomp-bench: n = {}: powersgd_r4\n", n);
  std::fflush(stderr);
  {
    const matrix_shape shape = powersgd_bench_shape(n);
    const powersgd<float> scheme({.rank = powersgd_bench_rank});
    const std::size_t factor_bytes = (shape.rows + shape.cols) * powersgd_bench_rank * sizeof(float);
    in_process_group(1).run([&](in_process_transport& t) {
      std::vector<float> reference_result(gradient.begin(), gradient.end());
      powersgd_state<float> reference_state;
      compressed_all_reduce(reference_executor{}, t, scheme, reference_state, std::span<float>(reference_result),
                            shape);
      std::copy(gradient.begin(), gradient.end(), dense.begin());
      powersgd_state<float> state;
      compressed_all_reduce(cpu, t, scheme, state, dense, shape);
      require_check(std::equal(dense.begin(), dense.end(), reference_result.begin(),
                               [](float x, float y) { return to_bits(x) == to_bits(y); }),
                    "powersgd_r4: the CPU step differs from the reference backend's");
      std::copy(gradient.begin(), gradient.end(), dense.begin());
      const timing step = measure(
          opt, [&] { compressed_all_reduce(cpu, t, scheme, state, dense, shape); }, [&] { sum.add_sample(dense); });
      add("powersgd_r4/step", step, dense_bytes / static_cast<double>(factor_bytes));
    });
    // The compression alone, the issue's "two passes over M plus the small products": P = G·Q, P̂,
    // Q = Gᵀ·P̂ by the CPU backend, from the first step's Q.
    using steps = backend<powersgd<float>, cpu_executor>;
    const std::uint64_t r = powersgd_bench_rank;
    std::vector<float> q(shape.cols * r), p(shape.rows * r);
    const timing compress = measure(
        opt,
        [&] {
          powersgd_draw_q(std::span<float>(q), shape.cols, r, 0, 0, 0, false);
          steps::project(cpu, shape, r, gradient, {}, std::span<const float>(q), {}, std::span<float>(p));
          powersgd_orthonormalise(std::span<float>(p), shape.rows, r, false);
          steps::back_project(cpu, shape, r, gradient, std::span<const float>(p), std::span<float>(q));
        },
        [&] { sum.add_sample(std::span<const float>(q)); });
    add("powersgd_r4/compress", compress, dense_bytes / static_cast<double>(factor_bytes));
  }

  // CRC-32C of the gradient's bytes: crc32c() as the envelope calls it, and the table it replaces
  // where the CPU has SSE4.2. Both must give the same value.
  fmt::print(stderr, "gradcomp-bench: n = {}: crc32c\n", n);
  std::fflush(stderr);
  {
    const std::byte* const bytes = reinterpret_cast<const std::byte*>(gradient.data());
    const std::size_t byte_count = size * sizeof(float);
    std::uint32_t crc = 0, table_crc = 0;
    const timing table = measure(
        opt, [&] { table_crc = detail::crc32c_update_portable(0xFFFFFFFFu, bytes, byte_count) ^ 0xFFFFFFFFu; },
        [&] { sum.add(std::uint64_t{table_crc}); });
    add("crc32c_table/checksum", table, 1.0);
    const timing dispatched = measure(
        opt, [&] { crc = crc32c(bytes, byte_count); }, [&] { sum.add(std::uint64_t{crc}); });
    record& r = add("crc32c/checksum", dispatched, 1.0);
    r.baseline = "crc32c_table/checksum";
    r.speedup = table.median / dispatched.median;
    require_check(crc == table_crc, fmt::format("crc32c {:#010x} differs from the table's {:#010x}", crc, table_crc));
  }

  for (std::size_t i = first; i < records.size(); ++i)
    records[i].copy_median = records[i].value_bytes == sizeof(bf16) ? copy16_median : copy.median;
}

// ---- output -----------------------------------------------------------------------------------

void print_targets(const std::vector<record>& records, const std::vector<std::uint64_t>& sizes) {
  const auto line = target_line;
  fmt::print("\ntargets (informational; the exit status does not depend on them):\n");
  for (const std::uint64_t n : sizes) {
    if (const record* r = find_record(records, "topk/encode", n); r != nullptr && r->speedup) {
      line(*r->speedup >= topk_speedup_target,
           fmt::format("topk/encode n={}{}: speedup_vs_baseline {:.2f} >= {} (exact top-k, k = 1%, vs nth_element)", n,
                       n == topk_target_n ? "" : " (target set for n=2^24)", *r->speedup, topk_speedup_target));
    }
    if (const record* r = find_record(records, "topk_bf16/encode", n); r != nullptr && r->speedup) {
      line(*r->speedup >= topk_speedup_target,
           fmt::format("topk_bf16/encode n={}{}: speedup_vs_baseline {:.2f} >= {} (k = 1%, vs nth_element over the "
                       "widened values)",
                       n, n == topk_target_n ? "" : " (target set for n=2^24)", *r->speedup, topk_speedup_target));
    }
    if (const record* r = find_record(records, "threshold/encode", n); r != nullptr) {
      line(r->ratio_to_copy() >= ratio_to_copy_target, fmt::format("threshold/encode n={}: ratio_to_copy {:.3f} >= {}",
                                                                   n, r->ratio_to_copy(), ratio_to_copy_target));
      const double density = r->achieved_density.value_or(0.0);
      line(density >= density_low * target_density && density <= density_high * target_density,
           fmt::format("threshold/encode n={}: achieved_density {:.5f} within [{:.4f}, {:.4f}] (target {})", n, density,
                       density_low * target_density, density_high * target_density, target_density));
    }
    if (const record* r = find_record(records, "dynamic/threshold", n); r != nullptr)
      line(r->ratio_to_copy() >= ratio_to_copy_target,
           fmt::format("dynamic/threshold n={}: ratio_to_copy {:.3f} >= {} (exact threshold, f* = {})", n,
                       r->ratio_to_copy(), ratio_to_copy_target, dynamic_zero_fraction));
    if (const record* r = find_record(records, "count_sketch/encode", n); r != nullptr) {
      const double ns = r->time.median * 1e9 / (static_cast<double>(sketch_rows) * static_cast<double>(n));
      line(ns <= sketch_update_ns_target,
           fmt::format("count_sketch/encode n={}: {:.2f} ns per element-row update <= {} ({} rows, {} columns)", n, ns,
                       sketch_update_ns_target, sketch_rows, sketch_columns));
    }
    if (const record* r = find_record(records, "crc32c/checksum", n); r != nullptr)
      line(r->gradient_gbps() >= crc32c_gbps_target,
           fmt::format("crc32c/checksum n={}: {:.2f} GB/s >= {} ({}; {:.3f} of memcpy, {:.1f}x the table)", n,
                       r->gradient_gbps(), crc32c_gbps_target,
                       gradcomp::cpu_has_sse42() ? "SSE4.2 crc32" : "table: no SSE4.2", r->ratio_to_copy(),
                       r->speedup.value_or(0.0)));
    for (const ratio_target& t : quantizer_targets) {
      if (const record* r = find_record(records, t.name, n); r != nullptr)
        line(r->ratio_to_copy() >= t.ratio,
             fmt::format("{} n={}: ratio_to_copy {:.3f} >= {}", t.name, n, r->ratio_to_copy(), t.ratio));
    }
    for (const record& r : records)
      if (r.n == n && r.max_error)
        line(r.error_to_bound.value_or(2.0) <= 1.0,
             fmt::format("{} n={}: max error {:.3g} (N(0, {}) gradient), {:.3f} of the documented bound", r.name, n,
                         *r.max_error, gradient_stddev, r.error_to_bound.value_or(0.0)));
    for (const record& r : records) {
      // The reference tier has no speed target; sign, QSGD and shared-scale have none yet.
      if (r.n != n || !r.name.ends_with("/decode") || r.name.starts_with("uniform8_rtn") ||
          r.name.starts_with("lhc/") || r.name.starts_with("count_sketch/") || r.name.starts_with("mpc") ||
          r.name.starts_with("zfp") || r.name.starts_with("sign/") || r.name.starts_with("qsgd/") ||
          r.name.starts_with("shared_scale8/") || !r.backend.empty())
        continue;
      line(r.ratio_to_copy() >= ratio_to_copy_target,
           fmt::format("{} n={}: ratio_to_copy {:.3f} >= {}", r.name, n, r.ratio_to_copy(), ratio_to_copy_target));
    }
  }
}

/// Bytes one rank contributes per step for a GPT-2-small-shaped model (124M parameters, Hugging
/// Face's Conv1D layouts): dense float32, PowerSGD at r = 1, 2, 4 (matrices its rule compresses, the
/// rest dense), top-k 1% and 4-bit LoCo (their messages, one per tensor). These are payloads: what
/// each plan then moves per rank is collective/all_reduce_cost.hpp's business.
void print_gpt2_small_bytes() {
  using gradcomp::matrix_shape;
  std::vector<matrix_shape> tensors{{50257, 768}, {1024, 768}, {1, 768}, {1, 768}};  // wte, wpe, ln_f
  for (int layer = 0; layer < 12; ++layer)
    for (const matrix_shape t :
         {matrix_shape{1, 768}, matrix_shape{1, 768}, matrix_shape{768, 2304}, matrix_shape{1, 2304},
          matrix_shape{768, 768}, matrix_shape{1, 768}, matrix_shape{1, 768}, matrix_shape{1, 768},
          matrix_shape{768, 3072}, matrix_shape{1, 3072}, matrix_shape{3072, 768}, matrix_shape{1, 768}})
      tensors.push_back(t);
  double dense = 0.0, topk = 0.0, loco4 = 0.0, values = 0.0;
  const gradcomp::topk_sparsifier<float> top1({.density = 0.01});
  const gradcomp::uniform_quantizer<float> q4({.bits = 4});
  for (const matrix_shape t : tensors) {
    values += static_cast<double>(t.count());
    dense += static_cast<double>(t.count() * sizeof(float));
    topk += static_cast<double>(top1.expected_encoded_bytes(t.count()));
    loco4 += static_cast<double>(q4.max_encoded_bytes(t.count()));
  }
  fmt::print("\nGPT-2 small ({:.1f}M parameters in {} tensors), bytes per rank per step:\n", values / 1e6,
             tensors.size());
  fmt::print("  {:<24} {:>14.0f}  {:>7.1f}x\n", "dense float32", dense, 1.0);
  for (const std::uint32_t r : {1u, 2u, 4u}) {
    const gradcomp::powersgd<float> scheme({.rank = r});
    double bytes = 0.0;
    for (const matrix_shape t : tensors)
      bytes += scheme.compresses(t) ? static_cast<double>((t.rows + t.cols) * scheme.rank_for(t) * sizeof(float))
                                    : static_cast<double>(t.count() * sizeof(float));
    fmt::print("  {:<24} {:>14.0f}  {:>7.1f}x\n", fmt::format("PowerSGD r = {}", r), bytes, dense / bytes);
  }
  fmt::print("  {:<24} {:>14.0f}  {:>7.1f}x\n", "top-k 1%", topk, dense / topk);
  fmt::print("  {:<24} {:>14.0f}  {:>7.1f}x\n", "4-bit LoCo", loco4, dense / loco4);
}

}  // namespace

int main(int argc, char** argv) {
  return bench_main("gradcomp-bench", usage_text, argc, argv, parse_options, [](const options& opt) {
    if (!opt.compare.empty()) {
      compare_files(opt.compare[0], opt.compare[1]);
      return 0;
    }
    std::vector<record> records;
    checksum sum;
    for (const std::uint64_t n : opt.sizes) run_size(n, opt, records, sum);

    fmt::print(
        "gradcomp-bench: single thread, float32 ~ N(0, sigma={}), seed {:#x}, density {}, {} warm-up + {} timed "
        "runs; GB/s = 1e9 bytes of gradient (n*4) per second at the median time\n",
        gradient_stddev, gradient_seed, target_density, opt.warmup, opt.reps);
    const run_context run = describe_run();
    fmt::print("machine: {}, {} logical CPUs; built by {} with \"{}\"; gradcomp {} at {}\n\n", run.cpu,
               run.logical_cpus, run.compiler, run.flags, run.version, run.commit);
    print_table(records, gradcomp::cpu_executor::name);
    print_targets(records, opt.sizes);
    print_gpt2_small_bytes();
    fmt::print("\nchecksum {:016x}\n", sum.value());

    if (!opt.json.empty()) {
      write_file(opt.json, to_json(records, gradcomp::cpu_executor::name, {}, run));
      fmt::print("wrote {} records to {}\n", records.size(), opt.json);
    }
    return 0;
  });
}
