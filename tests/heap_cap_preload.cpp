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

#include <unistd.h>

namespace {

unsigned long long base = 0;
unsigned long long cap = 0;

void write_number(char* line, std::size_t& at, std::size_t size, unsigned long long n) {
  char digits[24];
  int count = 0;
  do digits[count++] = static_cast<char>('0' + n % 10); while ((n /= 10) != 0);
  while (count > 0 && at < size) line[at++] = digits[--count];
}

void write_text(char* line, std::size_t& at, std::size_t size, const char* text) {
  while (*text != '\0' && at < size) line[at++] = *text++;
}

// No allocation here: the heap is what is measured.
void report_peak() {
  char line[160];
  std::size_t at = 0;
  const unsigned long long peak = loom_test::heap_peak_bytes();
  write_text(line, at, sizeof line, "heap cap: peak ");
  write_number(line, at, sizeof line, peak > base ? peak - base : 0);
  write_text(line, at, sizeof line, " bytes above the start (cap ");
  write_number(line, at, sizeof line, cap);
  write_text(line, at, sizeof line, ")\n");
  [[maybe_unused]] const auto written = ::write(2, line, at);
}

__attribute__((constructor)) void start_capping() {
  base = loom_test::heap_live_bytes();
  loom_test::reset_heap_peak();
  cap = static_cast<unsigned long long>(
      loom::cluster::setting_integer("LOOM_HEAP_CAP_BYTES", 0, 1LL << 50).value_or(0));
  if (cap > 0) loom_test::set_heap_cap(base + cap);
}

__attribute__((destructor)) void end_capping() {
  loom_test::set_heap_cap(0);
  report_peak();
}

}  // namespace
