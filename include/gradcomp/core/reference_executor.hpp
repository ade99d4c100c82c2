#pragma once
/// @file
/// The reference executor: codecs given a `reference_executor` run their specification, the
/// plain scalar code of `include/gradcomp/reference/`, on the calling thread in host memory.
///
/// gradcomp has three tiers (docs/design.md §3): the reference, written to be read (one loop per
/// step of the algorithm as docs/ describes it, no intrinsics, no prefetching, no unrolling); the
/// `cpu_executor` backends, fast on the host; the `cuda_executor` backends, fast on the GPU. The
/// fast tiers write the same bytes as the reference for the same inputs and keys, and decode to
/// the same bits; the tests check that. Use it to read what a codec does, or to check a kernel of
/// your own against it. Its speed does not matter.

#include <string_view>

#include <gradcomp/core/memory_space.hpp>

namespace gradcomp {

/// Runs codecs' reference backends on the calling CPU thread, in memory the caller owns. It has
/// no settings: there is one way to compute each result.
struct reference_executor {
  /// Backend name used in benchmark records and messages.
  static constexpr std::string_view name = "reference";
  /// Gradients, messages and workspace are host memory.
  static constexpr memory_space memory = memory_space::host;
};

}  // namespace gradcomp
