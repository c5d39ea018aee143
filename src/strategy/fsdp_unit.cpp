// The unit's state moves (fsdp_unit.hpp).
#include "fsdp_unit.hpp"

#include <stdexcept>

namespace loom::detail {

const char* to_string(training_state state) noexcept {
  switch (state) {
    case training_state::idle: return "idle";
    case training_state::forward: return "forward";
    case training_state::backward: return "backward";
    case training_state::reduced: return "reduced";
  }
  return "?";
}

const char* to_string(sharded_state state) noexcept {
  switch (state) {
    case sharded_state::sharded: return "sharded";
    case sharded_state::gathering: return "gathering";
    case sharded_state::gathered: return "gathered";
    case sharded_state::unsharded: return "unsharded";
  }
  return "?";
}

namespace {

template <class State>
[[noreturn]] void refuse_move(const sharded_unit& unit, const char* kind, State from, State to, State now) {
  throw std::logic_error(std::string("loom fsdp (a bug in loom, please report it): unit '") +
                         (unit.name.empty() ? "<root>" : unit.name) + "' asked to move its " + kind + " state " +
                         to_string(from) + " -> " + to_string(to) + " while it is " + to_string(now));
}

}  // namespace

void move_training(sharded_unit& unit, training_state from, training_state to) {
  if (unit.training != from) refuse_move(unit, "training", from, to, unit.training);
  unit.training = to;
}

void move_sharded(sharded_unit& unit, sharded_state from, sharded_state to) {
  if (unit.sharding != from) refuse_move(unit, "sharded", from, to, unit.sharding);
  unit.sharding = to;
}

}  // namespace loom::detail
