#include "network_model.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <ostream>
#include <stdexcept>

namespace loom_bench {

using loom::comm::collective_kind;

namespace {

double log2_ceil(int ranks) { return std::ceil(std::log2(static_cast<double>(std::max(ranks, 1)))); }

// 8e-9 / beta: Gb/s from seconds per byte, and back.
double gbit_per_s(double beta_s_per_byte) { return beta_s_per_byte > 0 ? 8e-9 / beta_s_per_byte : 0; }

link_cost read_cost(const nlohmann::json& entry, const std::string& where) {
  // A kind that sends nothing (a barrier) has no bandwidth.
  const double alpha_us = entry.at("alpha_us").get<double>();
  const double gbit = entry.contains("bandwidth_gbit_s") ? entry.at("bandwidth_gbit_s").get<double>() : 0;
  if (!(alpha_us >= 0) || !(gbit >= 0) || !std::isfinite(alpha_us) || !std::isfinite(gbit)) {
    throw std::runtime_error(where + ": alpha_us and bandwidth_gbit_s must be finite numbers >= 0");
  }
  return {alpha_us * 1e-6, gbit > 0 ? 8e-9 / gbit : 0};
}

nlohmann::json cost_json(const link_cost& cost) {
  nlohmann::json entry{{"alpha_us", cost.alpha_s * 1e6}};
  if (cost.beta_s_per_byte > 0) entry["bandwidth_gbit_s"] = gbit_per_s(cost.beta_s_per_byte);
  return entry;
}

}  // namespace

algorithm algorithm_of(collective_kind kind, int ranks) {
  const double n = std::max(ranks, 1);
  const double others = n - 1;
  switch (kind) {
    case collective_kind::all_reduce:
    case collective_kind::all_reduce_coalesced:
      // Gloo's default (UNSPECIFIED -> ring): a reduce-scatter and an all-gather around the ring.
      return {"ring (Gloo)", 2 * others, 2 * others / n};
    case collective_kind::all_gather:
    case collective_kind::all_gather_coalesced:
    case collective_kind::reduce_scatter:
    case collective_kind::all_to_all:
      // loom's emulation on Gloo: each rank sends its chunk to each other rank.
      return {"pairwise exchange (loom's emulation)", others, others / n};
    case collective_kind::broadcast:
      // Gloo's binomial tree: log2 N rounds, N - 1 copies of the payload in all.
      return {"binomial tree (Gloo)", log2_ceil(ranks), others / n};
    case collective_kind::reduce:
    case collective_kind::gather:
    case collective_kind::scatter:
      return {"to or from the root (Gloo)", others, others / n};
    case collective_kind::barrier: return {"barrier (Gloo)", 2 * log2_ceil(ranks), 0};
  }
  return {"unknown", others, others / n};
}

std::optional<collective_kind> kind_named(const std::string& name) {
  for (std::size_t k = 0; k < loom::comm::collective_kinds; ++k) {
    const auto kind = static_cast<collective_kind>(k);
    if (name == loom::comm::name_of(kind)) return kind;
  }
  return std::nullopt;
}

double wire_bytes(const std::map<std::string, std::pair<double, double>>& by_kind, int ranks) {
  double sum = 0;
  for (const auto& [name, count] : by_kind) {
    if (auto kind = kind_named(name)) sum += algorithm_of(*kind, ranks).wire_per_payload * count.second;
  }
  return sum;
}

const link_cost& kind_cost::at(double payload_bytes) const {
  for (const auto& r : regimes) {
    if (payload_bytes <= r.up_to_bytes) return r.cost;
  }
  return regimes.back().cost;
}

const link_cost* network::cost_of(const std::string& kind, double payload_bytes) const {
  auto it = kinds.find(kind);
  // A coalesced form costs what its plain form does.
  if (it == kinds.end() && (kind == "all_reduce_coalesced" || kind == "all_gather_coalesced")) {
    it = kinds.find(kind.substr(0, kind.size() - std::string("_coalesced").size()));
  }
  if (it != kinds.end() && !it->second.regimes.empty()) return &it->second.at(payload_bytes);
  return other ? &*other : nullptr;
}

std::optional<double> predict_seconds(const network& net, const std::string& kind, double payload_bytes,
                                      int ranks) {
  const auto known = kind_named(kind);
  const link_cost* cost = net.cost_of(kind, payload_bytes);
  if (!known || cost == nullptr) return std::nullopt;
  const algorithm how = algorithm_of(*known, ranks);
  return how.steps * cost->alpha_s + how.wire_per_payload * payload_bytes * cost->beta_s_per_byte;
}

std::optional<double> predict_step_seconds(const network& net,
                                           const std::vector<std::pair<std::string, double>>& collectives,
                                           int ranks) {
  double sum = 0;
  for (const auto& [kind, payload] : collectives) {
    const auto seconds = predict_seconds(net, kind, payload, ranks);
    if (!seconds) return std::nullopt;
    sum += *seconds;
  }
  return sum;
}

namespace {

struct line {
  double a = 0;  // seconds
  double b = 0;  // seconds per payload byte
  double error = 0;  // the weighted sum of squared relative residuals
};

// t = a + b x over points [first, last), weights 1/t^2, a and b >= 0.
line fit_line(const std::vector<const sample*>& points, std::size_t first, std::size_t last) {
  double sw = 0, sx = 0, st = 0, sxx = 0, sxt = 0;
  for (std::size_t i = first; i < last; ++i) {
    const sample* p = points[i];
    const double w = 1 / (p->seconds * p->seconds);
    sw += w;
    sx += w * p->payload_bytes;
    st += w * p->seconds;
    sxx += w * p->payload_bytes * p->payload_bytes;
    sxt += w * p->payload_bytes * p->seconds;
  }
  const double det = sw * sxx - sx * sx;
  line fitted{det != 0 ? (sxx * st - sx * sxt) / det : st / sw, det != 0 ? (sw * sxt - sx * st) / det : 0};
  if (fitted.a < 0) fitted = {0, sxx > 0 ? sxt / sxx : 0};  // keep both terms physical: refit the one left
  if (fitted.b < 0) fitted = {st / sw, 0};
  for (std::size_t i = first; i < last; ++i) {
    const double relative = (fitted.a + fitted.b * points[i]->payload_bytes - points[i]->seconds) / points[i]->seconds;
    fitted.error += relative * relative;
  }
  return fitted;
}

}  // namespace

network fit_network(const std::vector<sample>& samples, int ranks, std::string name) {
  constexpr std::size_t least_per_regime = 3;
  network net;
  net.name = std::move(name);
  net.fitted_ranks = ranks;
  net.samples = samples;
  std::map<std::string, std::vector<const sample*>> by_kind;
  for (const auto& s : net.samples) by_kind[s.kind].push_back(&s);
  for (auto& [kind, points] : by_kind) {
    const auto known = kind_named(kind);
    if (!known || points.empty()) continue;
    std::sort(points.begin(), points.end(),
              [](const sample* x, const sample* y) { return x->payload_bytes < y->payload_bytes; });
    // One line, or the best split into two.
    std::vector<std::pair<std::size_t, line>> pieces{{points.size(), fit_line(points, 0, points.size())}};
    double best = pieces.front().second.error;
    for (std::size_t split = least_per_regime; split + least_per_regime <= points.size(); ++split) {
      const line low = fit_line(points, 0, split);
      const line high = fit_line(points, split, points.size());
      if (low.error + high.error < best) {
        best = low.error + high.error;
        pieces = {{split, low}, {points.size(), high}};
      }
    }
    const algorithm how = algorithm_of(*known, ranks);
    kind_cost cost;
    double worst = 0;
    std::size_t first = 0;
    for (const auto& [end, fitted] : pieces) {
      const double bound = end == points.size()
                               ? std::numeric_limits<double>::infinity()
                               : std::sqrt(points[end - 1]->payload_bytes * points[end]->payload_bytes);
      cost.regimes.push_back({bound, {how.steps > 0 ? fitted.a / how.steps : 0,
                                      how.wire_per_payload > 0 ? fitted.b / how.wire_per_payload : 0}});
      for (std::size_t i = first; i < end; ++i) {
        worst = std::max(worst, std::abs(fitted.a + fitted.b * points[i]->payload_bytes - points[i]->seconds) /
                                    points[i]->seconds);
      }
      first = end;
    }
    net.kinds[kind] = std::move(cost);
    net.worst_residual[kind] = worst;
  }
  return net;
}

namespace {

// One regime (an object) or several (a list, each but the last bounded).
kind_cost read_kind(const nlohmann::json& entry, const std::string& where) {
  kind_cost cost;
  if (!entry.is_array()) {
    cost.regimes.push_back({std::numeric_limits<double>::infinity(), read_cost(entry, where)});
    return cost;
  }
  if (entry.empty()) throw std::runtime_error(where + ": an empty list of regimes");
  double previous = 0;
  for (std::size_t i = 0; i < entry.size(); ++i) {
    const bool last = i + 1 == entry.size();
    const double bound = last ? std::numeric_limits<double>::infinity() : entry[i].at("up_to_bytes").get<double>();
    if (!last && !(bound > previous)) {
      throw std::runtime_error(where + ": up_to_bytes must grow from one regime to the next");
    }
    cost.regimes.push_back({bound, read_cost(entry[i], where)});
    previous = bound;
  }
  return cost;
}

nlohmann::json kind_json(const kind_cost& cost) {
  if (cost.regimes.size() == 1) return cost_json(cost.regimes.front().cost);
  nlohmann::json regimes = nlohmann::json::array();
  for (const auto& r : cost.regimes) {
    nlohmann::json entry = cost_json(r.cost);
    if (std::isfinite(r.up_to_bytes)) entry["up_to_bytes"] = std::round(r.up_to_bytes);
    regimes.push_back(entry);
  }
  return regimes;
}

}  // namespace

network read_network(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("the network file " + path + " cannot be read");
  network net;
  try {
    const auto document = nlohmann::json::parse(in);
    net.name = document.at("name").get<std::string>();
    net.fitted_ranks = document.value("fitted_ranks", 0);
    if (document.contains("collectives")) {
      for (const auto& [kind, entry] : document.at("collectives").items()) {
        if (!kind_named(kind)) {
          throw std::runtime_error(path + ": '" + kind + "' is not a collective (all_reduce, all_gather, "
                                   "reduce_scatter, broadcast, barrier, ...)");
        }
        net.kinds[kind] = read_kind(entry, path + ": " + kind);
      }
    }
    if (document.contains("worst_residual")) {
      for (const auto& [kind, value] : document.at("worst_residual").items()) {
        net.worst_residual[kind] = value.get<double>();
      }
    }
    if (document.contains("samples")) {
      for (const auto& entry : document.at("samples")) {
        net.samples.push_back({entry.at("collective").get<std::string>(), entry.at("payload_bytes").get<double>(),
                               entry.at("seconds").get<double>()});
      }
    }
    if (document.contains("other")) net.other = read_cost(document.at("other"), path + ": other");
  } catch (const nlohmann::json::exception& error) {
    throw std::runtime_error(path + " is not a network file ({\"name\": ..., \"collectives\": {KIND: {\"alpha_us\": "
                             "A, \"bandwidth_gbit_s\": B}}, \"other\": {...}}): " + error.what());
  }
  if (net.kinds.empty() && !net.other) throw std::runtime_error(path + ": neither 'collectives' nor 'other' given");
  return net;
}

void write_network(std::ostream& out, const network& net) {
  nlohmann::json collectives = nlohmann::json::object();
  for (const auto& [kind, cost] : net.kinds) collectives[kind] = kind_json(cost);
  nlohmann::json document{{"name", net.name}, {"collectives", collectives}};
  if (net.fitted_ranks > 0) document["fitted_ranks"] = net.fitted_ranks;
  if (!net.worst_residual.empty()) document["worst_residual"] = net.worst_residual;
  if (net.other) document["other"] = cost_json(*net.other);
  if (!net.samples.empty()) {
    nlohmann::json samples = nlohmann::json::array();
    for (const auto& s : net.samples) {
      samples.push_back({{"collective", s.kind}, {"payload_bytes", s.payload_bytes}, {"seconds", s.seconds}});
    }
    document["samples"] = samples;
  }
  out << document.dump(1) << '\n';
}

}  // namespace loom_bench
