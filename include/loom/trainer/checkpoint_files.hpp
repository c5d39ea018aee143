// Names of the trainer's checkpoints and how "last" finds the newest one.
// No torch headers.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace loom {

// <dir>/epoch=<epoch>-step=<step>.ckpt (Lightning ModelCheckpoint's default name).
std::string checkpoint_file_name(const std::string& dir, std::int64_t epoch, std::int64_t step);

// The newest checkpoint the trainer wrote in dir: the greatest step, then
// epoch, among files named as above. Empty when there is none.
std::optional<std::string> latest_checkpoint(const std::string& dir);

}  // namespace loom
