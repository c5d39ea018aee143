// What loom-plot's SVGs share: round axis ticks, numbers and text as SVG
// writes them, and the series colours. No torch headers.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

namespace loom_plot {

// Round tick values covering [low, high]: steps of 1, 2 or 5 times a power of ten.
inline std::vector<double> ticks(double low, double high, int wanted = 5) {
  if (!(high > low)) {
    const double pad = std::max(std::fabs(low) * 0.1, 1.0);
    low -= pad;
    high += pad;
  }
  const double raw = (high - low) / wanted;
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  double step = magnitude;
  for (double factor : {1.0, 2.0, 5.0, 10.0}) {
    step = factor * magnitude;
    if (raw <= step) break;
  }
  // From the last round value at or below low to the first at or above high.
  const double first = std::floor(low / step) * step;
  const auto count = static_cast<int>(std::llround(std::ceil(high / step) - std::floor(low / step)));
  std::vector<double> out;
  for (int i = 0; i <= count; ++i) {
    const double v = first + i * step;
    out.push_back(std::fabs(v) < step * 1e-9 ? 0.0 : v);
  }
  return out;
}

inline std::string number(double v) {
  char buffer[32];
  if (v != 0 && (std::fabs(v) >= 1e5 || std::fabs(v) < 1e-3)) std::snprintf(buffer, sizeof(buffer), "%.1e", v);
  else std::snprintf(buffer, sizeof(buffer), "%.6g", v);
  return buffer;
}

inline std::string escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

inline const char* const colors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"};

}  // namespace loom_plot
