// Two codecs on two non-blocking streams at once give the CPU's bytes: the operations keep all
// their work, scratch and waits on their own executor's stream, so work queued on another stream
// (which a non-blocking stream does not wait for) cannot reach theirs. Once with encodes queued on
// both streams before any wait (deferred errors), once from two host threads that each run a codec
// with its host waits (top-k encode and decode; error-feedback steps with their state).
#include <cstddef>
#include <cstdint>
#include <exception>
#include <span>
#include <thread>
#include <vector>

#include "cuda/device_io.cuh"
#include "support/data.hpp"
#include "support/errors.hpp"

using namespace gradcomp;
using namespace gradcomp::test;

namespace {

constexpr std::size_t n = (std::size_t{1} << 20) + 3;
constexpr std::uint64_t rounds = 4;

/// One encode queued on a stream: its device buffers, kept until the stream has run it.
struct queued_encode {
  device_array<float> grad;
  device_array<std::byte> out;
  device_array<std::byte> ws;
  std::size_t size;
};

template <class Codec>
queued_encode queue_encode(const cuda_executor& exec, const Codec& codec, const std::vector<float>& x,
                           message_key key) {
  queued_encode e{to_device(exec, x), poisoned<std::byte>(exec, codec.max_encoded_bytes(n)),
                  poisoned<std::byte>(exec, codec.workspace_bytes(exec, n)), 0};
  e.size = codec.encode(exec, std::span<const float>(e.grad.span()), e.out.span(), e.ws.span(), key);
  return e;
}

/// Runs `f`, returning what it threw (a failed REQUIRE too), for a thread to hand to the test.
template <class F>
std::exception_ptr caught(F&& f) {
  try {
    f();
  } catch (...) {
    return std::current_exception();
  }
  return nullptr;
}

}  // namespace

GRADCOMP_CUDA_TEST_CASE("two codecs queued on two non-blocking streams at once give the CPU's bytes") {
  const uniform_quantizer<float> uniform({.bits = 8});
  const topk_sparsifier<float> topk(sparsity{.density = 0.01});
  const test_stream first, second;
  device_array<std::uint32_t> words =
      to_device(first.executor(), std::vector<std::uint32_t>{0, 0});  // zeroed, as documented
  first.executor().synchronize();  // the second stream does not wait for the first
  const cuda_executor a = first.executor(words.data());
  const cuda_executor b = second.executor(words.data() + 1);
  std::vector<queued_encode> on_a, on_b;
  for (std::uint64_t r = 0; r < rounds; ++r) {  // no host wait between these
    on_a.push_back(
        queue_encode(a, uniform, make_input<float>(input_kind::normal, n, 10 + r), {.step = r, .tensor_id = 1}));
    on_b.push_back(
        queue_encode(b, topk, make_input<float>(input_kind::normal, n, 20 + r), {.step = r, .tensor_id = 2}));
  }
  CHECK(thrown_by([&] { check_deferred_errors(a); }) == "no exception");
  CHECK(thrown_by([&] { check_deferred_errors(b); }) == "no exception");
  for (std::uint64_t r = 0; r < rounds; ++r) {
    CAPTURE(r);
    CHECK(to_host(a, on_a[r].out, on_a[r].size) == encode_on(cpu_executor{}, uniform,
                                                             make_input<float>(input_kind::normal, n, 10 + r),
                                                             {.step = r, .tensor_id = 1}));
    CHECK(to_host(b, on_b[r].out, on_b[r].size) == encode_on(cpu_executor{}, topk,
                                                             make_input<float>(input_kind::normal, n, 20 + r),
                                                             {.step = r, .tensor_id = 2}));
  }
}

GRADCOMP_CUDA_TEST_CASE("two host threads running two codecs on two non-blocking streams give the CPU's bytes") {
  const topk_sparsifier<float> topk(sparsity{.density = 0.01});
  const error_feedback<uniform_quantizer<float>> ef(uniform_quantizer<float>({.bits = 8}));
  std::vector<std::vector<float>> topk_inputs, ef_inputs;
  for (std::uint64_t r = 0; r < rounds; ++r) {
    topk_inputs.push_back(make_input<float>(r % 2 == 0 ? input_kind::normal : input_kind::ties, n, 30 + r));
    ef_inputs.push_back(make_input<float>(input_kind::normal, n, 40 + r));
  }
  std::vector<std::vector<std::byte>> topk_messages(rounds), ef_messages(rounds);
  std::vector<std::vector<float>> topk_decoded(rounds), ef_residuals(rounds);
  const test_stream first, second;
  std::exception_ptr topk_failure, ef_failure;
  std::thread topk_thread([&] {
    topk_failure = caught([&] {
      for (std::uint64_t r = 0; r < rounds; ++r) {
        topk_messages[r] = encode_on(first.executor(), topk, topk_inputs[r], {.step = r});
        topk_decoded[r] = decode_on(first.executor(), topk, topk_messages[r], poisoned_values<float>(n));
      }
    });
  });
  std::thread ef_thread([&] {
    ef_failure = caught([&] {
      stepper<cuda_executor, error_feedback<uniform_quantizer<float>>> gpu(second.executor(), ef, n);
      for (std::uint64_t r = 0; r < rounds; ++r) {
        ef_messages[r] = gpu.step(ef_inputs[r], {.step = r});
        ef_residuals[r] = gpu.carried_error();
      }
    });
  });
  topk_thread.join();
  ef_thread.join();
  if (topk_failure) std::rethrow_exception(topk_failure);
  if (ef_failure) std::rethrow_exception(ef_failure);

  stepper<cpu_executor, error_feedback<uniform_quantizer<float>>> cpu({}, ef, n);
  for (std::uint64_t r = 0; r < rounds; ++r) {
    CAPTURE(r);
    const std::vector<std::byte> message = encode_on(cpu_executor{}, topk, topk_inputs[r], {.step = r});
    CHECK(topk_messages[r] == message);
    CHECK(bit_patterns(topk_decoded[r]) ==
          bit_patterns(decode_on(cpu_executor{}, topk, message, poisoned_values<float>(n))));
    CHECK(ef_messages[r] == cpu.step(ef_inputs[r], {.step = r}));
    CHECK(bit_patterns(ef_residuals[r]) == bit_patterns(cpu.carried_error()));
  }
}
