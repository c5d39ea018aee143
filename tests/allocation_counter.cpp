// Counts heap allocations, so tests can compare the allocations of a raw
// LibTorch step with those of a step through Fabric.
//
// The usual build replaces the global operator new and counts its calls.
// Under AddressSanitizer or ThreadSanitizer the runtime owns operator new:
// a replacement would pair its malloc with the runtime's own nothrow new and
// free (reported as alloc-dealloc-mismatch at exit) and would hide loom's
// new/delete mismatches from the sanitizer. There the runtime's allocation
// hook counts instead, and it sees every allocation (malloc as well as new):
// a stricter count for the same comparisons.
//
// Heap bytes: the usual build also replaces the malloc family (over glibc's
// __libc_* entry points) and adds each block's usable size; under a
// sanitizer the same hooks add the size allocated and subtract the size of
// each block freed.
#include "allocation_counter.hpp"

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <new>

#include <unistd.h>

namespace {
std::atomic<unsigned long long> allocations{0};
std::atomic<unsigned long long> live_bytes{0};
std::atomic<unsigned long long> peak_bytes{0};
std::atomic<unsigned long long> cap_bytes{0};  // 0: none
std::atomic<unsigned long long> cap_refusals{0};

// A line for stderr built and written (write(2)) without allocating: the
// heap is what is measured, or what was refused.
class stderr_line {
 public:
  stderr_line& text(const char* s) noexcept {
    while (*s != '\0' && at_ < sizeof line_) line_[at_++] = *s++;
    return *this;
  }
  stderr_line& number(unsigned long long n) noexcept {
    char digits[24];
    int count = 0;
    do digits[count++] = static_cast<char>('0' + n % 10); while ((n /= 10) != 0);
    while (count > 0 && at_ < sizeof line_) line_[at_++] = digits[--count];
    return *this;
  }
  void write() const noexcept { [[maybe_unused]] const auto written = ::write(2, line_, at_); }

 private:
  char line_[160];
  std::size_t at_ = 0;
};

// The first refusal: whatever fails next (an exception, or std::terminate
// in a library's thread), the output says the cap was reached.
[[maybe_unused]] void say_first_refusal(unsigned long long bytes, unsigned long long cap) noexcept {
  stderr_line().text("heap cap: refused an allocation of ").number(bytes).text(" bytes (cap ").number(cap)
      .text(" bytes live)\n").write();
}

// Whether `more` bytes (requested; the block's usable size may be a few
// bytes larger) would take the live bytes above the cap; counts a refusal.
[[maybe_unused]] bool over_cap(unsigned long long more) noexcept {
  const unsigned long long cap = cap_bytes.load(std::memory_order_relaxed);
  if (cap == 0 || live_bytes.load(std::memory_order_relaxed) + more <= cap) return false;
  if (cap_refusals.fetch_add(1, std::memory_order_relaxed) == 0) say_first_refusal(more, cap);
  return true;
}

void note_allocated(std::size_t bytes) noexcept {
  const unsigned long long now = live_bytes.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  unsigned long long peak = peak_bytes.load(std::memory_order_relaxed);
  while (now > peak && !peak_bytes.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}
void note_freed(std::size_t bytes) noexcept { live_bytes.fetch_sub(bytes, std::memory_order_relaxed); }
}  // namespace

namespace loom_test {
unsigned long long allocation_count() noexcept { return allocations.load(std::memory_order_relaxed); }
unsigned long long heap_live_bytes() noexcept { return live_bytes.load(std::memory_order_relaxed); }
unsigned long long heap_peak_bytes() noexcept { return peak_bytes.load(std::memory_order_relaxed); }
void reset_heap_peak() noexcept { peak_bytes.store(live_bytes.load(std::memory_order_relaxed), std::memory_order_relaxed); }
void set_heap_cap(unsigned long long bytes) noexcept { cap_bytes.store(bytes, std::memory_order_relaxed); }
unsigned long long heap_cap_refusals() noexcept { return cap_refusals.load(std::memory_order_relaxed); }
void say_heap_peak(unsigned long long above_start, unsigned long long cap) noexcept {
  stderr_line().text("heap cap: peak ").number(above_start).text(" bytes above the start (cap ").number(cap)
      .text(")\n").write();
}
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
bool heap_cap_enforced() noexcept { return false; }
#else
bool heap_cap_enforced() noexcept { return true; }
#endif
}  // namespace loom_test

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)

// sanitizer/allocator_interface.h, which g++ 12 does not install.
extern "C" int __sanitizer_install_malloc_and_free_hooks(void (*malloc_hook)(const volatile void*, std::size_t),
                                                         void (*free_hook)(const volatile void*));
extern "C" std::size_t __sanitizer_get_allocated_size(const volatile void* pointer);

namespace {
void count_allocation(const volatile void* /*pointer*/, std::size_t size) {
  allocations.fetch_add(1, std::memory_order_relaxed);
  note_allocated(size);
}
void count_free(const volatile void* pointer) { note_freed(__sanitizer_get_allocated_size(pointer)); }
[[maybe_unused]] const int hooks_installed = __sanitizer_install_malloc_and_free_hooks(count_allocation, count_free);
}  // namespace

#else

// The malloc family over glibc's own entry points (which glibc exports for
// this), so LibTorch's and every library's allocations count too.
extern "C" {
void* __libc_malloc(std::size_t size);
void* __libc_calloc(std::size_t count, std::size_t size);
void* __libc_realloc(void* pointer, std::size_t size);
void* __libc_memalign(std::size_t alignment, std::size_t size);
void __libc_free(void* pointer);
std::size_t malloc_usable_size(void* pointer) noexcept;

static void* noted(void* pointer) noexcept {
  if (pointer != nullptr) note_allocated(malloc_usable_size(pointer));
  return pointer;
}
static void* refused() noexcept {
  errno = ENOMEM;
  return nullptr;
}
void* malloc(std::size_t size) noexcept { return over_cap(size) ? refused() : noted(__libc_malloc(size)); }
void* calloc(std::size_t count, std::size_t size) noexcept {
  if (count != 0 && size > static_cast<std::size_t>(-1) / count) return refused();
  return over_cap(count * size) ? refused() : noted(__libc_calloc(count, size));
}
void* memalign(std::size_t alignment, std::size_t size) noexcept {
  return over_cap(size) ? refused() : noted(__libc_memalign(alignment, size));
}
void* aligned_alloc(std::size_t alignment, std::size_t size) noexcept { return memalign(alignment, size); }
void* valloc(std::size_t size) noexcept { return memalign(4096, size); }
int posix_memalign(void** out, std::size_t alignment, std::size_t size) noexcept {
  if (alignment < sizeof(void*) || (alignment & (alignment - 1)) != 0) return 22;  // EINVAL
  void* pointer = memalign(alignment, size);
  if (pointer == nullptr && size != 0) return 12;  // ENOMEM
  *out = pointer;
  return 0;
}
void* realloc(void* pointer, std::size_t size) noexcept {
  const std::size_t before = pointer != nullptr ? malloc_usable_size(pointer) : 0;
  if (size > before && over_cap(size - before)) return refused();
  void* moved = __libc_realloc(pointer, size);
  if (moved != nullptr || size == 0) {  // the old block is gone
    note_freed(before);
    noted(moved);
  }
  return moved;
}
void free(void* pointer) noexcept {
  if (pointer != nullptr) note_freed(malloc_usable_size(pointer));
  __libc_free(pointer);
}
}

void* operator new(std::size_t size) {
  allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t size) { return ::operator new(size); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }

#endif
