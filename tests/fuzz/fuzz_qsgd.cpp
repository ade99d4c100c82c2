// Fuzz target: QSGD decode and decode_accumulate (8-bit codes in float, 2-bit codes in double).
#include "fuzz_target.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace gradcomp;
  const qsgd_quantizer<float> f32({.levels = 15, .bucket = 32, .seed = 3});
  const qsgd_quantizer<double> f64({.levels = 1, .bucket = 16, .seed = 9});
  const bool wide = size > 0 && (data[0] & 2u) != 0;
  if (wide) fuzz::decode_both(f64, fuzz::message_from(data, size, f64.params_hash()));
  else
    fuzz::decode_both(f32, fuzz::message_from(data, size, f32.params_hash()));
  return 0;
}
