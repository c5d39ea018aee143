// A yes/no question about a policy that the static Fabric answers at compile
// time and AnyFabric at run time. The facade's members are written once over
// it: `always`/`never` become `if constexpr` (and compile errors), and only
// `at_run_time` asks the erased combination.
#pragma once

namespace loom {

enum class decided { never, always, at_run_time };

constexpr decided decided_from(bool answer) noexcept { return answer ? decided::always : decided::never; }

}  // namespace loom
