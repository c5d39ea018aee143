// What this process's NVMe offload streams (deepspeed's offload_optimizer /
// offload_param device "nvme") have read and written so far, all streams
// together: loom-bench's NVMe cells take it before and after their steps,
// as they take loom::comm::traffic_so_far() for collectives. Each request
// adds to it when it completes (two relaxed atomic adds beside the I/O). No
// torch headers.
#pragma once

#include <cstdint>

namespace loom {

struct offload_io {
  std::uint64_t bytes_read = 0;
  std::uint64_t bytes_written = 0;
  // Wall time with at least one read (write) of a stream in flight, summed
  // over the streams: bytes / busy time is the stream's throughput.
  std::uint64_t read_busy_ns = 0;
  std::uint64_t write_busy_ns = 0;

  offload_io& operator+=(const offload_io& other) noexcept {
    bytes_read += other.bytes_read;
    bytes_written += other.bytes_written;
    read_busy_ns += other.read_busy_ns;
    write_busy_ns += other.write_busy_ns;
    return *this;
  }
  friend offload_io operator-(offload_io a, const offload_io& b) noexcept {
    a.bytes_read -= b.bytes_read;
    a.bytes_written -= b.bytes_written;
    a.read_busy_ns -= b.read_busy_ns;
    a.write_busy_ns -= b.write_busy_ns;
    return a;
  }
};

// Since the process started (zero where no stream ever ran).
offload_io offload_io_so_far() noexcept;

}  // namespace loom
