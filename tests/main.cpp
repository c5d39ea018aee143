// Catch2's main, in a TU of its own so test TUs rebuild without it.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
