#pragma once
/// @file
/// The check a decoder with a 16-bit output makes before its first write (docs/half-precision.md
/// §3): a result that would round to ±Inf in the output's type is `narrowing_overflow`, so that the
/// output is left untouched.

#include <cstdint>
#include <string>

#include <gradcomp/core/error.hpp>
#include <gradcomp/core/float_bits.hpp>

namespace gradcomp::detail {

/// Throws `narrowing_overflow` naming element i and its result v unless v narrows to a finite O.
/// @throws error `narrowing_overflow`.
template <gradient_value O>
void require_narrows(std::uint64_t i, float v) {
  require(narrows_finite<O>(v), errc::narrowing_overflow, [&] {
    return "the result at element " + std::to_string(i) + " (" + std::to_string(v) +
           ") is beyond the 16-bit output's range";
  });
}

}  // namespace gradcomp::detail
