// Laws of checkpoints: save then load is the identity; a filter saves a
// subset; every bad file or mismatching state is a clear error that changes
// nothing; state dicts from LibTorch and from Python load into modules.
#include "test_models.hpp"
#include "allocation_counter.hpp"
#include "bytes_read.hpp"

#include "catch.hpp"
#include "../src/checkpoint/checkpoint_bytes.hpp"
#include "../src/checkpoint/python_pickle.hpp"
#include "../src/checkpoint/structure_budget.hpp"
#include "../src/checkpoint/tensor_records.hpp"
#include "../src/checkpoint/torch_archive.hpp"
#include "../src/checkpoint/unpickled_value.hpp"
#include "../src/util/outside_files.hpp"

#include <c10/core/CPUAllocator.h>
#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/pickler.h>

#include <sys/resource.h>
#include <sys/stat.h>
#include <loom/environment.hpp>
#include <loom/loom.hpp>
#include <loom/strategy/zero_config.hpp>  // the resolved DeepSpeed configuration
#include <torch/optim/adam.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>
#include <torch/serialize.h>
#include <zlib.h>

#include <csignal>
#include <cstdlib>
#include <functional>
#include <cstring>
#include <sstream>
#include <filesystem>
#include <fstream>
#include <iterator>

using loom_test::Mlp;

namespace {

// A user-written precision with state: bf16 autocast plus a loss scaler, to
// show that Fabric saves any stateful precision under "precision" (the path
// 16-mixed takes on CUDA) on this CPU-only machine.
struct scaled_bf16_mixed : loom::autocast_precision<c10::ScalarType::BFloat16> {
  static constexpr std::string_view name = "scaled-bf16-mixed";
  static constexpr bool has_state = true;
  void backward(const at::Tensor& loss) { scaler.scale(loss).backward(); }
  void optimizer_step(torch::optim::Optimizer& optimizer, loom::optimizer_slot slot) {
    scaler.step(optimizer, slot);
    scaler.update();
  }
  void unscale_gradients(torch::optim::Optimizer& optimizer, loom::optimizer_slot slot) {
    scaler.unscale_(optimizer, slot);
  }
  c10::IValue state_dict() const { return scaler.state_dict(); }
  void load_state_dict(const c10::IValue& state) { scaler.load_state_dict(state); }
  loom::grad_scaler scaler{{.init_scale = 4096.0, .growth_interval = 2}};
};

using fabric_t = loom::Fabric<loom::cpu, loom::single_device, scaled_bf16_mixed>;

struct training_run {
  fabric_t fabric;
  Mlp net{4, 8, 2};
  torch::optim::Adam adam{net->parameters(), torch::optim::AdamOptions(1e-2)};
  fabric_t::module_type<Mlp> model = fabric.setup_module(net);
  fabric_t::optimizer_type<torch::optim::Adam> optimizer = fabric.setup_optimizers(adam);
  std::int64_t step = 0;
  double best = 0.0;
  bool finished = false;
  std::string tag = "none";
  at::Tensor ema = at::zeros({3});

  void train(int steps) {
    for (int i = 0; i < steps; ++i) {
      optimizer.zero_grad();
      auto loss = model(at::randn({8, 4})).pow(2).mean();
      fabric.backward(loss);
      optimizer.step();
      ++step;
      best = loss.item<double>();
      ema = ema * 0.9 + 0.1;
    }
  }
  loom::state state() {
    return {{"model", model}, {"optimizer", optimizer}, {"step", step}, {"best", best},
            {"finished", finished}, {"tag", tag}, {"ema", ema}};
  }
};

std::map<std::string, at::Tensor> snapshot(const Mlp& net) {
  std::map<std::string, at::Tensor> out;
  for (const auto& item : net->named_parameters()) out[item.key()] = item.value().detach().clone();
  return out;
}

bool same_parameters(const Mlp& net, const std::map<std::string, at::Tensor>& expected) {
  for (const auto& item : net->named_parameters()) {
    if (!torch::equal(item.value(), expected.at(item.key()))) return false;
  }
  return true;
}

// The optimizer's state as bytes, to compare two optimizers exactly.
std::string optimizer_bytes(torch::optim::Optimizer& optimizer) {
  torch::serialize::OutputArchive archive;
  optimizer.save(archive);
  std::ostringstream out;
  archive.save_to(out);
  return out.str();
}

// Adam's per-parameter state, by parameter position.
std::vector<at::Tensor> adam_moments(torch::optim::Adam& adam) {
  std::vector<at::Tensor> out;
  for (const auto& p : adam.param_groups()[0].params()) {
    auto& state = static_cast<torch::optim::AdamParamState&>(*adam.state().at(loom::compat::optimizer_state_key(p)));
    out.push_back(state.exp_avg().clone());
    out.push_back(state.exp_avg_sq().clone());
    out.push_back(at::tensor(state.step()));
  }
  return out;
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

// Little-endian fields of a zip archive's bytes.
std::uint64_t zip_field(const std::string& zip, std::size_t at, int bytes) {
  std::uint64_t value = 0;
  for (int i = bytes - 1; i >= 0; --i) value = value << 8 | std::uint8_t(zip[at + static_cast<std::size_t>(i)]);
  return value;
}
void set_zip_field(std::string& zip, std::size_t at, int bytes, std::uint64_t value) {
  for (int i = 0; i < bytes; ++i) zip[at + static_cast<std::size_t>(i)] = static_cast<char>((value >> (8 * i)) & 0xFF);
}

// A zip archive's bytes with the first entry of its central directory
// listed `copies` more times (the end records' counts, size and offsets
// updated): one record that a reader would check copies + 1 times.
std::string with_repeated_entry(const std::string& zip, int copies) {
  const std::size_t eocd = zip.rfind(std::string("PK\x05\x06", 4));
  const std::size_t zip64 = zip.find(std::string("PK\x06\x06", 4));
  REQUIRE(eocd != std::string::npos);
  std::uint64_t entries = zip_field(zip, eocd + 10, 2), size = zip_field(zip, eocd + 12, 4),
                directory = zip_field(zip, eocd + 16, 4);
  if (zip64 != std::string::npos) {
    entries = zip_field(zip, zip64 + 32, 8), size = zip_field(zip, zip64 + 40, 8), directory = zip_field(zip, zip64 + 48, 8);
  }
  const std::size_t first = 46 + zip_field(zip, directory + 28, 2) + zip_field(zip, directory + 30, 2) +
                            zip_field(zip, directory + 32, 2);
  const std::size_t grown = first * static_cast<std::size_t>(copies);
  std::string tail = zip.substr(directory + size);  // [ZIP64 end record, locator,] end record
  const std::size_t end = tail.rfind(std::string("PK\x05\x06", 4));
  if (zip_field(tail, end + 10, 2) != 0xFFFF) {
    set_zip_field(tail, end + 8, 2, entries + copies);
    set_zip_field(tail, end + 10, 2, entries + copies);
  }
  if (zip_field(tail, end + 12, 4) != 0xFFFFFFFF) set_zip_field(tail, end + 12, 4, size + grown);
  if (zip64 != std::string::npos) {
    const std::size_t record = zip64 - (directory + size);
    set_zip_field(tail, record + 24, 8, entries + copies);
    set_zip_field(tail, record + 32, 8, entries + copies);
    set_zip_field(tail, record + 40, 8, size + grown);
    const std::size_t locator = tail.find(std::string("PK\x06\x07", 4));
    REQUIRE(locator != std::string::npos);
    set_zip_field(tail, locator + 8, 8, zip64 + grown);
  }
  std::string out = zip.substr(0, directory + size);
  for (int i = 0; i < copies; ++i) out += zip.substr(directory, first);
  return out + tail;
}

// Where the bytes of record `name` start (after its local header).
std::size_t zip_record_data(const std::string& zip, const std::string& name) {
  const std::size_t local = zip.find(name) - 30;  // the first occurrence is the local header's
  REQUIRE(zip.compare(local, 4, std::string("PK\x03\x04", 4)) == 0);
  return local + 30 + zip_field(zip, local + 26, 2) + zip_field(zip, local + 28, 2);
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::size_t temporary_files(const std::filesystem::path& dir) {
  std::size_t count = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().filename().string().find(".tmp-") != std::string::npos) ++count;
  }
  return count;
}

}  // namespace

TEST_CASE("save then load restores module, optimizer, scaler and values exactly", "[checkpoint]") {
  loom_test::scratch_dir dir("ckpt-roundtrip");
  at::manual_seed(1);
  training_run source;
  source.train(5);
  source.finished = true;
  source.tag = "epoch-1";
  source.fabric.save(dir.file("run.ckpt"), source.state());
  REQUIRE(source.fabric.precision().scaler.get_scale() == 4096.0 * 4);  // grew twice in 5 steps
  REQUIRE(temporary_files(dir.path()) == 0);

  at::manual_seed(2);  // different initial weights
  training_run target;
  REQUIRE_FALSE(same_parameters(target.net, snapshot(source.net)));
  auto remainder = target.fabric.load(dir.file("run.ckpt"), target.state());
  CHECK(remainder.size() == 0);
  CHECK(same_parameters(target.net, snapshot(source.net)));
  const auto want = adam_moments(source.adam);
  const auto got = adam_moments(target.adam);
  REQUIRE(want.size() == got.size());
  for (std::size_t i = 0; i < want.size(); ++i) CHECK(torch::equal(want[i], got[i]));
  CHECK(static_cast<torch::optim::AdamOptions&>(target.adam.param_groups()[0].options()).lr() == 1e-2);
  CHECK(target.step == 5);
  CHECK(target.best == source.best);
  CHECK(target.finished);
  CHECK(target.tag == "epoch-1");
  CHECK(torch::equal(target.ema, source.ema));
  CHECK(target.fabric.precision().scaler.get_scale() == source.fabric.precision().scaler.get_scale());
  CHECK(target.fabric.precision().scaler.growth_tracker() == source.fabric.precision().scaler.growth_tracker());

  // Identity: both continue identically from here.
  at::manual_seed(3);
  source.train(3);
  at::manual_seed(3);
  target.train(3);
  CHECK(same_parameters(target.net, snapshot(source.net)));
}

TEST_CASE("a checkpoint of loom's earlier format (a header before the archive) still loads", "[checkpoint]") {
  loom_test::scratch_dir dir("ckpt-format1");
  at::manual_seed(12);
  Mlp net(4, 8, 2);
  torch::optim::Adam adam(net->parameters(), torch::optim::AdamOptions(1e-2));
  adam.zero_grad();
  net->forward(at::randn({3, 4})).sum().backward();
  adam.step();

  // Written as format 1 was: "LOOMCKPT", u32 version, u64 length, u32 CRC32, then torch::pickle_save.
  c10::impl::GenericDict entries(c10::StringType::get(), c10::AnyType::get());
  c10::impl::GenericDict meta(c10::StringType::get(), c10::AnyType::get());
  meta.insert("format_version", std::int64_t{1});
  meta.insert("world_size", std::int64_t{1});
  meta.insert("global_rank", std::int64_t{0});
  meta.insert("strategy", std::string("single_device"));
  meta.insert("precision", std::string("32-true"));
  entries.insert("__loom__", meta);
  c10::impl::GenericDict weights(c10::StringType::get(), c10::TensorType::get());
  for (const auto& item : net->named_parameters()) weights.insert(item.key(), item.value().detach());
  entries.insert("model", weights);
  std::ostringstream archive_bytes;
  torch::serialize::OutputArchive archive;
  adam.save(archive);
  archive.save_to(archive_bytes);
  const std::string blob_bytes = archive_bytes.str();
  at::Tensor blob = at::empty({static_cast<std::int64_t>(blob_bytes.size())}, at::kByte);
  std::memcpy(blob.data_ptr(), blob_bytes.data(), blob_bytes.size());
  c10::impl::GenericDict optimizer(c10::StringType::get(), c10::AnyType::get());
  optimizer.insert("type", std::string("torch::optim::Adam"));
  optimizer.insert("libtorch_archive", blob);
  entries.insert("optimizer", optimizer);
  entries.insert("step", std::int64_t{7});
  const std::vector<char> payload = torch::pickle_save(entries);
  std::string file = "LOOMCKPT";
  auto put = [&file](std::uint64_t value, int bytes) {
    for (int i = 0; i < bytes; ++i) file.push_back(static_cast<char>((value >> (8 * i)) & 0xFF));
  };
  put(1, 4);
  put(payload.size(), 8);
  put(crc32(crc32(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(payload.data()), static_cast<uInt>(payload.size())), 4);
  file.append(payload.data(), payload.size());
  write_bytes(dir.file("old.ckpt"), file);

  loom::Fabric<loom::cpu> fabric;
  at::manual_seed(13);
  Mlp target(4, 8, 2);
  torch::optim::Adam target_adam(target->parameters(), torch::optim::AdamOptions(1e-2));
  auto [model, target_optimizer] = fabric.setup(target, target_adam);
  int step = 0;
  fabric.load(dir.file("old.ckpt"), {{"model", model}, {"optimizer", target_optimizer}, {"step", step}});
  CHECK(step == 7);
  CHECK(same_parameters(target, snapshot(net)));
  const auto want = adam_moments(adam);
  const auto got = adam_moments(target_adam);
  REQUIRE(want.size() == got.size());
  for (std::size_t i = 0; i < want.size(); ++i) CHECK(torch::equal(want[i], got[i]));

  // A corrupted format-1 file is still refused by its header's CRC.
  file[file.size() / 2] = static_cast<char>(file[file.size() / 2] ^ 0x5A);
  write_bytes(dir.file("old-flip.ckpt"), file);
  CHECK_THROWS_WITH(fabric.load(dir.file("old-flip.ckpt"), {{"model", model}}), Catch::Contains("CRC32 mismatch"));

  // Its payload goes through the same zip walk as format 2 (LibTorch's
  // pickle_load read it unchecked): a record marked compressed is refused,
  // though the header's CRC32 is right.
  std::vector<char> compressed = payload;
  const std::string payload_text(compressed.begin(), compressed.end());
  // The directory's first entry (the payload's records hold zips of their own: search from the directory).
  const std::size_t end_record = payload_text.rfind(std::string("PK\x05\x06", 4));
  REQUIRE(end_record != std::string::npos);
  std::uint32_t directory = 0;
  std::memcpy(&directory, payload_text.data() + end_record + 16, 4);
  REQUIRE(payload_text.compare(directory, 4, std::string("PK\x01\x02", 4)) == 0);
  compressed[directory + 10] = 8;  // method: deflate
  std::string forged = "LOOMCKPT";
  forged.push_back(1), forged.append(3, '\0');
  for (int i = 0; i < 8; ++i) forged.push_back(static_cast<char>((compressed.size() >> (8 * i)) & 0xFF));
  const auto crc = crc32(crc32(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(compressed.data()),
                         static_cast<uInt>(compressed.size()));
  for (int i = 0; i < 4; ++i) forged.push_back(static_cast<char>((crc >> (8 * i)) & 0xFF));
  forged.append(compressed.data(), compressed.size());
  write_bytes(dir.file("old-compressed.ckpt"), forged);
  CHECK_THROWS_WITH(fabric.load(dir.file("old-compressed.ckpt"), {{"model", model}}),
                    Catch::Contains("holds a compressed record"));
}

struct custom_sgd : torch::optim::SGD {
  using torch::optim::SGD::SGD;
};

TEST_CASE("every optimizer family goes through a checkpoint unchanged: the next steps are identical", "[checkpoint]") {
  loom_test::scratch_dir dir("ckpt-optimizers");
  using factory = std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<at::Tensor>)>;
  const std::vector<std::pair<std::string, factory>> families = {
      {"sgd", [](auto p) { return std::make_unique<torch::optim::SGD>(p, torch::optim::SGDOptions(0.1).momentum(0.9).nesterov(true)); }},
      {"adamw", [](auto p) { return std::make_unique<torch::optim::AdamW>(p, torch::optim::AdamWOptions(1e-2).amsgrad(true)); }},
      {"rmsprop", [](auto p) { return std::make_unique<torch::optim::RMSprop>(p, torch::optim::RMSpropOptions(1e-2).momentum(0.5).centered(true)); }},
      {"adagrad", [](auto p) { return std::make_unique<torch::optim::Adagrad>(p, torch::optim::AdagradOptions(0.1)); }},
      // A type loom has no torch.optim layout for keeps LibTorch's own archive.
      {"an SGD subclass (LibTorch's own archive)", [](auto p) { return std::make_unique<custom_sgd>(p, torch::optim::SGDOptions(0.1).momentum(0.5)); }},
  };
  const at::Tensor x = at::randn({8, 4});
  const at::Tensor y = at::randn({8, 2});
  auto step = [&](Mlp& net, torch::optim::Optimizer& optimizer) {
    auto closure = [&] {
      optimizer.zero_grad();
      at::Tensor loss = torch::mse_loss(net->forward(x), y);
      loss.backward();
      return loss;
    };
    optimizer.step(closure);
  };
  for (const auto& [name, make] : families) {
    DYNAMIC_SECTION(name) {
      loom::Fabric<loom::cpu> fabric;
      at::manual_seed(21);
      Mlp source(4, 8, 2);
      auto source_optimizer = make(source->parameters());
      for (int i = 0; i < 2; ++i) step(source, *source_optimizer);
      fabric.save(dir.file(name + ".ckpt"), {{"model", source}, {"optimizer", *source_optimizer}});

      at::manual_seed(22);
      Mlp target(4, 8, 2);
      auto target_optimizer = make(target->parameters());
      fabric.load(dir.file(name + ".ckpt"), {{"model", target}, {"optimizer", *target_optimizer}});
      for (int i = 0; i < 2; ++i) {
        step(source, *source_optimizer);
        step(target, *target_optimizer);
      }
      CHECK(same_parameters(target, snapshot(source)));
    }
  }
}

TEST_CASE("publish_directory replaces a checkpoint directory in one step", "[checkpoint]") {
  loom_test::scratch_dir dir("ckpt-publish");
  const std::string path = dir.file("sharded");
  auto stage = [&](const std::string& name, const std::string& content) {
    const std::string staged = dir.file(name);
    std::filesystem::create_directories(staged);
    write_bytes(staged + "/rank-0", content);
    return staged;
  };
  loom::publish_directory(stage("sharded.tmp-1", "first"), path);  // path does not exist yet: a rename
  CHECK(read_bytes(path + "/rank-0") == "first");
  CHECK_FALSE(std::filesystem::exists(dir.file("sharded.tmp-1")));

  const std::string second = stage("sharded.tmp-2", "second");
  write_bytes(second + "/rank-1", "only in the second");
  loom::publish_directory(second, path);  // a non-empty directory: exchanged, the old one removed
  CHECK(read_bytes(path + "/rank-0") == "second");
  CHECK(read_bytes(path + "/rank-1") == "only in the second");
  CHECK_FALSE(std::filesystem::exists(second));

  CHECK_THROWS_WITH(loom::publish_directory(dir.file("absent.tmp"), path),
                    Catch::Contains("absent.tmp, which does not exist"));
  CHECK(read_bytes(path + "/rank-0") == "second");
}

TEST_CASE("owned values are written, read back with get, and unknown entries are returned", "[checkpoint]") {
  loom_test::scratch_dir dir("ckpt-owned");
  loom::Fabric<loom::cpu> fabric;
  Mlp net(4, 8, 2);
  auto model = fabric.setup(net);
  fabric.save(dir.file("a.ckpt"), {{"model", model}, {"epoch", 3}, {"lr", 0.5}, {"name", "mlp"}});

  loom::state wanted{{"model", model}, {"epoch", 0}};
  auto rest = fabric.load(dir.file("a.ckpt"), wanted);
  CHECK(wanted.get<int>("epoch") == 3);
  CHECK((rest.names() == std::vector<std::string>{"lr", "name"}));
  CHECK(rest.get<double>("lr") == 0.5);
  CHECK(rest.get<std::string>("name") == "mlp");
  CHECK_THROWS_WITH(rest.get<double>("missing"), Catch::Contains("no entry 'missing'"));
}

TEST_CASE("a filter saves part of a module; strict loading then names the missing keys", "[checkpoint]") {
  loom_test::scratch_dir dir("ckpt-filter");
  loom::Fabric<loom::cpu> fabric;
  at::manual_seed(4);
  Mlp net(4, 8, 2);
  auto model = fabric.setup(net);
  fabric.save(dir.file("weights.ckpt"), {{"model", model}},
              {{"model", [](std::string_view key, const at::Tensor&) { return key.ends_with("weight"); }}});

  const auto contents = loom::read_checkpoint(dir.file("weights.ckpt"));
  const auto saved = contents.entries.at("model").toGenericDict();
  CHECK(saved.size() == 3);
  CHECK(saved.contains("fc1.weight"));
  CHECK_FALSE(saved.contains("fc1.bias"));
  CHECK(contents.metadata.strategy == "single_device");
  CHECK(contents.metadata.precision == "32-true");

  at::manual_seed(5);
  Mlp other(4, 8, 2);
  auto other_model = fabric.setup(other);
  const auto before = snapshot(other);
  CHECK_THROWS_WITH(fabric.load(dir.file("weights.ckpt"), {{"model", other_model}}),
                    Catch::Contains("missing key(s) 'fc1.bias', 'fc2.bias', 'fc3.bias'") &&
                        Catch::Contains("nothing was changed"));
  CHECK(same_parameters(other, before));
  fabric.load(dir.file("weights.ckpt"), {{"model", other_model}}, /*strict=*/false);
  CHECK(torch::equal(other->fc2->weight, net->fc2->weight));
  CHECK(torch::equal(other->fc2->bias, before.at("fc2.bias")));

  CHECK_THROWS_WITH(fabric.save(dir.file("x.ckpt"), {{"model", model}}, {{"optimizer", nullptr}}),
                    Catch::Contains("filter names 'optimizer', which is not in the state"));
}

TEST_CASE("each bad checkpoint file is a clear error and leaves every entry as it was", "[checkpoint]") {
  loom_test::scratch_dir dir("ckpt-corrupt");
  at::manual_seed(6);
  training_run run;
  run.train(2);
  const std::string good = dir.file("good.ckpt");
  run.fabric.save(good, run.state());
  const std::string bytes = read_bytes(good);

  at::manual_seed(7);
  training_run victim;
  victim.train(1);
  const auto parameters = snapshot(victim.net);
  const auto optimizer_state = optimizer_bytes(victim.adam);
  const double scale = victim.fabric.precision().scaler.get_scale();
  auto unchanged = [&] {
    CHECK(same_parameters(victim.net, parameters));
    CHECK(optimizer_bytes(victim.adam) == optimizer_state);
    CHECK(victim.step == 1);
    CHECK(victim.tag == "none");
    CHECK(victim.fabric.precision().scaler.get_scale() == scale);
  };

  SECTION("missing") {
    CHECK_THROWS_WITH(victim.fabric.load(dir.file("absent.ckpt"), victim.state()),
                      Catch::Contains("absent.ckpt") && Catch::Contains("does not exist"));
  }
  SECTION("truncated") {
    write_bytes(dir.file("cut.ckpt"), bytes.substr(0, bytes.size() / 2));
    CHECK_THROWS_WITH(victim.fabric.load(dir.file("cut.ckpt"), victim.state()),
                      Catch::Contains("cut.ckpt") && Catch::Contains("truncated"));
  }
  SECTION("truncated inside the header") {
    write_bytes(dir.file("stub.ckpt"), bytes.substr(0, 10));
    CHECK_THROWS_WITH(victim.fabric.load(dir.file("stub.ckpt"), victim.state()), Catch::Contains("truncated"));
  }
  SECTION("one flipped byte in the tensor data") {
    std::string flipped = bytes;
    const std::size_t at = zip_record_data(flipped, "archive/data/0") + 1;
    flipped[at] = static_cast<char>(flipped[at] ^ 0x5A);
    write_bytes(dir.file("flip.ckpt"), flipped);
    CHECK_THROWS_WITH(victim.fabric.load(dir.file("flip.ckpt"), victim.state()),
                      Catch::Contains("flip.ckpt") && Catch::Contains("corrupted (CRC32 mismatch)"));
  }
  SECTION("a FIFO (no writer: reading it would wait forever)") {
    REQUIRE(::mkfifo(dir.file("pipe.ckpt").c_str(), 0600) == 0);
    CHECK_THROWS_WITH(victim.fabric.load(dir.file("pipe.ckpt"), victim.state()),
                      Catch::Contains("pipe.ckpt") && Catch::Contains("is a FIFO, not a regular file"));
  }
  SECTION("a device (/dev/zero never ends)") {
    CHECK_THROWS_WITH(victim.fabric.load("/dev/zero", victim.state()),
                      Catch::Contains("/dev/zero") && Catch::Contains("is a character device, not a regular file"));
  }
  SECTION("one zip record listed a thousand times (each would be CRC-checked)") {
    write_bytes(dir.file("repeated.ckpt"), with_repeated_entry(bytes, 1000));
    CHECK_THROWS_WITH(victim.fabric.load(dir.file("repeated.ckpt"), victim.state()),
                      Catch::Contains("repeated.ckpt") && Catch::Contains("its zip directory lists") &&
                          Catch::Contains("twice"));
  }
  SECTION("a local header that names another record than the directory does") {
    std::string renamed = bytes;
    REQUIRE(renamed.compare(0, 4, std::string("PK\x03\x04", 4)) == 0);
    renamed[30] = static_cast<char>(renamed[30] ^ 0x20);  // the first letter of the first record's local name
    write_bytes(dir.file("renamed.ckpt"), renamed);
    CHECK_THROWS_WITH(victim.fabric.load(dir.file("renamed.ckpt"), victim.state()),
                      Catch::Contains("does not match the local header it points at"));
  }
  SECTION("not a checkpoint") {
    write_bytes(dir.file("text.ckpt"), std::string(100, 'x'));
    CHECK_THROWS_WITH(victim.fabric.load(dir.file("text.ckpt"), victim.state()),
                      Catch::Contains("not a loom checkpoint"));
  }
  SECTION("a plain torch file") {
    torch::save(victim.net, dir.file("plain.pt"));
    CHECK_THROWS_WITH(victim.fabric.load(dir.file("plain.pt"), victim.state()), Catch::Contains("load_raw"));
  }
  SECTION("a missing entry under strict") {
    loom::state more = victim.state();
    more.set("scheduler", std::int64_t{0});
    CHECK_THROWS_WITH(victim.fabric.load(good, more),
                      Catch::Contains("missing key(s) 'scheduler'") && Catch::Contains("strict=false"));
  }
  SECTION("a module of another shape") {
    Mlp bigger(4, 16, 2);  // the same names, wider layers
    loom::state mismatched = victim.state();
    mismatched.set("model", bigger);
    CHECK_THROWS_WITH(victim.fabric.load(good, mismatched),
                      Catch::Contains("size mismatch for 'fc1.weight'") && Catch::Contains("[16, 4]"));
  }
  SECTION("another optimizer type") {
    torch::optim::SGD sgd(victim.net->parameters(), 0.1);
    loom::state wrong = victim.state();
    wrong.set("optimizer", sgd);
    CHECK_THROWS_WITH(victim.fabric.load(good, wrong),
                      Catch::Contains("torch::optim::Adam") && Catch::Contains("torch::optim::SGD"));
  }
  SECTION("an optimizer whose parameters do not fit") {
    Mlp small(4, 8, 2);
    torch::optim::Adam partial(std::vector<at::Tensor>{small->fc1->weight}, torch::optim::AdamOptions(1e-2));
    loom::state wrong = victim.state();
    wrong.set("optimizer", partial);
    CHECK_THROWS_WITH(victim.fabric.load(good, wrong),
                      Catch::Contains("param group 0 has 6 parameter(s) in the checkpoint, 1 in the optimizer") &&
                          Catch::Contains("nothing was changed"));
  }
  SECTION("an entry whose load fails after validation: every loaded entry rolled back") {
    // The precision and the optimizer are loaded first (they can fail, so
    // they are snapshotted) and must be rolled back when a later one fails.
    struct refuses_to_load {
      c10::IValue state_dict() const { return std::int64_t{0}; }
      void load_state_dict(const c10::IValue&) { throw std::runtime_error("refused"); }
    } refusing;
    loom::state with_extra = run.state();
    with_extra.set("extra", std::int64_t{1});
    run.fabric.save(dir.file("extra.ckpt"), with_extra);
    loom::state wrong;
    wrong.add(loom::state_entry("precision", victim.fabric.precision()));
    const loom::state base = victim.state();
    for (const auto& entry : base.entries()) wrong.add(entry);
    wrong.set("extra", refusing);
    CHECK_THROWS_WITH(victim.fabric.load(dir.file("extra.ckpt"), wrong),
                      Catch::Contains("cannot load 'extra'") && Catch::Contains("refused") &&
                          Catch::Contains("nothing was changed"));
  }
  SECTION("a value of another type") {
    loom::state wrong = victim.state();
    std::string step_as_text;
    wrong.set("step", step_as_text);
    CHECK_THROWS_WITH(victim.fabric.load(good, wrong), Catch::Contains("'step' (value): expected a string"));
  }
  unchanged();
}

namespace {
[[noreturn]] void refuse_for_test(const std::string& path, const std::string& why) {
  throw std::runtime_error(path + ": " + why);
}
}  // namespace

// What an index inside a checkpoint directory names is read only as a
// regular file of that directory: names are single components, links are
// not followed (not even to a file inside), FIFOs and devices are refused.
TEST_CASE("a checkpoint directory's files are read only as regular files inside it", "[checkpoint]") {
  loom_test::scratch_dir dir("ckpt-confined");
  namespace fs = std::filesystem;
  const fs::path root = dir.file("checkpoint");
  fs::create_directories(root / "tag");
  write_bytes((root / "rank_0.pt").string(), "twelve bytes");
  write_bytes(dir.file("outside.pt"), "twelve bytes");  // the same bytes, so the same size and CRC32
  fs::create_symlink("../outside.pt", root / "link.pt");
  fs::create_symlink(root / "rank_0.pt", root / "inner_link.pt");
  fs::create_directory_symlink("..", root / "up");
  REQUIRE(::mkfifo((root / "pipe.pt").c_str(), 0600) == 0);

  const loom::detail::confined_directory checkpoint(root.string(), &refuse_for_test);
  const auto bytes = checkpoint.read("rank_0.pt");
  REQUIRE(bytes.has_value());
  CHECK(std::string(bytes->begin(), bytes->end()) == "twelve bytes");
  CHECK_FALSE(checkpoint.read("absent.pt").has_value());
  CHECK(checkpoint.has("rank_0.pt"));
  CHECK_FALSE(checkpoint.has("absent.pt"));
  for (const std::string name : {"../outside.pt", "/etc/passwd", "tag/../rank_0.pt", "..", ".", ""}) {
    CHECK_THROWS_WITH(checkpoint.read(name), Catch::Contains("which is not the name of an entry in it"));
  }
  CHECK_THROWS_WITH(checkpoint.read("link.pt"), Catch::Contains("link.pt: is a symbolic link"));
  CHECK_THROWS_WITH(checkpoint.read("inner_link.pt"), Catch::Contains("is a symbolic link"));
  CHECK_THROWS_WITH(checkpoint.read("pipe.pt"), Catch::Contains("pipe.pt: is a FIFO, not a regular file"));
  CHECK_THROWS_WITH(checkpoint.read("tag"), Catch::Contains("is a directory, not a regular file"));
  CHECK_THROWS_WITH(checkpoint.read("rank_0.pt", 4), Catch::Contains("has 12 bytes, more than the 4"));
  CHECK(checkpoint.subdirectory("tag").path() == (root / "tag").string());
  CHECK_THROWS_WITH(checkpoint.subdirectory("up"), Catch::Contains("up: is a symbolic link, not a directory"));
  CHECK_THROWS_WITH(checkpoint.subdirectory("rank_0.pt"), Catch::Contains("is not a directory inside"));
  CHECK_THROWS_WITH(loom::detail::confined_directory((root / "rank_0.pt").string(), &refuse_for_test),
                    Catch::Contains("is not a directory"));
}

namespace {
// A torch archive of this pickle and its tensors' records (data/0, ...), laid
// out as loom writes one.
std::vector<char> archive_of_pickle(const std::string& pickle, const std::vector<at::Tensor>& storages = {}) {
  std::vector<char> archive;
  caffe2::serialize::PyTorchStreamWriter writer([&archive](const void* data, size_t size) {
    archive.insert(archive.end(), static_cast<const char*>(data), static_cast<const char*>(data) + size);
    return size;
  });
  writer.writeRecord("data.pkl", pickle.data(), pickle.size());
  for (std::size_t i = 0; i < storages.size(); ++i) {
    const auto data = torch::jit::getWriteableTensorData(storages[i]);
    writer.writeRecord("data/" + std::to_string(i), data.data(), data.sizeInBytes());
  }
  writer.writeEndOfFile();
  return archive;
}

// A torch archive of {"w": tensor} as loom writes one, its pickle edited by
// `forge` first (the records stay as they are, their CRCs right).
std::vector<char> forged_archive(const at::Tensor& tensor, const std::function<void(std::string&)>& forge) {
  c10::impl::GenericDict dict(c10::StringType::get(), c10::AnyType::get());
  dict.insert("w", tensor);
  std::string pickle;
  torch::jit::Pickler pickler([&pickle](const char* data, size_t size) { pickle.append(data, size); }, nullptr,
                              nullptr, nullptr, nullptr, false);
  pickler.protocol();
  pickler.pushIValue(dict);
  pickler.stop();
  forge(pickle);
  return archive_of_pickle(pickle, pickler.tensorData());
}

// The bytes of a string literal, NULs included.
template <std::size_t N>
std::string pickle_bytes(const char (&literal)[N]) {
  return std::string(literal, N - 1);
}

// The checkpoint_error reading these archive bytes raises, or "no error".
std::string refusal_of_archive(const std::vector<char>& archive, const std::string& name) {
  try {
    loom::detail::read_torch_archive(archive, name);
  } catch (const loom::checkpoint_error& error) {
    return error.what();
  }
  return "no error";
}

void replace_once(std::string& text, const std::string& from, const std::string& to) {
  std::string shown;  // the pickle, printable, when the edit does not apply
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    char hex[8];
    std::snprintf(hex, sizeof hex, "\\x%02x", byte);
    shown += byte >= 0x20 && byte < 0x7f ? std::string(1, c) : std::string(hex);
  }
  INFO("pickle: " << shown);
  const std::size_t at = text.find(from);
  REQUIRE(at != std::string::npos);
  REQUIRE(text.find(from, at + 1) == std::string::npos);
  text.replace(at, from.size(), to);
}
}  // namespace

// LibTorch 1.13's unpickler sizes a storage by the numel the pickle states
// and sets each view as stated: a forged file could make a tensor read heap
// memory past its record. Every view is checked against its record first.
TEST_CASE("a tensor that reaches past its record is refused before anything reads it", "[checkpoint]") {
  const at::Tensor tensor = at::arange(6, at::kFloat).reshape({2, 3});
  const auto honest = loom::detail::read_torch_archive(forged_archive(tensor, [](std::string&) {}), "honest.pt");
  CHECK(torch::equal(honest.toGenericDict().at("w").toTensor(), tensor));
  // The storage's numel, 6, stated as 60: a 240-byte storage over a 24-byte record.
  const auto longer = forged_archive(tensor, [](std::string& pickle) {
    replace_once(pickle, std::string("K\x06tQ", 4), std::string("K\x3ctQ", 4));
  });
  CHECK_THROWS_WITH(loom::detail::read_torch_archive(longer, "longer.pt"),
                    Catch::Contains("checkpoint longer.pt: record data.pkl cannot be decoded: the pickle declares a "
                                    "storage of 60 elements of 4 bytes over record data/0, which holds 24 bytes"));
  // Sizes (2, 3) stated as (2, 9) over strides (3, 1): 12 elements of a 6-element storage.
  const auto wider = forged_archive(tensor, [](std::string& pickle) {
    replace_once(pickle, std::string("(K\x02K\x03t(K\x03K\x01t", 12), std::string("(K\x02K\x09t(K\x03K\x01t", 12));
  });
  CHECK_THROWS_WITH(loom::detail::read_torch_archive(wider, "wider.pt"),
                    Catch::Contains("the pickle rebuilds a tensor (sizes [2, 9], strides [3, 1], offset 0) that "
                                    "reaches past its storage of 6 elements (record data/0)"));
  // A tensor of 10^12 elements over the same 6: refused, nothing allocated for it.
  const auto huge = forged_archive(tensor, [](std::string& pickle) {
    replace_once(pickle, pickle_bytes("(K\x02K\x03t(K\x03K\x01t"),
                 pickle_bytes("(J\x40\x42\x0f\x00J\x40\x42\x0f\x00t(J\x40\x42\x0f\x00K\x01t"));
  });
  CHECK_THROWS_WITH(loom::detail::read_torch_archive(huge, "huge.pt"),
                    Catch::Contains("(sizes [1000000, 1000000], strides [1000000, 1], offset 0) that reaches past "
                                    "its storage of 6 elements"));
  // An offset that starts past the end.
  const auto shifted = forged_archive(tensor, [](std::string& pickle) {
    replace_once(pickle, std::string("K\x00(K\x02", 5), std::string("K\x05(K\x02", 5));
  });
  CHECK_THROWS_WITH(loom::detail::read_torch_archive(shifted, "shifted.pt"), Catch::Contains("offset 5) that reaches past"));
}

// A pickle's containers 10^5 deep (LibTorch's IValue destructor recurses:
// destroying that overflows the stack), a list that contains itself (any
// recursive walk never ends), a small memo graph that decodes to 10^8
// values: each refused by loom's walk of the opcodes, before LibTorch's
// unpickler runs.
TEST_CASE("pickles nested without bound, containing themselves or amplified are refused before unpickling",
          "[checkpoint]") {
  const auto refusal_of = [](const std::string& pickle) { return refusal_of_archive(archive_of_pickle(pickle), "forged.pt"); };
  constexpr std::size_t depth = 100000;
  const std::string deep = pickle_bytes("\x80\x02") + std::string(depth, ']') + std::string(depth - 1, 'a') + ".";
  CHECK_THAT(refusal_of(deep), Catch::Contains("checkpoint forged.pt: record data.pkl cannot be decoded: the pickle "
                                               "nests containers deeper than 1000 levels (at byte "));
  // Tuples 10^5 deep: MARKs open without bound.
  const std::string marks = pickle_bytes("\x80\x02") + std::string(depth, '(') + std::string(depth, 't') + ".";
  CHECK_THAT(refusal_of(marks), Catch::Contains("opens more than 1000 MARKs"));
  // EMPTY_LIST, BINPUT 0, BINGET 0, APPEND: l = []; l.append(l)
  const std::string cycle = pickle_bytes("\x80\x02]q\x00h\x00" "a.");
  CHECK_THAT(refusal_of(cycle), Catch::Contains("the pickle changes a container after it fetched it again (from the "
                                                "memo or by DUP)"));
  // The same by DUP: l = []; then l appended to the copy of itself.
  const std::string dup = pickle_bytes("\x80\x02]2a.");
  CHECK_THAT(refusal_of(dup), Catch::Contains("changes a container after it fetched it again"));
  // A memo index LibTorch would grow its table to (2^31 entries, 32 GiB).
  const std::string memo = pickle_bytes("\x80\x02]r\xff\xff\xff\x7f.");
  CHECK_THAT(refusal_of(memo), Catch::Contains("has memo index 2147483647, larger than a pickle of 9 bytes can use"));
  // A memo entry fetched that was never stored.
  CHECK_THAT(refusal_of(pickle_bytes("\x80\x02h\x05.")), Catch::Contains("fetches memo entry 5, which it never stored"));
  // A string whose 8-byte length, 2^64 - 11, would wrap the walker's
  // position back to byte 0: it would walk the pickle forever.
  const std::string wrap = pickle_bytes("\x80\x02\x8d\xf5\xff\xff\xff\xff\xff\xff\xff.");
  CHECK_THAT(refusal_of(wrap), Catch::Contains("the pickle ends inside an opcode's argument"));
  // l = [1] * 10^4 memoized, then [l] * 10^4: 40 kB that decode to 10^8 values.
  std::string graph = pickle_bytes("\x80\x02]q\x00(");
  for (int i = 0; i < 10000; ++i) graph += pickle_bytes("K\x01");
  graph += "e0](";
  for (int i = 0; i < 10000; ++i) graph += pickle_bytes("h\x00");
  graph += "e.";
  CHECK_THAT(refusal_of(graph), Catch::Contains("decodes to more than ") && Catch::Contains("16 per byte of a 40012-byte pickle"));
  // SETITEMS over an odd number of items: LibTorch's would read one past its stack.
  CHECK_THAT(refusal_of(pickle_bytes("\x80\x02}(K\x01u.")),
             Catch::Contains("gives a dict an odd number of items (1) after its MARK"));
  // A list shared twice is not a cycle: [l, l] with l = [1].
  const std::string shared = pickle_bytes("\x80\x02](]q\x00K\x01" "ah\x00" "e.");
  const auto both = loom::detail::read_torch_archive(archive_of_pickle(shared), "shared.pt");
  CHECK(both.toListRef().size() == 2);
}

// LibTorch 1.13's reader leaks its zip state when its constructor throws:
// the conditions under which it does are checked before it is built (found
// by fuzzing: tests/fuzz/corpus/archive/regression_*).
TEST_CASE("a torch archive LibTorch's reader would throw on in its constructor is refused before it", "[checkpoint]") {
  const auto with_version = [](const std::string& version) {
    std::vector<char> archive;
    caffe2::serialize::PyTorchStreamWriter writer([&archive](const void* data, size_t size) {
      archive.insert(archive.end(), static_cast<const char*>(data), static_cast<const char*>(data) + size);
      return size;
    });
    writer.writeRecord("data.pkl", "\x80\x02K\x01.", 5);
    writer.writeEndOfFile();
    // The writer's own version record holds "3\n": replace its bytes in place.
    std::string bytes(archive.begin(), archive.end());
    const std::size_t name = bytes.rfind("/version");
    REQUIRE(name != std::string::npos);
    const std::size_t local = bytes.rfind("PK\x03\x04", name);
    const std::size_t data = local + 30 + (static_cast<unsigned char>(bytes[local + 26]) | static_cast<unsigned char>(bytes[local + 27]) << 8) +
                             (static_cast<unsigned char>(bytes[local + 28]) | static_cast<unsigned char>(bytes[local + 29]) << 8);
    REQUIRE(bytes.compare(data, 2, "3\n") == 0);
    bytes.replace(data, 2, version);
    return std::vector<char>(bytes.begin(), bytes.end());
  };
  CHECK_NOTHROW(loom::detail::verify_zip_records(with_version("3\n"), "three.pt"));
  // (CRC32s not fixed: the version is checked first.)
  CHECK_THROWS_WITH(loom::detail::verify_zip_records(with_version("0\n"), "zero.pt"),
                    Catch::Contains("checkpoint zero.pt: record 'archive/version' does not hold a format version "
                                    "LibTorch reads (1 to 10)"));
  CHECK_THROWS_WITH(loom::detail::verify_zip_records(with_version("]\n"), "text.pt"),
                    Catch::Contains("does not hold a format version"));
  // An encrypted record (general purpose flag bit 0): miniz refuses it from
  // inside the reader's constructor.
  std::vector<char> encrypted = with_version("3\n");
  const std::string text(encrypted.begin(), encrypted.end());
  const std::size_t central = text.find("PK\x01\x02");
  REQUIRE(central != std::string::npos);
  encrypted[central + 8] = static_cast<char>(encrypted[central + 8] | 1);
  CHECK_THROWS_WITH(loom::detail::verify_zip_records(encrypted, "encrypted.pt"),
                    Catch::Contains("with zip flags 0x0809 (encrypted, patched or masked)"));
  // The ZIP64 end record (which the writer always adds) says no entries, the
  // end record says 3: its locator is there, so the ZIP64 record counts, as
  // in miniz (loom read the end record alone, and the two differed).
  std::vector<char> zip64 = with_version("3\n");
  const std::string zip64_text(zip64.begin(), zip64.end());
  const std::size_t zip64_record = zip64_text.rfind(std::string("PK\x06\x06", 4));
  REQUIRE(zip64_record != std::string::npos);
  std::memset(zip64.data() + zip64_record + 24, 0, 16);  // entries on this disk, entries in all
  CHECK_THROWS_WITH(loom::detail::verify_zip_records(zip64, "zip64.pt"), Catch::Contains("a zip archive with no records"));
}

// What LibTorch built is checked again (a second line behind the pickle's
// walk, which refuses these first): a storage larger than its record, and a
// view past its storage, built here directly.
TEST_CASE("tensor views built over a record are checked against it", "[checkpoint]") {
  loom::detail::tensor_records records([](const std::string&) {
    at::DataPtr data = c10::GetCPUAllocator()->allocate(24);
    std::memset(data.get(), 0, 24);
    return std::make_tuple(std::move(data), std::size_t{24});
  });
  const auto tensor_over = [&records](std::size_t storage_bytes, std::vector<int64_t> sizes, std::vector<int64_t> strides) {
    c10::Storage storage(c10::Storage::use_byte_size_t(), storage_bytes, records("0"), nullptr, false);
    at::Tensor tensor = at::empty({0}, at::kFloat);
    tensor.unsafeGetTensorImpl()->set_storage_keep_dtype(std::move(storage));
    tensor.unsafeGetTensorImpl()->set_sizes_and_strides(sizes, strides);
    c10::impl::GenericDict dict(c10::StringType::get(), c10::AnyType::get());
    dict.insert("w", tensor);
    return c10::IValue(dict);
  };
  c10::IValue fits = tensor_over(24, {2, 3}, {3, 1});
  CHECK_NOTHROW(records.check_views(fits, "fits.pt"));
  c10::IValue longer = tensor_over(240, {2, 3}, {3, 1});
  CHECK_THROWS_WITH(records.check_views(longer, "longer.pt"),
                    Catch::Contains("checkpoint longer.pt: the tensor at 'w' claims a storage of 240 bytes, and its "
                                    "record data/0 holds 24"));
  c10::IValue wider = tensor_over(24, {2, 9}, {3, 1});
  CHECK_THROWS_WITH(records.check_views(wider, "wider.pt"),
                    Catch::Contains("the tensor at 'w' (sizes [2, 9], strides [3, 1], offset 0) reaches past its "
                                    "storage of 6 elements"));
}

// The walk of the unpickled value stays as a second line behind the
// pickle's walk: a value that contains itself is refused and taken apart.
TEST_CASE("an unpickled value that contains itself is refused and taken apart", "[checkpoint]") {
  c10::impl::GenericList list(c10::AnyType::get());
  list.push_back(c10::IValue(1));
  list.push_back(c10::IValue(list));
  const auto refusal = loom::detail::walk_unpickled(c10::IValue(list), [](const c10::IValue&, const std::string&) {});
  REQUIRE(refusal.has_value());
  CHECK_THAT(*refusal, Catch::Contains("the container at [1] contains itself"));
  loom::detail::dismantle(c10::IValue(list));
  CHECK(list.empty());
}

// A forged pickle cannot run code: loom resolves only the globals a
// checkpoint needs, and names any other with the list it accepts.
TEST_CASE("a pickle naming a global loom does not resolve is refused with the list it accepts", "[checkpoint]") {
  const auto refusal_of = [](const std::string& pickle) { return refusal_of_archive(archive_of_pickle(pickle), "malicious.pt"); };
  // os.system("ls") by GLOBAL and REDUCE (protocol 2, what torch.save writes).
  const std::string system = pickle_bytes("\x80\x02" "cos\nsystem\nq\x00X\x02\x00\x00\x00lsq\x01\x85q\x02Rq\x03.");
  CHECK_THAT(refusal_of(system),
             Catch::Contains("checkpoint malicious.pt: record data.pkl cannot be decoded: the pickle names the global "
                             "os.system, which loom does not resolve") &&
                 Catch::Contains("loom resolves only torch._utils._rebuild_tensor_v2") && Catch::Contains("(at byte 2)"));
  // builtins.eval("1+1") by STACK_GLOBAL (protocol 4), the names memoized.
  const std::string eval = pickle_bytes("\x80\x04\x8c\x08" "builtins\x94\x8c\x04" "eval\x94\x93\x94\x8c\x03" "1+1\x85R.");
  CHECK_THAT(refusal_of(eval), Catch::Contains("names the global builtins.eval, which loom does not resolve"));
  // The same names fetched back from the memo.
  const std::string fetched = pickle_bytes("\x80\x04\x8c\x08" "builtins\x94\x8c\x04" "eval\x94" "0h\x00h\x01\x93.");
  CHECK_THAT(refusal_of(fetched), Catch::Contains("names the global builtins.eval"));
  // INST (protocol 0): MARK, args, INST os system.
  const std::string inst = pickle_bytes("(X\x02\x00\x00\x00lsios\nsystem\n.");
  CHECK_THAT(refusal_of(inst), Catch::Contains("names the global os.system"));
  // A global from copyreg's extension registry.
  CHECK_THAT(refusal_of(pickle_bytes("\x80\x02\x82\x01.")), Catch::Contains("extension registry (EXT1)"));
  // A global named by a value that is not a string.
  CHECK_THAT(refusal_of(pickle_bytes("\x80\x04K\x01K\x02\x93.")), Catch::Contains("by a value that is not a string"));
  // Names given as SHORT_BINSTRING (a 1-byte length): read back at their own
  // width (at 4 bytes the length ran past the pickle: found by fuzzing).
  CHECK_THAT(refusal_of(pickle_bytes("\x80\x04U\x02osU\x06system\x93.")), Catch::Contains("names the global os.system"));
  // A name close to an accepted one.
  const std::string near = pickle_bytes("\x80\x02" "ctorch._utils\n_rebuild_tensor_v3\n.");
  CHECK_THAT(refusal_of(near), Catch::Contains("names the global torch._utils._rebuild_tensor_v3"));
}

// Bounded allocation on load, measured at the malloc level (every block of
// the process, file buffers included; allocation_counter.cpp): each forged
// file is refused, naming the file and what is wrong, before loom allocates
// more than the bound stated in docs/checkpoints.md: the file's size (the
// bytes read; the pickle is read where it lies), plus a fixed margin: the
// structure budget (what checking the zip directory and the pickle may
// hold, structure_budget.hpp) and 1 MiB for everything else.
TEST_CASE("a forged file is refused before its load allocates more than the bound", "[checkpoint]") {
  loom_test::scratch_dir dir("ckpt-allocation");
  const at::Tensor tensor = at::arange(6, at::kFloat).reshape({2, 3});
  const auto refused_within_bound = [&](const std::string& name, const std::vector<char>& bytes,
                                        const std::string& expected) {
    write_bytes(dir.file(name), std::string(bytes.begin(), bytes.end()));
    const unsigned long long before = loom_test::heap_live_bytes();
    loom_test::reset_heap_peak();
    std::string refusal = "(loaded)";
    try {
      (void)loom::read_checkpoint(dir.file(name));
    } catch (const loom::checkpoint_error& error) {
      refusal = error.what();
    }
    const unsigned long long peak = loom_test::heap_peak_bytes() - before;
    const unsigned long long bound = bytes.size() + loom::detail::checkpoint_structure_budget + (1ULL << 20);
    std::printf("allocation bound: %-26s file %9zu B, peak %10llu B, bound %10llu B\n", name.c_str(), bytes.size(),
                peak, bound);
    INFO(name << ": " << refusal);
    CHECK_THAT(refusal, Catch::Contains(dir.file(name)) && Catch::Contains(expected));
    CHECK(peak <= bound);
  };
  // A tensor of 10^12 elements over a record of 6.
  refused_within_bound("huge_tensor.pt", forged_archive(tensor, [](std::string& pickle) {
    replace_once(pickle, pickle_bytes("(K\x02K\x03t(K\x03K\x01t"),
                 pickle_bytes("(J\x40\x42\x0f\x00J\x40\x42\x0f\x00t(J\x40\x42\x0f\x00K\x01t"));
  }), "that reaches past its storage of 6 elements");
  // A storage of 2^28 floats (1 GiB) over a record of 24 bytes.
  refused_within_bound("huge_storage.pt", forged_archive(tensor, [](std::string& pickle) {
    replace_once(pickle, pickle_bytes("K\x06tQ"), pickle_bytes("J\x00\x00\x00\x10tQ"));
  }), "declares a storage of 268435456 elements of 4 bytes over record data/0, which holds 24 bytes");
  // Lists nested 10^6 deep.
  constexpr std::size_t depth = 1000000;
  const std::string deep = pickle_bytes("\x80\x02") + std::string(depth, ']') + std::string(depth - 1, 'a') + ".";
  refused_within_bound("deep.pt", archive_of_pickle(deep), "nests containers deeper than 1000 levels");
  // A 40 kB memo graph that decodes to 10^8 values.
  std::string graph = pickle_bytes("\x80\x02]q\x00(");
  for (int i = 0; i < 10000; ++i) graph += pickle_bytes("K\x01");
  graph += "e0](";
  for (int i = 0; i < 10000; ++i) graph += pickle_bytes("h\x00");
  graph += "e.";
  refused_within_bound("amplified.pt", archive_of_pickle(graph), "decodes to more than");
  // A record whose declared size (0xFFFFFFF0 in the directory) is far larger than the file.
  std::vector<char> huge_record = forged_archive(tensor, [](std::string&) {});
  const std::string text(huge_record.begin(), huge_record.end());
  const std::size_t entry = text.find(std::string("PK\x01\x02", 4) , text.find(std::string("PK\x01\x02", 4)) + 4);
  REQUIRE(entry != std::string::npos);
  for (const int field : {20, 24}) std::memcpy(huge_record.data() + entry + field, "\xf0\xff\xff\xff", 4);
  refused_within_bound("huge_record.pt", huge_record, "runs past the end of the file");
}

// What checking a file's structure holds (the zip index, the pickle walk's
// stack, memo, containers and kept tuples) is charged to one fixed budget:
// an honest file of many tensors fits it with room to spare, and a file
// whose structure needs more is refused at the budget, whatever its size.
TEST_CASE("checking a checkpoint's structure holds at most the structure budget", "[checkpoint]") {
  constexpr int tensors = 10000;
  c10::impl::GenericDict dict(c10::StringType::get(), c10::AnyType::get());
  for (int i = 0; i < tensors; ++i) dict.insert("layers." + std::to_string(i) + ".weight", at::zeros({2, 3}));
  const std::vector<char> archive = loom::detail::write_torch_archive(dict);
  loom::detail::structure_budget budget;
  const c10::IValue read = loom::detail::read_torch_archive(archive, "many.pt", budget);
  CHECK(read.toGenericDict().size() == static_cast<std::size_t>(tensors));
  const std::size_t per_tensor = budget.peak() / tensors;
  std::printf("structure budget: %d tensors (%zu-byte file) held at most %zu B, %zu B per tensor: a %zu MiB budget "
              "reads about %zu tensors per file\n",
              tensors, archive.size(), budget.peak(), per_tensor, loom::detail::checkpoint_structure_budget >> 20,
              loom::detail::checkpoint_structure_budget / per_tensor);
  CHECK(budget.held() == 0);
  CHECK(budget.peak() * 4 < loom::detail::checkpoint_structure_budget);
  // The same file against a budget of 1 MiB: refused at the budget, naming
  // the file; what the checks held is given back.
  loom::detail::structure_budget small(std::size_t{1} << 20);
  CHECK_THROWS_WITH(loom::detail::read_torch_archive(archive, "many.pt", small),
                    Catch::Contains("checkpoint many.pt: record data.pkl cannot be decoded: its structure (zip "
                                    "directory and pickle) needs more than 1 MiB to check"));
  CHECK(small.peak() <= (std::size_t{1} << 20));
  CHECK(small.held() == 0);
  // A zip directory of 10,004 entries (the tensors, data.pkl, byteorder,
  // loom's block table, version) against a budget of 64 KiB: refused while
  // the directory is read.
  loom::detail::structure_budget tiny(std::size_t{64} << 10);
  CHECK_THROWS_WITH(loom::detail::verify_zip_records(archive, "many.pt", tiny),
                    Catch::Contains("checkpoint many.pt: has a zip directory of 10004 entries, and its structure"));
  CHECK(tiny.held() == 0);
  // 10^6 values pending at once (a dict's keys and values under one MARK),
  // walked with a budget of 4 MiB: refused at the budget, not at the end.
  std::string pending = pickle_bytes("\x80\x02}(");
  for (int i = 0; i < 500000; ++i) pending += pickle_bytes("K\x01K\x02");
  pending += "u.";
  loom::detail::structure_budget four(std::size_t{4} << 20);
  CHECK_THROWS_WITH(loom::detail::validate_and_fix_pickle(pending, [](std::string_view) { return std::nullopt; }, four),
                    Catch::Contains("needs more than 4 MiB to check"));
  CHECK(four.held() == 0);
}

// The same for a DeepSpeed JSON config nested 10^5 deep.
TEST_CASE("a DeepSpeed config nested 10^5 deep is refused before it allocates more than the bound", "[checkpoint]") {
  const std::string json = "{\"a\": " + std::string(100000, '[') + std::string(100000, ']') + "}";
  const unsigned long long before = loom_test::heap_live_bytes();
  loom_test::reset_heap_peak();
  CHECK_THROWS_WITH(loom::resolve_zero_config(loom::deepspeed_options{.config = json}, {}, 2),
                    Catch::Contains("nests deeper than 64 levels"));
  const unsigned long long peak = loom_test::heap_peak_bytes() - before;
  std::printf("allocation bound: %-26s text %9zu B, peak %10llu B, bound %10llu B\n", "deep DeepSpeed config",
              json.size(), peak, json.size() + (1ULL << 20));
  CHECK(peak <= json.size() + (1ULL << 20));
}

// An optimizer step no int64 holds made the conversion undefined (found by
// fuzzing: tests/fuzz/corpus/load/regression_step_out_of_range.pt).
TEST_CASE("an optimizer state whose step is no step count is refused", "[checkpoint]") {
  loom_test::scratch_dir dir("ckpt-step");
  torch::nn::Linear model(4, 3);
  torch::optim::Adam optimizer(model->parameters(), torch::optim::AdamOptions(0.01));
  model(torch::ones({2, 4})).sum().backward();
  optimizer.step();
  const std::string path = dir.file("step.ckpt");
  loom::save_checkpoint(path, {{"model", model}, {"optimizer", optimizer}}, {}, {});
  for (const c10::IValue& forged : {c10::IValue(-3.69e19), c10::IValue(std::nan("")), c10::IValue(std::string("seven"))}) {
    loom::checkpoint_contents contents = loom::read_checkpoint(path);
    auto state = contents.entries.at("optimizer").toGenericDict().at("state").toGenericDict();
    state.at(state.begin()->key()).toGenericDict().insert_or_assign("step", forged);
    loom::write_checkpoint(dir.file("forged.ckpt"), contents);
    CHECK_THROWS_WITH(loom::load_checkpoint(dir.file("forged.ckpt"), {{"model", model}, {"optimizer", optimizer}}),
                      Catch::Contains("has a step that is not a step count (0 to 2^53)"));
  }
}

// A rank's part of a full file (read_local_parts) is read as the 64 KiB
// blocks that hold it, each checked against loom's block table: a flipped
// byte in a block the part lies in is refused naming the bytes; one outside
// it is not read, so not seen.
TEST_CASE("a rank's read of part of a full file reads and checks only the blocks that hold it", "[checkpoint]") {
  loom_test::scratch_dir dir("ckpt-blocks");
  at::manual_seed(3);
  torch::nn::Linear model(1024, 1024);  // weight: 4 MiB, 64 blocks
  const std::string path = dir.file("full.ckpt");
  loom::save_checkpoint(path, {{"model", model}}, {}, {});
  const std::string bytes = read_bytes(path);
  REQUIRE(bytes.find("loom_block_crc32") != std::string::npos);
  // Elements [2^18, 2^19) of the flattened weight: bytes 1 MiB to 2 MiB, blocks 16 to 31.
  const std::int64_t from = 1 << 18, count = 1 << 18;
  const loom::rank_parts mine{{"weight", loom::rank_part{loom::shard_range{from, from + count, {1024, 1024}}, {count}}}};
  const at::Tensor expected = model->weight.detach().reshape({-1}).narrow(0, from, count);
  auto part_of = [&](const std::string& file) {
    const loom::checkpoint_contents contents = loom::read_local_parts(file, mine);
    return contents.entries.at("model").toGenericDict().at("weight").toTensor();
  };
  const std::int64_t before = loom_test::bytes_read();
  CHECK(torch::equal(part_of(path), expected));
  const std::int64_t read = loom_test::bytes_read() - before;
  CHECK(read >= (1 << 20));
  CHECK(read < (1 << 20) + (64 << 10));  // its 16 blocks and the bias's record (4 KiB)
  const std::size_t weight_at = zip_record_data(bytes, "archive/data/0");
  SECTION("a flipped byte in a block the part lies in") {
    std::string flipped = bytes;
    flipped[weight_at + (1 << 20) + (200 << 10)] ^= 0x5A;  // block 19
    write_bytes(dir.file("inside.ckpt"), flipped);
    CHECK_THROWS_WITH(part_of(dir.file("inside.ckpt")),
                      Catch::Contains("corrupted (CRC32 mismatch) in record 'archive/data/0' (bytes 1245184 to 1310720)"));
  }
  SECTION("a flipped byte in a block it does not read") {
    std::string flipped = bytes;
    flipped[weight_at + (3 << 20)] ^= 0x5A;  // block 48
    write_bytes(dir.file("outside.ckpt"), flipped);
    CHECK(torch::equal(part_of(dir.file("outside.ckpt")), expected));
    // A whole read checks every record.
    CHECK_THROWS_WITH(loom::read_checkpoint(dir.file("outside.ckpt")), Catch::Contains("CRC32 mismatch"));
  }
}

// Files are written as they are serialised (no buffer of the file's size):
// a write that fails part way (the file-size limit, EFBIG) or a producer
// that throws part way leaves the previous file whole and no temporary file.
TEST_CASE("a save that fails part way leaves the previous file and no temporary file", "[checkpoint]") {
  loom_test::scratch_dir dir("ckpt-failed-write");
  const std::string path = dir.file("model.pt");
  torch::nn::Linear small(4, 3);
  loom::save_checkpoint(path, {{"model", small}}, {}, {});
  const auto saved = small->weight.detach().clone();
  auto leftovers = [&] {
    int count = 0;
    for (const auto& entry : std::filesystem::directory_iterator(dir.path())) {
      count += entry.path().filename().string().find(".tmp-") != std::string::npos ? 1 : 0;
    }
    return count;
  };
  torch::nn::Linear large(256, 256);  // 257 KiB of records
  {
    struct rlimit before {};
    ::getrlimit(RLIMIT_FSIZE, &before);
    struct rlimit limit = before;
    limit.rlim_cur = 64 * 1024;
    auto* previous = std::signal(SIGXFSZ, SIG_IGN);  // the write fails with EFBIG instead
    ::setrlimit(RLIMIT_FSIZE, &limit);
    std::string error;
    try {
      loom::save_checkpoint(path, {{"model", large}}, {}, {});
    } catch (const loom::checkpoint_error& e) {
      error = e.what();
    }
    ::setrlimit(RLIMIT_FSIZE, &before);
    std::signal(SIGXFSZ, previous);
    CHECK_THAT(error, Catch::Contains("write failed") && Catch::Contains("the previous file, if any, is untouched"));
  }
  CHECK(leftovers() == 0);
  torch::nn::Linear back(4, 3);
  loom::load_checkpoint(path, {{"model", back}});
  CHECK(torch::equal(back->weight.detach(), saved));

  CHECK_THROWS_WITH(loom::detail::write_file_atomically(path,
                                                        [](const loom::detail::byte_sink& sink) {
                                                          sink("PK", 2);
                                                          throw std::runtime_error("the producer failed");
                                                        }),
                    Catch::Contains("the producer failed"));
  CHECK(leftovers() == 0);
  loom::load_checkpoint(path, {{"model", back}});
  CHECK(torch::equal(back->weight.detach(), saved));
}

// Files of a sharded checkpoint from outside (found by fuzzing, inputs in
// tests/fuzz/corpus/sharded_index/ and sharded_rank/): an index entry
// without its fields escaped as std::out_of_range (now refused), and a rank
// file whose optimizer state has a key that is not a string as c10::Error
// (now kept unmerged, as every field that is not a slice).
TEST_CASE("a sharded checkpoint's forged index entry or state key is refused", "[checkpoint]") {
  loom_test::scratch_dir dir("ckpt-sharded-forged");
  torch::nn::Linear model(4, 3);
  torch::optim::Adam optimizer(model->parameters(), torch::optim::AdamOptions(0.01));
  model(torch::ones({2, 4})).sum().backward();
  optimizer.step();
  loom::shard_layout slices;
  for (const auto& item : model->named_parameters()) {
    slices[item.key()] = loom::shard_range{0, item.value().numel(), item.value().sizes().vec()};
  }
  loom::comm::process_group alone;
  const std::string path = dir.file("sharded");
  loom::save_sharded_checkpoint(path, {{"model", model}, {"optimizer", optimizer}}, {}, slices, alone);
  const std::string meta = path + "/meta.pt";
  const std::string rank = path + "/shard_0_of_1.pt";
  const loom::checkpoint_contents honest_meta = loom::read_checkpoint(meta);
  CHECK_NOTHROW(loom::read_sharded_checkpoint(path));

  // The index's entry for the rank file without its CRC32.
  loom::checkpoint_contents forged = loom::read_checkpoint(meta);
  auto files = forged.entries.at("__loom_shard_files__").toList();
  c10::impl::GenericDict entry = files.get(0).toGenericDict().copy();
  REQUIRE(entry.erase("crc32") == 1);
  files.set(0, entry);
  loom::write_checkpoint(meta, forged);
  CHECK_THROWS_WITH(loom::read_sharded_checkpoint(path),
                    Catch::Contains("lists a file as something other than {'name': str, 'bytes': int >= 0"));
  loom::write_checkpoint(meta, honest_meta);

  // The rank file's optimizer state with an integer key beside 'exp_avg',
  // written with the index's size and CRC32 to match.
  loom::checkpoint_contents shard = loom::read_checkpoint(rank);
  auto state = shard.entries.at("optimizer").toGenericDict().at("state").toGenericDict();
  state.at(state.begin()->key()).toGenericDict().insert(c10::IValue(std::int64_t{7}), c10::IValue(std::int64_t{1}));
  loom::write_checkpoint(rank, shard);
  const std::string bytes = read_bytes(rank);
  loom::checkpoint_contents listed = loom::read_checkpoint(meta);
  auto listed_files = listed.entries.at("__loom_shard_files__").toList();
  c10::impl::GenericDict listed_entry = listed_files.get(0).toGenericDict().copy();
  listed_entry.insert_or_assign("bytes", static_cast<std::int64_t>(bytes.size()));
  listed_entry.insert_or_assign(
      "crc32", static_cast<std::int64_t>(crc32(crc32(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(bytes.data()),
                                               static_cast<uInt>(bytes.size()))));
  listed_files.set(0, listed_entry);
  loom::write_checkpoint(meta, listed);
  // Such a field is kept as it is (only tensor slices are merged); before,
  // reading its key escaped as c10::Error.
  const loom::checkpoint_contents merged = loom::read_sharded_checkpoint(path);
  CHECK(torch::equal(merged.entries.at("model").toGenericDict().at("weight").toTensor(), model->weight));
}

TEST_CASE("a failed save leaves the previous checkpoint and no temporary file", "[checkpoint]") {
  loom_test::scratch_dir dir("ckpt-atomic");
  loom::Fabric<loom::cpu> fabric;
  Mlp net(4, 8, 2);
  auto model = fabric.setup(net);
  const std::string path = dir.file("model.ckpt");
  fabric.save(path, {{"model", model}, {"step", 1}});
  const std::string before = read_bytes(path);

  struct exploding {
    c10::IValue state_dict() const { throw std::runtime_error("disk full while serialising"); }
    void load_state_dict(const c10::IValue&) {}
  } bomb;
  CHECK_THROWS_WITH(fabric.save(path, {{"model", model}, {"bomb", bomb}}), Catch::Contains("disk full"));
  CHECK(read_bytes(path) == before);

  // The rename itself fails: the target name is a non-empty directory.
  std::filesystem::create_directories(dir.path() / "taken" / "inside");
  CHECK_THROWS_WITH(fabric.save(dir.file("taken"), {{"step", 2}}), Catch::Contains("rename failed"));
  CHECK(temporary_files(dir.path()) == 0);
  CHECK(read_bytes(path) == before);
}

TEST_CASE("load_raw reads LibTorch's torch::save and Python's torch.save of a plain dict", "[checkpoint][raw]") {
  loom_test::scratch_dir dir("ckpt-raw");
  loom::Fabric<loom::cpu> fabric;

  SECTION("torch::save(module) and torch::save(optimizer) from LibTorch") {
    at::manual_seed(8);
    Mlp source(4, 8, 2);
    torch::optim::Adam source_adam(source->parameters(), torch::optim::AdamOptions(1e-2));
    source->forward(at::randn({3, 4})).sum().backward();
    source_adam.step();
    torch::save(source, dir.file("module.pt"));
    torch::save(source_adam, dir.file("adam.pt"));

    at::manual_seed(9);
    Mlp target(4, 8, 2);
    torch::optim::Adam target_adam(target->parameters(), torch::optim::AdamOptions(1e-2));
    auto [model, optimizer] = fabric.setup(target, target_adam);
    fabric.load_raw(dir.file("module.pt"), model);
    CHECK(same_parameters(target, snapshot(source)));
    fabric.load_raw(dir.file("adam.pt"), optimizer);
    const auto want = adam_moments(source_adam);
    const auto got = adam_moments(target_adam);
    for (std::size_t i = 0; i < want.size(); ++i) CHECK(torch::equal(want[i], got[i]));

    Mlp wider(4, 16, 2);
    const auto before = snapshot(wider);
    CHECK_THROWS_WITH(fabric.load_raw(dir.file("module.pt"), wider), Catch::Contains("size mismatch"));
    CHECK(same_parameters(wider, before));
  }
  SECTION("Python torch.save(dict(model.state_dict()))") {
    Mlp target(4, 8, 2);
    fabric.load_raw(loom_test::fixtures_dir() + "/python_plain_state_dict.pt", target);
    for (const auto& item : target->named_parameters()) {
      const auto& p = item.value();
      INFO(item.key());
      CHECK(torch::equal(p, at::arange(p.numel(), at::kFloat).reshape(p.sizes()) / 100));
    }
  }
  SECTION("Python's OrderedDict is detected before LibTorch's unpickler sees it") {
    Mlp target(4, 8, 2);
    const auto before = snapshot(target);
    CHECK_THROWS_WITH(fabric.load_raw(loom_test::fixtures_dir() + "/python_ordered_state_dict.pt", target),
                      Catch::Contains("OrderedDict") && Catch::Contains("torch.save(dict(model.state_dict()), path)"));
    CHECK(same_parameters(target, before));
  }
  SECTION("strict names what is missing and unexpected") {
    struct OtherImpl : torch::nn::Module {
      OtherImpl() { fc1 = register_module("fc1", torch::nn::Linear(4, 8)); head = register_module("head", torch::nn::Linear(8, 2)); }
      torch::nn::Linear fc1{nullptr}, head{nullptr};
    };
    auto other = std::make_shared<OtherImpl>();
    CHECK_THROWS_WITH(fabric.load_raw(loom_test::fixtures_dir() + "/python_plain_state_dict.pt", other),
                      Catch::Contains("missing key(s) 'head.weight', 'head.bias'") &&
                          Catch::Contains("unexpected key(s)") && Catch::Contains("'fc3.bias'"));
    fabric.load_raw(loom_test::fixtures_dir() + "/python_plain_state_dict.pt", other, /*strict=*/false);
    CHECK(torch::equal(other->fc1->bias, at::arange(8, at::kFloat) / 100));
  }
  SECTION("a missing file") {
    Mlp target(4, 8, 2);
    CHECK_THROWS_WITH(fabric.load_raw(dir.file("nope.pt"), target), Catch::Contains("nope.pt: does not exist"));
  }
}

TEST_CASE("16-mixed's scaler state goes through a checkpoint unchanged", "[checkpoint][scaler]") {
  // Fabric<cuda, *, fp16_mixed> adds the precision as "precision" on its own
  // (the path scaled_bf16_mixed exercises above); here the object itself.
  loom_test::scratch_dir dir("ckpt-scaler");
  loom::fp16_mixed trained(loom::grad_scaler_options{.init_scale = 512.0, .growth_interval = 3});
  at::Tensor weight = at::ones({2}).requires_grad_(true);
  torch::optim::SGD sgd(std::vector<at::Tensor>{weight}, 0.1);
  for (int step = 0; step < 4; ++step) {
    sgd.zero_grad();
    trained.backward((weight * 2).sum());
    trained.optimizer_step(sgd, {0});
  }
  REQUIRE(trained.scaler().get_scale() == 1024.0);
  REQUIRE(trained.scaler().growth_tracker() == 1);
  loom::Fabric<loom::cpu> fabric;
  fabric.save(dir.file("scaler.ckpt"), {{"precision", trained}});

  loom::fp16_mixed restored;
  fabric.load(dir.file("scaler.ckpt"), {{"precision", restored}});
  CHECK(restored.scaler().get_scale() == 1024.0);
  CHECK(restored.scaler().growth_tracker() == 1);
  CHECK(restored.scaler().options().growth_interval == 3);
}

// The two C++ halves of tests/python_checkpoint.sh (hidden from the [checkpoint]
// run: they need the Python half between them). In $LOOM_PYTHON_DIR:
//   [.python_export] writes loom.ckpt (fabric.save) and reference.pt (the same
//                    tensors through LibTorch's own torch::pickle_save, an
//                    independent path), plus one more Adam step's result;
//   python_checkpoint.py reads loom.ckpt with torch.load(weights_only=True),
//                    compares, steps in Python, writes python.ckpt;
//   [.python_import] loads python.ckpt with fabric.load and compares with
//                    python_reference.pt.
namespace {

// ---- checkpoints with Python (tests/python_checkpoint.sh runs these halves) ----
std::string python_dir() {
  const auto dir = loom::cluster::setting_text("LOOM_PYTHON_DIR");
  REQUIRE(dir);
  return *dir;
}

std::vector<char> read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

at::Tensor mse_step(Mlp& net, torch::optim::Optimizer& optimizer, const at::Tensor& x, const at::Tensor& y) {
  optimizer.zero_grad();
  at::Tensor loss = torch::mse_loss(net->forward(x), y);
  loss.backward();
  optimizer.step();
  return loss;
}

}  // namespace

TEST_CASE("loom writes a checkpoint Python's torch.load reads", "[.python_export]") {
  const std::string dir = python_dir();
  loom::Fabric<loom::cpu> fabric;
  at::manual_seed(11);
  Mlp net(4, 8, 2);
  torch::optim::Adam adam(net->parameters(), torch::optim::AdamOptions(1e-2).betas({0.8, 0.95}).weight_decay(0.01));
  auto [model, optimizer] = fabric.setup(net, adam);
  const at::Tensor x = at::randn({16, 4});
  const at::Tensor y = at::randn({16, 2});
  for (int i = 0; i < 3; ++i) mse_step(net, adam, x, y);

  at::Tensor bf16 = at::randn({3, 5}).to(at::kBFloat16);
  c10::impl::GenericList ints(c10::IntType::get());
  ints.push_back(1);
  ints.push_back(2);
  ints.push_back(3);
  c10::impl::GenericDict nested(c10::StringType::get(), c10::AnyType::get());
  nested.insert("a", 1);
  fabric.save(dir + "/loom.ckpt", {{"model", model},
                                   {"optimizer", optimizer},
                                   {"step", 3},
                                   {"lr", 0.5},
                                   {"name", "mlp"},
                                   {"flag", true},
                                   {"bf16", bf16},
                                   {"ints", c10::IValue(ints)},
                                   {"nested", c10::IValue(nested)}});

  // Weights and integers only: Debian's torch 1.13 has no BINFLOAT in its
  // weights_only unpickler (its own torch.save({'a': 0.5}) fails there too).
  fabric.save(dir + "/weights.ckpt", {{"model", model}, {"step", 3}});

  // The same tensors through LibTorch's own writer, and one more step's result.
  c10::impl::GenericDict reference(c10::StringType::get(), c10::TensorType::get());
  for (const auto& item : net->named_parameters()) {
    reference.insert("model." + item.key(), item.value().detach().clone());
    const auto& state = static_cast<torch::optim::AdamParamState&>(
        *adam.state().at(loom::compat::optimizer_state_key(item.value())));
    reference.insert("exp_avg." + item.key(), state.exp_avg().clone());
    reference.insert("exp_avg_sq." + item.key(), state.exp_avg_sq().clone());
  }
  reference.insert("bf16", bf16);
  reference.insert("x", x);
  reference.insert("y", y);
  mse_step(net, adam, x, y);
  for (const auto& item : net->named_parameters()) reference.insert("after_step." + item.key(), item.value().detach().clone());
  const std::vector<char> bytes = torch::pickle_save(reference);
  std::ofstream(dir + "/reference.pt", std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

TEST_CASE("a checkpoint Python's torch.save wrote loads with fabric.load", "[.python_import]") {
  const std::string dir = python_dir();
  loom::Fabric<loom::cpu> fabric;
  Mlp net(4, 8, 2);
  torch::optim::Adam adam(net->parameters(), torch::optim::AdamOptions(1e-3));
  auto [model, optimizer] = fabric.setup(net, adam);
  std::int64_t epoch = 0;
  loom::state rest = fabric.load(dir + "/python.ckpt", {{"model", model}, {"optimizer", optimizer}, {"epoch", epoch}});

  const c10::IValue reference_value = torch::pickle_load(read_all(dir + "/python_reference.pt"));
  const auto reference = reference_value.toGenericDict();
  CHECK(epoch == 5);
  for (const auto& item : net->named_parameters()) {
    INFO(item.key());
    CHECK(torch::equal(item.value(), reference.at("model." + item.key()).toTensor()));
    const auto& state = static_cast<torch::optim::AdamParamState&>(
        *adam.state().at(loom::compat::optimizer_state_key(item.value())));
    CHECK(torch::equal(state.exp_avg(), reference.at("exp_avg." + item.key()).toTensor()));
    CHECK(torch::equal(state.exp_avg_sq(), reference.at("exp_avg_sq." + item.key()).toTensor()));
    CHECK(state.step() == 2);
  }
  const auto& options = static_cast<torch::optim::AdamOptions&>(adam.param_groups()[0].options());
  CHECK(options.lr() == 0.02);
  CHECK(std::get<0>(options.betas()) == 0.7);
  // Python's one-key dict and one-element lists (APPEND and SETITEM opcodes).
  const auto one_key = rest.get<c10::IValue>("one_key").toGenericDict();
  CHECK(one_key.size() == 1);
  CHECK(one_key.at("x").toListRef().size() == 1);
  CHECK(one_key.at("x").toListRef()[0].toInt() == 1);
  CHECK(rest.get<c10::IValue>("single").toListRef()[0].toInt() == 2);

  // LibTorch 1.13 reads pickle protocol 2 only (torch.save's default): another is named.
  CHECK_THROWS_WITH(fabric.load(dir + "/python4.ckpt", {{"model", model}}),
                    Catch::Contains("protocol 4") && Catch::Contains("without pickle_protocol"));
  // The same checkpoint with model.state_dict() (an OrderedDict) is refused, naming what to save.
  CHECK_THROWS_WITH(fabric.load(dir + "/ordered.ckpt", {{"model", model}}),
                    Catch::Contains("OrderedDict") && Catch::Contains("dict(model.state_dict())"));
}
