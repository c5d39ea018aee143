#include "results.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <ostream>
#include <stdexcept>
#include <tuple>
#include <utility>

namespace loom_bench {

namespace {

// The value at fraction q of the sorted values (nearest rank, interpolated).
double quantile(const std::vector<double>& sorted, double q) {
  const double position = q * static_cast<double>(sorted.size() - 1);
  const auto below = static_cast<std::size_t>(std::floor(position));
  const auto above = std::min(below + 1, sorted.size() - 1);
  return sorted[below] + (position - static_cast<double>(below)) * (sorted[above] - sorted[below]);
}

std::string fixed(double value, int decimals) {
  char text[64];
  std::snprintf(text, sizeof text, "%.*f", decimals, value);
  return text;
}

std::string optional_text(const std::optional<double>& value, int decimals) {
  return value ? fixed(*value, decimals) : std::string("-");
}

nlohmann::json optional_json(const std::optional<double>& value) {
  return value ? nlohmann::json(*value) : nlohmann::json(nullptr);
}

// A measured count over its formula's ("= 0" where both are 0; "-": no formula).
std::string formula_check(double measured, const std::optional<double>& formula) {
  if (!formula) return "-";
  if (*formula == 0) return measured == 0 ? "= 0" : "not 0";
  return fixed(measured / *formula, 4);
}

// {"all_gather": {"collectives": 8, "payload_bytes": 1.2e7}, ...} per step.
nlohmann::json by_kind_json(const cell_result& r) {
  nlohmann::json kinds = nlohmann::json::object();
  for (const auto& [kind, count] : r.collectives_by_kind) {
    kinds[kind] = {{"collectives", count.first}, {"payload_bytes", count.second}};
  }
  return kinds;
}

void write_nvme_markdown(std::ostream& out, const std::vector<cell_result>& results) {
  if (std::none_of(results.begin(), results.end(), [](const cell_result& r) { return r.nvme.has_value(); })) return;
  out << "\nNVMe offload per step (loom/util/offload_io.hpp): bytes read and written by rank 0, and throughput: bytes "
         "/ the time with at least one request of that kind in flight, MB/s (10^6 bytes); all ranks: the ranks' "
         "throughputs summed (they share the disk).\n\n"
      << "| cell | precision | ranks | read MB/step | written MB/step | read MB/s | write MB/s | read MB/s, all ranks "
         "| write MB/s, all ranks |\n|---|---|---|---|---|---|---|---|---|\n";
  for (const auto& r : results) {
    if (!r.nvme) continue;
    const offload_figures& io = *r.nvme;
    out << "| " << r.label << " | " << r.precision << " | " << r.world_size << " | "
        << fixed(io.read_bytes_per_step / 1e6, 2) << " | " << fixed(io.written_bytes_per_step / 1e6, 2) << " | "
        << fixed(io.read_mb_per_s, 1) << " | " << fixed(io.write_mb_per_s, 1) << " | "
        << optional_text(io.read_mb_per_s_all_ranks, 1) << " | " << optional_text(io.write_mb_per_s_all_ranks, 1)
        << " |\n";
  }
}

nlohmann::json nvme_json(const std::optional<offload_figures>& io) {
  if (!io) return nullptr;
  return {{"read_bytes_per_step", io->read_bytes_per_step},
          {"written_bytes_per_step", io->written_bytes_per_step},
          {"read_mb_per_s", io->read_mb_per_s},
          {"write_mb_per_s", io->write_mb_per_s},
          {"read_mb_per_s_all_ranks", optional_json(io->read_mb_per_s_all_ranks)},
          {"write_mb_per_s_all_ranks", optional_json(io->write_mb_per_s_all_ranks)}};
}

std::optional<offload_figures> nvme_from_json(const nlohmann::json& cell) {
  if (!cell.contains("nvme") || cell.at("nvme").is_null()) return std::nullopt;
  const auto& io = cell.at("nvme");
  const auto optional = [&](const char* key) -> std::optional<double> {
    if (io.at(key).is_null()) return std::nullopt;
    return io.at(key).get<double>();
  };
  return offload_figures{io.at("read_bytes_per_step").get<double>(), io.at("written_bytes_per_step").get<double>(),
                         io.at("read_mb_per_s").get<double>(), io.at("write_mb_per_s").get<double>(),
                         optional("read_mb_per_s_all_ranks"), optional("write_mb_per_s_all_ranks")};
}

}  // namespace

spread spread_of(std::vector<double> values) {
  if (values.empty()) return {};
  std::sort(values.begin(), values.end());
  return {quantile(values, 0.5), quantile(values, 0.1), quantile(values, 0.9)};
}

void summarize(cell_result& result) {
  const step_samples& s = result.samples;
  if (s.step.empty()) return;
  const double before = result.step_ms.median;
  result.steps = static_cast<int>(s.step.size());
  result.step_ms = spread_of(s.step);
  result.forward_ms = spread_of(s.forward).median;
  result.backward_ms = spread_of(s.backward).median;
  result.optimizer_ms = spread_of(s.optimizer).median;
  result.off_cpu_ms = spread_of(s.off_cpu).median;
  if (before > 0 && result.step_ms.median > 0) {
    const double scale = before / result.step_ms.median;
    result.samples_per_second *= scale;
    result.flop_per_second *= scale;
  }
}

std::vector<cell_result> merge_rounds(const std::vector<cell_result>& results) {
  std::vector<cell_result> merged;
  std::map<std::tuple<std::string, std::string, int>, std::pair<std::size_t, int>> seen;  // -> index, rounds
  for (const auto& r : results) {
    const auto key = std::make_tuple(r.label, r.precision, r.world_size);
    auto it = seen.find(key);
    if (it == seen.end()) {
      seen.emplace(key, std::pair{merged.size(), 1});
      merged.push_back(r);
      continue;
    }
    cell_result& m = merged[it->second.first];
    const int rounds = ++it->second.second;
    if (!r.refused.empty() || !m.refused.empty()) {
      if (m.refused.empty()) m.refused = r.refused;
      continue;
    }
    for (auto [into, from] : {std::pair{&m.samples.step, &r.samples.step}, {&m.samples.forward, &r.samples.forward},
                              {&m.samples.backward, &r.samples.backward}, {&m.samples.optimizer, &r.samples.optimizer},
                              {&m.samples.off_cpu, &r.samples.off_cpu}}) {
      into->insert(into->end(), from->begin(), from->end());
    }
    m.comm_in_flight_ms += (r.comm_in_flight_ms - m.comm_in_flight_ms) / rounds;
    if (m.comm_alone_ms && r.comm_alone_ms) *m.comm_alone_ms += (*r.comm_alone_ms - *m.comm_alone_ms) / rounds;
    m.rss_peak_mib = std::max(m.rss_peak_mib, r.rss_peak_mib);
    summarize(m);
  }
  return merged;
}

void compare(std::vector<cell_result>& results) {
  // (precision, world size) -> the raw loop's median; precision -> single_device's at one rank.
  std::map<std::pair<std::string, int>, double> raw;
  std::map<std::string, double> single;
  for (const auto& r : results) {
    if (!r.refused.empty() || r.steps == 0) continue;
    if (r.label == "raw") raw[{r.precision, r.world_size}] = r.step_ms.median;
    if (r.label == "single_device" && r.world_size == 1) single[r.precision] = r.step_ms.median;
  }
  // (peer, precision, world size) -> the PyTorch peer's median.
  std::map<std::tuple<std::string, std::string, int>, double> peers;
  for (const auto& r : results) {
    if (r.peer && r.refused.empty() && r.steps > 0) peers[{r.label, r.precision, r.world_size}] = r.step_ms.median;
  }
  const std::map<std::string, std::string> peer_of{{"ddp", "torch_ddp"}, {"deepspeed_stage_1", "torch_zero1"}};
  for (auto& r : results) {
    if (!r.refused.empty() || r.steps == 0) continue;
    if (auto kind = peer_of.find(r.label); kind != peer_of.end()) {
      if (auto it = peers.find({kind->second, r.precision, r.world_size}); it != peers.end()) {
        r.vs_peer = r.step_ms.median / it->second;
      }
    }
    if (auto it = raw.find({r.precision, r.world_size}); it != raw.end() && r.label != "raw") {
      r.beyond_raw_ms = r.step_ms.median - it->second;
    }
    if (auto it = single.find(r.precision); it != single.end()) r.vs_single_device = r.step_ms.median / it->second;
  }
}

void write_markdown(std::ostream& out, const std::vector<cell_result>& results) {
  out << "Time per step (ms; rank 0). Off-CPU: the training thread's wall time off the CPU, waiting on a "
         "collective (exposed communication) or for a core.\n\n"
      << "| cell | precision | ranks | step ms (p10-p90) | forward | backward | optimizer | off-CPU "
         "| beyond raw loop ms | samples/s | GFLOP/s | x single_device (1 rank) | x PyTorch peer |\n"
      << "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (const auto& r : results) {
    out << "| " << r.label << " | " << r.precision << " | " << r.world_size << " | ";
    if (!r.refused.empty()) {
      out << "refused: " << r.refused << " | | | | | | | | | |\n";
      continue;
    }
    out << fixed(r.step_ms.median, 2) << " (" << fixed(r.step_ms.p10, 2) << "-" << fixed(r.step_ms.p90, 2) << ") | "
        << fixed(r.forward_ms, 2) << " | " << fixed(r.backward_ms, 2) << " | " << fixed(r.optimizer_ms, 2) << " | "
        << fixed(r.off_cpu_ms, 2) << " | " << optional_text(r.beyond_raw_ms, 2) << " | "
        << fixed(r.samples_per_second, 0) << " | " << (r.peer ? "-" : fixed(r.flop_per_second / 1e9, 2)) << " | "
        << optional_text(r.vs_single_device, 3) << " | " << optional_text(r.vs_peer, 3) << " |\n";
  }
  out << "\nCommunication and memory per rank (rank 0; loom's cells). Payload: the collectives' logical tensors "
         "(loom/comm/traffic.hpp), against the strategy's formula; wire: an estimate of the bytes sent for the "
         "algorithm each collective ran; in flight: wall time while any collective was in flight during the "
         "steps (overlap counted once; loom's emulated collectives until the caller waits for them); alone: the "
         "step's collectives replayed one after another with nothing else running; alpha-beta: the network "
         "model's time for them (--network).\n\n"
      << "| cell | precision | ranks | collectives/step | payload MiB/step | payload / formula | wire MiB/step "
         "| comm in flight ms/step | comm alone ms/step | alpha-beta ms/step | alpha-beta / alone | state MiB/rank "
         "| state / formula | RSS peak MiB |\n"
      << "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (const auto& r : results) {
    if (!r.refused.empty() || r.peer) continue;
    std::optional<double> model_ratio;
    if (r.predicted_comm_ms && r.comm_alone_ms && *r.comm_alone_ms > 0) {
      model_ratio = *r.predicted_comm_ms / *r.comm_alone_ms;
    }
    out << "| " << r.label << " | " << r.precision << " | " << r.world_size << " | " << fixed(r.collectives_per_step, 1)
        << " | " << fixed(r.payload_bytes_per_step / (1 << 20), 3) << " | "
        << formula_check(r.payload_bytes_per_step, r.payload_formula_bytes) << " | "
        << fixed(r.wire_bytes_per_step / (1 << 20), 3) << " | " << fixed(r.comm_in_flight_ms, 2) << " | "
        << optional_text(r.comm_alone_ms, 2) << " | " << optional_text(r.predicted_comm_ms, 2) << " | "
        << optional_text(model_ratio, 3) << " | "
        << fixed(r.state_bytes / (1 << 20), 3) << " | " << formula_check(r.state_bytes, r.state_formula_bytes) << " | "
        << fixed(r.rss_peak_mib, 0) << " |\n";
  }
  write_nvme_markdown(out, results);
}

void write_csv(std::ostream& out, const std::vector<cell_result>& results) {
  out << "cell,precision,world_size,refused,steps,step_ms_median,step_ms_p10,step_ms_p90,forward_ms,backward_ms,"
         "optimizer_ms,off_cpu_ms,beyond_raw_ms,samples_per_second,flop_per_second,vs_single_device,vs_peer,peer,"
         "collectives_per_step,payload_bytes_per_step,payload_formula_bytes,wire_bytes_per_step,comm_in_flight_ms,"
         "comm_alone_ms,predicted_comm_ms,state_bytes,state_formula_bytes,rss_peak_mib,nvme_read_bytes_per_step,"
         "nvme_written_bytes_per_step,nvme_read_mb_per_s,nvme_write_mb_per_s,nvme_read_mb_per_s_all_ranks,"
         "nvme_write_mb_per_s_all_ranks\n";
  for (const auto& r : results) {
    std::string refused = r.refused;
    std::replace(refused.begin(), refused.end(), '"', '\'');
    out << '"' << r.label << "\"," << r.precision << ',' << r.world_size << ",\"" << refused << "\"," << r.steps << ','
        << fixed(r.step_ms.median, 4) << ',' << fixed(r.step_ms.p10, 4) << ',' << fixed(r.step_ms.p90, 4) << ','
        << fixed(r.forward_ms, 4) << ',' << fixed(r.backward_ms, 4) << ',' << fixed(r.optimizer_ms, 4) << ','
        << fixed(r.off_cpu_ms, 4) << ',' << (r.beyond_raw_ms ? fixed(*r.beyond_raw_ms, 4) : "") << ','
        << fixed(r.samples_per_second, 1) << ','
        << fixed(r.flop_per_second, 0) << ',' << (r.vs_single_device ? fixed(*r.vs_single_device, 4) : "") << ','
        << (r.vs_peer ? fixed(*r.vs_peer, 4) : "") << ',' << (r.peer ? "true" : "false") << ','
        << fixed(r.collectives_per_step, 2) << ',' << fixed(r.payload_bytes_per_step, 0) << ','
        << (r.payload_formula_bytes ? fixed(*r.payload_formula_bytes, 0) : "") << ','
        << fixed(r.wire_bytes_per_step, 0) << ',' << fixed(r.comm_in_flight_ms, 4) << ','
        << (r.comm_alone_ms ? fixed(*r.comm_alone_ms, 4) : "") << ','
        << (r.predicted_comm_ms ? fixed(*r.predicted_comm_ms, 4) : "") << ',' << fixed(r.state_bytes, 0) << ','
        << (r.state_formula_bytes ? fixed(*r.state_formula_bytes, 0) : "") << ',' << fixed(r.rss_peak_mib, 1);
    if (r.nvme) {
      const offload_figures& io = *r.nvme;
      out << ',' << fixed(io.read_bytes_per_step, 0) << ',' << fixed(io.written_bytes_per_step, 0) << ','
          << fixed(io.read_mb_per_s, 1) << ',' << fixed(io.write_mb_per_s, 1) << ','
          << (io.read_mb_per_s_all_ranks ? fixed(*io.read_mb_per_s_all_ranks, 1) : "") << ','
          << (io.write_mb_per_s_all_ranks ? fixed(*io.write_mb_per_s_all_ranks, 1) : "");
    } else {
      out << ",,,,,,";
    }
    out << '\n';
  }
}

void write_json(std::ostream& out, const std::vector<cell_result>& results, const std::string& machine) {
  nlohmann::json cells = nlohmann::json::array();
  for (const auto& r : results) {
    cells.push_back({{"cell", r.label},
                     {"precision", r.precision},
                     {"world_size", r.world_size},
                     {"model", r.model},
                     {"refused", r.refused},
                     {"steps", r.steps},
                     {"step_ms", {{"median", r.step_ms.median}, {"p10", r.step_ms.p10}, {"p90", r.step_ms.p90}}},
                     {"forward_ms", r.forward_ms},
                     {"backward_ms", r.backward_ms},
                     {"optimizer_ms", r.optimizer_ms},
                     {"off_cpu_ms", r.off_cpu_ms},
                     {"beyond_raw_ms", optional_json(r.beyond_raw_ms)},
                     {"samples_per_second", r.samples_per_second},
                     {"flop_per_second", r.flop_per_second},
                     {"vs_single_device", optional_json(r.vs_single_device)},
                     {"vs_peer", optional_json(r.vs_peer)},
                     {"peer", r.peer},
                     {"collectives_per_step", r.collectives_per_step},
                     {"payload_bytes_per_step", r.payload_bytes_per_step},
                     {"payload_formula_bytes", optional_json(r.payload_formula_bytes)},
                     {"wire_bytes_per_step", r.wire_bytes_per_step},
                     {"comm_in_flight_ms", r.comm_in_flight_ms},
                     {"comm_alone_ms", optional_json(r.comm_alone_ms)},
                     {"step_collectives", r.step_collectives},
                     {"samples", {{"step", r.samples.step},
                                  {"forward", r.samples.forward},
                                  {"backward", r.samples.backward},
                                  {"optimizer", r.samples.optimizer},
                                  {"off_cpu", r.samples.off_cpu}}},
                     {"predicted_comm_ms", optional_json(r.predicted_comm_ms)},
                     {"state_bytes", r.state_bytes},
                     {"state_formula_bytes", optional_json(r.state_formula_bytes)},
                     {"collectives_by_kind", by_kind_json(r)},
                     {"nvme", nvme_json(r.nvme)},
                     {"rss_peak_mib", r.rss_peak_mib}});
  }
  out << nlohmann::json{{"machine", machine}, {"cells", cells}}.dump(1) << '\n';
}

std::vector<cell_result> read_json(std::istream& in) {
  std::vector<cell_result> results;
  try {
    const auto document = nlohmann::json::parse(in);
    for (const auto& c : document.at("cells")) {
      cell_result r;
      r.label = c.at("cell").get<std::string>();
      r.precision = c.at("precision").get<std::string>();
      r.world_size = c.at("world_size").get<int>();
      r.model = c.value("model", std::string());
      r.refused = c.at("refused").get<std::string>();
      r.steps = c.at("steps").get<int>();
      const auto& step = c.at("step_ms");
      r.step_ms = {step.at("median").get<double>(), step.at("p10").get<double>(), step.at("p90").get<double>()};
      r.forward_ms = c.at("forward_ms").get<double>();
      r.backward_ms = c.at("backward_ms").get<double>();
      r.optimizer_ms = c.at("optimizer_ms").get<double>();
      r.off_cpu_ms = c.at("off_cpu_ms").get<double>();
      r.samples_per_second = c.at("samples_per_second").get<double>();
      r.rss_peak_mib = c.at("rss_peak_mib").get<double>();
      r.peer = c.value("peer", false);
      if (c.contains("samples")) {
        const auto& samples = c.at("samples");
        r.samples = {samples.at("step").get<std::vector<double>>(), samples.at("forward").get<std::vector<double>>(),
                     samples.at("backward").get<std::vector<double>>(),
                     samples.at("optimizer").get<std::vector<double>>(),
                     samples.at("off_cpu").get<std::vector<double>>()};
      }
      if (r.peer) {  // PyTorch's own cells carry no loom counters
        results.push_back(std::move(r));
        continue;
      }
      r.flop_per_second = c.at("flop_per_second").get<double>();
      r.collectives_per_step = c.at("collectives_per_step").get<double>();
      r.payload_bytes_per_step = c.at("payload_bytes_per_step").get<double>();
      if (!c.at("payload_formula_bytes").is_null()) {
        r.payload_formula_bytes = c.at("payload_formula_bytes").get<double>();
      }
      r.wire_bytes_per_step = c.at("wire_bytes_per_step").get<double>();
      r.comm_in_flight_ms = c.at("comm_in_flight_ms").get<double>();
      if (!c.at("comm_alone_ms").is_null()) r.comm_alone_ms = c.at("comm_alone_ms").get<double>();
      r.step_collectives = c.at("step_collectives").get<std::vector<std::pair<std::string, double>>>();
      r.state_bytes = c.at("state_bytes").get<double>();
      if (!c.at("state_formula_bytes").is_null()) r.state_formula_bytes = c.at("state_formula_bytes").get<double>();
      r.nvme = nvme_from_json(c);
      for (const auto& [kind, count] : c.at("collectives_by_kind").items()) {
        r.collectives_by_kind[kind] = {count.at("collectives").get<double>(), count.at("payload_bytes").get<double>()};
      }
      results.push_back(std::move(r));
    }
  } catch (const nlohmann::json::exception& error) {
    throw std::runtime_error(std::string("loom-bench: a worker's results cannot be read: ") + error.what());
  }
  return results;
}

}  // namespace loom_bench
