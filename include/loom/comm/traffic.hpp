// What this process has put into collectives, by kind: how many and their
// payload bytes, on every group (the world, sub-groups, DDP's Reducer, the
// sharding engines), counted where the collective watchdog records them --
// so while it is on (collective_timeout > 0, the default); 0 when it is off.
// Take a snapshot before and after the work to measure and subtract.
//
// Payload: the bytes of the whole logical tensor the collective works on, in
// the caller's dtype (what a strategy's formula counts, 4 bytes per fp32
// element), not what crosses the wire:
//   all_reduce, all_reduce_coalesced, reduce, broadcast: the tensors' bytes;
//   all_gather, all_gather_coalesced, gather: the gathered result (the
//     group's size x this rank's input);
//   reduce_scatter, scatter: the whole input (the group's size x this rank's
//     output);
//   all_to_all: this rank's input; barrier: none.
// One count per collective entered, whatever algorithm carries it (Gloo's,
// or loom's point-to-point emulation).
//
// Communication time, when asked for (time_collectives): the wall time
// during which at least one of this process's collectives was in flight --
// entered, and its work not yet complete (Gloo's threads, loom's emulation
// waiting for its messages). Overlapped collectives count once. It is not
// the time the training thread waited: a collective overlapped with the
// backward pass counts in full. No torch headers.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace loom::comm {

enum class collective_kind : std::uint8_t {
  broadcast,
  all_reduce,
  all_reduce_coalesced,
  reduce,
  all_gather,
  all_gather_coalesced,
  gather,
  scatter,
  reduce_scatter,
  all_to_all,
  barrier,
};
inline constexpr std::size_t collective_kinds = static_cast<std::size_t>(collective_kind::barrier) + 1;

// "all_reduce", "reduce_scatter", ...
const char* name_of(collective_kind kind) noexcept;

struct traffic_count {
  std::uint64_t collectives = 0;
  std::uint64_t payload_bytes = 0;
};

struct traffic {
  std::array<traffic_count, collective_kinds> by_kind{};
  std::int64_t in_flight_ns = 0;  // communication time (0 unless time_collectives(true))

  const traffic_count& operator[](collective_kind kind) const noexcept {
    return by_kind[static_cast<std::size_t>(kind)];
  }
  traffic_count total() const noexcept {
    traffic_count sum;
    for (const auto& count : by_kind) {
      sum.collectives += count.collectives;
      sum.payload_bytes += count.payload_bytes;
    }
    return sum;
  }
  traffic& operator+=(const traffic& other) noexcept {
    for (std::size_t k = 0; k < collective_kinds; ++k) {
      by_kind[k].collectives += other.by_kind[k].collectives;
      by_kind[k].payload_bytes += other.by_kind[k].payload_bytes;
    }
    in_flight_ns += other.in_flight_ns;
    return *this;
  }
  // What happened between two snapshots (later - earlier).
  friend traffic operator-(const traffic& later, const traffic& earlier) noexcept {
    traffic difference;
    for (std::size_t k = 0; k < collective_kinds; ++k) {
      difference.by_kind[k] = {later.by_kind[k].collectives - earlier.by_kind[k].collectives,
                               later.by_kind[k].payload_bytes - earlier.by_kind[k].payload_bytes};
    }
    difference.in_flight_ns = later.in_flight_ns - earlier.in_flight_ns;
    return difference;
  }
};

// This process's totals so far (relaxed reads: exact once the collectives
// measured have been entered on this thread).
traffic traffic_so_far() noexcept;

// One collective as a trace holds it: its kind, payload and group size.
struct traced_collective {
  collective_kind kind = collective_kind::barrier;
  std::uint64_t payload_bytes = 0;
  int group_size = 0;  // ranks of the group it ran on (0: not known)
};

// While a trace is set, every collective this process enters is appended to
// it, in the order entered (any thread; under a lock). For measurement:
// appending allocates. Set nullptr to stop before reading it.
void trace_collectives(std::vector<traced_collective>* trace) noexcept;

// Turns communication timing on or off for this process (off at start).
// On, each collective entered gets a completion callback on its work (one
// allocation per collective): a measurement's cost, which training without
// it does not pay (off, with no trace set: two relaxed loads per
// collective). Collectives already in flight when it is turned off are
// still timed to completion.
void time_collectives(bool on) noexcept;

}  // namespace loom::comm
