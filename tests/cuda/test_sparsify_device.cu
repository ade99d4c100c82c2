// The sparsifiers on the GPU: top-k, random-k and threshold messages (and threshold's report)
// equal the reference executor's bit for bit over sizes, densities, ties, special inputs and value
// types, top-k included where its candidates overflow; decodes and random-k's accumulate_encoded
// equal the CPU's; top-k with deferred errors runs inside a captured CUDA graph; and on both
// executors NaN or Inf is non_finite_input with no message left.
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "cuda/device_io.cuh"
#include "support/data.hpp"
#include "support/errors.hpp"

using namespace gradcomp;
using namespace gradcomp::test;

namespace {

template <class T>
void check_topk(std::size_t n) {
  for (const sparsity amount : {sparsity{.k = 1}, sparsity{.density = 0.01}, sparsity{.density = 0.1},
                                sparsity{.density = 0.5}, sparsity{.density = 1.0}})
    for (const input_kind kind : all_input_kinds) check_matches_reference(topk_sparsifier<T>(amount), n, kind, 31 + n);
}

const auto non_finite_leaves_no_message = [](const auto& exec) {
  std::vector<float> x = make_input<float>(input_kind::normal, 5000, 8);
  x[4321] = std::numeric_limits<float>::quiet_NaN();
  const auto no_message = [](const outcome<std::byte>& result) {
    CHECK(result.status == named(errc::non_finite_input));
    CHECK(thrown_by([&] { (void)parse_envelope(result.output); }) != "no exception");
  };
  no_message(encode_outcome_on(exec, topk_sparsifier<float>(sparsity{.density = 0.01}), x));
  no_message(encode_outcome_on(exec, threshold_sparsifier<float>({.target = {.density = 0.01}}), x));
  no_message(encode_outcome_on(exec, randomk_sparsifier<float>({.amount = {.density = 1.0}}), x));
};

}  // namespace

GRADCOMP_CUDA_TEST_CASE("top-k messages and decodings equal the reference's bit for bit") {
  for (const std::size_t n : {1u, 2u, 1000u, 4099u, 100000u}) {
    check_topk<float>(n);
    check_topk<double>(n);
  }
  // Large enough that the candidate list is a sixteenth of n (131072 entries): all_equal overflows it.
  check_topk<float>(std::size_t{1} << 21);
}

GRADCOMP_CUDA_TEST_CASE("random-k messages, decodings and summed messages equal the reference's") {
  for (const bool scaled : {true, false})
    for (const std::size_t n : {1u, 1000u, 100003u})
      for (const double density : {0.001, 0.05, 1.0}) {
        const randomk_sparsifier<float> codec({.amount = {.density = density}, .seed = 9, .scaled = scaled});
        check_matches_reference(codec, n, input_kind::normal, 5 + n);
        const randomk_sparsifier<double> wide({.amount = {.density = density}, .seed = 10, .scaled = scaled});
        check_matches_reference(wide, n, input_kind::ties, 6 + n);
      }
  const randomk_sparsifier<float> codec({.amount = {.density = 0.1}, .seed = 3});
  const std::vector<float> a = make_input<float>(input_kind::normal, 10000, 1);
  const std::vector<float> b = make_input<float>(input_kind::normal, 10000, 2);
  std::vector<std::byte> sum_cpu = encode_on(cpu_executor{}, codec, a, {.step = 4});
  const std::vector<std::byte> other = encode_on(cpu_executor{}, codec, b, {.step = 4});
  device_array<std::byte> sum_gpu = to_device(test_gpu(), sum_cpu);
  const device_array<std::byte> other_gpu = to_device(test_gpu(), other);
  codec.accumulate_encoded(cpu_executor{}, std::span<std::byte>(sum_cpu), std::span<const std::byte>(other));
  codec.accumulate_encoded(test_gpu(), sum_gpu.span(), std::span<const std::byte>(other_gpu.span()));
  CHECK(to_host(test_gpu(), sum_gpu) == sum_cpu);
  const std::vector<std::byte> later = encode_on(cpu_executor{}, codec, b, {.step = 5});
  const device_array<std::byte> later_gpu = to_device(test_gpu(), later);
  CHECK(thrown_by([&] {
          codec.accumulate_encoded(test_gpu(), sum_gpu.span(), std::span<const std::byte>(later_gpu.span()));
        }) == named(errc::step_mismatch));
  CHECK(to_host(test_gpu(), sum_gpu) == sum_cpu);
}

GRADCOMP_CUDA_TEST_CASE("threshold messages and reports equal the reference's") {
  for (const bool refine : {true, false})
    for (const std::size_t n : {1u, 1000u, 100000u, 1u << 20})
      for (const input_kind kind : {input_kind::normal, input_kind::ties, input_kind::signed_zeros}) {
        CAPTURE(refine);
        const threshold_sparsifier<float> codec(
            {.target = {.density = 0.01}, .sample_fraction = 0.02, .refine = refine, .seed = 4});
        check_matches_reference(codec, n, kind, 70 + n);
        const threshold_sparsifier<double> wide(
            {.target = {.density = 0.05}, .min_samples = 100, .refine = refine, .seed = 5});
        check_matches_reference(wide, n, kind, 71 + n);
        // The report: bytes, kept, target, threshold and density.
        const std::vector<float> x = make_input<float>(kind, n, 72 + n);
        std::vector<std::byte> out = poisoned_values<std::byte>(codec.max_encoded_bytes(n));
        std::vector<std::byte> ws = poisoned_values<std::byte>(codec.workspace_bytes(cpu_executor{}, n));
        const threshold_report<float> cpu =
            codec.encode_with_report(cpu_executor{}, std::span<const float>(x), out, ws, {});
        const device_array<float> g = to_device(test_gpu(), x);
        device_array<std::byte> out_gpu = poisoned<std::byte>(test_gpu(), codec.max_encoded_bytes(n));
        device_array<std::byte> ws_gpu = poisoned<std::byte>(test_gpu(), codec.workspace_bytes(test_gpu(), n));
        const threshold_report<float> gpu =
            codec.encode_with_report(test_gpu(), std::span<const float>(g.span()), out_gpu.span(), ws_gpu.span(), {});
        CHECK(gpu.bytes == cpu.bytes);
        CHECK(gpu.kept == cpu.kept);
        CHECK(gpu.target == cpu.target);
        CHECK(to_bits(gpu.threshold) == to_bits(cpu.threshold));
        CHECK(gpu.density == cpu.density);
      }
}

GRADCOMP_CUDA_TEST_CASE("pipeline messages and decodings equal the reference's") {
  for (const std::size_t n : {1u, 1000u, 100000u}) {
    check_matches_reference(pipeline(topk_sparsifier<float>(sparsity{.density = 0.01}),
                                     uniform_quantizer<float>({.bits = 8, .block = 64})),
                            n, input_kind::normal, 90 + n);
    check_matches_reference(pipeline(topk_sparsifier<double>(sparsity{.density = 0.3}),
                                     uniform_quantizer<double>({.bits = 4, .block = 5})),
                            n, input_kind::ties, 91 + n);
    check_matches_reference(pipeline(threshold_sparsifier<float>({.target = {.density = 0.02}},
                                                                 {.payload_checksum = true}),
                                     qsgd_quantizer<float>({.levels = 7})),
                            n, input_kind::normal, 92 + n);
  }
}

GRADCOMP_CUDA_TEST_CASE("top-k with deferred errors is captured in a CUDA graph and replayed") {
  const topk_sparsifier<float> codec(sparsity{.density = 0.01});
  constexpr std::size_t n = 1 << 18;
  const std::vector<float> x = make_input<float>(input_kind::normal, n, 12);
  const test_stream stream;
  device_array<std::uint32_t> errors =
      to_device(stream.executor(), std::vector<std::uint32_t>{0});  // zeroed, as documented
  const cuda_executor exec = stream.executor(errors.data());
  const device_array<float> g = to_device(exec, x);
  device_array<std::byte> out(codec.max_encoded_bytes(n), exec);
  device_array<std::byte> ws = poisoned<std::byte>(exec, codec.workspace_bytes(exec, n));
  exec.synchronize();  // the copies and fills above are not part of the graph
  cudaGraph_t graph = nullptr;
  REQUIRE(cudaStreamBeginCapture(exec.native_stream(), cudaStreamCaptureModeThreadLocal) == cudaSuccess);
  const std::size_t size = codec.encode(exec, std::span<const float>(g.span()), out.span(), ws.span(), {.step = 2});
  REQUIRE(cudaStreamEndCapture(exec.native_stream(), &graph) == cudaSuccess);
  cudaGraphExec_t instance = nullptr;
  REQUIRE(cudaGraphInstantiate(&instance, graph, 0) == cudaSuccess);
  for (int replay = 0; replay < 2; ++replay) {
    GRADCOMP_CUDA_CHECK(cudaMemsetAsync(out.data(), poison_byte, out.size(), exec.native_stream()));
    REQUIRE(cudaGraphLaunch(instance, exec.native_stream()) == cudaSuccess);
    CHECK(to_host(exec, out, size) == encode_on(cpu_executor{}, codec, x, {.step = 2}));
  }
  CHECK(thrown_by([&] { check_deferred_errors(exec); }) == "no exception");
  cudaGraphExecDestroy(instance);
  cudaGraphDestroy(graph);
}

GRADCOMP_TEST_ON_EXECUTORS("sparsifiers: NaN or Inf in the gradient is non_finite_input and leaves no message",
                           non_finite_leaves_no_message)
