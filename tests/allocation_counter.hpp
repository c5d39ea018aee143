// Heap allocations since the program started: operator new calls, or every
// allocation under a sanitizer (see allocation_counter.cpp).
#pragma once

namespace loom_test {
unsigned long long allocation_count() noexcept;
}
