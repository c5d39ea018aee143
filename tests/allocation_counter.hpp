// Heap allocations since the program started: operator new calls, or every
// allocation under a sanitizer (see allocation_counter.cpp); and the heap's
// bytes, at the malloc level.
#pragma once

namespace loom_test {
unsigned long long allocation_count() noexcept;

// Heap bytes in use (malloc's usable size of every live block: operator new,
// malloc, calloc, realloc and the aligned allocators LibTorch uses), and
// the most in use since the last reset_heap_peak().
unsigned long long heap_live_bytes() noexcept;
unsigned long long heap_peak_bytes() noexcept;
void reset_heap_peak() noexcept;
}  // namespace loom_test
