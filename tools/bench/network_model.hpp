// loom-bench's network model: how loom carries each collective across N
// ranks (the algorithm, the bytes a rank sends), and an alpha-beta model of
// its time, fitted from loom's collective microbenchmarks (--fit-network)
// or read from a file that describes another network. No torch headers.
//
// One collective of kind k carrying P payload bytes (loom/comm/traffic.hpp
// says what the payload is for each kind) on N ranks takes
//
//     steps_k(N) x alpha + wire_k(N) x P x beta
//
// alpha: the latency of one message step; beta: seconds per byte a rank
// sends; steps and wire from the algorithm (algorithm_of). A fitted network
// has its own alpha and beta per kind (the fit absorbs what each algorithm
// costs beyond the wire: Gloo's reductions, loom's emulation); a described
// one may give one pair for every kind ("other").
#pragma once

#include <loom/comm/traffic.hpp>

#include <iosfwd>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace loom_bench {

// How a kind crosses the network on the CPU: Gloo's algorithm or loom's
// point-to-point emulation, as the process group runs it.
struct algorithm {
  const char* name;
  double steps;             // messages a rank waits for in sequence
  double wire_per_payload;  // bytes a rank sends per payload byte (averaged over the ranks)
};
algorithm algorithm_of(loom::comm::collective_kind kind, int ranks);
// The kind named by name_of ("all_reduce"); nullopt for any other text.
std::optional<loom::comm::collective_kind> kind_named(const std::string& name);

// Bytes one rank sends per step for these collectives (kind name -> payload
// bytes per step), on `ranks` ranks.
double wire_bytes(const std::map<std::string, std::pair<double, double>>& by_kind, int ranks);

// One microbenchmark measurement: the median time of a collective of this
// kind and payload on `ranks` ranks.
struct sample {
  std::string kind;
  double payload_bytes = 0;
  double seconds = 0;
};

struct link_cost {
  double alpha_s = 0;          // seconds per message step
  double beta_s_per_byte = 0;  // seconds per byte sent
};

// A kind's cost by payload: regimes in increasing payload, each up to its
// bound (the last: any payload). Two where a fit finds the time per byte
// changes with size (on a CPU: messages that leave the caches).
struct kind_cost {
  struct regime {
    double up_to_bytes;  // +infinity for the last
    link_cost cost;
  };
  std::vector<regime> regimes;
  const link_cost& at(double payload_bytes) const;
};

struct network {
  std::string name;                        // what it is, and where its figures come from
  std::map<std::string, kind_cost> kinds;  // by kind name
  std::optional<link_cost> other;          // every kind not listed
  int fitted_ranks = 0;                    // > 0: fitted by loom-bench on this many ranks
  // Fitted networks: the fit's worst relative residual per kind, and the
  // measurements it was fitted to.
  std::map<std::string, double> worst_residual;
  std::vector<sample> samples;

  // The cost of one collective of `kind` with this payload; null: none.
  const link_cost* cost_of(const std::string& kind, double payload_bytes) const;
};

// Seconds for one collective of `kind` carrying `payload_bytes` on `ranks`
// ranks; nullopt when the network has no cost for it.
std::optional<double> predict_seconds(const network& net, const std::string& kind, double payload_bytes, int ranks);
// One step's: each collective {kind, payload bytes} in turn, one after
// another; nullopt when one has no cost.
std::optional<double> predict_step_seconds(const network& net,
                                           const std::vector<std::pair<std::string, double>>& collectives,
                                           int ranks);

// Per kind, the line a + b x payload closest to the samples in relative
// error (weights 1/t^2: the small payloads' latency counts as much as the
// large ones' bandwidth), a, b >= 0; or two such lines, split between two
// payloads (at least three samples each), where that fits better. Then
// alpha = a / steps and beta = b / wire at the samples' rank count.
network fit_network(const std::vector<sample>& samples, int ranks, std::string name);

// The network file (JSON):
//   {"name": "...", "fitted_ranks": 2,
//    "collectives": {"barrier": {"alpha_us": 50},
//                    "all_reduce": [{"up_to_bytes": 1048576, "alpha_us": 40.5, "bandwidth_gbit_s": 19.1},
//                                   {"alpha_us": 120, "bandwidth_gbit_s": 12.2}], ...},
//    "other": {"alpha_us": 2, "bandwidth_gbit_s": 200}}
// A kind is one regime (an object) or several (a list, each but the last
// with up_to_bytes); bandwidth_gbit_s is 8e-9 / beta, left out where
// nothing is sent. Throws std::runtime_error saying what is
// wrong with a file it cannot use.
network read_network(const std::string& path);
void write_network(std::ostream& out, const network& net);

}  // namespace loom_bench
