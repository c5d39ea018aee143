// Lightning's apply_to_collection for C++: apply a function to every tensor
// inside a value (a tensor, an Example, a vector, array, map, pair, tuple or
// optional of those, nested), keep everything else as it is. The result has
// the same structure, with each tensor replaced by what the function returns.
// A struct of its own joins in with two members: map_tensors(f) (a copy with
// each tensor t replaced by f(t)) and for_each_tensor(f) (f(t&) on each).
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/data/example.h>

#include <array>
#include <map>
#include <optional>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

namespace loom {

// A type-erased view of a collection (the erased Fabric's forward output):
// it maps its tensors in place and visits them, and declares loom_tensor_view.
template <class T>
concept tensor_view = requires { typename std::remove_cvref_t<T>::loom_tensor_view; };

template <class T, class F>
auto apply_to_collection(T&& value, F&& function) {
  using value_type = std::remove_cvref_t<T>;
  if constexpr (tensor_view<value_type>) {
    value_type view = value;
    view.map(function);  // the function must return a tensor here
    return view;
  } else if constexpr (std::is_same_v<value_type, at::Tensor>) {
    return function(value);  // usually a tensor; all_gather makes a vector of them
  } else if constexpr (requires { value.map_tensors(function); }) {
    return value.map_tensors(function);
  } else if constexpr (std::is_convertible_v<const value_type&, std::string_view>) {
    return value_type(std::forward<T>(value));  // strings are values, not containers
  } else if constexpr (requires { typename value_type::DataType; typename value_type::TargetType; }) {
    // torch::data::Example<Data, Target>
    using data_t = decltype(apply_to_collection(value.data, function));
    using target_t = decltype(apply_to_collection(value.target, function));
    return torch::data::Example<data_t, target_t>(apply_to_collection(std::forward<T>(value).data, function),
                                                  apply_to_collection(std::forward<T>(value).target, function));
  } else if constexpr (requires { typename std::tuple_size<value_type>::type; } &&
                       !requires { typename value_type::value_type; }) {
    // pair and tuple
    return std::apply(
        [&](auto&&... items) {
          return std::make_tuple(apply_to_collection(std::forward<decltype(items)>(items), function)...);
        },
        std::forward<T>(value));
  } else if constexpr (requires { typename std::tuple_size<value_type>::type; typename value_type::value_type; }) {
    // std::array
    using item_t = decltype(apply_to_collection(value[0], function));
    std::array<item_t, std::tuple_size_v<value_type>> out;
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = apply_to_collection(std::forward<T>(value)[i], function);
    return out;
  } else if constexpr (requires { typename value_type::key_type; typename value_type::mapped_type; }) {
    using mapped_t = decltype(apply_to_collection(value.begin()->second, function));
    using key_t = typename value_type::key_type;
    std::conditional_t<std::is_same_v<value_type, std::unordered_map<key_t, typename value_type::mapped_type>>,
                       std::unordered_map<key_t, mapped_t>, std::map<key_t, mapped_t>>
        out;
    for (auto&& [key, item] : value) out.emplace(key, apply_to_collection(item, function));
    return out;
  } else if constexpr (requires { typename value_type::value_type; value.push_back(*value.begin()); }) {
    using item_t = decltype(apply_to_collection(*value.begin(), function));
    std::vector<item_t> out;
    out.reserve(value.size());
    for (auto&& item : value) out.push_back(apply_to_collection(item, function));
    return out;
  } else if constexpr (requires { typename value_type::value_type; value.has_value(); *value; }) {
    using item_t = decltype(apply_to_collection(*value, function));
    return value ? std::optional<item_t>(apply_to_collection(*std::forward<T>(value), function))
                 : std::optional<item_t>();
  } else {
    return value_type(std::forward<T>(value));
  }
}

// Calls function(tensor) on every tensor inside value, in place: a mutable
// value gives at::Tensor&, so the function may replace each tensor.
template <class T, class F>
void for_each_tensor(T&& value, F&& function) {
  using value_type = std::remove_cvref_t<T>;
  if constexpr (tensor_view<value_type>) {
    value.for_each(function);
  } else if constexpr (std::is_same_v<value_type, at::Tensor>) {
    function(value);
  } else if constexpr (requires { value.for_each_tensor(function); }) {
    value.for_each_tensor(function);
  } else if constexpr (std::is_convertible_v<const value_type&, std::string_view>) {
    // strings hold no tensors
  } else if constexpr (requires { typename value_type::DataType; typename value_type::TargetType; }) {
    for_each_tensor(value.data, function);
    for_each_tensor(value.target, function);
  } else if constexpr (requires { typename std::tuple_size<value_type>::type; } &&
                       !requires { typename value_type::value_type; }) {
    std::apply([&](auto&... items) { (for_each_tensor(items, function), ...); }, value);
  } else if constexpr (requires { typename value_type::key_type; typename value_type::mapped_type; }) {
    for (auto& item : value) for_each_tensor(item.second, function);
  } else if constexpr (requires { typename value_type::value_type; value.begin(); value.end(); }) {
    for (auto& item : value) for_each_tensor(item, function);
  } else if constexpr (requires { typename value_type::value_type; value.has_value(); *value; }) {
    if (value) for_each_tensor(*value, function);
  }
}

}  // namespace loom
