// Registering a strategy name: the Boost.Hana product of this build's
// accelerators and loom's precisions with one strategy type, filtered by
// compatible<A, S, P>, turned into registry entries. The built-in names use
// it in src/runtime/builtin_*.cpp; register_strategy is the user's door.
#pragma once

// Each built-in accelerator's type (builtin_accelerators.def lists their headers).
#include <loom/builtin_accelerators.def>
#include <loom/compatibility.hpp>
#include <loom/precision/mixed.hpp>
#include <loom/precision/true_precision.hpp>
#include <loom/runtime/fabric_model.hpp>
#include <loom/runtime/registry.hpp>

#include <boost/hana/cartesian_product.hpp>
#include <boost/hana/filter.hpp>
#include <boost/hana/flatten.hpp>
#include <boost/hana/if.hpp>
#include <boost/hana/for_each.hpp>
#include <boost/hana/tuple.hpp>
#include <boost/hana/type.hpp>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace loom::runtime {

namespace hana = boost::hana;

// Whether this build's registry holds accelerator A (cuda: only when loom
// is built for it).
template <class A>
inline constexpr bool compiled_in = [] {
  if constexpr (requires { A::compiled_in; }) return bool(A::compiled_in);
  else return true;
}();

// The built-in accelerators (builtin_accelerators.def) this build holds:
// each line gives a tuple of its type, or an empty one when it is not
// compiled in, and the empty tuple after them takes the last line's comma.
#define LOOM_ACCELERATOR(type, device, fp16_compute) \
  hana::if_(hana::bool_c<compiled_in<type>>, hana::tuple_t<type>, hana::tuple_t<>),
inline constexpr auto accelerators = hana::flatten(hana::make_tuple(
#include <loom/builtin_accelerators.def>
    hana::tuple_t<>));
#undef LOOM_ACCELERATOR
inline constexpr auto precisions = hana::tuple_t<fp32, fp64, fp16, bf16, fp16_mixed, bf16_mixed>;

template <class T>
inline constexpr const char* type_name = "?";
#define LOOM_ACCELERATOR(type, device, fp16_compute) \
  template <>                                        \
  inline constexpr const char* type_name<type> = "loom::" #type;
#include <loom/builtin_accelerators.def>
#undef LOOM_ACCELERATOR
template <> inline constexpr const char* type_name<fp32> = "loom::fp32";
template <> inline constexpr const char* type_name<fp64> = "loom::fp64";
template <> inline constexpr const char* type_name<fp16> = "loom::fp16";
template <> inline constexpr const char* type_name<bf16> = "loom::bf16";
template <> inline constexpr const char* type_name<fp16_mixed> = "loom::fp16_mixed";
template <> inline constexpr const char* type_name<bf16_mixed> = "loom::bf16_mixed";

// A registered name with its preset: how to make the strategy from the
// options make_fabric was given (the preset's own parameters first, the
// user's options over them).
template <class S>
struct preset {
  using strategy_type = S;
  const char* name;
  const char* type;  // as written in docs: "loom::ddp"
  std::function<S(option_reader&)> make;
  const char* description = nullptr;  // default: the catalog's (runtime/names)
};

// Every runnable (A, S, P) of the product over the given presets, as registry entries.
template <class... S>
std::vector<std::vector<registry_entry>> entries(const preset<S>&... presets) {
  std::vector<std::vector<registry_entry>> out;
  auto one = [&out](const auto& preset) {
    using strategy_t = typename std::remove_cvref_t<decltype(preset)>::strategy_type;
    std::vector<registry_entry> named;
    constexpr auto product =
        hana::cartesian_product(hana::make_tuple(accelerators, hana::tuple_t<strategy_t>, precisions));
    constexpr auto runnable = hana::filter(product, [](auto triple) {
      using A = typename decltype(+hana::at_c<0>(triple))::type;
      using S_ = typename decltype(+hana::at_c<1>(triple))::type;
      using P = typename decltype(+hana::at_c<2>(triple))::type;
      return hana::bool_c<compatible<A, S_, P>>;
    });
    const strategy_name* known = find_strategy(preset.name);
    hana::for_each(runnable, [&](auto triple) {
      using A = typename decltype(+hana::at_c<0>(triple))::type;
      using P = typename decltype(+hana::at_c<2>(triple))::type;
      registry_entry entry;
      entry.strategy = preset.name;
      entry.description = preset.description ? std::string(preset.description)
                                             : known ? known->description : std::string();
      entry.accelerator = std::string(A::name);
      entry.precision = std::string(P::name);
      entry.strategy_type = preset.type;
      entry.accelerator_type = type_name<A>;
      entry.precision_type = type_name<P>;
      entry.multi_process = is_distributed<strategy_t>;
      entry.devices = strategy_devices<strategy_t>;
      entry.sharded = is_sharded<strategy_t>;
      entry.scales_own_loss = scales_own_loss<strategy_t>;
      entry.make = [make = preset.make, name = std::string(preset.name)](fabric_options options,
                                                                         option_reader& reader) {
        strategy_t strategy = make(reader);
        reader.finish();
        return std::unique_ptr<fabric_interface>(
            std::make_unique<fabric_model<A, strategy_t, P>>(name, std::move(options), std::move(strategy), P{}));
      };
      named.push_back(std::move(entry));
    });
    out.push_back(std::move(named));
  };
  (one(presets), ...);
  return out;
}


// Registers name -> the strategy make() returns, for every accelerator and
// precision it is compatible with (instantiated in the caller's TU). An
// existing name is replaced only with {.override_existing = true}. make may
// take a runtime::option_reader& to read make_fabric's strategy_options;
// without one, any option given is refused.
template <class S, class Make>
  requires std::is_invocable_r_v<S, Make&, option_reader&> || std::is_invocable_r_v<S, Make&>
void register_strategy(const char* name, const char* type, const char* description, Make make,
                       registration_options options = {}) {
  std::function<S(option_reader&)> read;
  if constexpr (std::is_invocable_r_v<S, Make&, option_reader&>) read = std::move(make);
  else read = [make = std::move(make)](option_reader&) mutable { return make(); };
  auto named = entries(preset<S>{name, type, std::move(read), description});
  registry::instance().add_strategy(named.front(), options);
}

}  // namespace loom::runtime
