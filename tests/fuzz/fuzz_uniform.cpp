// Fuzz target: uniform quantizer decode and decode_accumulate: 8-bit float, 4-bit double, 8-bit
// bf16 and 4-bit stochastic fp16 messages (the 16-bit ones decoded into their own type and into
// float32), chosen by bits 1-2 of the first byte.
#include "fuzz_target.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace gradcomp;
  const uniform_quantizer<float> q8({.bits = 8, .block = 32});
  const uniform_quantizer<double> q4({.bits = 4, .block = 16, .round = rounding::stochastic, .seed = 9});
  const uniform_quantizer<bf16> b8({.bits = 8, .block = 32});
  const uniform_quantizer<fp16> h4({.bits = 4, .block = 64, .round = rounding::stochastic, .seed = 5});
  switch (size > 0 ? (data[0] >> 1) & 3u : 0u) {
    case 0: fuzz::decode_both(q8, fuzz::message_from(data, size, q8.params_hash())); break;
    case 1: fuzz::decode_both(q4, fuzz::message_from(data, size, q4.params_hash())); break;
    case 2: fuzz::decode_both_outputs(b8, fuzz::message_from(data, size, b8.params_hash())); break;
    default: fuzz::decode_both_outputs(h4, fuzz::message_from(data, size, h4.params_hash())); break;
  }
  return 0;
}
