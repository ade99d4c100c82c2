// Fuzz target: MPC lossless codec decode and decode_accumulate (dimensionality 1 and 3).
#include "fuzz_target.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace gradcomp;
  const mpc_codec d1({.dim = 1});
  const mpc_codec d3({.dim = 3});
  const bool three = size > 0 && (data[0] & 2u) != 0;
  if (three) fuzz::decode_both(d3, fuzz::message_from(data, size, d3.params_hash()));
  else
    fuzz::decode_both(d1, fuzz::message_from(data, size, d1.params_hash()));
  return 0;
}
