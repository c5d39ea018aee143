#include "network_report.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

namespace loom_bench {

namespace {

// "<= 1448 KiB", "> 1448 KiB", "all".
std::string payload_range(double from, double up_to) {
  auto kib = [](double bytes) { return std::to_string(static_cast<long long>(bytes / 1024)) + " KiB"; };
  if (std::isfinite(up_to)) return "<= " + kib(up_to);
  return from > 0 ? "> " + kib(from) : std::string("all");
}

bool projectable(const cell_result& r) {
  return r.label.rfind("model_parallel", 0) != 0 && r.label.find("HYBRID") == std::string::npos;
}

}  // namespace

void predict(std::vector<cell_result>& results, const std::map<int, network>& models) {
  for (auto& r : results) {
    if (!r.refused.empty() || r.peer || r.world_size < 2) continue;
    const auto model = models.find(r.world_size);
    if (model == models.end()) continue;
    if (auto seconds = predict_step_seconds(model->second, r.step_collectives, r.world_size)) {
      r.predicted_comm_ms = *seconds * 1e3;
    }
  }
}

void print_fit(const network& net) {
  const int ranks = net.fitted_ranks;
  std::printf("\nThe network model %s: loom's collectives on %d ranks (median per kind and payload, each call after a "
              "barrier) and the alpha-beta model fitted to them.\n\n| collective | algorithm | payload KiB "
              "| measured ms | model ms | model / measured |\n|---|---|---|---|---|---|\n",
              net.name.c_str(), ranks);
  for (const auto& s : net.samples) {
    const auto kind = kind_named(s.kind);
    if (!kind) continue;  // a baseline beside loom's (c10d_allreduce): not modelled
    const double model = predict_seconds(net, s.kind, s.payload_bytes, ranks).value_or(0);
    std::printf("| %s | %s | %.0f | %.4f | %.4f | %.3f |\n", s.kind.c_str(), algorithm_of(*kind, ranks).name,
                s.payload_bytes / 1024, s.seconds * 1e3, model * 1e3, model / s.seconds);
  }
  std::printf("\n| collective | payloads | alpha us (per message step) | bandwidth Gb/s (per rank sending) "
              "| worst residual |\n|---|---|---|---|---|\n");
  for (const auto& [kind, cost] : net.kinds) {
    double from = 0;
    const auto residual = net.worst_residual.find(kind);
    for (const auto& regime : cost.regimes) {
      std::printf("| %s | %s | %.2f | %.3f | %s |\n", kind.c_str(), payload_range(from, regime.up_to_bytes).c_str(),
                  regime.cost.alpha_s * 1e6, regime.cost.beta_s_per_byte > 0 ? 8e-9 / regime.cost.beta_s_per_byte : 0.0,
                  residual == net.worst_residual.end() ? "-" : std::to_string(residual->second).c_str());
      from = regime.up_to_bytes;
    }
  }
}

void print_validation(const std::vector<cell_result>& results, const std::map<int, network>& models) {
  std::printf("\nThe alpha-beta model, not refitted, against each cell's collectives of one step replayed alone, one "
              "after another (rank 0, median); in flight and off-CPU: the same collectives inside the training step "
              "(in situ). Model:");
  for (const auto& [world_size, net] : models) std::printf(" at %d ranks, %s.", world_size, net.name.c_str());
  std::printf("\n\n| cell | ranks | alone ms/step | model ms/step | model / alone | within 25%% "
              "| in flight ms/step | off-CPU ms/step |\n|---|---|---|---|---|---|---|---|\n");
  int checked = 0;
  int within = 0;
  const cell_result* worst = nullptr;
  double worst_error = -1;
  for (const auto& r : results) {
    if (!r.predicted_comm_ms || !r.comm_alone_ms || r.collectives_per_step == 0) continue;
    const double ratio = *r.predicted_comm_ms / *r.comm_alone_ms;
    const bool close = ratio >= 0.75 && ratio <= 1.25;
    ++checked;
    within += close;
    if (std::abs(ratio - 1) > worst_error) {
      worst_error = std::abs(ratio - 1);
      worst = &r;
    }
    std::printf("| %s (%s) | %d | %.3f | %.3f | %.3f | %s | %.3f | %.3f |\n", r.label.c_str(), r.precision.c_str(),
                r.world_size, *r.comm_alone_ms, *r.predicted_comm_ms, ratio, close ? "yes" : "no",
                r.comm_in_flight_ms, r.off_cpu_ms);
  }
  if (worst == nullptr) {
    std::printf("\n(no cell with collectives was replayed: the replay runs at 2 or more ranks, under loom-run)\n");
    return;
  }
  std::printf("\nalpha_beta_within_25pct=%d/%d worst_ratio=%.3f cell=%s\n", within, checked,
              *worst->predicted_comm_ms / *worst->comm_alone_ms, worst->label.c_str());
}

void print_projection(const std::vector<cell_result>& results, const network& net,
                      const std::vector<std::int64_t>& ranks) {
  int measured_at = 0;
  for (const auto& r : results) {
    if (r.refused.empty() && !r.peer && r.collectives_per_step > 0) measured_at = std::max(measured_at, r.world_size);
  }
  if (measured_at < 2) {
    std::printf("\nNo projection: no cell ran collectives (measure at 2 or more ranks).\n");
    return;
  }
  std::printf("\nPROJECTION, not a measurement: the alpha-beta model on \"%s\", communication ms per step per rank, "
              "from each cell's collectives of one step as recorded at %d ranks (payloads kept: no strategy's formula "
              "grows with N but for padding), every collective spanning all N ranks with the algorithm it ran here, "
              "one after another (no overlap). Left out: cells whose groups are not the world (model_parallel's "
              "2-D mesh, hybrid sharding).\n\n| cell |",
              net.name.c_str(), measured_at);
  for (const auto n : ranks) std::printf(" N=%lld |", static_cast<long long>(n));
  std::printf("\n|---|");
  for (std::size_t i = 0; i < ranks.size(); ++i) std::printf("---|");
  std::printf("\n");
  for (const auto& r : results) {
    if (!r.refused.empty() || r.peer || r.world_size != measured_at || r.collectives_per_step == 0) continue;
    if (!projectable(r)) continue;
    std::printf("| %s (%s) |", r.label.c_str(), r.precision.c_str());
    for (const auto n : ranks) {
      const auto seconds = predict_step_seconds(net, r.step_collectives, static_cast<int>(n));
      if (seconds) std::printf(" %.3f |", *seconds * 1e3);
      else std::printf(" - |");
    }
    std::printf("\n");
  }
}

}  // namespace loom_bench
