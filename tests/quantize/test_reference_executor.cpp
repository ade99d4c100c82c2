// reference_executor: a host executor on which every codec of the reference tier runs, and the
// golden wire files reproduced by the reference backends byte for byte. (Each codec's own tests
// check the reference against independent oracles and every cpu_executor setting against the
// reference.)
#include <gradcomp/core/concepts.hpp>
#include <gradcomp/core/memory_space.hpp>
#include <gradcomp/core/reference_executor.hpp>
#include <gradcomp/lossless/mpc.hpp>
#include <gradcomp/lossless/zfp_fixed_rate.hpp>
#include <gradcomp/pipeline.hpp>
#include <gradcomp/sketch/count_sketch.hpp>
#include <gradcomp/quantize/qsgd.hpp>
#include <gradcomp/quantize/shared_scale.hpp>
#include <gradcomp/quantize/sign.hpp>
#include <gradcomp/quantize/uniform.hpp>
#include <gradcomp/sparsify/randomk.hpp>
#include <gradcomp/sparsify/threshold.hpp>
#include <gradcomp/sparsify/topk.hpp>

#include <doctest/doctest.h>

#include <cstddef>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "support/executor_io.hpp"
#include "support/golden_cases.hpp"
#include "support/golden_io.hpp"

using namespace gradcomp;
using namespace gradcomp::test;

namespace {

template <class C>
struct is_pipeline : std::false_type {};
template <class S, class Q>
struct is_pipeline<pipeline<S, Q>> : std::true_type {};

template <class C, template <class> class Codec>
struct is_instance : std::false_type {};
template <class T, template <class> class Codec>
struct is_instance<Codec<T>, Codec> : std::true_type {};

/// Whether codec type C has a reference backend in this release.
template <class C>
inline constexpr bool reference_backed =
    is_instance<C, uniform_quantizer>::value || is_instance<C, qsgd_quantizer>::value ||
    is_instance<C, sign_quantizer>::value || is_instance<C, shared_scale_quantizer>::value ||
    is_instance<C, topk_sparsifier>::value || is_instance<C, randomk_sparsifier>::value ||
    is_instance<C, threshold_sparsifier>::value || is_instance<C, count_sketch>::value || is_pipeline<C>::value ||
    is_instance<C, mpc_codec>::value || is_instance<C, zfp_fixed_rate_codec>::value;

template <class T>
constexpr bool every_codec_runs_on_the_reference() {
  return codec_for<uniform_quantizer<T>, reference_executor> && codec_for<qsgd_quantizer<T>, reference_executor> &&
         codec_for<sign_quantizer<T>, reference_executor> && codec_for<topk_sparsifier<T>, reference_executor> &&
         codec_for<threshold_sparsifier<T>, reference_executor> &&
         homomorphic<shared_scale_quantizer<T>, reference_executor> &&
         homomorphic<randomk_sparsifier<T>, reference_executor> &&
         codec_for<pipeline<topk_sparsifier<T>, uniform_quantizer<T>>, reference_executor> &&
         homomorphic<count_sketch<T>, reference_executor>;
}
static_assert(codec_for<mpc_codec<float>, reference_executor> &&
              codec_for<zfp_fixed_rate_codec<float>, reference_executor>);

}  // namespace

static_assert(executor<reference_executor>);
static_assert(memory_space_of<reference_executor> == memory_space::host);
static_assert(every_codec_runs_on_the_reference<float>());
static_assert(every_codec_runs_on_the_reference<double>());

TEST_CASE("the reference backends reproduce the golden wire files byte for byte") {
  int checked = 0;
  const auto check = [&](const std::string& file, const auto& codec, const auto& x, message_key key) {
    if constexpr (reference_backed<std::decay_t<decltype(codec)>>) {
      CAPTURE(file);
      const std::vector<std::byte> golden = read_golden(file);
      REQUIRE_FALSE(golden.empty());
      CHECK(encode_on(reference_executor{}, codec, x, key) == golden);
      ++checked;
    }
  };
  for_each_golden_codec(check);
  for_each_golden_half_codec(check);
  CHECK(checked == 30);  // every golden file
}

TEST_CASE("the reference's shared-scale protocol reproduces the golden three-rank sum") {
  // As golden_cases(): ranks holding x, −x/2 and x/4, the maxima MAX-reduced, each rank's
  // encode_shared, and the messages summed with accumulate_encoded, all on the reference.
  const reference_executor ref;
  const shared_scale_quantizer<float> q = golden_shared_sum_codec();
  const std::vector<float> x = golden_input<float>(100);
  std::vector<std::vector<float>> ranks(3, x);
  for (std::size_t i = 0; i < x.size(); ++i) {
    ranks[1][i] = -0.5f * x[i];
    ranks[2][i] = 0.25f * x[i];
  }
  std::vector<float> agreed(q.block_count(x.size()), 0.0f), mine(agreed.size());
  for (const std::vector<float>& g : ranks) {
    q.block_maxima(ref, std::span<const float>(g), std::span<float>(mine));
    for (std::size_t j = 0; j < agreed.size(); ++j) agreed[j] = mine[j] > agreed[j] ? mine[j] : agreed[j];
  }
  std::vector<std::vector<std::byte>> messages;
  for (std::uint32_t r = 0; r < ranks.size(); ++r) {
    std::vector<std::byte> out(q.max_encoded_bytes(x.size()));
    q.encode_shared(ref, std::span<const float>(ranks[r]), std::span<const float>(agreed), out, {},
                    {.step = 4, .tensor_id = 1}, r);
    messages.push_back(std::move(out));
  }
  for (std::size_t r = 1; r < messages.size(); ++r) q.accumulate_encoded(ref, messages[0], messages[r]);
  const std::vector<std::byte> golden = read_golden("shared_scale8_sum3_f32.bin");
  REQUIRE_FALSE(golden.empty());
  CHECK(messages[0] == golden);
}
