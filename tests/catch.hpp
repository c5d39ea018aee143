// Catch2 for loom's tests. Debian's c10 logs through glog, whose CHECK macro
// would replace Catch's: c10's logging comes first, its CHECK is dropped,
// then Catch defines its own.
#pragma once

#include <c10/util/Logging.h>

#ifdef CHECK
#undef CHECK
#endif

#include <catch2/catch.hpp>
