#pragma once
/// @file
/// The host executor: codecs given a `cpu_executor` run their CPU reference implementation on the
/// calling thread, in memory the caller owns.

#include <string_view>

namespace gradcomp {

/// Runs codecs on the calling CPU thread. Stateless and cheap to copy; two instances behave
/// identically (same inputs and keys give the same bytes).
struct cpu_executor {
  /// Backend name used in benchmark records and messages.
  static constexpr std::string_view name = "cpu";
};

}  // namespace gradcomp
