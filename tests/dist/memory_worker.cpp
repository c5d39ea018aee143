// Memory caps the tests enforce (tests/dist/memory.sh): a model of 16 hidden
// Linear(1024, 1024) units (Ψ = 16,793,600 parameters; fp32 Adam state 16Ψ =
// 269 MB) built, trained and saved on N ranks, each phase under a cap on the
// process's heap (tests/allocation_counter.cpp: malloc, calloc, realloc, the
// aligned allocators and operator new, so LibTorch's, Gloo's and the C++
// library's bytes count too) computed from the phase's formula plus a stated
// margin, as if each rank had only that much memory:
//   build + setup  4Ψ/N + the largest unit              (init_module(true))
//   step           16Ψ/N + 2 gathered units + 2 units' gradient buffers
//                  (each its full gradient and, where Gloo's reduce-scatter
//                  is emulated (N > 2), the chunks it receives: 1 unit)
//                  + autograd's weight gradient before it is added (1 unit)
//                  + activations (4 tensors of b x 1024 floats per layer)
//   sharded save   16Ψ/N: the rank's state, written from its own tensors
//   full save      16Ψ/N + 2W + W/N (W: the largest tensor, one weight):
//                  every rank gathers each tensor as rank 0 writes its
//                  record (the all-gather's N padded slices, the full tensor
//                  made of them, this rank's padded slice), then drops it
//   consolidate    16Ψ/N + the largest tensor (one weight, 4 MiB): rank 0,
//                  holding its state, makes one file of the save
//   load, full load, reshard  16Ψ/N + one read buffer (4 MiB): each rank
//                  reads its parts of the sharded save, of the consolidated
//                  file, and of a save from another world size (RESHARD_FROM)
//                  straight into the state it holds
// model_parallel on a 2 x 2 mesh (`mp`: the plan column-wise then
// row-wise, FULL_SHARD on data parallel) holds 1/tp of a unit where the
// formulas say U (step), gathers each unit whole once at setup and keeps
// its chunk (build: + U/tp), gathers a chunk over data parallel before the
// chunks over tensor parallel (full save: W/tp for W/N), and assembles a
// chunk along the second dimension through one chunk-sized buffer
// (consolidate: + W/tp).
// The margin, 6 MiB, covers what no formula names (module objects, Gloo's
// buffers for a message that arrives before its receive is posted (up to
// 2 MiB seen at N = 8), the optimizer's temporaries of one shard, a save's
// pickle and zip index, the allocator's rounding) and is far below what
// each phase's negative control adds, so every cap can fail:
//   control_build  the same model built outside init_module(true): whole on
//                  every rank (4Ψ, 67 MB) before setup shards it;
//   control_step   parameters kept whole through the step (SHARD_GRAD_OP;
//                  deepspeed_stage_2 for ZeRO-3; NO_SHARD on model_parallel's
//                  data-parallel dimension), built without a cap;
//   control_save   under the full save's cap, the parameters gathered whole
//                  (4Ψ, 67 MB), as every full save began before it wrote
//                  tensor by tensor;
//   control_consolidate  the merged checkpoint read whole, then written
//                  (read_sharded_checkpoint + write_checkpoint);
//   control_load, control_full_load  the checkpoint read whole on every
//                  rank (read_sharded_checkpoint, read_deepspeed_checkpoint,
//                  read_checkpoint), as every load did before per-rank reads.
// A control caps one rank only: that rank's refusal must end every rank
// within seconds (the collectives' timeout here is 5 s; 30 s in the real
// runs), not leave the others waiting for it.
// After the phases the cap is lifted and the trained parameters, gathered,
// equal one process's (single_device, batch B) within the laws' tolerance.
//
// `capped_full` runs the phases with a full save (fsdp; the full file is then
// loaded back), `uncapped` and `uncapped_full` measure them without caps.
//
//   memory_worker fsdp|zero3|mp capped|capped_full|uncapped|uncapped_full|control_build|control_step|control_save|
//                 control_consolidate|control_load|control_full_load N MARK [RESHARD_FROM]
#include "../allocation_counter.hpp"
#include "../bytes_read.hpp"
#include "strategy_laws.hpp"

#include <loom/tp/parallelize.hpp>
#include <loom/util/counting_allocator.hpp>
#include <loom/util/rss_peak.hpp>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <vector>

namespace {

constexpr std::int64_t width = 1024;
constexpr int hidden_units = 16;
constexpr std::int64_t unit_numel = width * width + width;
constexpr std::int64_t psi = hidden_units * unit_numel;  // 16,793,600
constexpr std::int64_t unit_bytes = 4 * unit_numel;
constexpr std::int64_t global_rows = 16;
constexpr int steps = 2;  // Adam's state exists from the first
constexpr std::int64_t margin_bytes = 6 << 20;
// A control's refused rank ends the others through this; the real runs
// allow more, for 8 ranks on 2 shared cores.
constexpr auto control_timeout = std::chrono::seconds(5);
constexpr auto capped_timeout = std::chrono::seconds(30);

struct MlpImpl : torch::nn::Module {
  MlpImpl() {
    for (int i = 0; i < hidden_units; ++i) {
      layers.push_back(register_module("h" + std::to_string(i), loom::unit<loom::tp::Linear>(width, width)));
    }
  }
  at::Tensor forward(at::Tensor x) {
    for (std::size_t i = 0; i < layers.size(); ++i) {
      x = layers[i](x);
      if (i + 1 < layers.size()) x = torch::relu(x);
    }
    return x;
  }
  std::vector<loom::unit<loom::tp::Linear>> layers;
};
TORCH_MODULE(Mlp);

// model_parallel's plan: column-wise then row-wise pairs (h0 colwise, h1
// rowwise, ...); until a plan runs, loom::tp::Linear is torch::nn::Linear.
loom::tp::parallelize_plan mlp_plan() {
  loom::tp::parallelize_plan plan;
  for (int i = 0; i < hidden_units; ++i) {
    if (i % 2 == 0) plan.emplace_back("h" + std::to_string(i), loom::tp::colwise_parallel{});
    else plan.emplace_back("h" + std::to_string(i), loom::tp::rowwise_parallel{});
  }
  return plan;
}

Mlp make_mlp() {
  at::manual_seed(7);
  return Mlp();
}
at::Tensor inputs(int step) { return at::randn({global_rows, width}, at::detail::createCPUGenerator(100 + step)); }
at::Tensor targets(int step) {
  return at::randint(0, width, {global_rows}, at::detail::createCPUGenerator(200 + step));
}

double mib(std::int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

// The phase running now and its cap, for the message of a refusal.
struct phase_state {
  std::string name = "start";
  std::int64_t cap = 0;  // bytes above the base; 0: none
};
phase_state current;

// One phase's peaks above the base (the live bytes before the model was
// built): the heap (malloc level), the tensors (c10's CPU allocator, which
// says which of the heap's bytes are tensors) and the resident set (VmHWM;
// glibc keeps freed blocks resident unless MALLOC_MMAP_THRESHOLD_ fixes its
// mmap threshold, as memory.sh does: then it follows the heap).
struct phase_peaks {
  std::int64_t heap = 0, tensors = 0, rss = 0;
  std::int64_t held = 0;  // the heap's live bytes when the phase ended
};

class meter {
 public:
  explicit meter(loom::counting_allocator& tensors) : tensors_(tensors) {}
  // Starts PHASE; capped: its cap is base + formula + margin.
  void begin(const std::string& phase, std::int64_t formula, bool capped) {
    current = {phase, capped ? formula + margin_bytes : 0};
    loom_test::reset_heap_peak();
    tensors_.reset_peak();
    loom::reset_rss_peak();
    loom_test::set_heap_cap(capped ? static_cast<unsigned long long>(base_ + formula + margin_bytes) : 0);
  }
  phase_peaks end() {
    loom_test::set_heap_cap(0);
    return {static_cast<std::int64_t>(loom_test::heap_peak_bytes()) - base_, tensors_.peak() - tensor_base_,
            loom::rss_peak_bytes() - rss_base_, static_cast<std::int64_t>(loom_test::heap_live_bytes()) - base_};
  }
  void set_base() {
    base_ = static_cast<std::int64_t>(loom_test::heap_live_bytes());
    tensor_base_ = tensors_.live();
    loom::reset_rss_peak();  // VmHWM is now the resident set
    rss_base_ = loom::rss_peak_bytes();
  }

 private:
  loom::counting_allocator& tensors_;
  std::int64_t base_ = 0, tensor_base_ = 0, rss_base_ = 0;
};

// Rank 0 prints a phase's peaks, the largest over the ranks.
template <class F>
void report(F& fabric, const std::string& phase, const phase_peaks& mine, std::int64_t formula, bool capped) {
  auto peaks = at::tensor({static_cast<double>(mine.heap), static_cast<double>(mine.tensors),
                           static_cast<double>(mine.rss), static_cast<double>(mine.held)}, at::kDouble);
  peaks = fabric.all_reduce(peaks, loom::reduce_op::max);
  if (fabric.global_rank() != 0) return;
  auto at_mib = [&](int k) { return peaks[k].template item<double>() / (1 << 20); };
  std::printf("phase %-6s heap peak %8.2f MiB (tensors %8.2f MiB, VmHWM +%8.2f MiB), held after %8.2f MiB; "
              "formula %8.2f MiB, cap %s\n",
              phase.c_str(), at_mib(0), at_mib(1), at_mib(2), at_mib(3), mib(formula),
              capped ? (std::to_string(mib(formula + margin_bytes)).substr(0, 6) + " MiB").c_str() : "none");
  std::fflush(stdout);
}

// One small step of the same operations in one process, before any phase:
// the code pages LibTorch touches the first time count in VmHWM, which is
// then closer to the data the phases allocate.
void warm_up() {
  torch::nn::Linear layer(64, 64);
  torch::optim::Adam adam(layer->parameters(), torch::optim::AdamOptions(1e-3));
  for (int step = 0; step < 2; ++step) {
    adam.zero_grad();
    torch::nn::functional::cross_entropy(layer(torch::relu(at::randn({4, 64}))), at::randint(0, 64, {4})).backward();
    adam.step();
  }
}

bool files_equal(const std::string& a, const std::string& b) {
  std::ifstream first(a, std::ios::binary), second(b, std::ios::binary);
  const std::string x((std::istreambuf_iterator<char>(first)), std::istreambuf_iterator<char>());
  const std::string y((std::istreambuf_iterator<char>(second)), std::istreambuf_iterator<char>());
  return first.good() == second.good() && !x.empty() && x == y;
}

// A checkpoint's bytes on disk (a file, or a directory's files).
std::int64_t checkpoint_bytes(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_directory(path, ec)) return static_cast<std::int64_t>(std::filesystem::file_size(path, ec));
  std::int64_t total = 0;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(path, ec)) {
    if (entry.is_regular_file(ec)) total += static_cast<std::int64_t>(entry.file_size(ec));
  }
  return total;
}

// Which phases this rank runs under a cap, and how the model is built.
struct plan {
  bool empty_init = true;
  bool build = false, step = false, save = false, consolidate = false, load = false, full_load = false,
       reshard = false;
  bool eager_consolidate = false;  // today's path before streaming: the merged checkpoint whole in memory
  // today's path before per-rank reads, the checkpoint read whole: in the
  // load of the save (eager_load) or of its consolidated file (eager_full_load)
  bool eager_load = false, eager_full_load = false;
  // The consolidation law (uncapped): in the runs that measure every phase;
  // a control ends at its phase, and the law adds a whole merged checkpoint.
  bool consolidation_law = true;
  bool full_save = false;          // state_dict_type full
  bool eager_save = false;         // today's path before streamed full saves: the parameters gathered whole
  std::string checkpoint;    // where the save goes
  std::string reshard_from;  // a save of the same training on another number of ranks ("": none)
};

// The phases under Fabric F.
template <class F>
void run_phases(F& fabric, loom::counting_allocator& tensors, const plan& capped) {
  const int n = fabric.world_size();
  const int r = fabric.global_rank();
  // model_parallel: a data-parallel rank's rows; its tensor-parallel ranks
  // (tp) hold 1/tp of each unit, which the engine shards over n / tp ranks.
  int tp = 1, data_rank = r, data_ranks = n;
  if constexpr (requires { fabric.strategy().device_mesh(); }) {
    tp = fabric.strategy().device_mesh().size("tensor_parallel");
    data_rank = fabric.strategy().device_mesh().coordinate("data_parallel");
    data_ranks = n / tp;
  }
  const std::int64_t rows = global_rows / data_ranks;
  const std::int64_t unit_part = unit_bytes / tp;  // what of a unit a rank holds whole while it computes
  // Built over the world; model_parallel's setup gathers each unit whole
  // and keeps its chunk (1/tp) before the engine shards it.
  const std::int64_t build_formula = 4 * psi / n + unit_bytes + (tp > 1 ? unit_part : 0);
  const std::int64_t activations = 4 * hidden_units * rows * width * 4;
  // Two units in flight in backward (this one, and the one before whose
  // reduction is still on the wire), each with its full gradient and, where
  // Gloo's reduce-scatter is emulated (more than 2 data-parallel ranks),
  // the chunks it receives; autograd's weight gradient before it is added
  // into the buffer.
  const std::int64_t receive_bytes = data_ranks > 2 ? unit_part : 0;
  const std::int64_t step_formula =
      16 * psi / n + 2 * unit_part + 2 * (unit_part + receive_bytes) + unit_part + activations;
  // What the rank holds (parameters, gradients, Adam's two moments): the
  // file is written from the tensors themselves, record by record; a full
  // save gathers one tensor at a time.
  const std::int64_t weight_bytes = 4 * width * width;
  // (model_parallel gathers a chunk over data parallel, then the chunks
  // over tensor parallel: W/tp where fsdp has its padded slice W/N.)
  const std::int64_t slice_bytes = tp > 1 ? weight_bytes / tp : weight_bytes / n;
  const std::int64_t save_formula = 16 * psi / n + (capped.full_save ? 2 * weight_bytes + slice_bytes : 0);
  meter measure(tensors);
  warm_up();
  fabric.barrier();
  measure.set_base();

  measure.begin("build", build_formula, capped.build);
  Mlp net = [&] {
    auto guard = fabric.init_module(capped.empty_init);
    return make_mlp();
  }();
  torch::optim::Adam adam(net->parameters(), torch::optim::AdamOptions(1e-3));
  auto [model, optimizer] = fabric.setup(net, adam);
  const phase_peaks built = measure.end();
  report(fabric, "build", built, build_formula, capped.build);

  measure.begin("step", step_formula, capped.step);
  for (int step = 0; step < steps; ++step) {
    optimizer.zero_grad();
    const auto loss = torch::nn::functional::cross_entropy(model(inputs(step).narrow(0, data_rank * rows, rows)),
                                                           targets(step).narrow(0, data_rank * rows, rows));
    fabric.backward(loss);
    optimizer.step();
  }
  const phase_peaks stepped = measure.end();
  report(fabric, "step", stepped, step_formula, capped.step);

  const std::string& path = capped.checkpoint;
  measure.begin("save", save_formula, capped.save);
  if (capped.eager_save) {
    const auto whole = laws::full_parameters(fabric, model, net);
    (void)whole;
  }
  fabric.save(path, {{"model", model}, {"optimizer", optimizer}});
  report(fabric, "save", measure.end(), save_formula, capped.save);

  // Rank 0 makes one file of the save (loom-consolidate's function) while
  // it holds its state; the others wait. A full save is one file already.
  if (loom::is_sharded_checkpoint(path) || loom::is_deepspeed_checkpoint(path)) {
    // The largest tensor, assembled; a tensor-parallel chunk along another
    // dimension than the first goes through one chunk-sized buffer.
    const std::int64_t consolidate_formula = 16 * psi / n + weight_bytes + (tp > 1 ? weight_bytes / tp : 0);
    const std::string consolidated = path + ".pt";
    measure.begin("consolidate", consolidate_formula, capped.consolidate);
    if (r == 0) {
      if (capped.eager_consolidate) {
        loom::write_checkpoint(consolidated, loom::is_sharded_checkpoint(path) ? loom::read_sharded_checkpoint(path)
                                                                               : loom::read_deepspeed_checkpoint(path));
      } else {
        loom::consolidate_checkpoint(path, consolidated);
      }
    }
    report(fabric, "consolidate", measure.end(), consolidate_formula, capped.consolidate);
    if (r == 0 && capped.consolidation_law && n <= 4) {
      // Uncapped: byte for byte what the merged checkpoint, whole, writes
      // (on 4 ranks: on 8 the same code writes the same layout, and 8
      // ranks on 2 cores are the test's slowest part).
      loom::write_checkpoint(consolidated + ".eager", loom::is_sharded_checkpoint(path)
                                                          ? loom::read_sharded_checkpoint(path)
                                                          : loom::read_deepspeed_checkpoint(path));
      const bool same = files_equal(consolidated, consolidated + ".eager");
      LAW_EXPECT(same, "the streamed consolidation %s differs from the merged checkpoint written whole",
                 consolidated.c_str());
      std::printf("law (consolidate) streamed, one tensor at a time, is byte for byte the file written whole: %s\n",
                  same ? "yes" : "NO");
      std::fflush(stdout);
    }
  }

  // Loads into the live state (parameters, gradients, Adam's moments), each
  // rank reading its parts straight into it through one buffer: the save
  // back (sharded), its consolidated file (full), and a save written on
  // another number of ranks (reshard). Each equals what it loads.
  const std::int64_t load_formula = 16 * psi / n + static_cast<std::int64_t>(loom::local_read_buffer_bytes);
  auto load_phase = [&](const std::string& phase, const std::string& from, bool cap, bool eager) {
    const std::int64_t read_before = loom_test::bytes_read();
    measure.begin(phase, load_formula, cap);
    if (eager) {
      // Today's path before per-rank reads: every rank read the whole checkpoint.
      const auto whole = loom::is_sharded_checkpoint(from)     ? loom::read_sharded_checkpoint(from)
                         : loom::is_deepspeed_checkpoint(from) ? loom::read_deepspeed_checkpoint(from)
                                                               : loom::read_checkpoint(from);
      (void)whole;
    } else {
      fabric.load(from, {{"model", model}, {"optimizer", optimizer}});
    }
    report(fabric, phase, measure.end(), load_formula, cap);
    auto read = at::tensor({static_cast<double>(loom_test::bytes_read() - read_before)}, at::kDouble);
    read = fabric.all_reduce(read, loom::reduce_op::max);
    if (r == 0) {
      std::printf("  read by a rank at most %8.2f MiB of the checkpoint's %8.2f MiB (each needed record read twice: "
                  "checked, then into the state)\n",
                  read.template item<double>() / (1 << 20), mib(checkpoint_bytes(from)));
      std::fflush(stdout);
    }
  };
  const bool consolidated = loom::is_sharded_checkpoint(path) || loom::is_deepspeed_checkpoint(path);
  if (consolidated) load_phase("load", path, capped.load, capped.eager_load);
  load_phase("full_load", consolidated ? path + ".pt" : path, capped.full_load, capped.eager_full_load);
  if (!capped.reshard_from.empty()) load_phase("reshard", capped.reshard_from, capped.reshard, false);

  // Uncapped: the gathered parameters against one process with batch B.
  current = {"check", 0};
  const auto trained = laws::flat(laws::full_parameters(fabric, model, net));
  if (r == 0) {
    auto reference = make_mlp();
    torch::optim::Adam reference_adam(reference->parameters(), torch::optim::AdamOptions(1e-3));
    for (int step = 0; step < steps; ++step) {
      reference_adam.zero_grad();
      torch::nn::functional::cross_entropy(reference->forward(inputs(step)), targets(step)).backward();
      reference_adam.step();
    }
    const auto single = laws::flat_of(reference);
    const laws::tolerance allowed;
    const double difference = (trained - single).abs().max().template item<double>();
    LAW_EXPECT(torch::allclose(trained, single, allowed.rtol, allowed.atol),
               "after the capped phases the parameters differ from single_device's by %.3g", difference);
    std::printf("law (capped training) equals single_device: max |difference| %.3g after %d Adam steps (rtol %g, "
                "atol %g)\n",
                difference, steps, allowed.rtol, allowed.atol);
    std::fflush(stdout);
  }
  fabric.barrier();
}

template <class Strategy>
loom::Fabric<loom::cpu, Strategy, loom::fp32> make_fabric(Strategy strategy) {
  return loom::Fabric<loom::cpu, Strategy, loom::fp32>({}, std::move(strategy));
}

}  // namespace

int main(int argc, char** argv) {
  auto& tensors = loom::install_counting_allocator();
  if (argc < 4) {
    std::fprintf(stderr, "usage: memory_worker fsdp|zero3|mp capped|capped_full|uncapped|uncapped_full|control_build|control_step|"
                         "control_save|control_consolidate|control_load|control_full_load N [MARK [RESHARD_FROM]]\n");
    return 2;
  }
  const std::string which = argv[1];
  const std::string scenario = argv[2];
  const std::set<std::string> scenarios{"capped",       "capped_full",       "uncapped",      "uncapped_full", "control_build",
                                        "control_step", "control_save",      "control_consolidate",
                                        "control_load", "control_full_load"};
  if ((which != "fsdp" && which != "zero3" && which != "mp") || scenarios.count(scenario) == 0 ||
      (which == "zero3" && (scenario == "control_save" || scenario == "uncapped_full" || scenario == "capped_full"))) {
    std::fprintf(stderr, "memory_worker: unknown strategy '%s' or scenario '%s'\n", which.c_str(), scenario.c_str());
    return 2;
  }
  if (!loom_test::heap_cap_enforced()) {
    std::printf("memory_worker: the heap cap is not enforced under a sanitizer (its runtime owns malloc)\n");
    return 77;
  }
  try {
    loom::Fabric<loom::cpu, loom::fsdp, loom::fp32> launcher({.devices = loom::devices_spec(std::atoi(argv[3]))});
    launcher.launch();
    laws::rank_for_messages = launcher.global_rank();
    // A control caps one rank (the last; rank 0 for the save, where rank 0
    // gathers); the real runs cap every rank.
    const bool last = launcher.global_rank() == launcher.world_size() - 1;
    const bool all = scenario == "capped" || scenario == "capped_full";
    const bool full_save = scenario == "control_save" || scenario == "uncapped_full" || scenario == "capped_full";
    const plan capped{.empty_init = scenario != "control_build",
                      .build = all || (scenario == "control_build" && last),
                      .step = all || (scenario == "control_step" && last),
                      .save = all || (scenario == "control_save" && launcher.global_rank() == 0),
                      .consolidate = all || (scenario == "control_consolidate" && launcher.global_rank() == 0),
                      .load = all || (scenario == "control_load" && last),
                      .full_load = all || (scenario == "control_full_load" && last),
                      .reshard = all,
                      .eager_consolidate = scenario == "control_consolidate",
                      .eager_load = scenario == "control_load",
                      .eager_full_load = scenario == "control_full_load",
                      .consolidation_law = !scenario.starts_with("control_"),
                      .full_save = full_save,
                      .eager_save = scenario == "control_save",
                      .checkpoint = laws::test_dir() + "/memory_" + which + "_" + scenario + "_" + argv[3],
                      .reshard_from = argc > 5 ? argv[5] : ""};
    const bool whole_parameters = scenario == "control_step";
    const auto timeout =
        std::chrono::duration_cast<std::chrono::milliseconds>(all ? capped_timeout : control_timeout);
    if (which == "fsdp") {
      auto fabric = make_fabric(loom::fsdp(loom::fsdp_options{
          .strategy = whole_parameters ? loom::sharding_strategy::shard_grad_op : loom::sharding_strategy::full_shard,
          .state_dict = full_save ? loom::state_dict_type::full : loom::state_dict_type::sharded,
          .process = {.collective_timeout = timeout}}));
      run_phases(fabric, tensors, capped);
    } else if (which == "mp") {
      // 2 x 2: the plan on tensor parallel 2, FULL_SHARD on data parallel 2
      // (the control: NO_SHARD, each data-parallel rank's chunks whole).
      auto fabric = make_fabric(loom::model_parallel(loom::model_parallel_options{
          .parallelize_fn = [](torch::nn::Module& module,
                               loom::comm::device_mesh& mesh) { loom::tp::parallelize_module(module, mesh, mlp_plan()); },
          .data_parallel_size = launcher.world_size() / 2,
          .tensor_parallel_size = 2,
          .save_distributed_checkpoint = !full_save,
          .data_parallel = loom::fsdp_options{.strategy = whole_parameters ? loom::sharding_strategy::no_shard
                                                                           : loom::sharding_strategy::full_shard},
          .process = {.collective_timeout = timeout}}));
      run_phases(fabric, tensors, capped);
    } else if (whole_parameters) {
      auto fabric = make_fabric(loom::deepspeed_stage_2(loom::deepspeed_options{.process = {.collective_timeout = timeout}}));
      run_phases(fabric, tensors, capped);
    } else {
      auto fabric = make_fabric(loom::deepspeed_stage_3(loom::deepspeed_options{.process = {.collective_timeout = timeout}}));
      run_phases(fabric, tensors, capped);
    }
    const bool everyone = launcher.reduce_boolean_decision(laws::failures == 0, /*all=*/true);
    if (launcher.is_global_zero()) {
      std::printf("memory caps (%s, %s): world_size=%d %s\n", which.c_str(), scenario.c_str(), launcher.world_size(),
                  everyone ? "all checks passed" : "FAILED");
    }
    return laws::failures == 0 ? 0 : 1;
  } catch (const std::exception& error) {
    const std::int64_t cap = current.cap;
    loom_test::set_heap_cap(0);
    std::fprintf(stderr, "memory_worker rank %d: %s phase (cap %.2f MiB above the base%s): %s\n",
                 laws::rank_for_messages, current.name.c_str(), mib(cap),
                 loom_test::heap_cap_refusals() > 0 ? ", refused by the cap" : "", error.what());
    return 3;
  }
}
