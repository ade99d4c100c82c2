#pragma once
/// @file
/// The deadline of one compressed collective call (docs/transports.md §8): the call's options carry
/// a `timeout` (`default_collective_timeout`, or `infinite_timeout`); the call sets its transport's
/// deadline to that timeout from its start, for every transport call it makes, and gives the
/// previous deadline back when it ends. A deadline the caller set on the transport that passes
/// earlier is kept. The transport's timeouts and failures are rethrown naming the collective and
/// its key, so a survivor's error says which call, step and tensor stopped.
///
/// A transport without deadlines (a user's own, not modelling `transport_with_deadline`) waits as
/// long as its library does: the timeout has no effect on it.

#include <chrono>
#include <optional>
#include <string>
#include <utility>

#include <gradcomp/core/error.hpp>
#include <gradcomp/core/wire_envelope.hpp>
#include <gradcomp/transport/deadline.hpp>
#include <gradcomp/transport/transport.hpp>

namespace gradcomp::detail {

/// Sets transport `t`'s deadline to `timeout` from now (or keeps an earlier one) while it lives,
/// and restores the previous one when it ends. Does nothing for a transport without deadlines.
template <transport X>
class deadline_scope {
 public:
  /// @throws error `invalid_argument` for a negative timeout (before anything is sent).
  deadline_scope(X& t, std::chrono::milliseconds timeout) : t_(t) {
    const deadline mine = deadline::after(timeout);
    if constexpr (transport_with_deadline<X>) {
      previous_ = t_.current_deadline();
      t_.set_deadline(earlier(previous_, mine));
    }
  }
  ~deadline_scope() {
    if constexpr (transport_with_deadline<X>) t_.set_deadline(previous_);
  }
  deadline_scope(const deadline_scope&) = delete;
  deadline_scope& operator=(const deadline_scope&) = delete;

 private:
  X& t_;
  deadline previous_{};
};

/// Runs `body` (one collective call named `where`, with `key` where it has one) under the deadline
/// `timeout` from now on `t`, and rethrows a `timeout` or `transport_failed` of the transport as
/// "`where` (step S, tensor T): <the transport's detail>". Every other error passes unchanged (the
/// collectives' own errors already name them).
template <transport X, class Body>
decltype(auto) within_deadline(X& t, std::chrono::milliseconds timeout, const char* where,
                               std::optional<message_key> key, Body&& body) {
  const deadline_scope<X> scope(t, timeout);
  try {
    return std::forward<Body>(body)();
  } catch (const error& e) {
    if (e.code() != errc::timeout && e.code() != errc::transport_failed) throw;
    std::string named = where;
    if (key) named += " (step " + std::to_string(key->step) + ", tensor " + std::to_string(key->tensor_id) + ")";
    fail(e.code(), named + ": " + std::string(e.detail_text()));
  }
}

}  // namespace gradcomp::detail
