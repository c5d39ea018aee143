// Where a fit stands: what a checkpoint records so a resumed fit continues
// at the same batch of the same epoch (saved as the entry "loop").
#pragma once

#include <loom/errors.hpp>

#include <ATen/core/ivalue.h>

#include <cstdint>
#include <string>

namespace loom::detail {

struct fit_progress {
  std::int64_t epoch = 0;           // epochs finished
  std::int64_t batch_in_epoch = 0;  // batches of the current epoch done (at a window boundary when saved)
  std::int64_t global_step = 0;     // optimizer steps taken

  c10::IValue state_dict() const {
    c10::impl::GenericDict dict(c10::StringType::get(), c10::AnyType::get());
    dict.insert("epoch", epoch);
    dict.insert("batch_in_epoch", batch_in_epoch);
    dict.insert("global_step", global_step);
    return dict;
  }
  void load_state_dict(const c10::IValue& state) {
    if (!state.isGenericDict()) throw checkpoint_error("loop: the saved progress is not a dict");
    const auto dict = state.toGenericDict();
    for (const char* key : {"epoch", "batch_in_epoch", "global_step"}) {
      if (!dict.contains(key) || !dict.at(key).isInt()) {
        throw checkpoint_error(std::string("loop: the saved progress has no integer '") + key + "'");
      }
    }
    epoch = dict.at("epoch").toInt();
    batch_in_epoch = dict.at("batch_in_epoch").toInt();
    global_step = dict.at("global_step").toInt();
  }
};

}  // namespace loom::detail
