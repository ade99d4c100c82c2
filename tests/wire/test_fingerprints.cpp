// Fingerprints of every result the documentation promises bit for bit, on inputs large enough for
// the vectorised kernels and their tails: encodings, decodes and accumulations of every codec,
// error-feedback, LoCo and dynamic-sparsifier messages and saved states over several steps,
// PowerSGD's results and saved states over several steps on three ranks, and aggregates (shared-scale and count-sketch sums, lossless homomorphic sketches). Each output's
// size and FNV-1a hash must equal tests/golden/fingerprints.txt, written by a build without FMA
// contraction (the documented definition: every operation rounded as written). The CPU tests run
// again from builds with other compilers and flags (the fma-* presets, tests/fp_matrix.sh), which
// must give the same fingerprints. Each output is computed twice, with the widest kernels the CPU
// has and with the baseline ones (`cpu_executor::max_simd`), under the same name.
//
// GRADCOMP_UPDATE_GOLDEN=1 rewrites the file's entries (after a deliberate format change, said so
// in the commit); GRADCOMP_FINGERPRINT_DUMP=<dir> also writes each output's bytes to <dir>, so
// that two builds can be compared byte by byte.
//
// The inputs are built from integers and powers of two only (no floating-point arithmetic), so
// that they are the same bits under every flag.
#include <gradcomp/gradcomp.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <span>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "support/codec_io.hpp"
#include "support/golden_io.hpp"

using namespace gradcomp;
using namespace gradcomp::test;

namespace {

using bytes = std::vector<std::byte>;

// ---- the fingerprint file ------------------------------------------------------------------------

/// Size and FNV-1a (64-bit) hash of an output.
struct fingerprint {
  std::uint64_t size = 0;
  std::uint64_t hash = 0;
};

fingerprint fingerprint_of(std::span<const std::byte> data) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (const std::byte b : data) h = (h ^ std::to_integer<std::uint64_t>(b)) * 0x100000001b3ull;
  return {data.size(), h};
}

const char* const fingerprint_file = "fingerprints.txt";

std::map<std::string, fingerprint> read_fingerprints() {
  std::map<std::string, fingerprint> book;
  std::ifstream in(golden_path(fingerprint_file));
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream fields(line);
    std::string name;
    fingerprint f;
    fields >> name >> f.size >> std::hex >> f.hash;
    book[name] = f;
  }
  return book;
}

void write_fingerprints(const std::map<std::string, fingerprint>& book) {
  std::ofstream out(golden_path(fingerprint_file));
  out << "# name, size in bytes, FNV-1a 64 of the bytes: written by tests/wire/test_fingerprints.cpp\n"
         "# (GRADCOMP_UPDATE_GOLDEN=1) from a build without FMA contraction; every build must match.\n";
  for (const auto& [name, f] : book) {
    char hash[17];
    std::snprintf(hash, sizeof hash, "%016llx", static_cast<unsigned long long>(f.hash));
    out << name << ' ' << f.size << ' ' << hash << '\n';
  }
}

/// Checks (or records, under GRADCOMP_UPDATE_GOLDEN) the fingerprint of one output, and dumps its
/// bytes under GRADCOMP_FINGERPRINT_DUMP.
void check_fingerprint(const std::string& name, std::span<const std::byte> data) {
  const fingerprint actual = fingerprint_of(data);
  if (const char* dir = std::getenv("GRADCOMP_FINGERPRINT_DUMP"); dir != nullptr) {
    std::string file = name;
    std::replace(file.begin(), file.end(), '/', '.');
    std::filesystem::create_directories(dir);
    std::ofstream out(std::filesystem::path(dir) / (file + ".bin"), std::ios::binary);
    out.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
  }
  std::map<std::string, fingerprint> book = read_fingerprints();
  if (std::getenv("GRADCOMP_UPDATE_GOLDEN") != nullptr) {
    book[name] = actual;
    write_fingerprints(book);
  }
  CAPTURE(name);
  REQUIRE_MESSAGE(book.count(name) == 1, "no fingerprint recorded (run once with GRADCOMP_UPDATE_GOLDEN=1)");
  CHECK(book.at(name).size == actual.size);
  CHECK(book.at(name).hash == actual.hash);
}

template <class T>
void check_fingerprint(const std::string& name, const std::vector<T>& values) {
  check_fingerprint(name, std::as_bytes(std::span<const T>(values)));
}

// ---- inputs ------------------------------------------------------------------------------------

/// n gradient-like values: random full-width significands, magnitudes in [2^-28, 2^-7) concentrated at
/// the top (a geometric law), random signs and about 1% zeros. Integers and ldexp only, so the same
/// bits under any compiler flags.
template <class T>
std::vector<T> input(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 engine(seed);
  constexpr int digits = std::numeric_limits<T>::digits;
  std::vector<T> x(n);
  for (T& v : x) {
    const std::uint64_t r = engine();
    if (r % 97 == 0) continue;
    const std::uint64_t significand = (engine() >> (64 - digits)) | (std::uint64_t{1} << (digits - 1));
    const int exponent = -8 - std::min(std::countr_zero(r >> 8 | std::uint64_t{1} << 20), 20);
    const T magnitude = static_cast<T>(std::ldexp(static_cast<T>(significand), exponent - digits + 1));
    v = (r & 128u) != 0 ? -magnitude : magnitude;
  }
  return x;
}

/// Not a multiple of any block or kernel width, so every vectorised loop has a tail.
constexpr std::size_t elements = (std::size_t{1} << 17) + 37;

/// A tensor's gradient at step t.
template <class T>
std::vector<T> gradient(std::uint64_t t) {
  return input<T>(elements, 7000 + t);
}

message_key key_at(std::uint64_t t) { return {.step = t, .tensor_id = 5}; }

/// The executors every output is computed on: the widest kernels, and the baseline ones.
constexpr cpu_executor executors[] = {cpu_executor{}, cpu_executor{.max_simd = cpu_simd::baseline}};

// ---- codecs ------------------------------------------------------------------------------------

/// The encoding of x, its decoding, and its decode_accumulate onto x, on each executor.
template <class Codec>
void round_trip(const std::string& name, const Codec& codec, const std::vector<typename Codec::value_type>& x) {
  using T = typename Codec::value_type;
  for (const cpu_executor& cpu : executors) {
    std::vector<std::byte> ws(codec.workspace_bytes(cpu, x.size()));
    bytes message(codec.max_encoded_bytes(x.size()));
    message.resize(codec.encode(cpu, std::span<const T>(x), message, ws, key_at(1)));
    check_fingerprint(name + "/encode", message);
    check_fingerprint(name + "/decode", decode_values(codec, message, x.size(), {}, cpu));
    std::vector<T> sum = x;
    codec.decode_accumulate(cpu, message, std::span<T>(sum), ws);
    check_fingerprint(name + "/accumulate", sum);
  }
}

template <class T>
void quantizers(const std::string& type) {
  const std::vector<T> x = gradient<T>(0);
  for (const int bits : {1, 2, 4, 8})
    for (const rounding mode : {rounding::nearest_even, rounding::stochastic}) {
      const std::string name =
          "uniform" + std::to_string(bits) + (mode == rounding::stochastic ? "_sr_" : "_rtn_") + type;
      round_trip(name, uniform_quantizer<T>({.bits = bits, .block = 256, .round = mode, .seed = 3}), x);
      round_trip(name + "_block100", uniform_quantizer<T>({.bits = bits, .block = 100, .round = mode, .seed = 3}), x);
    }
  round_trip("sign_" + type, sign_quantizer<T>({.block = 256}), x);
  for (const std::uint32_t levels : {1u, 7u, 127u})
    round_trip("qsgd" + std::to_string(levels) + "_" + type,
               qsgd_quantizer<T>({.levels = levels, .bucket = 512, .seed = 4}), x);
  round_trip("pipeline_topk_uniform8_" + type,
             pipeline(topk_sparsifier<T>(sparsity{.density = 0.05}), uniform_quantizer<T>({.bits = 8, .block = 64})),
             x);
}

TEST_CASE("fingerprints: quantizers (uniform, sign, QSGD, pipeline), float") { quantizers<float>("f32"); }
TEST_CASE("fingerprints: quantizers (uniform, sign, QSGD, pipeline), double") { quantizers<double>("f64"); }

TEST_CASE("fingerprints: sparsifiers and lossless codecs") {
  const std::vector<float> x = gradient<float>(0);
  const std::vector<double> y = gradient<double>(0);
  round_trip("topk_f32", topk_sparsifier<float>(sparsity{.density = 0.01}), x);
  round_trip("threshold_f64", threshold_sparsifier<double>({.target = {.density = 0.01}, .seed = 2}), y);
  round_trip("randomk_scaled_f32", randomk_sparsifier<float>({.amount = {.density = 0.01}, .seed = 2}), x);
  round_trip("randomk_scaled_f64", randomk_sparsifier<double>({.amount = {.density = 0.03}, .seed = 2}), y);
  round_trip("mpc_f32", mpc_codec<float>({.dim = 2}), x);
  round_trip("zfp8_f32", zfp_fixed_rate_codec<float>({.rate_bits = 8}), x);
  round_trip("zfp16_f32", zfp_fixed_rate_codec<float>({.rate_bits = 16}), x);
}

// ---- stateful wrappers -----------------------------------------------------------------------------

/// Three steps of a stateful wrapper (error feedback, LoCo) on `cpu`: each message, then the saved
/// state.
template <class Wrapper>
void three_steps_on(const cpu_executor& cpu, const std::string& name, const Wrapper& wrapper) {
  using T = typename Wrapper::value_type;
  auto state = wrapper.make_state(cpu, elements);
  std::vector<std::byte> ws(wrapper.workspace_bytes(cpu, elements));
  for (std::uint64_t t = 1; t <= 3; ++t) {
    const std::vector<T> g = gradient<T>(t);
    bytes out(wrapper.max_encoded_bytes(elements));
    out.resize(wrapper.encode(cpu, std::span<const T>(g), state, out, ws, key_at(t)));
    check_fingerprint(name + "/step" + std::to_string(t), out);
  }
  bytes saved(wrapper.saved_state_bytes(elements));
  saved.resize(wrapper.save_state(cpu, state, saved));
  check_fingerprint(name + "/state", saved);
}

/// three_steps_on on each executor.
template <class Wrapper>
void three_steps(const std::string& name, const Wrapper& wrapper) {
  for (const cpu_executor& cpu : executors) three_steps_on(cpu, name, wrapper);
}

TEST_CASE("fingerprints: error feedback messages and states over three steps") {
  three_steps("ef_uniform8_f32", error_feedback(uniform_quantizer<float>({.bits = 8, .block = 256})));
  three_steps("ef_uniform4_f32", error_feedback(uniform_quantizer<float>({.bits = 4, .block = 256})));
  three_steps("ef_uniform8_sr_f32", error_feedback(uniform_quantizer<float>(
                                        {.bits = 8, .block = 256, .round = rounding::stochastic, .seed = 1})));
  three_steps("ef_uniform2_f64", error_feedback(uniform_quantizer<double>({.bits = 2, .block = 64})));
  three_steps("ef_qsgd15_f32", error_feedback(qsgd_quantizer<float>({.levels = 15, .bucket = 256, .seed = 1})));
  three_steps("ef_sign_f64", error_feedback(sign_quantizer<double>({.block = 128})));
  three_steps("ef_topk_f32", error_feedback(topk_sparsifier<float>(sparsity{.density = 0.01})));
  three_steps("ef_randomk_f32", error_feedback(randomk_sparsifier<float>({.amount = {.density = 0.01}, .seed = 8})));
}

TEST_CASE("fingerprints: LoCo messages and states over three steps, a reset included") {
  // The fused path (error groups = blocks) and the reference path (other groups, double).
  three_steps("loco_uniform4_f32", loco(uniform_quantizer<float>({.bits = 4, .block = 256}),
                                        {.beta = 0.8f, .reset_period = 2, .error_group = 256}));
  three_steps("loco_uniform8_f32", loco(uniform_quantizer<float>({.bits = 8, .block = 256}),
                                        {.beta = 0.6f, .reset_period = 5, .error_group = 256}));
  three_steps("loco_uniform4_group100_f32", loco(uniform_quantizer<float>({.bits = 4, .block = 256}),
                                                 {.beta = 0.8f, .reset_period = 2, .error_group = 100}));
  three_steps("loco_uniform4_f64", loco(uniform_quantizer<double>({.bits = 4, .block = 128}),
                                        {.beta = 0.7f, .reset_period = 3, .error_group = 64}));
}

template <class T>
void dynamic_steps(const std::string& name, dynamic_threshold_mode mode) {
  const cpu_executor cpu;
  const dynamic_sparsifier<T> sp({.zero_fraction = 0.9, .mode = mode});
  dynamic_state<T> state;
  std::vector<std::byte> ws(sp.workspace_bytes(cpu, elements));
  for (std::uint64_t t = 1; t <= 3; ++t)
    for (const std::uint64_t id : {4u, 9u}) {
      const std::vector<T> g = input<T>(elements, 100 * t + id);
      std::vector<T> out(elements);
      sp.sparsify(cpu, state, id, std::span<const T>(g), std::span<T>(out), ws);
      check_fingerprint(name + "/step" + std::to_string(t) + "_id" + std::to_string(id), out);
    }
  bytes saved(sp.saved_state_bytes(state));
  saved.resize(sp.save_state(cpu, state, saved));
  check_fingerprint(name + "/state", saved);
}

TEST_CASE("fingerprints: dynamic sparsifier outputs and states over three steps") {
  dynamic_steps<float>("dynamic_exact_f32", dynamic_threshold_mode::exact);
  dynamic_steps<double>("dynamic_table_f64", dynamic_threshold_mode::tagc_table);
}

// ---- aggregates ------------------------------------------------------------------------------------

template <class T>
void shared_scale_sum(const std::string& name, int bits, rounding mode) {
  const shared_scale_quantizer<T> q({.bits = bits, .block = 256, .round = mode, .seed = 6, .headroom_bits = 2});
  std::vector<std::vector<T>> ranks;
  for (std::uint64_t r = 0; r < 4; ++r) ranks.push_back(input<T>(elements, 300 + r));
  std::vector<bytes> messages = encode_shared_ranks(q, ranks, key_at(2));
  for (std::size_t r = 1; r < messages.size(); ++r) q.accumulate_encoded(cpu_executor{}, messages[0], messages[r]);
  check_fingerprint(name + "/sum", messages[0]);
  check_fingerprint(name + "/decode", decode_values(q, messages[0], elements));
}

template <class T>
void count_sketch_sum(const std::string& name) {
  const cpu_executor cpu;
  const count_sketch<T> cs({.rows = 3, .columns = 4096, .seed = 7, .heavy_hitters = {.k = 100}});
  bytes sum = encode_bytes(cs, input<T>(elements, 400), key_at(3));
  for (std::uint64_t r = 1; r < 3; ++r)
    cs.accumulate_encoded(cpu, sum, encode_bytes(cs, input<T>(elements, 400 + r), key_at(3)));
  check_fingerprint(name + "/sum", sum);
  check_fingerprint(name + "/decode", decode_values(cs, sum, elements));
  std::vector<std::byte> ws(cs.workspace_bytes(cpu, elements));
  std::vector<T> estimates(elements);
  cs.estimate(cpu, sum, std::span<T>(estimates), ws);
  check_fingerprint(name + "/estimate", estimates);
  std::vector<std::uint64_t> hitters(static_cast<std::size_t>(cs.heavy_hitter_count(elements)));
  hitters.resize(cs.heavy_hitters(cpu, sum, elements, hitters, ws));
  check_fingerprint(name + "/heavy_hitters", hitters);
}

/// Four ranks' sparse gradients through lossless homomorphic compression: the OR-aggregated index,
/// the summed sketch (in rank order) and its decoding.
template <class T>
void lhc_sum(const std::string& name) {
  const cpu_executor cpu;
  const lossless_homomorphic<T> lhc({.seed = 12});
  std::vector<std::vector<T>> x;
  for (std::uint64_t r = 0; r < 4; ++r) {
    x.push_back(input<T>(elements, 500 + r));
    for (std::size_t i = 0; i < elements; ++i)
      if (i % 37 != r) x.back()[i] = T{0};  // sparse, some elements non-zero on one rank only
  }
  bytes index(lhc.index_bytes(elements), std::byte{0});
  for (const std::vector<T>& g : x) {
    bytes mine(index.size());
    lhc.encode_index(cpu, std::span<const T>(g), std::span<std::byte>(mine));
    for (std::size_t q = 0; q < index.size(); ++q) index[q] |= mine[q];
  }
  const lhc_plan plan = lhc.plan(cpu, std::span<const std::byte>(index), elements, x.size());
  std::vector<T> summed(plan.sketch_values(), T{0}), sketch(plan.sketch_values());
  for (const std::vector<T>& g : x) {
    lhc.encode_sketch(cpu, std::span<const T>(g), std::span<const std::byte>(index), plan, std::span<T>(sketch));
    for (std::size_t c = 0; c < sketch.size(); ++c) summed[c] += sketch[c];
  }
  check_fingerprint(name + "/sketch_sum", summed);
  bytes ws(lhc.workspace_bytes(cpu, plan));
  std::vector<T> out(elements);
  lhc.decode(cpu, std::span<const std::byte>(index), plan, std::span<const T>(summed), std::span<T>(out),
             std::span<std::byte>(ws));
  check_fingerprint(name + "/decode", out);
}

template <class T>
void powersgd_steps(const std::string& name, const powersgd<T>& scheme, bool average) {
  // 365 x 359: no dimension a multiple of 8, so every vectorised loop has a tail; three ranks.
  const matrix_shape shape{365, 359};
  const int P = 3;
  for (const cpu_executor& cpu : executors) {
    std::vector<std::vector<T>> results(3);  // rank 0's, step by step
    std::vector<bytes> states(P);
    in_process_group(P).run([&](in_process_transport& t) {
      const auto rank = static_cast<std::size_t>(t.rank());
      powersgd_state<T> state;
      for (std::uint64_t step = 1; step <= 3; ++step) {
        std::vector<T> g = input<T>(static_cast<std::size_t>(shape.count()), 500 * step + rank);
        compressed_all_reduce(cpu, t, scheme, state, std::span<T>(g), shape, {.key = key_at(step), .average = average});
        if (rank == 0) results[step - 1] = std::move(g);
      }
      states[rank].resize(scheme.saved_state_bytes(shape));
      states[rank].resize(scheme.save_state(state, shape, states[rank]));
    });
    for (std::size_t step = 1; step <= 3; ++step)
      check_fingerprint(name + "/step" + std::to_string(step), results[step - 1]);
    check_fingerprint(name + "/state_rank0", states[0]);
    check_fingerprint(name + "/state_rank2", states[2]);
  }
}

TEST_CASE("fingerprints: PowerSGD results and states over three steps, three ranks") {
  powersgd_steps("powersgd_r4_f32", powersgd<float>({.rank = 4, .seed = 2}), false);
  powersgd_steps("powersgd_r3_local_mean_f32",
                 powersgd<float>({.rank = 3, .seed = 2, .feedback = powersgd_feedback::local}), true);
  powersgd_steps("powersgd_r2_f64", powersgd<double>({.rank = 2, .seed = 2, .orthonormalise_in_double = true}), false);
}

TEST_CASE("fingerprints: aggregates (shared-scale sums, count-sketch sums, lossless homomorphic sketches)") {
  shared_scale_sum<float>("shared_scale8_sum4_f32", 8, rounding::nearest_even);
  shared_scale_sum<double>("shared_scale4_sr_sum4_f64", 4, rounding::stochastic);
  count_sketch_sum<float>("count_sketch_sum3_f32");
  count_sketch_sum<double>("count_sketch_sum3_f64");
  lhc_sum<float>("lhc_sum4_f32");
  lhc_sum<double>("lhc_sum4_f64");
}

}  // namespace
