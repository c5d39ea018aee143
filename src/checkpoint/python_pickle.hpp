// What LibTorch 1.13's unpickler needs done to a pickle Python wrote before it
// can read it. Internal to src/checkpoint.
#pragma once

#include <string>
#include <vector>

namespace loom::detail {

struct pickle_fixup {
  std::vector<char> pickle;      // the rewritten pickle
  bool has_ordered_dict = false;  // a non-empty collections.OrderedDict (a Python state_dict())
  int protocol = 0;               // the PROTO opcode's; LibTorch 1.13 reads 2 (torch.save's default)
};

// LibTorch 1.13 lacks the APPEND and SETITEM opcodes, which Python emits for a
// one-element list and a one-key dict: each becomes MARK ... APPENDS or
// MARK ... SETITEMS (the MARK placed where the appended item's opcodes
// start), and FRAME opcodes are dropped (their lengths would no longer hold).
// Also reports an OrderedDict that receives items, which the unpickler
// cannot build. Throws std::runtime_error on a malformed pickle.
pickle_fixup fix_python_pickle(const std::vector<char>& pickle);

}  // namespace loom::detail
