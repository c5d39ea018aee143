// The CSV dialect of Lightning's metrics.csv (Python's csv module): fields
// with a comma, quote or line break are quoted, quotes doubled, rows end in
// \r\n. Shared by the CSV logger and loom-plot. No torch headers.
#pragma once

#include <string>
#include <vector>

namespace loom {

// One field, quoted when it needs to be.
std::string csv_field(const std::string& text);
// One line split into fields, quotes removed (a trailing \r is dropped).
std::vector<std::string> split_csv_line(const std::string& line);

}  // namespace loom
