// The concepts of docs/design.md §2, checked at compile time: the shipped sparsifiers model codec_for
// and sparsifier on cpu_executor, only random-k is homomorphic, and the controller, stateful and
// executor concepts accept and reject test-local types as their definitions say.

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include <gradcomp/core/concepts.hpp>
#include <gradcomp/core/cpu_executor.hpp>
#include <gradcomp/sparsify/randomk.hpp>
#include <gradcomp/sparsify/threshold.hpp>
#include <gradcomp/sparsify/topk.hpp>

namespace {

using gradcomp::cpu_executor;

// ---- controllers -------------------------------------------------------------------------------
struct mock_controller {
  struct parameters {
    double density = 0.01;
  };
  parameters next(const gradcomp::round_stats& stats) {
    last_step = stats.step;
    return {0.5};
  }
  std::uint64_t last_step = 0;
};

struct controller_without_parameters {
  double next(const gradcomp::round_stats&) { return 0.0; }
};

struct controller_returning_other_type {
  struct parameters {};
  int next(const gradcomp::round_stats&) { return 0; }
};

// ---- stateful components -----------------------------------------------------------------------
struct mock_stateful {
  using state_type = std::vector<float>;
  state_type make_state(const cpu_executor&, std::uint64_t n) const { return state_type(n); }
  std::size_t save_state(const cpu_executor&, state_type& state, std::span<std::byte>) const {
    return state.size() * sizeof(float);
  }
  void load_state(const cpu_executor&, std::span<const std::byte>, state_type&) const {}
};

struct stateful_without_save {
  using state_type = std::vector<float>;
  state_type make_state(const cpu_executor&, std::uint64_t n) const { return state_type(n); }
  void load_state(const cpu_executor&, std::span<const std::byte>, state_type&) const {}
};

struct stateful_with_wrong_make_state {
  using state_type = std::vector<float>;
  std::vector<double> make_state(const cpu_executor&, std::uint64_t n) const { return std::vector<double>(n); }
  std::size_t save_state(const cpu_executor&, state_type&, std::span<std::byte>) const { return 0; }
  void load_state(const cpu_executor&, std::span<const std::byte>, state_type&) const {}
};

// ---- executors ---------------------------------------------------------------------------------
struct named_executor {
  static constexpr std::string_view name = "mock";
};

struct unnamed_executor {};

struct move_only_executor {
  static constexpr std::string_view name = "move-only";
  move_only_executor() = default;
  move_only_executor(move_only_executor&&) = default;
  move_only_executor& operator=(move_only_executor&&) = default;
  move_only_executor(const move_only_executor&) = delete;
  move_only_executor& operator=(const move_only_executor&) = delete;
};

// ---- codecs ------------------------------------------------------------------------------------
// Size contract only: a codec, but not one that runs anywhere.
struct size_only_codec {
  using value_type = float;
  static constexpr gradcomp::codec_id id = gradcomp::codec_id::topk;
  std::size_t max_encoded_bytes(std::uint64_t n) const { return static_cast<std::size_t>(n); }
  std::uint64_t params_hash() const { return 0; }
};

struct codec_without_hash {
  using value_type = float;
  static constexpr gradcomp::codec_id id = gradcomp::codec_id::topk;
  std::size_t max_encoded_bytes(std::uint64_t n) const { return static_cast<std::size_t>(n); }
};

}  // namespace

TEST_CASE("the shipped sparsifiers are codecs that run on cpu_executor") {
  static_assert(gradcomp::codec_for<gradcomp::topk_sparsifier<float>, cpu_executor>);
  static_assert(gradcomp::codec_for<gradcomp::topk_sparsifier<double>, cpu_executor>);
  static_assert(gradcomp::codec_for<gradcomp::threshold_sparsifier<float>, cpu_executor>);
  static_assert(gradcomp::codec_for<gradcomp::threshold_sparsifier<double>, cpu_executor>);
  static_assert(gradcomp::codec_for<gradcomp::randomk_sparsifier<float>, cpu_executor>);
  static_assert(gradcomp::codec_for<gradcomp::randomk_sparsifier<double>, cpu_executor>);
  CHECK(gradcomp::codec_for<gradcomp::topk_sparsifier<float>, cpu_executor>);
}

TEST_CASE("the shipped sparsifiers model sparsifier") {
  static_assert(gradcomp::sparsifier<gradcomp::topk_sparsifier<float>>);
  static_assert(gradcomp::sparsifier<gradcomp::topk_sparsifier<double>>);
  static_assert(gradcomp::sparsifier<gradcomp::threshold_sparsifier<float>>);
  static_assert(gradcomp::sparsifier<gradcomp::randomk_sparsifier<float>>);
  static_assert(!gradcomp::sparsifier<size_only_codec>);
  CHECK(gradcomp::sparsifier<gradcomp::randomk_sparsifier<float>>);
}

TEST_CASE("random-k is homomorphic, top-k and threshold are not") {
  static_assert(gradcomp::homomorphic<gradcomp::randomk_sparsifier<float>, cpu_executor>);
  static_assert(gradcomp::homomorphic<gradcomp::randomk_sparsifier<double>, cpu_executor>);
  static_assert(!gradcomp::homomorphic<gradcomp::topk_sparsifier<float>, cpu_executor>);
  static_assert(!gradcomp::homomorphic<gradcomp::threshold_sparsifier<float>, cpu_executor>);
  CHECK_FALSE(gradcomp::homomorphic<gradcomp::topk_sparsifier<float>, cpu_executor>);
}

TEST_CASE("codec requires the whole size contract and codec_for requires an executor and the operations") {
  static_assert(gradcomp::codec<size_only_codec>);
  static_assert(!gradcomp::codec<codec_without_hash>);
  static_assert(!gradcomp::codec<int>);
  static_assert(!gradcomp::codec_for<size_only_codec, cpu_executor>);
  static_assert(!gradcomp::codec_for<gradcomp::topk_sparsifier<float>, unnamed_executor>);
  CHECK_FALSE(gradcomp::codec<codec_without_hash>);
}

TEST_CASE("executor accepts copyable types with a name and rejects the others") {
  static_assert(gradcomp::executor<cpu_executor>);
  static_assert(gradcomp::executor<named_executor>);
  static_assert(!gradcomp::executor<unnamed_executor>);
  static_assert(!gradcomp::executor<move_only_executor>);
  static_assert(!gradcomp::executor<int>);
  CHECK(cpu_executor::name == "cpu");
  CHECK(named_executor::name == "mock");
  // Rejected for being move-only, not for lacking a name.
  CHECK(move_only_executor::name == "move-only");
}

TEST_CASE("controller accepts a type with parameters and next(round_stats), and rejects int") {
  static_assert(gradcomp::controller<mock_controller>);
  static_assert(!gradcomp::controller<int>);
  static_assert(!gradcomp::controller<controller_without_parameters>);
  static_assert(!gradcomp::controller<controller_returning_other_type>);
  // The mock is a real controller, not just a declaration.
  mock_controller k;
  gradcomp::round_stats stats;
  stats.step = 12;
  CHECK(k.next(stats).density == 0.5);
  CHECK(k.last_step == 12);
}

TEST_CASE("stateful requires make_state, save_state and load_state with the documented types") {
  static_assert(gradcomp::stateful<mock_stateful, cpu_executor>);
  static_assert(!gradcomp::stateful<stateful_without_save, cpu_executor>);
  static_assert(!gradcomp::stateful<stateful_with_wrong_make_state, cpu_executor>);
  static_assert(!gradcomp::stateful<mock_stateful, unnamed_executor>);
  CHECK_FALSE(gradcomp::stateful<stateful_without_save, cpu_executor>);
}

TEST_CASE("round_stats starts zeroed") {
  const gradcomp::round_stats stats{};
  CHECK(stats.step == 0);
  CHECK(stats.dense_bytes == 0);
  CHECK(stats.sent_bytes == 0);
  CHECK(stats.gradient_norm2 == 0.0);
  CHECK(stats.compressed_norm2 == 0.0);
  CHECK(stats.seconds == 0.0);
  CHECK(stats.samples == 0);
}
