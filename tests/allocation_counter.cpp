// Counts calls of the global operator new, so tests can compare the heap
// allocations of a raw LibTorch step with those of a step through Fabric.
#include "allocation_counter.hpp"

#include <atomic>
#include <cstdlib>
#include <new>

namespace {
std::atomic<unsigned long long> allocations{0};
}

namespace loom_test {
unsigned long long allocation_count() noexcept { return allocations.load(std::memory_order_relaxed); }
}  // namespace loom_test

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
