// A whole-number setting read from the environment (LOOM_MPI_PIECE_BYTES,
// LT_NUM_NODES, ...), checked once where it is read: a value that is not a
// whole number, or lies outside what the setting accepts, is a
// configuration_error naming the variable, its value and the accepted range,
// instead of atoi's silent 0.
#pragma once

#include <optional>

namespace loom::detail {

// nullopt when name is unset or empty.
std::optional<long long> environment_integer(const char* name, long long minimum, long long maximum);

}  // namespace loom::detail
