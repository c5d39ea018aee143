// loom-plot: an SVG of the metrics a CSV logger wrote, each against step.
//
//   loom-plot metrics.csv -o curves.svg [--metrics train_loss,val_loss] [--title TEXT]
//   loom-plot --bench loom-bench/loom-bench.csv -o loom-bench.svg   (plot/bench_bars.hpp)
//
// One panel per metric; a train_/val_/test_ pair (train_loss, val_loss)
// shares a panel, told apart by the legend. Axes have ticks at round values
// and labels; points that are not finite are left out. No torch headers.
#include "plot/bench_bars.hpp"
#include "plot/svg_text.hpp"

#include <loom/loggers/csv_format.hpp>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using loom_plot::colors;
using loom_plot::escape;
using loom_plot::number;
using loom_plot::ticks;

struct series {
  std::string name;
  std::vector<std::pair<double, double>> points;  // (step, value)
};

struct panel {
  std::string title;
  std::vector<series> lines;
};

std::vector<series> read_metrics(const std::string& path, const std::vector<std::string>& wanted) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open " + path);
  std::string line;
  if (!std::getline(in, line)) throw std::runtime_error(path + " is empty");
  const std::vector<std::string> header = loom::split_csv_line(line);
  const auto step_it = std::find(header.begin(), header.end(), "step");
  if (step_it == header.end()) throw std::runtime_error(path + " has no 'step' column (is it a loom/Lightning metrics.csv?)");
  const auto step_column = static_cast<std::size_t>(step_it - header.begin());
  std::vector<series> out;
  std::vector<int> column_to_series(header.size(), -1);
  for (std::size_t c = 0; c < header.size(); ++c) {
    const bool chosen = wanted.empty() ? header[c] != "step" && header[c] != "epoch"
                                       : std::find(wanted.begin(), wanted.end(), header[c]) != wanted.end();
    if (!chosen) continue;
    column_to_series[c] = static_cast<int>(out.size());
    out.push_back({header[c], {}});
  }
  for (const auto& name : wanted) {
    if (std::find(header.begin(), header.end(), name) == header.end()) {
      throw std::runtime_error(path + " has no column '" + name + "'");
    }
  }
  std::size_t row = 1;
  while (std::getline(in, line)) {
    ++row;
    if (line.empty() || line == "\r") continue;
    const auto fields = loom::split_csv_line(line);
    if (step_column >= fields.size() || fields[step_column].empty()) continue;
    const double step = std::stod(fields[step_column]);
    for (std::size_t c = 0; c < fields.size() && c < header.size(); ++c) {
      if (column_to_series[c] < 0 || fields[c].empty()) continue;
      char* end = nullptr;
      const double value = std::strtod(fields[c].c_str(), &end);
      if (end == fields[c].c_str()) {
        throw std::runtime_error(path + ", row " + std::to_string(row) + ": '" + fields[c] + "' is not a number");
      }
      if (std::isfinite(value)) out[static_cast<std::size_t>(column_to_series[c])].points.emplace_back(step, value);
    }
  }
  std::erase_if(out, [](const series& s) { return s.points.empty(); });
  return out;
}

// train_loss and val_loss share the panel "loss"; other names stand alone.
std::vector<panel> group(std::vector<series> all) {
  std::vector<panel> panels;
  std::map<std::string, std::size_t> by_title;
  for (auto& s : all) {
    std::string title = s.name;
    for (const char* prefix : {"train_", "val_", "test_"}) {
      if (s.name.rfind(prefix, 0) == 0) title = s.name.substr(std::string(prefix).size());
    }
    auto it = by_title.find(title);
    if (it == by_title.end()) {
      by_title[title] = panels.size();
      panels.push_back({title, {std::move(s)}});
    } else {
      panels[it->second].lines.push_back(std::move(s));
    }
  }
  return panels;
}

std::string render(const std::vector<panel>& panels, const std::string& title) {
  constexpr int panel_w = 460, panel_h = 280, columns = 2, top = 40;
  constexpr int left = 70, right = 20, upper = 34, lower = 46;  // margins of a plot inside its panel
  const int rows = static_cast<int>((panels.size() + columns - 1) / columns);
  const int width = panel_w * std::min<int>(columns, static_cast<int>(panels.size()));
  const int height = top + panel_h * rows;
  std::ostringstream svg;
  svg << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\"" << height
      << "\" viewBox=\"0 0 " << width << " " << height << "\" font-family=\"sans-serif\" font-size=\"11\">\n"
      << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      << "<text x=\"" << width / 2 << "\" y=\"24\" text-anchor=\"middle\" font-size=\"15\">" << escape(title)
      << "</text>\n";
  for (std::size_t p = 0; p < panels.size(); ++p) {
    const panel& pane = panels[p];
    const int x0 = static_cast<int>(p % columns) * panel_w + left;
    const int y0 = top + static_cast<int>(p / columns) * panel_h + upper;
    const int w = panel_w - left - right, h = panel_h - upper - lower;
    double xmin = std::numeric_limits<double>::infinity(), xmax = -xmin, ymin = xmin, ymax = -xmin;
    for (const auto& line : pane.lines) {
      for (const auto& [x, y] : line.points) {
        xmin = std::min(xmin, x), xmax = std::max(xmax, x), ymin = std::min(ymin, y), ymax = std::max(ymax, y);
      }
    }
    const auto xt = ticks(xmin, xmax), yt = ticks(ymin, ymax);
    const double xlo = xt.front(), xhi = xt.back(), ylo = yt.front(), yhi = yt.back();
    auto sx = [&](double x) { return x0 + (x - xlo) / (xhi - xlo) * w; };
    auto sy = [&](double y) { return y0 + h - (y - ylo) / (yhi - ylo) * h; };
    svg << "<g class=\"panel\" id=\"panel-" << escape(pane.title) << "\">\n"
        << "<text x=\"" << x0 + w / 2 << "\" y=\"" << y0 - 12 << "\" text-anchor=\"middle\" font-size=\"13\">"
        << escape(pane.title) << "</text>\n";
    for (double v : yt) {
      svg << "<line x1=\"" << x0 << "\" y1=\"" << sy(v) << "\" x2=\"" << x0 + w << "\" y2=\"" << sy(v)
          << "\" stroke=\"#e5e5e5\"/>\n<text x=\"" << x0 - 6 << "\" y=\"" << sy(v) + 4 << "\" text-anchor=\"end\">"
          << number(v) << "</text>\n";
    }
    for (double v : xt) {
      svg << "<line x1=\"" << sx(v) << "\" y1=\"" << y0 + h << "\" x2=\"" << sx(v) << "\" y2=\"" << y0 + h + 5
          << "\" stroke=\"black\"/>\n<text x=\"" << sx(v) << "\" y=\"" << y0 + h + 18 << "\" text-anchor=\"middle\">"
          << number(v) << "</text>\n";
    }
    svg << "<line x1=\"" << x0 << "\" y1=\"" << y0 << "\" x2=\"" << x0 << "\" y2=\"" << y0 + h << "\" stroke=\"black\"/>\n"
        << "<line x1=\"" << x0 << "\" y1=\"" << y0 + h << "\" x2=\"" << x0 + w << "\" y2=\"" << y0 + h
        << "\" stroke=\"black\"/>\n"
        << "<text x=\"" << x0 + w / 2 << "\" y=\"" << y0 + h + 36 << "\" text-anchor=\"middle\">step</text>\n"
        << "<text transform=\"translate(" << x0 - 52 << "," << y0 + h / 2 << ") rotate(-90)\" text-anchor=\"middle\">"
        << escape(pane.title) << "</text>\n";
    svg << "<rect class=\"legend-box\" x=\"" << x0 + w - 156 << "\" y=\"" << y0 << "\" width=\"152\" height=\""
        << 16 * pane.lines.size() + 6 << "\" fill=\"white\" fill-opacity=\"0.85\"/>\n";
    for (std::size_t l = 0; l < pane.lines.size(); ++l) {
      const auto& line = pane.lines[l];
      const char* color = colors[l % std::size(colors)];
      svg << "<polyline class=\"series\" data-metric=\"" << escape(line.name) << "\" fill=\"none\" stroke=\"" << color
          << "\" stroke-width=\"1.5\" points=\"";
      for (const auto& [x, y] : line.points) svg << sx(x) << "," << sy(y) << " ";
      svg << "\"/>\n";
      if (line.points.size() == 1) {
        svg << "<circle cx=\"" << sx(line.points[0].first) << "\" cy=\"" << sy(line.points[0].second)
            << "\" r=\"3\" fill=\"" << color << "\"/>\n";
      }
      // The legend, top right inside the plot.
      const int ly = y0 + 8 + static_cast<int>(l) * 16;
      svg << "<g class=\"legend\"><rect x=\"" << x0 + w - 150 << "\" y=\"" << ly - 2 << "\" width=\"14\" height=\"4\" fill=\""
          << color << "\"/><text x=\"" << x0 + w - 130 << "\" y=\"" << ly + 4 << "\">" << escape(line.name)
          << "</text></g>\n";
    }
    svg << "</g>\n";
  }
  svg << "</svg>\n";
  return svg.str();
}

}  // namespace

int main(int argc, char** argv) {
  std::string input;
  std::string output = "curves.svg";
  std::string title;
  std::vector<std::string> wanted;
  CLI::App app("loom-plot: an SVG of each metric in a CSV logger's metrics.csv against step");
  app.add_option("metrics_csv", input, "the metrics.csv a loom (or Lightning) CSV logger wrote")->required();
  app.add_option("-o,--output", output, "the SVG to write");
  app.add_option("--metrics", wanted, "columns to plot (default: all but step and epoch)")->delimiter(',');
  app.add_option("--title", title, "a title above the panels (default: the CSV's path)");
  bool bench = false;
  app.add_flag("--bench", bench,
               "the CSV is loom-bench's: bars of each cell's step time and its split, and of its payload and state "
               "per rank");
  CLI11_PARSE(app, argc, argv);
  try {
    std::string svg;
    std::size_t count = 1;
    if (bench) {
      svg = loom_plot::render_bench(input, title.empty() ? input : title);
    } else {
      const auto panels = group(read_metrics(input, wanted));
      if (panels.empty()) throw std::runtime_error(input + " has no metric values to plot");
      svg = render(panels, title.empty() ? input : title);
      count = panels.size();
    }
    const std::string temporary = output + ".tmp";
    {
      std::ofstream out(temporary, std::ios::trunc);
      out << svg;
      if (!out) throw std::runtime_error("cannot write " + temporary);
    }
    if (std::rename(temporary.c_str(), output.c_str()) != 0) throw std::runtime_error("cannot write " + output);
    std::cerr << "loom-plot: " << (bench ? 2 : count) << " panel(s) -> " << output << '\n';
    return 0;
  } catch (const std::exception& error) {
    std::cerr << "loom-plot: " << error.what() << '\n';
    return 1;
  }
}
