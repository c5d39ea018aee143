// loom-plot --bench: loom-bench's CSV as bars, one row per measured cell
// (cell, precision, ranks): the step time split into forward, backward and
// optimizer (medians) with the step's median and its p10-p90 marked; and,
// per rank and step, the collective payload and the model state. No torch
// headers.
#pragma once

#include <string>

namespace loom_plot {

// The SVG of the loom-bench.csv at path; throws std::runtime_error naming
// what it cannot read (a missing column, a row that is not numbers).
std::string render_bench(const std::string& path, const std::string& title);

}  // namespace loom_plot
