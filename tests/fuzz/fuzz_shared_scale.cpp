// Fuzz target: shared-scale quantizer decode, decode_accumulate, and summing a message into a copy
// of itself (8-bit float with 2 headroom bits, or 2-bit stochastic double without headroom).
#include "fuzz_target.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace gradcomp;
  const shared_scale_quantizer<float> q8({.bits = 8, .block = 32, .headroom_bits = 2});
  const shared_scale_quantizer<double> q2(
      {.bits = 2, .block = 16, .round = rounding::stochastic, .seed = 9, .headroom_bits = 0});
  const auto run = [&](const auto& codec) {
    const std::vector<std::byte> message = fuzz::message_from(data, size, codec.params_hash());
    fuzz::decode_both(codec, message);
    fuzz::accumulate_into_copy(codec, message);
  };
  if (size > 0 && (data[0] & 2u) != 0) run(q2);
  else
    run(q8);
  return 0;
}
