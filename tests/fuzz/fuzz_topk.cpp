// Fuzz target: top-k decode and decode_accumulate (float and double), i.e. the sparse payload
// parser with every index coding.
#include "fuzz_target.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace gradcomp;
  const topk_sparsifier<float> f32(sparsity{.k = 10});
  const topk_sparsifier<double> f64(sparsity{.k = 40});
  const bool wide = size > 0 && (data[0] & 2u) != 0;
  if (wide) fuzz::decode_both(f64, fuzz::message_from(data, size, f64.params_hash()));
  else
    fuzz::decode_both(f32, fuzz::message_from(data, size, f32.params_hash()));
  return 0;
}
