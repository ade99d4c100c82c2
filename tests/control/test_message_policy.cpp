// Per-message policies of the hybrid scheme: every ready-made policy maps every message class as
// its documentation says (tables written out here), per-class rates are honoured, and invalid
// codec descriptions are refused.
#include <gradcomp/control/message_policy.hpp>

#include <doctest/doctest.h>

#include <array>
#include <cstddef>
#include <string>

#include "support/errors.hpp"

namespace gradcomp::test {
namespace {

using kind = message_codec_kind;

// The expected codec of each class, in the order dp_gradient, tp_activation, pp_activation,
// parameter_gather, optimizer_state.
void check_mapping(const message_policy& policy, const std::array<message_codec, 5>& expected) {
  const std::array classes{message_class::dp_gradient, message_class::tp_activation, message_class::pp_activation,
                           message_class::parameter_gather, message_class::optimizer_state};
  REQUIRE(all_message_classes == classes);
  for (std::size_t i = 0; i < classes.size(); ++i) {
    CAPTURE(i);
    CHECK(policy.codec_for(classes[i]) == expected[i]);
  }
}

TEST_CASE("message_codec factories describe their codec") {
  CHECK(message_codec::uncompressed() == message_codec{kind::none, 0, 1});
  CHECK(message_codec::mpc() == message_codec{kind::mpc, 0, 1});
  CHECK(message_codec::mpc(3) == message_codec{kind::mpc, 0, 3});
  CHECK(message_codec::zfp(12) == message_codec{kind::zfp, 12, 1});
}

TEST_CASE("naive policy gives every class the same codec") {
  const message_codec z{kind::zfp, 6, 1};
  check_mapping(naive_policy(z), {{z, z, z, z, z}});
  const message_codec none{kind::none, 0, 1};
  check_mapping(naive_policy(none), {{none, none, none, none, none}});
}

TEST_CASE("mz_hybrid policy sends DP gradients with ZFP and everything else with MPC") {
  const message_codec m1{kind::mpc, 0, 1};
  check_mapping(mz_hybrid_policy(), {{{kind::zfp, 8, 1}, m1, m1, m1, m1}});
  const message_codec m4{kind::mpc, 0, 4};
  check_mapping(mz_hybrid_policy(5, 4), {{{kind::zfp, 5, 1}, m4, m4, m4, m4}});
}

TEST_CASE("z_hybrid policy uses ZFP everywhere at each class's rate") {
  const message_codec z16{kind::zfp, 16, 1};
  check_mapping(z_hybrid_policy(), {{{kind::zfp, 8, 1}, z16, z16, z16, z16}});
  check_mapping(
      z_hybrid_policy(
          {.dp_gradient = 3, .tp_activation = 5, .pp_activation = 7, .parameter_gather = 11, .optimizer_state = 13}),
      {{{kind::zfp, 3, 1}, {kind::zfp, 5, 1}, {kind::zfp, 7, 1}, {kind::zfp, 11, 1}, {kind::zfp, 13, 1}}});
}

TEST_CASE("message_policy set overrides one class only") {
  message_policy policy = z_hybrid_policy();
  policy.set(message_class::optimizer_state, message_codec::uncompressed())
      .set(message_class::tp_activation, message_codec::mpc(2));
  const message_codec z16{kind::zfp, 16, 1};
  check_mapping(policy, {{{kind::zfp, 8, 1}, {kind::mpc, 0, 2}, z16, z16, {kind::none, 0, 1}}});
}

TEST_CASE("message_codec validation refuses out-of-range and mismatched fields") {
  const std::string invalid = named(errc::invalid_argument);
  const auto validated = [](message_codec c) { return thrown_by([&] { c.validate(); }); };
  CHECK(validated(message_codec::uncompressed()) == "no exception");
  CHECK(validated(message_codec::zfp(3)) == "no exception");
  CHECK(validated(message_codec::zfp(32)) == "no exception");
  CHECK(validated(message_codec::mpc(32)) == "no exception");
  CHECK(validated(message_codec::zfp(0)) == invalid);
  CHECK(validated(message_codec::zfp(1)) == invalid);  // zfp_params: below 3 the block header does not fit
  CHECK(validated(message_codec::zfp(2)) == invalid);
  CHECK(validated(message_codec::zfp(33)) == invalid);
  CHECK(validated(message_codec::mpc(0)) == invalid);
  CHECK(validated(message_codec::mpc(33)) == invalid);
  CHECK(validated({kind::none, 8, 1}) == invalid);
  CHECK(validated({kind::mpc, 8, 1}) == invalid);
  CHECK(validated({kind::zfp, 8, 2}) == invalid);
  CHECK(validated({static_cast<kind>(7), 0, 1}) == invalid);
}

TEST_CASE("message policies refuse invalid codecs and leave the policy unchanged") {
  const std::string invalid = named(errc::invalid_argument);
  CHECK(thrown_by([] { (void)naive_policy(message_codec::zfp(0)); }) == invalid);
  CHECK(thrown_by([] { (void)mz_hybrid_policy(40); }) == invalid);
  CHECK(thrown_by([] { (void)mz_hybrid_policy(8, 0); }) == invalid);
  CHECK(thrown_by([] { (void)z_hybrid_policy({.pp_activation = 0}); }) == invalid);
  message_policy policy = mz_hybrid_policy();
  CHECK(thrown_by([&] { policy.set(message_class::pp_activation, message_codec::zfp(64)); }) == invalid);
  CHECK(policy.codec_for(message_class::pp_activation) == message_codec::mpc());
  CHECK(thrown_by([&] { (void)policy.codec_for(static_cast<message_class>(5)); }) == invalid);
}

}  // namespace
}  // namespace gradcomp::test
