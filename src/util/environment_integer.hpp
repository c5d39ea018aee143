// A whole-number setting read from the environment (LOOM_MPI_PIECE_BYTES,
// LT_NUM_NODES, ...), checked once where it is read: a value that is not a
// whole number, or lies outside what the setting accepts, is a
// configuration_error naming the variable, its value and the accepted range,
// instead of atoi's silent 0.
#pragma once

#include <optional>
#include <string_view>

namespace loom::detail {

// The whole number `text` spells exactly (an optional '-', then digits, and
// nothing else); nullopt for anything else, an empty text included. The one
// parse behind every integer loom reads from the environment: its settings
// (below) and the cluster environments' variables (cluster/environment.cpp),
// which keep their own messages.
std::optional<long long> whole_number(std::string_view text) noexcept;

// nullopt when name is unset or empty.
std::optional<long long> environment_integer(const char* name, long long minimum, long long maximum);

}  // namespace loom::detail
