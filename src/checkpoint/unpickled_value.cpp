#include "unpickled_value.hpp"

#include <unordered_set>
#include <utility>
#include <vector>

namespace loom::detail {

namespace {

bool is_container(const c10::IValue& value) { return value.isList() || value.isGenericDict() || value.isTuple(); }

std::string place_key(const c10::IValue& key) {
  if (key.isString()) return "'" + key.toStringRef() + "'";
  if (key.isInt()) return std::to_string(key.toInt());
  return "(key)";
}

}  // namespace

std::optional<std::string> walk_unpickled(const c10::IValue& root,
                                          const std::function<void(const c10::IValue&, const std::string&)>& visit) {
  // Depth-first with an explicit stack; a container is on the path from
  // its entry to its exit, and done after it.
  struct step {
    const c10::IValue* value;
    std::string place;
    int depth;
    bool exit;
  };
  std::vector<step> pending{{&root, "", 0, false}};
  std::unordered_set<const void*> on_path, done;
  while (!pending.empty()) {
    step current = std::move(pending.back());
    pending.pop_back();
    const c10::IValue& value = *current.value;
    const std::string where = current.place.empty() ? "the root" : current.place;
    if (!is_container(value)) {
      visit(value, where);
      continue;
    }
    const void* self = value.internalToPointer();
    if (current.exit) {
      on_path.erase(self);
      done.insert(self);
      continue;
    }
    if (on_path.count(self) != 0) return "the container at " + where + " contains itself";
    if (done.count(self) != 0) continue;  // shared, and already walked
    if (current.depth >= unpickled_depth_limit) {
      return "containers nest deeper than " + std::to_string(unpickled_depth_limit) + " levels (at " + where + ")";
    }
    on_path.insert(self);
    pending.push_back({current.value, current.place, current.depth, true});
    const int inner = current.depth + 1;
    if (value.isGenericDict()) {
      for (const auto& entry : value.toGenericDict()) {
        const std::string key = place_key(entry.key());
        pending.push_back({&entry.value(), current.place.empty() ? key : current.place + "[" + key + "]", inner, false});
      }
    } else if (value.isList()) {
      const auto& list = value.toListRef();
      for (std::size_t i = 0; i < list.size(); ++i) {
        pending.push_back({&list[i], current.place + "[" + std::to_string(i) + "]", inner, false});
      }
    } else {
      const auto& elements = value.toTupleRef().elements();
      for (std::size_t i = 0; i < elements.size(); ++i) {
        pending.push_back({&elements[i], current.place + "[" + std::to_string(i) + "]", inner, false});
      }
    }
  }
  return std::nullopt;
}

void dismantle(c10::IValue value) {
  std::vector<c10::IValue> pending;
  pending.push_back(std::move(value));
  while (!pending.empty()) {
    c10::IValue current = std::move(pending.back());
    pending.pop_back();
    if (current.isList()) {
      auto list = current.toList();
      for (std::size_t i = 0; i < list.size(); ++i) pending.push_back(list.get(i));
      list.clear();
    } else if (current.isGenericDict()) {
      auto dict = current.toGenericDict();
      for (const auto& entry : dict) pending.push_back(entry.value());
      dict.clear();
    } else if (current.isTuple()) {
      auto tuple = current.toTuple();
      for (std::size_t i = 0; i < tuple->elements().size(); ++i) {
        pending.push_back(tuple->elements()[i]);
        tuple->unsafeSetElement(i, c10::IValue());
      }
    }
    // current now holds nothing nested: its destructor does not recurse.
  }
}

}  // namespace loom::detail
