// Fuzz target: uniform quantizer decode and decode_accumulate (8-bit float, 4-bit double).
#include "fuzz_target.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace gradcomp;
  const uniform_quantizer<float> q8({.bits = 8, .block = 32});
  const uniform_quantizer<double> q4({.bits = 4, .block = 16, .round = rounding::stochastic, .seed = 9});
  const bool wide = size > 0 && (data[0] & 2u) != 0;
  if (wide) fuzz::decode_both(q4, fuzz::message_from(data, size, q4.params_hash()));
  else
    fuzz::decode_both(q8, fuzz::message_from(data, size, q8.params_hash()));
  return 0;
}
