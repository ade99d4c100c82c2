// Fuzz target: shared-scale quantizer decode, decode_accumulate, and summing a message into a copy
// of itself: 8-bit float with 2 headroom bits, 2-bit stochastic double without headroom, 4-bit
// bf16 with 2 headroom bits and 2-bit stochastic fp16 with 1 (the 16-bit ones decoded into their
// own type and into float32), chosen by bits 1-2 of the first byte.
#include "fuzz_target.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace gradcomp;
  const shared_scale_quantizer<float> q8({.bits = 8, .block = 32, .headroom_bits = 2});
  const shared_scale_quantizer<double> q2(
      {.bits = 2, .block = 16, .round = rounding::stochastic, .seed = 9, .headroom_bits = 0});
  const shared_scale_quantizer<bf16> b4({.bits = 4, .block = 32, .headroom_bits = 2});
  const shared_scale_quantizer<fp16> h2(
      {.bits = 2, .block = 16, .round = rounding::stochastic, .seed = 5, .headroom_bits = 1});
  const auto run = [&](const auto& codec) {
    const std::vector<std::byte> message = fuzz::message_from(data, size, codec.params_hash());
    if constexpr (half_precision<typename std::decay_t<decltype(codec)>::value_type>)
      fuzz::decode_both_outputs(codec, message);
    else
      fuzz::decode_both(codec, message);
    fuzz::accumulate_into_copy(codec, message);
  };
  switch (size > 0 ? (data[0] >> 1) & 3u : 0u) {
    case 0: run(q8); break;
    case 1: run(q2); break;
    case 2: run(b4); break;
    default: run(h2); break;
  }
  return 0;
}
