#pragma once
/// @file
/// The customisation point that connects an algorithm (what it means) to an executor (how it runs).

#include <type_traits>

namespace gradcomp {

/// `backend<Codec, Executor>` holds the static functions that run `Codec` on `Executor`; each
/// backend folder (`cpu/`, `cuda/`) specialises it. The primary template is never defined usefully.
template <class Codec, class Executor>
struct backend {
  static_assert(!std::is_same_v<Codec, Codec>,
                "gradcomp has no implementation of this codec for this executor; for cuda_executor, "
                "include <gradcomp/cuda.cuh> from a .cu file");
};

}  // namespace gradcomp
