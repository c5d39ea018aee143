// The pickle pre-validator and rewriter (python_pickle.hpp): a walk over the
// opcodes that simulates the stack. Each stack item keeps the offset where
// the opcodes that built it start (so MARK can be inserted there) and, for
// a value built of others, an entry that counts what it holds and how deep.
#include "python_pickle.hpp"
#include "file_bytes.hpp"
#include "structure_budget.hpp"
#include "view_extent.hpp"

#include <algorithm>
#include <cstring>
#include <deque>
#include <initializer_list>
#include <map>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>

namespace loom::detail {

const char* const resolved_globals_text =
    "torch._utils._rebuild_tensor_v2, the storage types torch.{Float,Double,Half,BFloat16,Long,Int,Short,Char,Byte,"
    "Bool,ComplexFloat,ComplexDouble}Storage, collections.OrderedDict, and LibTorch's own "
    "torch.jit._pickle.{build_intlist,build_doublelist,build_boollist,build_tensorlist,restore_type_tag}";

namespace {

struct storage_type {
  std::string_view name;
  std::uint32_t element_size;
};
constexpr storage_type storage_types[] = {
    {"FloatStorage", 4}, {"DoubleStorage", 8}, {"HalfStorage", 2},  {"BFloat16Storage", 2},
    {"LongStorage", 8},  {"IntStorage", 4},    {"ShortStorage", 2}, {"CharStorage", 1},
    {"ByteStorage", 1},  {"BoolStorage", 1},   {"ComplexFloatStorage", 8}, {"ComplexDoubleStorage", 16},
};

// The element size of torch.<name>, 0 for a name that is not a storage type.
std::uint32_t storage_element_size(std::string_view name) {
  for (const auto& type : storage_types) {
    if (type.name == name) return type.element_size;
  }
  return 0;
}

bool is_resolved_global(std::string_view module, std::string_view name) {
  if (module == "torch._utils") return name == "_rebuild_tensor_v2";
  if (module == "collections") return name == "OrderedDict";
  if (module == "torch") return storage_element_size(name) != 0;
  if (module == "torch.jit._pickle") {
    return name == "build_intlist" || name == "build_doublelist" || name == "build_boollist" ||
           name == "build_tensorlist" || name == "restore_type_tag";
  }
  return false;
}

enum class tag : std::uint8_t {
  none, mark, text, integer, ordered_dict_class, ordered_dict,
  storage_class,   // torch.<T>Storage (detail: its element size)
  rebuild_tensor,  // torch._utils._rebuild_tensor_v2
};

constexpr std::uint32_t no_entry = 0xFFFFFFFFU;

struct item {
  std::uint32_t start;             // offset of the first opcode that built it (pickles are < 4 GiB)
  std::uint32_t built = no_entry;  // its entry in walker::built_, for a value built of others
  std::uint32_t detail = 0;  // text: its opcode's offset (a memo fetch starts elsewhere); integer: its entry in
                             // walker::integers_; storage_class: the element size
  tag kind = tag::none;
};

// A container or a call's result.
struct built_value {
  std::uint64_t values;                // the values under it and itself, a shared one counted each time it is used
  std::uint32_t depth;                 // containers on the longest path down, itself included
  std::uint32_t tuple_begin = 0;       // a short tuple: its elements in walker::tuple_items_
  std::uint32_t storage = no_entry;    // a storage a persistent id named: its entry in walker::storages_
  std::uint8_t tuple_count = 0;
  bool is_kept_tuple = false;
  bool fetched_again = false;          // taken from the memo or DUPed: it may not change any more
};

// A storage a persistent id named.
struct storage_view {
  std::uint32_t element_size;
  std::int64_t numel;
  std::string_view key;  // its record is data/<key>: a view into the pickle
};

// Tuples up to this long keep their elements (a tensor's arguments, sizes
// and strides; PyTorch tensors have at most 64 dimensions).
constexpr std::size_t tuple_elements_kept = 64;

std::uint64_t saturating_sum(std::uint64_t a, std::uint64_t b) {
  std::uint64_t sum = 0;
  return __builtin_add_overflow(a, b, &sum) ? UINT64_MAX : sum;
}

// The width of the length before a length-prefixed argument: one table for
// the walk and for reading a string back (a string's length read at the
// wrong width once sent a forged 1 GB allocation through: found by fuzzing).
int counted_length_bytes(unsigned char op) {
  switch (op) {
    case 'U': case 'C': case 0x8a: case 0x8c: return 1;  // SHORT_BINSTRING SHORT_BINBYTES LONG1 SHORT_BINUNICODE
    case 'T': case 'B': case 0x8b: case 'X': return 4;   // BINSTRING BINBYTES LONG4 BINUNICODE
    default: return 8;                                   // BINUNICODE8 BINBYTES8 BYTEARRAY8
  }
}

// What the walk keeps is charged to the structure budget: a pickle of many
// values is refused at a fixed size, not at the end of memory. Deques grow
// without copying, so the peak is what they hold.
template <class T>
using kept = std::deque<T, budget_allocator<T>>;

class walker {
 public:
  walker(std::string_view pickle, const record_size& record_bytes, structure_budget& budget)
      : record_bytes_(record_bytes),
        data_(pickle.data()),
        size_(pickle.size()),
        value_budget_(saturating_sum(pickle_amplification_limit * pickle.size(), 4096)),
        stack_(budget_allocator<item>(budget)),
        marks_(budget_allocator<std::size_t>(budget)),
        built_(budget_allocator<built_value>(budget)),
        memo_(budget_allocator<item>(budget)),
        integers_(budget_allocator<std::int64_t>(budget)),
        tuple_items_(budget_allocator<item>(budget)),
        storages_(budget_allocator<storage_view>(budget)),
        marks_before_(budget_allocator<std::pair<const std::size_t, int>>(budget)),
        replace_(budget_allocator<std::pair<const std::size_t, char>>(budget)),
        dropped_(budget_allocator<std::pair<const std::size_t, std::size_t>>(budget)) {
    if (size_ >= no_entry) throw std::runtime_error("the pickle is 4 GiB or larger; a checkpoint's is far smaller");
  }

  pickle_fixup run() {
    pickle_fixup result;
    std::size_t at = 0;
    bool stopped = false;
    while (at < size_ && !stopped) {
      const auto op_at = static_cast<std::uint32_t>(at);
      const auto op = static_cast<unsigned char>(data_[at++]);
      if (op == '.') {  // STOP
        stopped = true;
      } else if (!push_value(op, at, op_at) && !stack_step(op, at, op_at, result) &&
                 !build_container(op, at, op_at, result)) {
        fail("has the unknown opcode 0x" + hex(op), op_at);
      }
    }
    if (!stopped) throw std::runtime_error("the pickle has no STOP opcode (truncated)");
    // loom's own files (LibTorch's pickler) need no rewrite: no copy then.
    if (!marks_before_.empty() || !replace_.empty() || !dropped_.empty()) result.rewritten = rewrite(at);
    return result;
  }

 private:
  // The opcodes that push a value or write the memo.
  // Whether op is one of them.
  bool push_value(unsigned char op, std::size_t& at, std::uint32_t op_at) {
    switch (op) {
      // ------------------------------------------------ push one value, no argument
      case 'N': case 0x88: case 0x89: push(op_at); return true;                      // NONE NEWTRUE NEWFALSE
      case '}': case ']': case 0x8f: push_built(op_at, 1, 1); return true;  // empty dict list set
      case ')': push_built(op_at, 1, 1); keep_tuple({}); return true;  // EMPTY_TUPLE
      // ------------------------------------------------ push, fixed-size argument
      case 'K': at = push_integer(at, 1, false, op_at); return true;  // BININT1
      case 'M': at = push_integer(at, 2, false, op_at); return true;  // BININT2
      case 'J': at = push_integer(at, 4, true, op_at); return true;   // BININT
      case 'G': at = push_after(at, 8, op_at); return true;  // BINFLOAT
      case 0x82: case 0x83: case 0x84:                 // EXT1 EXT2 EXT4
        fail("names a global through copyreg's extension registry (EXT" + std::to_string(op == 0x84 ? 4 : op - 0x81) +
                 "), which loom does not resolve",
             op_at);
      case 'h': at = push_memo(at, 1, op_at); return true;  // BINGET
      case 'j': at = push_memo(at, 4, op_at); return true;  // LONG_BINGET
      // ------------------------------------------------ push, length-prefixed argument
      case 'U': case 'T': case 'X': case 0x8c: case 0x8d:  // strings
        at = skip_counted(at, counted_length_bytes(op), op_at, true);
        return true;
      case 0x8a: {  // LONG1: a little-endian two's complement integer of 0 to 255 bytes
        const std::size_t length = static_cast<unsigned char>(*need(at, 1));
        if (length >= 1 && length <= 8) {
          at = push_integer(at + 1, static_cast<int>(length), true, op_at);
        } else {
          at = skip_counted(at, 1, op_at, false);
        }
        return true;
      }
      case 'C': case 'B': case 0x8b: case 0x8e: case 0x96:  // bytes, LONG4, bytearray
        at = skip_counted(at, counted_length_bytes(op), op_at, false);
        return true;
      // ------------------------------------------------ push, newline-terminated argument
      case 'I': case 'L': case 'F': case 'S': case 'V': case 'P':
        at = skip_line(at);
        push(op_at);
        return true;
      case 'g': {  // GET
        const std::size_t end = skip_line(at);
        push_memo_entry(op_at, decimal(at, end - 1, op_at));
        at = end;
        return true;
      }
      case 'c': {  // GLOBAL module\nname\n
        const std::size_t module_end = skip_line(at);
        const std::size_t name_end = skip_line(module_end);
        stack_.push_back(global(text(at, module_end - 1), text(module_end, name_end - 1), op_at, op_at));
        at = name_end;
        return true;
      }
      case 0x93: {  // STACK_GLOBAL: module, name -> global
        const item name = pop();
        const item module = pop();
        if (module.kind != tag::text || name.kind != tag::text) fail("names a global by a value that is not a string", op_at);
        stack_.push_back(global(text_of(module), text_of(name), module.start, op_at));
        return true;
      }
      // ------------------------------------------------ memo writes: no stack change
      case 'q': at = memo_put_counted(at, 1, op_at); return true;  // BINPUT
      case 'r': at = memo_put_counted(at, 4, op_at); return true;  // LONG_BINPUT
      case 'p': {                                             // PUT
        const std::size_t end = skip_line(at);
        memo_put(decimal(at, end - 1, op_at), op_at);
        at = end;
        return true;
      }
      case 0x94: memo_put(memo_count_++, op_at); return true;  // MEMOIZE
      default: return false;
    }
  }

  // The opcodes that mark, pop, call and build: the stack's structure, and
  // the framing (PROTO, FRAME, buffers).
  // Whether op is one of them.
  bool stack_step(unsigned char op, std::size_t& at, std::uint32_t op_at, pickle_fixup& result) {
    switch (op) {
      // ------------------------------------------------ structure
      case '(':  // MARK
        if (marks_.size() >= static_cast<std::size_t>(pickle_depth_limit)) {
          fail("opens more than " + std::to_string(pickle_depth_limit) + " MARKs: containers nest deeper than " +
                   std::to_string(pickle_depth_limit) + " levels",
               op_at);
        }
        marks_.push_back(stack_.size());
        stack_.push_back({op_at, no_entry, 0, tag::mark});
        return true;
      case '0': pop(); return true;                      // POP
      case '1': pop_to_mark(); return true;              // POP_MARK
      case '2': {                                  // DUP
        const item copy = top();
        if (copy.kind == tag::mark) fail("DUPs a MARK", op_at);
        fetched_again(copy);
        stack_.push_back(copy);
        return true;
      }
      case 'R': {  // REDUCE: callable, args -> result
        const item args = pop();
        const item callable = pop();
        if (callable.kind == tag::rebuild_tensor) check_rebuilt_tensor(args, op_at);
        combine(callable.start, {callable, args}, callable.kind == tag::ordered_dict_class ? tag::ordered_dict : tag::none);
        return true;
      }
      case 0x81: { const item args = pop(); const item cls = pop(); combine(cls.start, {cls, args}); return true; }  // NEWOBJ
      case 0x92: {  // NEWOBJ_EX
        const item kwargs = pop();
        const item args = pop();
        const item cls = pop();
        combine(cls.start, {cls, args, kwargs});
        return true;
      }
      case 'Q': {  // BINPERSID: a storage
        const item pid = pop();
        const storage_view storage = storage_of(pid, op_at);
        combine(pid.start, {pid});
        built_[stack_.back().built].storage = static_cast<std::uint32_t>(storages_.size());
        storages_.push_back(storage);
        return true;
      }
      case 'b': {  // BUILD: object, state -> object
        const item state = pop();
        grow(top(), {state}, op_at);
        if (top().kind == tag::ordered_dict) result.has_ordered_dict = true;
        return true;
      }
      case 0x80:  // PROTO
        result.protocol = static_cast<int>(static_cast<unsigned char>(*need(at, 1)));
        at += 1;
        return true;
      case 0x95: need(at, 8); at += 8; dropped_[op_at] = 9; return true;  // FRAME: dropped
      case 0x97: case 0x98: return true;                                   // NEXT_BUFFER READONLY_BUFFER (protocol 5)
      default: return false;
    }
  }

  // The opcodes that build or fill a container from the values above a mark
  // (or the top two or three).
  // Whether op is one of them.
  bool build_container(unsigned char op, std::size_t& at, std::uint32_t op_at, pickle_fixup& result) {
    switch (op) {
      case 't': case 'l': case 'd': case 0x91: case 'o': {  // TUPLE LIST DICT FROZENSET OBJ
        const std::size_t mark = marks_.empty() ? stack_.size() : marks_.back();
        if (op == 'd') even_above(mark, op_at);
        const std::uint64_t values = values_above(mark);
        const std::uint32_t depth = depth_above(mark);
        // A short tuple's elements are kept: a tensor's sizes, strides and arguments.
        const std::size_t count = mark < stack_.size() ? stack_.size() - mark - 1 : 0;
        const bool keep = op == 't' && count <= tuple_elements_kept;
        item elements[tuple_elements_kept];
        if (keep) std::copy(stack_.end() - static_cast<std::ptrdiff_t>(count), stack_.end(), elements);
        const std::uint32_t start = pop_to_mark();
        push_built(start, saturating_sum(values, 1), depth + 1);
        if (keep) keep_tuple({elements, count});
        return true;
      }
      case 'i': {  // INST module\nname\n
        const std::size_t module_end = skip_line(at);
        const std::size_t name_end = skip_line(module_end);
        (void)global(text(at, module_end - 1), text(module_end, name_end - 1), op_at, op_at);
        at = name_end;
        const std::size_t mark = marks_.empty() ? stack_.size() : marks_.back();
        const std::uint64_t values = values_above(mark);
        const std::uint32_t depth = depth_above(mark);
        push_built(pop_to_mark(), saturating_sum(values, 1), depth + 1);
        return true;
      }
      case 0x85: {  // TUPLE1
        const item a = pop();
        combine(a.start, {a});
        keep_tuple({&a, 1});
        return true;
      }
      case 0x86: {  // TUPLE2
        const item b = pop();
        const item a = pop();
        combine(a.start, {a, b});
        const item pair[] = {a, b};
        keep_tuple(pair);
        return true;
      }
      case 0x87: {  // TUPLE3
        const item c = pop();
        const item b = pop();
        const item a = pop();
        combine(a.start, {a, b, c});
        const item triple[] = {a, b, c};
        keep_tuple(triple);
        return true;
      }
      case 'e': case 0x90: case 'u': {  // APPENDS ADDITEMS SETITEMS
        const std::size_t mark = marks_.empty() ? stack_.size() : marks_.back();
        if (op == 'u') even_above(mark, op_at);
        const std::uint64_t values = values_above(mark);
        const std::uint32_t depth = depth_above(mark);
        pop_to_mark();
        grow_by(top(), values, depth, op_at);
        if (op == 'u' && top().kind == tag::ordered_dict) result.has_ordered_dict = true;
        return true;
      }
      case 'a': {  // APPEND: list, value -> list
        const item value = pop();
        grow(top(), {value}, op_at);
        ++marks_before_[value.start];
        replace_[op_at] = 'e';
        return true;
      }
      case 's': {  // SETITEM: dict, key, value -> dict
        const item value = pop();
        const item key = pop();
        grow(top(), {key, value}, op_at);
        ++marks_before_[key.start];
        replace_[op_at] = 'u';
        if (top().kind == tag::ordered_dict) result.has_ordered_dict = true;
        return true;
      }
      default: return false;
    }
  }

  [[noreturn]] static void fail(const std::string& what, std::uint32_t op_at) {
    throw std::runtime_error("the pickle " + what + " (at byte " + std::to_string(op_at) + ")");
  }

  static std::string hex(unsigned value) {
    static const char digits[] = "0123456789abcdef";
    return {digits[(value >> 4) & 0xF], digits[value & 0xF]};
  }

  // (No sum that could wrap: a length comes from the file.)
  const char* need(std::size_t at, std::uint64_t bytes) const {
    if (at > size_ || bytes > size_ - at) throw std::runtime_error("the pickle ends inside an opcode's argument");
    return data_ + at;
  }

  std::string_view text(std::size_t from, std::size_t to) const { return {data_ + from, to - from}; }

  // A length-prefixed text's characters, found again from its opcode.
  std::string_view text_of(const item& string) const {
    const std::size_t at = string.detail;
    const int length_bytes = counted_length_bytes(static_cast<unsigned char>(data_[at]));
    const std::uint64_t length = little_endian(data_ + at + 1, length_bytes);
    return {data_ + at + 1 + length_bytes, static_cast<std::size_t>(length)};
  }

  // The global as a stack item (starting at start), once it is one loom resolves.
  item global(std::string_view module, std::string_view name, std::uint32_t start, std::uint32_t op_at) const {
    if (!is_resolved_global(module, name)) {
      fail("names the global " + std::string(module) + "." + std::string(name) +
               ", which loom does not resolve: a checkpoint holds tensors, numbers, strings, lists, tuples and dicts, "
               "and loom resolves only " + resolved_globals_text,
           op_at);
    }
    if (module == "collections") return {start, no_entry, 0, tag::ordered_dict_class};
    if (module == "torch._utils") return {start, no_entry, 0, tag::rebuild_tensor};
    if (module == "torch") return {start, no_entry, storage_element_size(name), tag::storage_class};
    return {start, no_entry, 0, tag::none};
  }

  std::uint64_t decimal(std::size_t from, std::size_t to, std::uint32_t op_at) const {
    if (from == to || to - from > 19) fail("has a memo index that is not a decimal number", op_at);
    std::uint64_t value = 0;
    for (std::size_t i = from; i < to; ++i) {
      if (data_[i] < '0' || data_[i] > '9') fail("has a memo index that is not a decimal number", op_at);
      value = value * 10 + static_cast<std::uint64_t>(data_[i] - '0');
    }
    return value;
  }

  // LibTorch's unpickler grows its memo table to the index a PUT names: a
  // forged index of 2^32 would allocate 64 GiB. An honest pickle numbers
  // its memo entries from 0, so an index is always below its length.
  std::uint64_t memo_index(std::uint64_t index, std::uint32_t op_at) const {
    if (index >= size_) {
      fail("has memo index " + std::to_string(index) + ", larger than a pickle of " + std::to_string(size_) +
               " bytes can use (a forged file: the unpickler would allocate that many entries)",
           op_at);
    }
    return index;
  }

  std::size_t skip_line(std::size_t at) const {
    const void* newline = at < size_ ? std::memchr(data_ + at, '\n', size_ - at) : nullptr;
    if (newline == nullptr) throw std::runtime_error("the pickle ends inside a text argument");
    return static_cast<std::size_t>(static_cast<const char*>(newline) - data_) + 1;
  }

  std::size_t push_after(std::size_t at, std::uint64_t argument_bytes, std::uint32_t op_at) {
    need(at, argument_bytes);
    push(op_at);
    return at + argument_bytes;
  }

  std::size_t skip_counted(std::size_t at, int length_bytes, std::uint32_t op_at, bool is_text) {
    const std::uint64_t length = little_endian(need(at, static_cast<std::size_t>(length_bytes)), length_bytes);
    at += static_cast<std::size_t>(length_bytes);
    need(at, length);
    stack_.push_back({op_at, no_entry, op_at, is_text ? tag::text : tag::none});
    return at + length;
  }

  // ------------------------------------------------ tensors
  std::size_t push_integer(std::size_t at, int bytes, bool is_signed, std::uint32_t op_at) {
    std::uint64_t value = little_endian(need(at, static_cast<std::size_t>(bytes)), bytes);
    if (is_signed && bytes < 8 && (value >> (8 * bytes - 1)) != 0) value |= ~std::uint64_t{0} << (8 * bytes);
    integers_.push_back(static_cast<std::int64_t>(value));
    stack_.push_back({op_at, no_entry, static_cast<std::uint32_t>(integers_.size() - 1), tag::integer});
    return at + static_cast<std::size_t>(bytes);
  }
  // The top of the stack is a short tuple: its elements are kept.
  void keep_tuple(std::span<const item> elements) {
    built_value& tuple = built_[stack_.back().built];
    tuple.tuple_begin = static_cast<std::uint32_t>(tuple_items_.size());
    tuple.tuple_count = static_cast<std::uint8_t>(elements.size());
    tuple.is_kept_tuple = true;
    tuple_items_.insert(tuple_items_.end(), elements.begin(), elements.end());
  }
  // A kept tuple's elements (they live in a deque: no span over them;
  // std::ranges::subrange would do, but clang 14, the fuzzing build's
  // compiler, cannot use libstdc++ 12's ranges).
  struct tuple_view {
    const kept<item>* items;
    std::size_t first, count;
    std::size_t size() const { return count; }
    bool empty() const { return count == 0; }
    const item& operator[](std::size_t i) const { return (*items)[first + i]; }
    auto begin() const { return items->begin() + static_cast<std::ptrdiff_t>(first); }
    auto end() const { return begin() + static_cast<std::ptrdiff_t>(count); }
  };
  std::optional<tuple_view> tuple_of(const item& value) const {
    if (value.built == no_entry || !built_[value.built].is_kept_tuple) return std::nullopt;
    const built_value& tuple = built_[value.built];
    return tuple_view{&tuple_items_, tuple.tuple_begin, tuple.tuple_count};
  }
  const storage_view* storage_named_by(const item& value) const {
    if (value.built == no_entry || built_[value.built].storage == no_entry) return nullptr;
    return &storages_[built_[value.built].storage];
  }
  // A tuple of integers (a tensor's sizes or strides), or false.
  bool integers_of(const item& value, std::vector<std::int64_t>& out) const {
    const auto elements = tuple_of(value);
    if (!elements) return false;
    out.clear();
    for (const item& element : *elements) {
      if (element.kind != tag::integer) return false;
      out.push_back(integers_[element.detail]);
    }
    return true;
  }

  // The storage a persistent id names: ('storage', torch.<T>Storage, key,
  // location, numel), as torch.save and LibTorch write it, its bytes no
  // more than the record data/<key> holds.
  storage_view storage_of(const item& pid, std::uint32_t op_at) const {
    const auto parts = tuple_of(pid);
    if (!parts || parts->size() != 5 || (*parts)[0].kind != tag::text || text_of((*parts)[0]) != "storage" ||
        (*parts)[1].kind != tag::storage_class || (*parts)[2].kind != tag::text || (*parts)[4].kind != tag::integer) {
      fail("has a persistent id other than ('storage', torch.<type>Storage, key, location, numel)", op_at);
    }
    storage_view storage{(*parts)[1].detail, integers_[(*parts)[4].detail], text_of((*parts)[2])};
    const std::optional<std::uint64_t> record = record_bytes_(storage.key);
    if (!record) fail("names the storage record data/" + std::string(storage.key) + ", which the archive does not hold", op_at);
    std::uint64_t bytes = 0;
    if (storage.numel < 0 || __builtin_mul_overflow(static_cast<std::uint64_t>(storage.numel), storage.element_size, &bytes) ||
        bytes > *record) {
      fail("declares a storage of " + std::to_string(storage.numel) + " elements of " +
               std::to_string(storage.element_size) + " bytes over record data/" + std::string(storage.key) + ", which holds " +
               std::to_string(*record) + " bytes",
           op_at);
    }
    return storage;
  }

  // torch._utils._rebuild_tensor_v2(storage, offset, sizes, strides, ...):
  // the view must lie inside the storage before LibTorch builds it.
  void check_rebuilt_tensor(const item& args, std::uint32_t op_at) const {
    const auto parts = tuple_of(args);
    std::vector<std::int64_t> sizes, strides;
    const storage_view* storage = parts && !parts->empty() ? storage_named_by((*parts)[0]) : nullptr;
    if (!parts || parts->size() < 4 || storage == nullptr || (*parts)[1].kind != tag::integer ||
        !integers_of((*parts)[2], sizes) || !integers_of((*parts)[3], strides) || sizes.size() != strides.size()) {
      fail("rebuilds a tensor from arguments other than (storage, offset, sizes, strides, ...)", op_at);
    }
    const std::int64_t offset = integers_[(*parts)[1].detail];
    const std::int64_t extent = view_extent(offset, sizes.data(), strides.data(), sizes.size());
    if (extent < 0 || extent > storage->numel) {
      std::string shape = "sizes [";
      for (std::size_t d = 0; d < sizes.size(); ++d) shape += (d ? ", " : "") + std::to_string(sizes[d]);
      shape += "], strides [";
      for (std::size_t d = 0; d < strides.size(); ++d) shape += (d ? ", " : "") + std::to_string(strides[d]);
      fail("rebuilds a tensor (" + shape + "], offset " + std::to_string(offset) + ") that reaches past its storage of " +
               std::to_string(storage->numel) + " elements (record data/" + std::string(storage->key) + ")",
           op_at);
    }
  }

  // ------------------------------------------------ the memo
  void memo_put(std::uint64_t index, std::uint32_t op_at) {
    const item& value = top();
    if (value.kind == tag::mark) fail("puts a MARK in the memo", op_at);
    const std::uint64_t slot = memo_index(index, op_at);
    if (slot >= memo_.size()) memo_.resize(slot + 1, item{no_entry, no_entry, 0, tag::mark});
    memo_[slot] = value;
  }
  std::size_t memo_put_counted(std::size_t at, int bytes, std::uint32_t op_at) {
    memo_put(little_endian(need(at, static_cast<std::size_t>(bytes)), bytes), op_at);
    return at + static_cast<std::size_t>(bytes);
  }
  void push_memo_entry(std::uint32_t op_at, std::uint64_t index) {
    if (index >= memo_.size() || memo_[index].kind == tag::mark) {
      fail("fetches memo entry " + std::to_string(index) + ", which it never stored", op_at);
    }
    item value = memo_[index];
    fetched_again(value);
    value.start = op_at;  // a MARK before this value goes before the GET, not before the original
    stack_.push_back(value);
  }
  std::size_t push_memo(std::size_t at, int bytes, std::uint32_t op_at) {
    push_memo_entry(op_at, little_endian(need(at, static_cast<std::size_t>(bytes)), bytes));
    return at + static_cast<std::size_t>(bytes);
  }

  // ------------------------------------------------ counting what values hold
  std::uint64_t values_of(const item& value) const { return value.built == no_entry ? 1 : built_[value.built].values; }
  std::uint32_t depth_of(const item& value) const { return value.built == no_entry ? 0 : built_[value.built].depth; }
  void fetched_again(const item& value) {
    if (value.built != no_entry) built_[value.built].fetched_again = true;
  }
  std::uint64_t values_above(std::size_t mark) const {
    std::uint64_t values = 0;
    for (std::size_t i = mark + 1; i < stack_.size(); ++i) values = saturating_sum(values, values_of(stack_[i]));
    return values;
  }
  std::uint32_t depth_above(std::size_t mark) const {
    std::uint32_t depth = 0;
    for (std::size_t i = mark + 1; i < stack_.size(); ++i) depth = std::max(depth, depth_of(stack_[i]));
    return depth;
  }

  // LibTorch's SETITEMS takes the items above the MARK two at a time: an
  // odd count would read one past the end of its stack.
  void even_above(std::size_t mark, std::uint32_t op_at) const {
    if (mark < stack_.size() && (stack_.size() - mark - 1) % 2 != 0) {
      fail("gives a dict an odd number of items (" + std::to_string(stack_.size() - mark - 1) +
               ") after its MARK: keys and values come in pairs",
           op_at);
    }
  }

  void check_bounds(const built_value& value, std::uint32_t op_at) const {
    if (value.depth > static_cast<std::uint32_t>(pickle_depth_limit)) {
      fail("nests containers deeper than " + std::to_string(pickle_depth_limit) + " levels", op_at);
    }
    if (value.values > value_budget_) {
      fail("decodes to more than " + std::to_string(value_budget_) + " values (" +
               std::to_string(pickle_amplification_limit) + " per byte of a " + std::to_string(size_) +
               "-byte pickle, shared values counted each time they are used): a forged file",
           op_at);
    }
  }
  void push_built(std::uint32_t start, std::uint64_t values, std::uint32_t depth, tag kind = tag::none) {
    built_value value{values, depth};
    check_bounds(value, start);
    built_.push_back(value);
    stack_.push_back({start, static_cast<std::uint32_t>(built_.size() - 1), 0, kind});
  }
  void combine(std::uint32_t start, std::initializer_list<item> parts, tag kind = tag::none) {
    std::uint64_t values = 1;
    std::uint32_t depth = 0;
    for (const item& part : parts) {
      values = saturating_sum(values, values_of(part));
      depth = std::max(depth, depth_of(part));
    }
    push_built(start, values, depth + 1, kind);
  }
  void grow_by(const item& target, std::uint64_t values, std::uint32_t depth, std::uint32_t op_at) {
    if (target.built == no_entry) fail("adds items to a value that is not a container", op_at);
    built_value& value = built_[target.built];
    if (value.fetched_again) {
      fail("changes a container after it fetched it again (from the memo or by DUP): a container that contains "
           "itself, or one counted many times before it grew",
           op_at);
    }
    value.values = saturating_sum(value.values, values);
    value.depth = std::max(value.depth, depth + 1);
    check_bounds(value, op_at);
  }
  void grow(const item& target, std::initializer_list<item> parts, std::uint32_t op_at) {
    std::uint64_t values = 0;
    std::uint32_t depth = 0;
    for (const item& part : parts) {
      values = saturating_sum(values, values_of(part));
      depth = std::max(depth, depth_of(part));
    }
    grow_by(target, values, depth, op_at);
  }

  // ------------------------------------------------ the stack
  void push(std::uint32_t start, tag kind = tag::none) { stack_.push_back({start, no_entry, 0, kind}); }
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
  std::uint32_t pop_to_mark() {
    if (marks_.empty()) throw std::runtime_error("the pickle has no MARK where one is needed");
    const std::uint32_t start = stack_[marks_.back()].start;
    stack_.resize(marks_.back());
    marks_.pop_back();
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

  const record_size& record_bytes_;
  const char* data_;
  std::size_t size_;
  std::uint64_t value_budget_;
  template <class K, class V>
  using kept_ordered = std::map<K, V, std::less<>, budget_allocator<std::pair<const K, V>>>;
  kept<item> stack_;
  kept<std::size_t> marks_;  // stack positions of the open MARKs
  kept<built_value> built_;
  kept<item> memo_;  // a MARK-tagged entry: never stored
  std::uint64_t memo_count_ = 0;
  kept<std::int64_t> integers_;                      // the values of integer items
  kept<item> tuple_items_;                           // the elements of short tuples
  kept<storage_view> storages_;                      // the storages persistent ids named
  kept_ordered<std::size_t, int> marks_before_;      // original offset -> MARKs to insert before it
  kept_ordered<std::size_t, char> replace_;          // APPEND -> APPENDS, SETITEM -> SETITEMS
  kept_ordered<std::size_t, std::size_t> dropped_;   // FRAME opcodes (offset -> length)
};

}  // namespace

pickle_fixup validate_and_fix_pickle(std::string_view pickle, const record_size& record_bytes,
                                     structure_budget& budget) {
  return walker(pickle, record_bytes, budget).run();
}

pickle_fixup validate_and_fix_pickle(std::string_view pickle, const record_size& record_bytes) {
  structure_budget budget;
  return validate_and_fix_pickle(pickle, record_bytes, budget);
}

}  // namespace loom::detail
