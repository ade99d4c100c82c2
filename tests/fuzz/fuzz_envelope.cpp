// Fuzz target: the envelope parser and validator on arbitrary bytes.
#include "fuzz_target.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace gradcomp;
  const std::vector<std::byte> message = fuzz::message_from(data, size, 0);
  try {
    const envelope e = parse_envelope(message);
    validate_envelope(e, {e.codec, e.dtype, e.elements, e.params_hash}, {.max_elements = fuzz::max_elements});
    (void)payload_of(message);
  } catch (const error&) {
  }
  return 0;
}
