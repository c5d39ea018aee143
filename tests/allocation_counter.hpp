// Calls of the global operator new since the program started (see allocation_counter.cpp).
#pragma once

namespace loom_test {
unsigned long long allocation_count() noexcept;
}
