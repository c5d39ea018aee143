// parallelize_module: plan entries matched against named_modules().
#include <loom/errors.hpp>
#include <loom/tp/parallelize.hpp>

#include <c10/util/Exception.h>

#include <sstream>

namespace loom::tp {

namespace {

// '*' matches one dot-separated segment; everything else literally.
bool matches(const std::string& pattern, const std::string& name) {
  std::size_t p = 0, n = 0;
  while (p < pattern.size() && n <= name.size()) {
    if (pattern[p] == '*') {
      const std::size_t end = name.find('.', n);
      n = end == std::string::npos ? name.size() : end;
      ++p;
      continue;
    }
    if (n >= name.size() || pattern[p] != name[n]) return false;
    ++p;
    ++n;
  }
  return p == pattern.size() && n == name.size();
}

std::string type_name(const torch::nn::Module& module) {
  try {
    return module.name();
  } catch (const c10::Error&) {
    return "a module";
  }
}

}  // namespace

void parallelize_module(torch::nn::Module& module, const comm::process_group& group, const parallelize_plan& plan) {
  const auto named = module.named_modules("", /*include_self=*/false);
  for (const auto& [pattern, style] : plan) {
    int found = 0;
    for (const auto& item : named) {
      if (!matches(pattern, item.key())) continue;
      ++found;
      auto* layer = dynamic_cast<layer_marker*>(item.value().get());
      if (layer == nullptr) {
        const std::string type = type_name(*item.value());
        const bool embedding = type.find("Embedding") != std::string::npos;
        throw configuration_error("parallelize_module: the plan gives '" + item.key() + "' " + describe(style) +
                                  ", but it is " + type + ", which cannot run a style's collectives (LibTorch has "
                                  "no forward hooks). Declare it as " +
                                  (embedding ? "loom::tp::Embedding" : "loom::tp::Linear") +
                                  " (same constructor and parameters; it behaves as the torch::nn layer until a plan "
                                  "parallelizes it)");
      }
      layer->parallelize(item.key(), style, group);
    }
    if (found == 0) {
      std::ostringstream names;
      int listed = 0;
      for (const auto& item : named) {
        if (listed++ == 12) {
          names << ", ...";
          break;
        }
        names << (listed > 1 ? ", " : "") << item.key();
      }
      throw configuration_error("parallelize_module: the plan names '" + pattern +
                                "', which matches no submodule; the module has: " + names.str());
    }
  }
}

void parallelize_module(torch::nn::Module& module, comm::device_mesh& mesh, const parallelize_plan& plan) {
  parallelize_module(module, mesh.group("tensor_parallel"), plan);
}

std::vector<const layer_marker*> parallelized_layers(const torch::nn::Module& module) {
  std::vector<const layer_marker*> layers;
  for (const auto& child : module.modules(/*include_self=*/true)) {
    if (const auto* layer = dynamic_cast<const layer_marker*>(child.get()); layer != nullptr && layer->parallelized()) {
      layers.push_back(layer);
    }
  }
  return layers;
}

}  // namespace loom::tp
