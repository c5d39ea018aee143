// loom's walk of a checkpoint's pickle before LibTorch's unpickler reads
// it: the pre-validator for pickles from outside, and the rewrite LibTorch
// 1.13 needs of the pickles Python writes. Internal to src/checkpoint.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace loom::detail {

// Containers nested deeper than this are refused (a state dict of optimizer
// state is about 6 deep); the same limit holds for the unpickled value.
inline constexpr int pickle_depth_limit = 1000;

// The values a pickle decodes to, a shared one counted each time it is
// used, may not exceed this many per byte of the pickle (honest pickles
// decode to at most about 2: each opcode pushes at most one value).
inline constexpr std::uint64_t pickle_amplification_limit = 16;

class structure_budget;

struct pickle_fixup {
  std::optional<std::vector<char>> rewritten;  // the rewritten pickle; none when it reads as it is
  bool has_ordered_dict = false;  // a non-empty collections.OrderedDict (a Python state_dict())
  int protocol = 0;               // the PROTO opcode's; LibTorch 1.13 reads 2 (torch.save's default)
};

// Simulates the pickle's stack over its opcodes and refuses, with a
// std::runtime_error that names the byte:
// - a global outside the list loom resolves (`resolved_globals_text`), and
//   globals named by the copyreg extension registry (EXT1/2/4);
// - containers nested deeper than pickle_depth_limit, or more MARKs open;
// - a memo index larger than the pickle could use;
// - a container changed after the pickle fetched it again (from the memo or
//   by DUP): that is how a pickle builds a container that contains itself,
//   or grows one already counted many times;
// - more decoded values than pickle_amplification_limit per byte;
// - truncated arguments, unknown opcodes, pops of an empty stack or a MARK.
// Then rewrites it for LibTorch 1.13, which lacks the APPEND and SETITEM
// opcodes Python emits for a one-element list and a one-key dict: each
// becomes MARK ... APPENDS or MARK ... SETITEMS (the MARK placed where the
// appended item's opcodes start), and FRAME opcodes are dropped (their
// lengths would no longer hold). Also reports an OrderedDict that receives
// items, which the unpickler cannot build.
//
// And checks every tensor the pickle rebuilds (torch._utils._rebuild_tensor_v2)
// before LibTorch builds it: its persistent id names a record the archive
// holds (record_bytes(key): the size of record data/<key>, nullopt when
// there is none), its storage's numel times its type's element size fits
// in that record, and its view (offset, sizes, strides) lies inside its
// storage.
//
// What the walk keeps is charged to budget (structure_budget.hpp): a pickle
// that needs more is refused when it gets there. The second form uses a
// budget of its own.
using record_size = std::function<std::optional<std::uint64_t>(std::string_view key)>;
pickle_fixup validate_and_fix_pickle(std::string_view pickle, const record_size& record_bytes,
                                     structure_budget& budget);
pickle_fixup validate_and_fix_pickle(std::string_view pickle, const record_size& record_bytes);

// The globals loom resolves, as a sentence for error messages and docs.
extern const char* const resolved_globals_text;

}  // namespace loom::detail
