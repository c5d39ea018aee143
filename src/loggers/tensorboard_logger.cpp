#include <loom/loggers/tensorboard_logger.hpp>

#include "loom_tensorboard.pb.h"

#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

namespace loom {

namespace fs = std::filesystem;
namespace pb = ::loom::tensorboard;

// ------------------------------------------------------------------ CRC32C
namespace {
std::array<std::uint32_t, 256> make_crc32c_table() {
  std::array<std::uint32_t, 256> table{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t crc = i;
    for (int bit = 0; bit < 8; ++bit) crc = (crc & 1) ? (crc >> 1) ^ 0x82F63B78u : crc >> 1;  // reflected Castagnoli
    table[i] = crc;
  }
  return table;
}
}  // namespace

std::uint32_t crc32c(const void* data, std::size_t size) {
  static const auto table = make_crc32c_table();
  const auto* bytes = static_cast<const unsigned char*>(data);
  std::uint32_t crc = 0xFFFFFFFFu;
  for (std::size_t i = 0; i < size; ++i) crc = table[(crc ^ bytes[i]) & 0xFFu] ^ (crc >> 8);
  return crc ^ 0xFFFFFFFFu;
}

std::uint32_t masked_crc32c(const void* data, std::size_t size) {
  const std::uint32_t crc = crc32c(data, size);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

// ------------------------------------------------------------------ writer
namespace {
double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

void put_u64(std::string& out, std::uint64_t value) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xFF));
}
void put_u32(std::string& out, std::uint32_t value) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xFF));
}

std::string host_name() {
  char buffer[256] = {};
  if (::gethostname(buffer, sizeof(buffer) - 1) != 0) return "localhost";
  return buffer;
}

std::atomic<int> file_counter{0};
}  // namespace

struct tensorboard_logger::writer {
  std::string dir;
  std::string path;
  std::FILE* file = nullptr;
  std::string pending;  // framed records not yet written
  std::int64_t pending_events = 0;
  std::int64_t flush_every = 50;

  writer(std::string directory, std::int64_t events_per_write) : dir(std::move(directory)), flush_every(events_per_write) {
    fs::create_directories(dir);
    // SummaryWriter's name: events.out.tfevents.<seconds>.<host>.<pid>.<counter>.
    path = (fs::path(dir) / ("events.out.tfevents." + std::to_string(static_cast<long long>(now_seconds())) + "." +
                             host_name() + "." + std::to_string(::getpid()) + "." +
                             std::to_string(file_counter.fetch_add(1))))
               .string();
    file = std::fopen(path.c_str(), "wb");
    if (file == nullptr) throw std::runtime_error("tensorboard_logger: cannot create " + path);
    pb::Event first;
    first.set_wall_time(now_seconds());
    first.set_file_version("brain.Event:2");
    add(first);
    flush();
  }
  ~writer() {
    try {
      flush();
    } catch (...) {
    }
    if (file != nullptr) std::fclose(file);
  }

  void add(const pb::Event& event) {
    const std::string data = event.SerializeAsString();
    std::string length;
    put_u64(length, data.size());
    pending += length;
    put_u32(pending, masked_crc32c(length.data(), length.size()));
    pending += data;
    put_u32(pending, masked_crc32c(data.data(), data.size()));
    if (++pending_events >= flush_every) flush();
  }

  void flush() {
    if (!pending.empty()) {
      if (std::fwrite(pending.data(), 1, pending.size(), file) != pending.size()) {
        throw std::runtime_error("tensorboard_logger: cannot write " + path);
      }
      pending.clear();
      pending_events = 0;
    }
    std::fflush(file);
  }
};

// ------------------------------------------------------------------ logger
tensorboard_logger::tensorboard_logger(std::string root_dir, tensorboard_logger_options options)
    : root_dir_(std::move(root_dir)), options_(std::move(options)), version_(options_.version) {
  if (options_.flush_every < 1) throw std::invalid_argument("tensorboard_logger: flush_every must be positive");
}
tensorboard_logger::tensorboard_logger(tensorboard_logger&&) noexcept = default;
tensorboard_logger& tensorboard_logger::operator=(tensorboard_logger&&) noexcept = default;
tensorboard_logger::~tensorboard_logger() = default;

std::string tensorboard_logger::log_dir() const {
  if (resumed_dir_) return *resumed_dir_;
  if (!version_) version_ = next_log_version((fs::path(root_dir_) / options_.name).string());
  std::string dir = versioned_log_dir(root_dir_, options_.name, *version_);
  if (!options_.sub_dir.empty()) dir = (fs::path(dir) / options_.sub_dir).string();
  return dir;
}

std::string tensorboard_logger::event_file() const { return writer_ ? writer_->path : std::string(); }

tensorboard_logger::writer& tensorboard_logger::open() {
  if (!writer_) writer_ = std::make_unique<writer>(log_dir(), options_.flush_every);
  return *writer_;
}

void tensorboard_logger::log_metrics(const metrics& values, std::optional<std::int64_t> step) {
  const std::int64_t event_step = step.value_or(calls_);
  ++calls_;
  writer& out = open();
  const double wall_time = now_seconds();
  for (const auto& [name, value] : values) {
    pb::Event event;
    event.set_wall_time(wall_time);
    event.set_step(event_step);
    auto* entry = event.mutable_summary()->add_value();
    entry->set_tag(options_.prefix.empty() ? name : options_.prefix + "-" + name);
    const double number = std::holds_alternative<std::int64_t>(value)
                              ? static_cast<double>(std::get<std::int64_t>(value))
                              : std::get<double>(value);
    entry->set_simple_value(static_cast<float>(number));
    out.add(event);
  }
}

namespace {
// One of the hparams plugin's three summaries, as an event at step 0.
pb::Event hparams_event(const std::string& tag, const pb::HParamsPluginData& data) {
  pb::Event event;
  event.set_wall_time(now_seconds());
  event.set_step(0);
  auto* value = event.mutable_summary()->add_value();
  value->set_tag(tag);
  auto* plugin = value->mutable_metadata()->mutable_plugin_data();
  plugin->set_plugin_name("hparams");
  plugin->set_content(data.SerializeAsString());
  return event;
}
}  // namespace

void tensorboard_logger::log_hyperparams(const hyperparameters& values) {
  pb::HParamsPluginData start;
  start.set_version(0);
  pb::HParamsPluginData experiment;
  experiment.set_version(0);
  for (const auto& [name, value] : values) {
    auto& slot = (*start.mutable_session_start_info()->mutable_hparams())[name];
    auto* info = experiment.mutable_experiment()->add_hparam_infos();
    info->set_name(name);
    std::visit(
        [&](const auto& v) {
          using T = std::decay_t<decltype(v)>;
          if constexpr (std::is_same_v<T, bool>) {
            slot.set_bool_value(v);
            info->set_type(pb::DATA_TYPE_BOOL);
          } else if constexpr (std::is_same_v<T, std::string>) {
            slot.set_string_value(v);
            info->set_type(pb::DATA_TYPE_STRING);
          } else {
            slot.set_number_value(static_cast<double>(v));
            info->set_type(pb::DATA_TYPE_FLOAT64);
          }
        },
        value);
  }
  if (options_.default_hp_metric) experiment.mutable_experiment()->add_metric_infos()->mutable_name()->set_tag("hp_metric");
  pb::HParamsPluginData end;
  end.set_version(0);
  end.mutable_session_end_info()->set_status(pb::STATUS_SUCCESS);
  writer& out = open();
  out.add(hparams_event("_hparams_/experiment", experiment));
  out.add(hparams_event("_hparams_/session_start_info", start));
  out.add(hparams_event("_hparams_/session_end_info", end));
  if (options_.default_hp_metric) log_metrics({{"hp_metric", -1.0}}, 0);
  out.flush();
}

void tensorboard_logger::save() {
  if (writer_) writer_->flush();
}

void tensorboard_logger::finalize(std::string_view /*status*/) { save(); }

void tensorboard_logger::resume(const std::string& log_dir, std::int64_t step) {
  writer_.reset();
  resumed_dir_ = log_dir;
  writer& out = open();
  pb::Event event;
  event.set_wall_time(now_seconds());
  event.set_step(step + 1);
  event.mutable_session_log()->set_status(pb::SessionLog::START);
  out.add(event);
  out.flush();
  calls_ = step + 1;
}

}  // namespace loom
