// The fuzz targets (targets.hpp). A target that needs files around its
// input (the indexes: the files they list) builds them once per process, in
// a scratch directory removed at exit, by loom's own writers.
#include "targets.hpp"

#include "../../src/checkpoint/python_pickle.hpp"
#include "../../src/checkpoint/torch_archive.hpp"

#include <loom/checkpoint/io.hpp>
#include <loom/data/idx.hpp>
#include <loom/environment.hpp>
#include <loom/errors.hpp>
#include <loom/precision/mixed.hpp>
#include <loom/precision/true_precision.hpp>
#include <loom/strategy/zero_config.hpp>

#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <fstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace loom_fuzz {
namespace {
namespace fs = std::filesystem;

std::vector<char> bytes_of(const std::uint8_t* data, std::size_t size) {
  return {reinterpret_cast<const char*>(data), reinterpret_cast<const char*>(data) + size};
}

void write_file(const fs::path& path, const std::uint8_t* data, std::size_t size) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
}

// The same weights in every process: a seed index records the CRC32s of
// files each process writes again.
torch::nn::Linear seeded_linear() {
  torch::manual_seed(0);
  return torch::nn::Linear(4, 3);
}

// What a checkpoint is loaded into: a module, its Adam optimizer, a step.
struct training_state {
  torch::nn::Linear model = seeded_linear();
  torch::optim::Adam optimizer{model->parameters(), torch::optim::AdamOptions(0.01)};
  std::int64_t step = 3;

  training_state() {
    // One step, so the optimizer has state to save and to load.
    model(torch::ones({2, 4})).sum().backward();
    optimizer.step();
  }
  loom::state entries() { return {{"model", model}, {"optimizer", optimizer}, {"step", step}}; }
};

// This process's scratch directory, with the checkpoints the index targets
// need written by loom: sharded/ (meta.pt, rank_0.pt) and deepspeed/
// (latest, checkpoint/mp_rank_00_model_states.pt and the optimizer file).
struct scratch {
  fs::path root;
  fs::path sharded;
  fs::path deepspeed;
  fs::path deepspeed_index;
  fs::path sliced;            // a sharded checkpoint whose rank file lists each parameter as a slice
  fs::path sliced_rank;
  std::uintmax_t sliced_rank_bytes = 0;

  scratch() {
    root = fs::temp_directory_path() / ("loom-fuzz-" + std::to_string(::getpid()));
    fs::create_directories(root);
    sharded = root / "sharded";
    deepspeed = root / "deepspeed";
    training_state state;
    loom::comm::process_group alone;
    loom::save_sharded_checkpoint(sharded.string(), state.entries(), {}, {}, alone);
    loom::save_deepspeed_checkpoint(deepspeed.string(), state.entries(), {}, {}, alone,
                                    [](const std::function<void()>& body) { body(); });
    deepspeed_index = deepspeed / "checkpoint" / "mp_rank_00_model_states.pt";
    sliced = root / "sliced";
    loom::shard_layout slices;
    for (const auto& item : state.model->named_parameters()) {
      slices[item.key()] = loom::shard_range{0, item.value().numel(), item.value().sizes().vec()};
    }
    loom::save_sharded_checkpoint(sliced.string(), state.entries(), {}, slices, alone);
    for (const auto& entry : fs::directory_iterator(sliced)) {
      if (entry.path().filename() != "meta.pt") sliced_rank = entry.path();
    }
    sliced_rank_bytes = fs::file_size(sliced_rank);
    if (!fs::exists(deepspeed_index)) throw std::logic_error("no " + deepspeed_index.string() + " after a save");
  }
  ~scratch() {
    std::error_code ignored;
    fs::remove_all(root, ignored);
  }
};

scratch& files() {
  static scratch made;
  return made;
}

// LOOM_FUZZ_VERBOSE=1 prints each refusal (to see which check a corpus
// file reaches); fuzzing runs stay quiet.
void refused(const std::exception& error) {
  static const bool verbose = loom::cluster::setting_text("LOOM_FUZZ_VERBOSE").has_value();
  if (verbose) std::fprintf(stderr, "  refused: %s\n", error.what());
}

// Runs read, catching only Error, the refusal its reader documents: any
// other exception escapes, a finding.
template <class Error, class Read>
int refused_only_as(Read read) {
  try {
    read();
  } catch (const Error& error) {
    refused(error);
  }
  return 0;
}

}  // namespace

int pickle(const std::uint8_t* data, std::size_t size) {
  // Records data/0 to data/9 hold 4 kB each; no other record exists.
  return refused_only_as<std::runtime_error>([&] {
    (void)loom::detail::validate_and_fix_pickle(std::string_view(reinterpret_cast<const char*>(data), size),
                                                [](std::string_view key) {
      return key.size() == 1 && key[0] >= '0' && key[0] <= '9' ? std::optional<std::uint64_t>(4096) : std::nullopt;
    });
  });
}

int archive(const std::uint8_t* data, std::size_t size) {
  return refused_only_as<loom::checkpoint_error>([&] {
    (void)loom::detail::read_torch_archive(bytes_of(data, size), "fuzz.pt");
  });
}

int load(const std::uint8_t* data, std::size_t size) {
  const fs::path path = files().root / "load.ckpt";
  write_file(path, data, size);
  training_state target;
  return refused_only_as<loom::checkpoint_error>([&] {
    (void)loom::load_checkpoint(path.string(), target.entries());
  });
}

int sharded_index(const std::uint8_t* data, std::size_t size) {
  write_file(files().sharded / "meta.pt", data, size);
  return refused_only_as<loom::checkpoint_error>([&] {
    (void)loom::read_sharded_checkpoint(files().sharded.string());
  });
}

int sharded_rank(const std::uint8_t* data, std::size_t size) {
  std::vector<std::uint8_t> fitted(data, data + std::min<std::size_t>(size, files().sliced_rank_bytes));
  fitted.resize(files().sliced_rank_bytes, 0);
  write_file(files().sliced_rank, fitted.data(), fitted.size());
  return refused_only_as<loom::checkpoint_error>([&] {
    (void)loom::read_sharded_checkpoint(files().sliced.string());
  });
}

int deepspeed_index(const std::uint8_t* data, std::size_t size) {
  write_file(files().deepspeed_index, data, size);
  return refused_only_as<loom::checkpoint_error>([&] {
    (void)loom::read_deepspeed_checkpoint(files().deepspeed.string());
  });
}

int local_parts(const std::uint8_t* data, std::size_t size) {
  const fs::path path = files().root / "local.ckpt";
  write_file(path, data, size);
  // Rank 1 of 2: the second half of each flattened parameter of Linear(4, 3).
  static const loom::rank_parts mine{
      {"weight", loom::rank_part{loom::shard_range{6, 12, {3, 4}}, {6}}},
      {"bias", loom::rank_part{loom::shard_range{2, 3, {3}}, {1}}},
  };
  return refused_only_as<loom::checkpoint_error>([&] { (void)loom::read_local_parts(path.string(), mine); });
}

int zero_config(const std::uint8_t* data, std::size_t size) {
  loom::deepspeed_options options;
  options.config = std::string(reinterpret_cast<const char*>(data), size);
  if (options.config.empty() || options.config.front() != '{') options.config.insert(0, "{");  // JSON text, not a path
  // Under each precision family: the config's fp16 and bf16 sections are
  // checked against the Fabric's precision.
  for (const loom::precision_dtypes& precision : {loom::precision_dtypes_of<loom::fp32>(),
                                                  loom::precision_dtypes_of<loom::fp16_mixed>(),
                                                  loom::precision_dtypes_of<loom::bf16_mixed>()}) {
    refused_only_as<loom::configuration_error>([&] { (void)loom::resolve_zero_config(options, precision, 2); });
  }
  return 0;
}

int idx(const std::uint8_t* data, std::size_t size) {
  // The name decides nothing: read_idx looks at the bytes (gzip or plain).
  const fs::path path = files().root / "input.idx";
  write_file(path, data, size);
  return refused_only_as<loom::data_error>([&] {
    (void)loom::data::read_idx(path.string());
  });
}

void write_seeds(const char* directory) {
  const fs::path out(directory);
  for (const auto& entry : targets) fs::create_directories(out / entry.name);
  training_state state;
  const fs::path checkpoint = out / "load" / "loom.ckpt";
  loom::save_checkpoint(checkpoint.string(), state.entries(), {}, {});
  fs::copy_file(checkpoint, out / "archive" / "loom.ckpt", fs::copy_options::overwrite_existing);
  fs::copy_file(checkpoint, out / "local_parts" / "loom.ckpt", fs::copy_options::overwrite_existing);
  fs::copy_file(files().sharded / "meta.pt", out / "sharded_index" / "meta.pt", fs::copy_options::overwrite_existing);
  fs::copy_file(files().sliced_rank, out / "sharded_rank" / files().sliced_rank.filename(),
                fs::copy_options::overwrite_existing);
  fs::copy_file(files().deepspeed_index, out / "deepspeed_index" / "mp_rank_00_model_states.pt",
                fs::copy_options::overwrite_existing);
}

}  // namespace loom_fuzz
