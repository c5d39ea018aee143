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
#include "allocation_counter.hpp"

#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <new>

namespace {
std::atomic<unsigned long long> allocations{0};
}

namespace loom_test {
unsigned long long allocation_count() noexcept { return allocations.load(std::memory_order_relaxed); }
}  // namespace loom_test

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)

// sanitizer/allocator_interface.h, which g++ 12 does not install.
extern "C" int __sanitizer_install_malloc_and_free_hooks(void (*malloc_hook)(const volatile void*, std::size_t),
                                                         void (*free_hook)(const volatile void*));

namespace {
void count_allocation(const volatile void* /*pointer*/, std::size_t /*size*/) {
  allocations.fetch_add(1, std::memory_order_relaxed);
}
void ignore_free(const volatile void* /*pointer*/) {}
[[maybe_unused]] const int hooks_installed = __sanitizer_install_malloc_and_free_hooks(count_allocation, ignore_free);
}  // namespace

#else

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
