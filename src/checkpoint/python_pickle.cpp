// Rewrites Python pickles for LibTorch 1.13's unpickler: a walk over the
// opcodes that simulates the stack, keeping for each item the offset where
// the opcodes that built it start, so MARK can be inserted there.
#include "python_pickle.hpp"
#include "file_bytes.hpp"

#include <cstdint>
#include <cstring>
#include <map>
#include <stdexcept>
#include <string>
#include <string_view>

namespace loom::detail {
namespace {

enum class tag : std::uint8_t { none, mark, ordered_dict_class, ordered_dict, string_collections, string_ordered_dict };

struct item {
  std::size_t start;
  tag kind = tag::none;
};

class walker {
 public:
  explicit walker(const std::vector<char>& pickle) : data_(pickle.data()), size_(pickle.size()) {}

  pickle_fixup run() {
    pickle_fixup result;
    std::size_t at = 0;
    bool stopped = false;
    while (at < size_ && !stopped) {
      const std::size_t op_at = at;
      const auto op = static_cast<unsigned char>(data_[at++]);
      switch (op) {
        // ------------------------------------------------ push one item, no argument
        case 'N': case 0x88: case 0x89: case '}': case ']': case ')': case 0x8f:
          push(op_at);
          break;
        // ------------------------------------------------ push, fixed-size argument
        case 'K': at += 1; push(op_at); break;                       // BININT1
        case 'M': at += 2; push(op_at); break;                       // BININT2
        case 'J': at += 4; push(op_at); break;                       // BININT
        case 'G': at += 8; push(op_at); break;                       // BINFLOAT
        case 0x82: at += 1; push(op_at); break;                      // EXT1
        case 0x83: at += 2; push(op_at); break;                      // EXT2
        case 0x84: at += 4; push(op_at); break;                      // EXT4
        case 'h': at += 1; push_memo(op_at, little_endian(need(at - 1, 1), 1)); break;  // BINGET
        case 'j': at += 4; push_memo(op_at, little_endian(need(at - 4, 4), 4)); break;  // LONG_BINGET
        // ------------------------------------------------ push, length-prefixed argument
        case 'U': case 'C': case 0x8a: at = skip_counted(at, 1, op_at, op == 0x8a ? false : true); break;
        case 'T': case 'B': case 0x8b: case 'X': at = skip_counted(at, 4, op_at, op == 'X'); break;
        case 0x8c: at = skip_counted(at, 1, op_at, true); break;      // SHORT_BINUNICODE
        case 0x8d: case 0x8e: case 0x96: at = skip_counted(at, 8, op_at, op == 0x8d); break;
        // ------------------------------------------------ push, newline-terminated argument
        case 'I': case 'L': case 'F': case 'S': case 'V': case 'P':
          at = skip_line(at);
          push(op_at);
          break;
        case 'g': {  // GET
          const std::size_t end = skip_line(at);
          push_memo(op_at, std::stoull(std::string(data_ + at, end - at - 1)));
          at = end;
          break;
        }
        case 'c': {  // GLOBAL module\nname\n
          const std::size_t module_end = skip_line(at);
          const std::size_t name_end = skip_line(module_end);
          const std::string_view module(data_ + at, module_end - at - 1);
          const std::string_view name(data_ + module_end, name_end - module_end - 1);
          push(op_at, module == "collections" && name == "OrderedDict" ? tag::ordered_dict_class : tag::none);
          at = name_end;
          break;
        }
        // ------------------------------------------------ memo writes: no stack change
        case 'q': at += 1; memo_[memo_index(little_endian(need(at - 1, 1), 1), op_at)] = top().kind; break;  // BINPUT
        case 'r': at += 4; memo_[memo_index(little_endian(need(at - 4, 4), 4), op_at)] = top().kind; break;  // LONG_BINPUT
        case 'p': {  // PUT
          const std::size_t end = skip_line(at);
          memo_[memo_index(std::stoull(std::string(data_ + at, end - at - 1)), op_at)] = top().kind;
          at = end;
          break;
        }
        case 0x94: memo_[memo_index(memo_count_++, op_at)] = top().kind; break;  // MEMOIZE
        // ------------------------------------------------ structure
        case '(': stack_.push_back({op_at, tag::mark}); break;  // MARK
        case '0': pop(); break;                                  // POP
        case '1': pop_to_mark(); break;                          // POP_MARK
        case '2': push(op_at, top().kind); break;                // DUP
        case 'R': {  // REDUCE: callable, args -> result
          pop();
          const item callable = pop();
          push(callable.start, callable.kind == tag::ordered_dict_class ? tag::ordered_dict : tag::none);
          break;
        }
        case 0x81: { pop(); const item cls = pop(); push(cls.start); break; }  // NEWOBJ
        case 0x92: { pop(); pop(); const item cls = pop(); push(cls.start); break; }  // NEWOBJ_EX
        case 0x93: {  // STACK_GLOBAL: module, name -> global
          const item name = pop();
          const item module = pop();
          const bool ordered = module.kind == tag::string_collections && name.kind == tag::string_ordered_dict;
          push(module.start, ordered ? tag::ordered_dict_class : tag::none);
          break;
        }
        case 'Q': { const item pid = pop(); push(pid.start); break; }  // BINPERSID
        case 'b': {  // BUILD: object, state -> object
          pop();
          if (top().kind == tag::ordered_dict) result.has_ordered_dict = true;
          break;
        }
        case 't': case 'l': case 'd': case 0x91: case 'o': {  // TUPLE LIST DICT FROZENSET OBJ
          const std::size_t mark = pop_to_mark();
          push(mark);
          break;
        }
        case 'i': {  // INST module\nname\n
          at = skip_line(skip_line(at));
          const std::size_t mark = pop_to_mark();
          push(mark);
          break;
        }
        case 0x85: { const item a = pop(); push(a.start); break; }                           // TUPLE1
        case 0x86: { pop(); const item a = pop(); push(a.start); break; }                    // TUPLE2
        case 0x87: { pop(); pop(); const item a = pop(); push(a.start); break; }             // TUPLE3
        case 'e': case 0x90: pop_to_mark(); break;  // APPENDS ADDITEMS
        case 'u':                                   // SETITEMS
          pop_to_mark();
          if (top().kind == tag::ordered_dict) result.has_ordered_dict = true;
          break;
        case 'a': {  // APPEND: list, value -> list
          const item value = pop();
          ++marks_before_[value.start];
          replace_[op_at] = 'e';
          break;
        }
        case 's': {  // SETITEM: dict, key, value -> dict
          pop();
          const item key = pop();
          ++marks_before_[key.start];
          replace_[op_at] = 'u';
          if (top().kind == tag::ordered_dict) result.has_ordered_dict = true;
          break;
        }
        case 0x80:  // PROTO
          at += 1;
          result.protocol = static_cast<int>(static_cast<unsigned char>(*need(at - 1, 1)));
          break;
        case 0x95: at += 8; dropped_[op_at] = 9; break;  // FRAME: dropped
        case 0x97: case 0x98: break;                     // NEXT_BUFFER READONLY_BUFFER (protocol 5)
        case '.': stopped = true; break;                 // STOP
        default:
          throw std::runtime_error("unknown pickle opcode 0x" + hex(op) + " at byte " + std::to_string(op_at));
      }
      if (at > size_) throw std::runtime_error("the pickle ends inside an opcode's argument");
    }
    if (!stopped) throw std::runtime_error("the pickle has no STOP opcode (truncated)");
    result.pickle = rewrite(at);
    return result;
  }

 private:
  static std::string hex(unsigned value) {
    static const char digits[] = "0123456789abcdef";
    return {digits[(value >> 4) & 0xF], digits[value & 0xF]};
  }

  // (No sum that could wrap: a length comes from the file.)
  const char* need(std::size_t at, std::uint64_t bytes) const {
    if (at > size_ || bytes > size_ - at) throw std::runtime_error("the pickle ends inside an opcode's argument");
    return data_ + at;
  }

  // LibTorch's unpickler grows its memo table to the index a PUT names: a
  // forged index of 2^32 would allocate 64 GiB. An honest pickle numbers
  // its memo entries from 0, so an index is always below its length.
  std::uint64_t memo_index(std::uint64_t index, std::size_t op_at) const {
    if (index >= size_) {
      throw std::runtime_error("memo index " + std::to_string(index) + " at byte " + std::to_string(op_at) +
                               " is larger than a pickle of " + std::to_string(size_) +
                               " bytes can use (a forged file: the unpickler would allocate that many entries)");
    }
    return index;
  }

  std::size_t skip_line(std::size_t at) const {
    const void* newline = at < size_ ? std::memchr(data_ + at, '\n', size_ - at) : nullptr;
    if (newline == nullptr) throw std::runtime_error("the pickle ends inside a text argument");
    return static_cast<std::size_t>(static_cast<const char*>(newline) - data_) + 1;
  }

  // A length-prefixed argument; strings are remembered when they spell
  // "collections" or "OrderedDict" (protocol 4's STACK_GLOBAL arguments).
  std::size_t skip_counted(std::size_t at, int length_bytes, std::size_t op_at, bool is_text) {
    const std::uint64_t length = little_endian(need(at, static_cast<std::size_t>(length_bytes)), length_bytes);
    at += static_cast<std::size_t>(length_bytes);
    need(at, length);
    tag kind = tag::none;
    if (is_text) {
      const std::string_view text(data_ + at, length);
      if (text == "collections") kind = tag::string_collections;
      else if (text == "OrderedDict") kind = tag::string_ordered_dict;
    }
    push(op_at, kind);
    return at + length;
  }

  void push(std::size_t start, tag kind = tag::none) { stack_.push_back({start, kind}); }
  void push_memo(std::size_t start, std::uint64_t index) {
    auto it = memo_.find(index);
    push(start, it == memo_.end() ? tag::none : it->second);
  }
  const item& top() const {
    if (stack_.empty()) throw std::runtime_error("the pickle pops an empty stack");
    return stack_.back();
  }
  item pop() {
    const item value = top();
    if (value.kind == tag::mark) throw std::runtime_error("the pickle pops a MARK as a value");
    stack_.pop_back();
    return value;
  }
  // Pops up to and including the topmost MARK; returns where the MARK was.
  std::size_t pop_to_mark() {
    while (!stack_.empty() && stack_.back().kind != tag::mark) stack_.pop_back();
    if (stack_.empty()) throw std::runtime_error("the pickle has no MARK where one is needed");
    const std::size_t start = stack_.back().start;
    stack_.pop_back();
    return start;
  }

  std::vector<char> rewrite(std::size_t end) const {
    std::vector<char> out;
    out.reserve(end + marks_before_.size() + 16);
    auto marks = marks_before_.begin();
    std::size_t at = 0;
    while (at < end) {
      for (; marks != marks_before_.end() && marks->first <= at; ++marks) out.insert(out.end(), marks->second, '(');
      if (auto dropped = dropped_.find(at); dropped != dropped_.end()) {
        at += dropped->second;
        continue;
      }
      auto replaced = replace_.find(at);
      out.push_back(replaced != replace_.end() ? replaced->second : data_[at]);
      ++at;
    }
    return out;
  }

  const char* data_;
  std::size_t size_;
  std::vector<item> stack_;
  std::map<std::uint64_t, tag> memo_;
  std::uint64_t memo_count_ = 0;
  std::map<std::size_t, int> marks_before_;  // original offset -> MARKs to insert before it
  std::map<std::size_t, char> replace_;      // APPEND -> APPENDS, SETITEM -> SETITEMS
  std::map<std::size_t, std::size_t> dropped_;  // FRAME opcodes (offset -> length)
};

}  // namespace

pickle_fixup fix_python_pickle(const std::vector<char>& pickle) { return walker(pickle).run(); }

}  // namespace loom::detail
