// The exceptions loom throws. Each says what was wrong and what is accepted,
// so callers can catch by kind (configuration, data, checkpoint) or all of them.
#pragma once

#include <stdexcept>
#include <string>

namespace loom {

// A policy, option or device string that cannot work as given.
struct configuration_error : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

// A dataset file that is missing or malformed.
struct data_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A checkpoint that cannot be written or read back; in-memory state is unchanged.
struct checkpoint_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A call that the state things are in does not allow (backward through a
// module whose set-up was destroyed, say); nothing was changed by it.
struct usage_error : std::logic_error {
  using std::logic_error::logic_error;
};

// A collective or rendezvous that failed because a peer went away, did not
// answer within the timeout, or could not be reached. The process group is
// unusable afterwards: every later collective on it throws at once.
struct peer_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace loom
