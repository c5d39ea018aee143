#include "bench_bars.hpp"

#include "svg_text.hpp"

#include <loom/loggers/csv_format.hpp>

#include <algorithm>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <vector>

namespace loom_plot {

namespace {

struct bench_row {
  std::string label;  // "fsdp (32-true, 2 ranks)"
  double forward = 0, backward = 0, optimizer = 0;
  double median = 0, p10 = 0, p90 = 0;
  bool counted = false;  // loom's own cell: payload and state were counted
  double payload_mib = 0, state_mib = 0;
};

std::vector<bench_row> read_bench(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open " + path);
  std::string line;
  if (!std::getline(in, line)) throw std::runtime_error(path + " is empty");
  const auto header = loom::split_csv_line(line);
  std::map<std::string, std::size_t> column;
  for (std::size_t c = 0; c < header.size(); ++c) column[header[c]] = c;
  for (const char* name : {"cell", "precision", "world_size", "refused", "forward_ms", "backward_ms", "optimizer_ms",
                           "step_ms_median", "step_ms_p10", "step_ms_p90", "peer", "payload_bytes_per_step",
                           "state_bytes"}) {
    if (!column.count(name)) throw std::runtime_error(path + " has no column '" + name + "' (is it loom-bench's CSV?)");
  }
  std::vector<bench_row> rows;
  for (std::size_t row = 2; std::getline(in, line); ++row) {
    if (line.empty()) continue;
    const auto fields = loom::split_csv_line(line);
    const std::string where = path + ", row " + std::to_string(row);
    if (fields.size() < header.size()) throw std::runtime_error(where + ": too few fields");
    if (!fields[column["refused"]].empty()) continue;
    auto value = [&](const char* name) {
      const std::string& text = fields[column[name]];
      char* end = nullptr;
      const double v = std::strtod(text.c_str(), &end);
      if (text.empty() || end == text.c_str()) {
        throw std::runtime_error(where + ": " + name + " '" + text + "' is not a number");
      }
      return v;
    };
    bench_row r;
    const std::string& ranks = fields[column["world_size"]];
    r.label = fields[column["cell"]] + " (" + fields[column["precision"]] + ", " + ranks +
              (ranks == "1" ? " rank)" : " ranks)");
    r.forward = value("forward_ms"), r.backward = value("backward_ms"), r.optimizer = value("optimizer_ms");
    r.median = value("step_ms_median"), r.p10 = value("step_ms_p10"), r.p90 = value("step_ms_p90");
    r.counted = fields[column["peer"]] != "true";
    if (r.counted) {
      r.payload_mib = value("payload_bytes_per_step") / (1 << 20);
      r.state_mib = value("state_bytes") / (1 << 20);
    }
    rows.push_back(std::move(r));
  }
  if (rows.empty()) throw std::runtime_error(path + " has no measured cell to plot");
  return rows;
}

// One panel of horizontal bars: an x axis from 0 to the ticks above `most`.
struct bar_panel {
  double x0, y0, width, height, top;
  std::vector<double> axis;
  double scale(double v) const { return x0 + v / axis.back() * width; }
};

bar_panel draw_axes(std::ostringstream& svg, double x0, double y0, double width, double height, double most,
                    const std::string& title) {
  bar_panel pane{x0, y0, width, height, most, ticks(0, std::max(most, 1e-9))};
  svg << "<text x=\"" << x0 + width / 2 << "\" y=\"" << y0 - 26 << "\" text-anchor=\"middle\" font-size=\"13\">"
      << escape(title) << "</text>\n";
  for (double v : pane.axis) {
    svg << "<line x1=\"" << pane.scale(v) << "\" y1=\"" << y0 - 4 << "\" x2=\"" << pane.scale(v) << "\" y2=\""
        << y0 + height << "\" stroke=\"#e5e5e5\"/>\n<text x=\"" << pane.scale(v) << "\" y=\"" << y0 - 8
        << "\" text-anchor=\"middle\">" << number(v) << "</text>\n";
  }
  return pane;
}

void legend(std::ostringstream& svg, double x, double y, const std::vector<std::pair<std::string, const char*>>& keys) {
  for (const auto& [name, color] : keys) {
    svg << "<g class=\"legend\"><rect x=\"" << x << "\" y=\"" << y - 9 << "\" width=\"10\" height=\"10\" fill=\""
        << color << "\"/><text x=\"" << x + 14 << "\" y=\"" << y << "\">" << escape(name) << "</text></g>\n";
    x += 16 + 7 * static_cast<double>(name.size()) + 14;
  }
}

}  // namespace

std::string render_bench(const std::string& path, const std::string& title) {
  const auto rows = read_bench(path);
  constexpr double label_w = 380, panel_w = 360, gap = 40, row_h = 18, top = 96, bottom = 40;
  const double height = top + row_h * static_cast<double>(rows.size()) + bottom;
  const double width = label_w + 2 * panel_w + gap + 20;
  double slowest = 0, most_bytes = 0;
  for (const auto& r : rows) {
    slowest = std::max({slowest, r.p90, r.forward + r.backward + r.optimizer});
    most_bytes = std::max({most_bytes, r.payload_mib, r.state_mib});
  }
  std::ostringstream svg;
  svg << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width
      << "\" height=\"" << height << "\" viewBox=\"0 0 " << width << " " << height
      << "\" font-family=\"sans-serif\" font-size=\"11\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      << "<text x=\"" << width / 2 << "\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">" << escape(title)
      << "</text>\n";
  const double body = row_h * static_cast<double>(rows.size());
  const bar_panel time = draw_axes(svg, label_w, top, panel_w, body, slowest, "step time (ms), rank 0");
  const bar_panel bytes =
      draw_axes(svg, label_w + panel_w + gap, top, panel_w, body, most_bytes, "MiB per rank: payload/step, state");
  legend(svg, label_w, 44, {{"forward", colors[0]}, {"backward", colors[1]}, {"optimizer", colors[2]},
                            {"median, p10-p90", "black"}});
  legend(svg, bytes.x0, 44, {{"collective payload per step", colors[3]}, {"model state", colors[4]}});
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const bench_row& r = rows[i];
    const double y = top + row_h * static_cast<double>(i);
    svg << "<g class=\"cell\" data-cell=\"" << escape(r.label) << "\">\n<text x=\"" << label_w - 8 << "\" y=\""
        << y + 12 << "\" text-anchor=\"end\">" << escape(r.label) << "</text>\n";
    double start = 0;
    const std::pair<double, const char*> parts[] = {
        {r.forward, colors[0]}, {r.backward, colors[1]}, {r.optimizer, colors[2]}};
    for (const auto& [part, color] : parts) {
      svg << "<rect x=\"" << time.scale(start) << "\" y=\"" << y + 3 << "\" width=\"" << time.scale(part) - time.x0
          << "\" height=\"" << row_h - 6 << "\" fill=\"" << color << "\"/>\n";
      start += part;
    }
    svg << "<line x1=\"" << time.scale(r.p10) << "\" y1=\"" << y + row_h / 2 << "\" x2=\"" << time.scale(r.p90)
        << "\" y2=\"" << y + row_h / 2 << "\" stroke=\"black\"/>\n<line x1=\"" << time.scale(r.median) << "\" y1=\""
        << y + 1 << "\" x2=\"" << time.scale(r.median) << "\" y2=\"" << y + row_h - 1
        << "\" stroke=\"black\" stroke-width=\"2\"/>\n";
    if (r.counted) {
      const double half = (row_h - 6) / 2;
      svg << "<rect x=\"" << bytes.x0 << "\" y=\"" << y + 3 << "\" width=\"" << bytes.scale(r.payload_mib) - bytes.x0
          << "\" height=\"" << half << "\" fill=\"" << colors[3] << "\"/>\n<rect x=\"" << bytes.x0 << "\" y=\""
          << y + 3 + half << "\" width=\"" << bytes.scale(r.state_mib) - bytes.x0 << "\" height=\"" << half
          << "\" fill=\"" << colors[4] << "\"/>\n";
    }
    svg << "</g>\n";
  }
  svg << "</svg>\n";
  return svg.str();
}

}  // namespace loom_plot
