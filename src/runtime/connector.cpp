// Lightning's connector rules (lightning/fabric/connector.py), in the order
// Lightning applies them, with loom's errors for what C++ cannot run.
#include <loom/accelerator/cpu_features.hpp>
#include <loom/accelerator/parse_devices.hpp>
#include <loom/errors.hpp>
#include <loom/concepts/compatibility_rules.hpp>
#include <loom/runtime/connector.hpp>

#include <algorithm>
#include <cctype>

namespace loom::runtime {

machine_facts builtin_machine(int cuda_devices, bool cuda_built) {
  machine_facts facts;
  facts.cuda_devices = cuda_built ? cuda_devices : 0;
  facts.cuda_built = cuda_built;
  facts.cpu_vector_bf16 = cpu_features::vector_bf16_matmul();
  facts.find_strategy = [](std::string_view name) { return runtime::find_strategy(name); };
  for (const auto& entry : strategy_names()) {
    if (entry.built) facts.available_strategies.push_back(entry.name);
  }
  return facts;
}

namespace {

std::string lower(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(), [](unsigned char c) { return std::tolower(c); });
  return text;
}


// Lightning's _argument_from_env: with the CLI, its value decides; a value in
// the code that is not the default and differs from it is an error. Values
// are compared canonically ("32" and "32-true" agree), where Lightning
// compares the spellings.
void take_from_cli(const cluster::env_lookup& env, const char* variable, const char* flag, std::string& current,
                   bool given, const std::function<std::string(const std::string&)>& canonical) {
  const auto cli = env(variable);
  if (!cli) return;
  if (given && canonical(*cli) != canonical(current)) {
    throw configuration_error("the code asks for " + std::string(flag) + "=" + current +
                              " but it conflicts with the value --" + flag + "=" + *cli +
                              " set through the command line (loom-run). Remove it either from the command line "
                              "or from the code.");
  }
  current = *cli;
}

std::string canonical_or_self(const std::optional<std::string>& canonical, const std::string& text) {
  return canonical.value_or(text);
}

}  // namespace

connection connect(connector_input input, const machine_facts& machine, const cluster::env_lookup& env) {
  connection out;
  const auto& find_known = machine.find_strategy ? machine.find_strategy
                                                 : std::function<const strategy_name*(std::string_view)>(
                                                       [](std::string_view name) { return runtime::find_strategy(name); });
  const std::optional<strategy_name>& object = input.strategy_object;
  if (object) input.strategy = object->name;
  auto find = [&](std::string_view name) -> const strategy_name* {
    if (object && name == object->name) return &*object;
    return find_known(name);
  };
  const std::string available = join(machine.available_strategies);

  // 0. Under loom-run, the LT_* values decide.
  std::string devices_text = input.devices.given() ? input.devices.text() : "auto";
  std::string precision = input.precision.text();
  std::string num_nodes = std::to_string(input.num_nodes);
  if (env("LT_CLI_USED").value_or("") == "1") {
    auto same = [](const std::string& text) { return text; };
    take_from_cli(env, "LT_ACCELERATOR", "accelerator", input.accelerator, input.accelerator != "auto",
                  [](const std::string& text) { return canonical_or_self(canonical_accelerator(text), text); });
    take_from_cli(env, "LT_STRATEGY", "strategy", input.strategy, input.strategy != "auto", same);
    std::string before = devices_text;
    take_from_cli(env, "LT_DEVICES", "devices", devices_text, input.devices.given(), same);
    if (devices_text != before) input.devices = devices_spec(devices_text);
    take_from_cli(env, "LT_NUM_NODES", "num_nodes", num_nodes, input.num_nodes != 1, same);
    take_from_cli(env, "LT_PRECISION", "precision", precision, input.precision.given(),
                  [](const std::string& text) { return canonical_or_self(canonical_precision(text), text); });
    try {
      input.num_nodes = std::stoi(num_nodes);
    } catch (const std::exception&) {
      throw configuration_error("LT_NUM_NODES=" + num_nodes + " is not a number");
    }
  }

  // 1. Names (Lightning's _check_config_and_set_final_flags).
  const std::string strategy = lower(input.strategy);
  const strategy_name* entry = strategy == "auto" ? nullptr : find(strategy);
  if (strategy != "auto" && entry == nullptr) {
    throw configuration_error("unknown strategy '" + input.strategy + "'. Available: auto, " + available);
  }
  const std::string accelerator_asked = lower(input.accelerator);
  const auto accelerator_known = canonical_accelerator(accelerator_asked);
  if (!accelerator_known) {
    throw configuration_error("unknown accelerator '" + input.accelerator + "'. Available: " +
                              join(accelerator_names()));
  }
  if (*accelerator_known == "mps") {
    throw configuration_error("accelerator 'mps': Apple's MPS backend is not in this LibTorch build. Accepted: cpu, "
                              "cuda, gpu, auto.");
  }
  if (*accelerator_known == "tpu") {
    throw configuration_error("accelerator 'tpu': XLA/TPU has no LibTorch C++ backend. Accepted: cpu, cuda, gpu, "
                              "auto.");
  }
  const auto precision_known = canonical_precision(precision);
  if (!precision_known) {
    throw configuration_error("precision '" + precision + "' is not valid. Accepted: " + join(precision_names()) +
                              " (and the ints 64, 32, 16)");
  }
  if (precision == "16" || precision == "bf16") {
    out.warnings.push_back(precision + " is supported for historical reasons but its usage is discouraged. Please "
                                       "set your precision to " + *precision_known + " instead!");
  }
  precision = *precision_known;

  // 2. Devices and nodes.
  if (input.num_nodes < 1) {
    throw configuration_error("num_nodes=" + std::to_string(input.num_nodes) + " is not valid: it must be >= 1");
  }
  if (input.devices.given()) {
    const auto& value = input.devices.value();
    const bool zero = (std::holds_alternative<int>(value) && std::get<int>(value) == 0) ||
                      (std::holds_alternative<std::string>(value) && std::get<std::string>(value) == "0") ||
                      (std::holds_alternative<std::vector<int>>(value) && std::get<std::vector<int>>(value).empty());
    if (zero) {
      throw configuration_error("devices=" + input.devices.to_string() + " is not a valid input using the " +
                                *accelerator_known + " accelerator: it selects no device");
    }
  }

  // 3. The accelerator (auto: cuda when available, else cpu).
  std::string accelerator = *accelerator_known;
  const bool cuda_usable = machine.cuda_built && machine.cuda_devices > 0;
  if (accelerator == "auto") accelerator = cuda_usable ? "cuda" : "cpu";
  if (accelerator == "cuda" && !cuda_usable) {
    throw configuration_error(
        "accelerator '" + accelerator_asked + "' cannot run here: " +
        (machine.cuda_built ? std::string("no CUDA device is visible")
                            : std::string("LibTorch was built without CUDA")) +
        ". Available accelerators: cpu" + (accelerator_asked == "gpu" ? " (no supported GPU backend found)" : ""));
  }

  // 4. The cluster environment, and devices when not given.
  out.cluster = cluster::detect(env);
  devices_spec devices = input.devices;
  if (!devices.given()) {
    if (out.cluster.creates_processes_externally && out.cluster.name != "lightning") {
      int local = out.cluster.local_world_size.value_or(0);
      if (local == 0 && out.cluster.world_size) local = std::max(1, *out.cluster.world_size / input.num_nodes);
      devices = devices_spec(std::max(local, 1));
    } else {
      devices = devices_spec("auto");
    }
  }
  if (accelerator == "cpu") {
    out.processes_per_node = detail::parse_cpu_devices(devices);
    out.devices = devices_spec(out.processes_per_node);
  } else {
    const auto indices = detail::parse_cuda_devices(devices, machine.cuda_devices);
    out.processes_per_node = static_cast<int>(indices.size());
    out.devices = devices_spec(indices);
  }

  // 5. The strategy (auto: ddp for several nodes or devices) and Lightning's fallbacks.
  std::string chosen = strategy;
  if (chosen == "auto") {
    chosen = input.num_nodes > 1 || out.processes_per_node > 1 ? "ddp" : "single_device";
    entry = find(chosen);
  }
  if (chosen == "dp" && accelerator == "cpu") {
    out.warnings.push_back("'dp' is not supported on CPUs, hence setting strategy='ddp'.");
    chosen = "ddp";
    entry = find(chosen);
  }
  // dp drives every selected device from one process.
  if (chosen == "dp") out.processes_per_node = 1;
  if (entry == nullptr || !entry->built) {
    throw configuration_error("strategy '" + chosen + "' cannot be used: " +
                              (entry ? entry->reason : std::string("it is not registered")) +
                              ". Available: " + available);
  }
  // The compatibility rules, as Fabric<A, S, P> asserts them (concepts/compatibility_rules.hpp).
  const rules::strategy_facts strategy_facts{.name = chosen,
                                             .multi_process = entry->multi_process,
                                             .devices = entry->devices,
                                             .sharded = entry->sharded,
                                             .scales_own_loss = entry->scales_own_loss};
  if (rules::processes_fit(strategy_facts, out.processes_per_node, input.num_nodes) != rules::rule::none) {
    throw configuration_error("strategy '" + chosen + "': devices=" + devices.to_string() + " and num_nodes=" +
                              std::to_string(input.num_nodes) + " ask for " +
                              std::to_string(out.processes_per_node * input.num_nodes) + " processes; " +
                              std::string(rules::reason(rules::rule::one_process)));
  }

  // 6. The precision on this accelerator.
  if (accelerator == "cpu" && precision == "16-mixed") {
    out.warnings.push_back("You passed precision='16-mixed' with accelerator='cpu' but AMP with fp16 is not "
                           "supported on CPU. Using precision='bf16-mixed' instead.");
    precision = "bf16-mixed";
  }
  if (accelerator == "cpu" && precision.starts_with("bf16") && !machine.cpu_vector_bf16) {
    out.warnings.push_back("precision='" + precision + "' on this CPU: it lacks AVX-512 (BW, VL and DQ), which "
                           "LibTorch's oneDNN bfloat16 matmuls need, so a scalar loop computes them, 15 to 25 times "
                           "slower than precision='32-true' (docs/launching.md). Use '32-true' here, or a CPU with "
                           "AVX-512.");
  }
  if (const rules::rule broken = rules::first_broken(rules::builtin_accelerator(accelerator), strategy_facts,
                                                      rules::builtin_precision(precision));
      broken != rules::rule::none) {
    throw configuration_error("strategy '" + chosen + "' on accelerator '" + accelerator + "' with precision '" +
                              precision + "': " + std::string(rules::reason(broken)));
  }

  out.accelerator = accelerator;
  out.strategy = chosen;
  out.precision = precision;
  out.num_nodes = input.num_nodes;
  return out;
}

}  // namespace loom::runtime
