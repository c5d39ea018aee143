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

// A cap on heap_live_bytes(), as if the machine had only that much memory:
// an allocation that would take the live bytes above it fails the way an
// exhausted system's does (malloc returns null with errno ENOMEM, operator
// new throws std::bad_alloc, c10's allocator throws "not enough memory"),
// wherever it is made: loom, LibTorch, Gloo, the C++ library. 0 lifts it.
// Enforced only in the usual build (under a sanitizer the runtime owns
// malloc): heap_cap_enforced() says which.
void set_heap_cap(unsigned long long bytes) noexcept;
bool heap_cap_enforced() noexcept;
// "heap cap: peak N bytes above the start (cap M)" on stderr, allocating
// nothing (heap_cap_preload.cpp says it at a program's exit).
void say_heap_peak(unsigned long long above_start, unsigned long long cap) noexcept;
// Allocations refused by the cap since the program started.
unsigned long long heap_cap_refusals() noexcept;
}  // namespace loom_test
