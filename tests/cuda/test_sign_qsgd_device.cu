// The sign and QSGD quantizers on the GPU: messages and decodings equal reference_executor's bit
// for bit over block sizes, levels, value types, sizes and special inputs (the per-block sums run
// in the documented order on both); on both executors NaN/Inf and an overflowing QSGD norm are
// non_finite_input with no message left.
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "cuda/device_io.cuh"
#include "support/data.hpp"
#include "support/errors.hpp"

using namespace gradcomp;
using namespace gradcomp::test;

namespace {

template <class Codec>
void check_all_inputs(const Codec& codec) {
  for (const std::size_t n : {0u, 1u, 33u, 1000u, 4099u})
    for (const input_kind kind : all_input_kinds) check_matches_reference(codec, n, kind, 4321 + n);
}

const auto non_finite_leaves_no_message = [](const auto& exec) {
  std::vector<double> x = make_input<double>(input_kind::normal, 700, 2);
  x[650] = std::numeric_limits<double>::infinity();
  const sign_quantizer<double> sign({.block = 100});
  const qsgd_quantizer<double> qsgd({.levels = 7, .bucket = 64});
  for (const outcome<std::byte>& result : {encode_outcome_on(exec, sign, x), encode_outcome_on(exec, qsgd, x)}) {
    CHECK(result.status == named(errc::non_finite_input));
    CHECK(std::vector<std::byte>(result.output.begin(), result.output.begin() + 56) == std::vector<std::byte>(56));
  }
  // Finite values whose bucket norm overflows float.
  std::vector<float> big(64, 3e38f);
  const outcome<std::byte> overflow = encode_outcome_on(exec, qsgd_quantizer<float>({.bucket = 32}), big);
  CHECK(overflow.status == named(errc::non_finite_input));
};

}  // namespace

GRADCOMP_CUDA_TEST_CASE("sign messages and decodings equal the reference's bit for bit") {
  for (const std::uint32_t block : {1u, 5u, 32u, 100u, 256u}) {
    CAPTURE(block);
    check_all_inputs(sign_quantizer<float>({.block = block}));
    check_all_inputs(sign_quantizer<double>({.block = block}));
  }
  check_all_inputs(sign_quantizer<float>({.block = 64}, {.payload_checksum = true}));
}

GRADCOMP_CUDA_TEST_CASE("QSGD messages and decodings equal the reference's bit for bit") {
  for (const std::uint32_t levels : {1u, 3u, 7u, 15u, 127u}) {
    for (const std::uint32_t bucket : {1u, 9u, 64u, 256u}) {
      CAPTURE(levels);
      CAPTURE(bucket);
      check_all_inputs(qsgd_quantizer<float>({.levels = levels, .bucket = bucket, .seed = 5}));
      check_all_inputs(qsgd_quantizer<double>({.levels = levels, .bucket = bucket, .seed = 6}));
    }
  }
}

GRADCOMP_TEST_ON_EXECUTORS("sign and QSGD: NaN, Inf or an overflowing norm is non_finite_input and leaves no message",
                           non_finite_leaves_no_message)

GRADCOMP_CUDA_TEST_CASE("shared-scale messages, block maxima, sums and decodings equal the CPU's") {
  for (const int bits : {1, 2, 4, 8}) {
    for (const std::uint32_t block : {7u, 64u, 256u}) {
      for (const rounding mode : {rounding::nearest_even, rounding::stochastic}) {
        CAPTURE(bits);
        CAPTURE(block);
        const shared_scale_quantizer<float> q(
            {.bits = bits, .block = block, .round = mode, .seed = 21, .headroom_bits = 3});
        // The single-stage encode (this rank's own maxima).
        check_all_inputs(q);
        // Three ranks: maxima agreed on the CPU, each rank's encode_shared on both, the sum on both.
        constexpr std::size_t n = 3001;
        std::vector<std::vector<float>> g;
        for (int r = 0; r < 3; ++r)
          g.push_back(make_input<float>(r == 1 ? input_kind::ties : input_kind::normal, n, 60 + r));
        std::vector<float> agreed(q.block_count(n), 0.0f), mine(agreed.size());
        for (const auto& x : g) {
          q.block_maxima(cpu_executor{}, std::span<const float>(x), std::span<float>(mine));
          const device_array<float> dx = to_device(test_gpu(), x);
          device_array<float> dmine = poisoned<float>(test_gpu(), mine.size());
          q.block_maxima(test_gpu(), std::span<const float>(dx.span()), dmine.span());
          CHECK(bit_patterns(to_host(test_gpu(), dmine)) == bit_patterns(mine));
          for (std::size_t j = 0; j < agreed.size(); ++j) agreed[j] = std::max(agreed[j], mine[j]);
        }
        const device_array<float> dagreed = to_device(test_gpu(), agreed);
        std::vector<std::byte> sum_cpu;
        device_array<std::byte> sum_gpu;
        for (std::uint32_t r = 0; r < 3; ++r) {
          std::vector<std::byte> cpu(q.max_encoded_bytes(n));
          q.encode_shared(cpu_executor{}, std::span<const float>(g[r]), std::span<const float>(agreed), cpu, {},
                          {.step = 5}, r);
          const device_array<float> dx = to_device(test_gpu(), g[r]);
          device_array<std::byte> gpu = poisoned<std::byte>(test_gpu(), q.max_encoded_bytes(n));
          device_array<std::byte> ws = poisoned<std::byte>(test_gpu(), q.workspace_bytes(test_gpu(), n));
          q.encode_shared(test_gpu(), std::span<const float>(dx.span()), std::span<const float>(dagreed.span()),
                          gpu.span(), ws.span(), {.step = 5}, r);
          CHECK(to_host(test_gpu(), gpu) == cpu);
          if (r == 0) {
            sum_cpu = cpu;
            sum_gpu = std::move(gpu);
            continue;
          }
          q.accumulate_encoded(cpu_executor{}, std::span<std::byte>(sum_cpu), std::span<const std::byte>(cpu));
          const device_array<std::byte> other = to_device(test_gpu(), cpu);
          q.accumulate_encoded(test_gpu(), sum_gpu.span(), std::span<const std::byte>(other.span()));
        }
        CHECK(to_host(test_gpu(), sum_gpu) == sum_cpu);
        CHECK(bit_patterns(decode_on(test_gpu(), q, sum_cpu, poisoned_values<float>(n))) ==
              bit_patterns(decode_on(cpu_executor{}, q, sum_cpu, poisoned_values<float>(n))));
        // A maximum below rank 0's own is refused on both.
        std::vector<float> own(agreed.size());
        q.block_maxima(cpu_executor{}, std::span<const float>(g[0]), std::span<float>(own));
        std::vector<float> low = agreed;
        low[1] = own[1] * 0.5f;
        const device_array<float> dlow = to_device(test_gpu(), low);
        const device_array<float> dx = to_device(test_gpu(), g[0]);
        device_array<std::byte> out = poisoned<std::byte>(test_gpu(), q.max_encoded_bytes(n));
        device_array<std::byte> ws = poisoned<std::byte>(test_gpu(), q.workspace_bytes(test_gpu(), n));
        std::vector<std::byte> cpu_out(q.max_encoded_bytes(n));
        CHECK(thrown_by([&] {
                q.encode_shared(test_gpu(), std::span<const float>(dx.span()), std::span<const float>(dlow.span()),
                                out.span(), ws.span(), {}, 0);
              }) == named(errc::parameter_mismatch));
        CHECK(thrown_by([&] {
                q.encode_shared(cpu_executor{}, std::span<const float>(g[0]), std::span<const float>(low), cpu_out, {},
                                {}, 0);
              }) == named(errc::parameter_mismatch));
      }
    }
  }
}
