#include <loom/util/process_state.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <string>
#include <string_view>

namespace loom::detail {

// Plain read(2): the process may vanish between open and read (ESRCH), which
// std::ifstream would turn into an exception of its own. The state follows
// the command name's closing parenthesis (the name may hold one itself).
char process_state(long pid) {
  const std::string path = "/proc/" + std::to_string(pid) + "/stat";
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return '\0';
  char buffer[512];
  const ssize_t size = ::read(fd, buffer, sizeof(buffer));
  ::close(fd);
  if (size <= 0) return '\0';
  const std::string_view text(buffer, static_cast<std::size_t>(size));
  const auto close = text.rfind(')');
  return close != std::string_view::npos && close + 2 < text.size() ? text[close + 2] : '\0';
}

}  // namespace loom::detail
