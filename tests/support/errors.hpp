#pragma once
// Names the gradcomp::error a callable throws, so a test can CHECK it against the errc it expects
// and print both on failure.
#include <gradcomp/core/error.hpp>

#include <exception>
#include <string>

namespace gradcomp::test {

/// "errc N (name)" for an error condition.
inline std::string named(errc e) {
  return "errc " + std::to_string(static_cast<int>(e)) + " (" + std::string(to_string(e)) + ")";
}

/// `named(code)` of the gradcomp::error that `f` throws, or what happened instead.
template <class F>
std::string thrown_by(F&& f) {
  try {
    f();
  } catch (const error& e) {
    return named(e.code());
  } catch (const std::exception& e) {
    return std::string("foreign exception: ") + e.what();
  }
  return "no exception";
}

}  // namespace gradcomp::test
