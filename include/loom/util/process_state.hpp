// A process's state letter from /proc/<pid>/stat ('R', 'S', 'T' stopped,
// 't' traced, 'Z' zombie, ...), or '\0' when it cannot be read (the process
// is gone). What loom reads to name a dead peer (comm) and to SIGKILL a
// stopped child (the supervisor). No torch headers.
#pragma once

namespace loom::detail {

char process_state(long pid);

}  // namespace loom::detail
