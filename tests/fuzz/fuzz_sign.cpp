// Fuzz target: sign quantizer decode and decode_accumulate (float and double).
#include "fuzz_target.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace gradcomp;
  const sign_quantizer<float> f32({.block = 32});
  const sign_quantizer<double> f64({.block = 16});
  const bool wide = size > 0 && (data[0] & 2u) != 0;
  if (wide) fuzz::decode_both(f64, fuzz::message_from(data, size, f64.params_hash()));
  else
    fuzz::decode_both(f32, fuzz::message_from(data, size, f32.params_hash()));
  return 0;
}
