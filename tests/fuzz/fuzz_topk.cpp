// Fuzz target: top-k decode and decode_accumulate (float, double, and bf16 and fp16 into their own
// type and into float32), i.e. the sparse payload parser with every index coding; bits 1-2 of the
// first byte choose the decoder.
#include "fuzz_target.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace gradcomp;
  const topk_sparsifier<float> f32(sparsity{.k = 10});
  const topk_sparsifier<double> f64(sparsity{.k = 40});
  const topk_sparsifier<bf16> b16(sparsity{.k = 10});
  const topk_sparsifier<fp16> h16(sparsity{.k = 40});
  switch (size > 0 ? (data[0] >> 1) & 3u : 0u) {
    case 0: fuzz::decode_both(f32, fuzz::message_from(data, size, f32.params_hash())); break;
    case 1: fuzz::decode_both(f64, fuzz::message_from(data, size, f64.params_hash())); break;
    case 2: fuzz::decode_both_outputs(b16, fuzz::message_from(data, size, b16.params_hash())); break;
    default: fuzz::decode_both_outputs(h16, fuzz::message_from(data, size, h16.params_hash())); break;
  }
  return 0;
}
