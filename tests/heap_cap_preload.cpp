// The heap cap of allocation_counter.cpp for a program loom installs
// (loom-consolidate), loaded with LD_PRELOAD: its malloc family and
// operator new replace the program's. LOOM_HEAP_CAP_BYTES (bytes above the
// live heap when this library is initialised, after the libraries the
// program links have run their static initialisers) caps the heap as
// set_heap_cap does; at exit the peak above that base is written to
// stderr as "heap cap: peak N bytes above the start (cap M)", so a test
// can read what the program held. Built only where the cap is enforced
// (not under a sanitizer, whose runtime owns malloc).
#include "allocation_counter.hpp"

#include <loom/environment.hpp>

namespace {

unsigned long long base = 0;
unsigned long long cap = 0;

__attribute__((constructor)) void start_capping() {
  base = loom_test::heap_live_bytes();
  loom_test::reset_heap_peak();
  cap = static_cast<unsigned long long>(
      loom::cluster::setting_integer("LOOM_HEAP_CAP_BYTES", 0, 1LL << 50).value_or(0));
  if (cap > 0) loom_test::set_heap_cap(base + cap);
}

__attribute__((destructor)) void end_capping() {
  loom_test::set_heap_cap(0);
  const unsigned long long peak = loom_test::heap_peak_bytes();
  loom_test::say_heap_peak(peak > base ? peak - base : 0, cap);
}

}  // namespace
