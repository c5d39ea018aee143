// LibTorch's packages are built with NDEBUG, and without it
// RecordFunction::inputs() reads a member that exists only in debug builds of
// LibTorch (inputs_valid_): a loom built without NDEBUG (debug,
// debugoptimized, the sanitizer builds) read a padding byte LibTorch never
// wrote (UBSan: "load of value 83, which is not a valid value for type
// 'bool'"), and the debug assert on it could fire at random. This TU reads
// LibTorch's headers as LibTorch was built.
#ifndef NDEBUG
#define NDEBUG
#endif

#include <loom/util/flop_counter.hpp>

#include <ATen/ATen.h>
#include <ATen/record_function.h>

#include <atomic>
#include <cstring>
#include <stdexcept>
#include <string_view>
#include <vector>

namespace loom {

namespace {

std::vector<std::int64_t> shape_of(const c10::IValue& value) {
  if (!value.isTensor()) return {};
  const auto sizes = value.toTensor().sizes();
  return {sizes.begin(), sizes.end()};
}

double product(const std::vector<std::int64_t>& values, std::size_t from = 0) {
  double out = 1;
  for (std::size_t i = from; i < values.size(); ++i) out *= static_cast<double>(values[i]);
  return out;
}

std::vector<std::int64_t> int_list(const c10::IValue& value) {
  if (value.isIntList()) return value.toIntVector();
  return {};
}

// 2 * batch * |weight| * positions, positions being the output's spatial
// size (the input's for a transposed convolution), as FlopCounterMode.
double conv_flops(const std::vector<std::int64_t>& x, const std::vector<std::int64_t>& w,
                  const std::vector<std::int64_t>& out, bool transposed) {
  if (x.empty() || w.empty() || out.empty()) return 0;
  const std::vector<std::int64_t>& spatial = transposed ? x : out;
  return 2.0 * static_cast<double>(x[0]) * product(w) * product(spatial, 2);
}

// The output shape of aten::convolution(input, weight, bias, stride, padding,
// dilation, transposed, output_padding, groups).
std::vector<std::int64_t> conv_output(const std::vector<std::int64_t>& x, const std::vector<std::int64_t>& w,
                                      const std::vector<std::int64_t>& stride, const std::vector<std::int64_t>& padding,
                                      const std::vector<std::int64_t>& dilation, bool transposed,
                                      const std::vector<std::int64_t>& output_padding, std::int64_t groups) {
  std::vector<std::int64_t> out{x[0], transposed ? w[1] * groups : w[0]};
  const std::size_t dims = x.size() - 2;
  auto at = [](const std::vector<std::int64_t>& v, std::size_t i, std::int64_t fallback) {
    return v.empty() ? fallback : v[v.size() == 1 ? 0 : i];
  };
  for (std::size_t i = 0; i < dims; ++i) {
    const std::int64_t in = x[i + 2];
    const std::int64_t k = w[i + 2];
    const std::int64_t s = at(stride, i, 1), p = at(padding, i, 0), d = at(dilation, i, 1);
    if (transposed) out.push_back((in - 1) * s - 2 * p + d * (k - 1) + at(output_padding, i, 0) + 1);
    else out.push_back((in + 2 * p - d * (k - 1) - 1) / s + 1);
  }
  return out;
}

// The flops of one counted operator call, or a negative number when the
// operator is not one loom counts.
double operator_flops(std::string_view name, c10::ArrayRef<const c10::IValue> in) {
  if (name == "aten::mm" && in.size() >= 2) {
    const auto a = shape_of(in[0]), b = shape_of(in[1]);
    if (a.size() == 2 && b.size() == 2) return 2.0 * a[0] * a[1] * b[1];
    return 0;
  }
  if (name == "aten::addmm" && in.size() >= 3) {
    const auto a = shape_of(in[1]), b = shape_of(in[2]);
    if (a.size() == 2 && b.size() == 2) return 2.0 * a[0] * a[1] * b[1];
    return 0;
  }
  if (name == "aten::bmm" && in.size() >= 2) {
    const auto a = shape_of(in[0]), b = shape_of(in[1]);
    if (a.size() == 3 && b.size() == 3) return 2.0 * a[0] * a[1] * a[2] * b[2];
    return 0;
  }
  if (name == "aten::baddbmm" && in.size() >= 3) {
    const auto a = shape_of(in[1]), b = shape_of(in[2]);
    if (a.size() == 3 && b.size() == 3) return 2.0 * a[0] * a[1] * a[2] * b[2];
    return 0;
  }
  if (name == "aten::convolution" && in.size() >= 9) {
    const auto x = shape_of(in[0]), w = shape_of(in[1]);
    if (x.size() < 3 || w.size() != x.size()) return 0;
    const bool transposed = in[6].isBool() && in[6].toBool();
    const auto out = conv_output(x, w, int_list(in[3]), int_list(in[4]), int_list(in[5]), transposed, int_list(in[7]),
                                 in[8].isInt() ? in[8].toInt() : 1);
    return conv_flops(x, w, out, transposed);
  }
  if (name == "aten::convolution_backward" && in.size() >= 11) {
    // (grad_output, input, weight, bias_sizes, stride, padding, dilation,
    //  transposed, output_padding, groups, output_mask): each computed
    // gradient of input or weight costs one forward convolution.
    const auto grad_out = shape_of(in[0]), x = shape_of(in[1]), w = shape_of(in[2]);
    const bool transposed = in[7].isBool() && in[7].toBool();
    const double one = conv_flops(x, w, grad_out, transposed);
    double total = 0;
    if (in[10].isBoolList()) {
      const auto mask = in[10].toBoolList();
      if (mask.size() > 0 && mask.get(0)) total += one;
      if (mask.size() > 1 && mask.get(1)) total += one;
    }
    return total;
  }
  // LibTorch 2.x's fused attention (query [b, h, s_q, d], key [b, h, s_k, d]):
  // two products, q k^T and p v. Their backward kernels cost twice that.
  const bool attention = name.find("aten::_scaled_dot_product") == 0 || name == "aten::scaled_dot_product_attention";
  if (attention && in.size() >= 2) {
    const auto q = shape_of(in[0]), k = shape_of(in[1]);
    if (q.size() < 3 || k.size() != q.size()) return 0;
    const double batch_heads = product(std::vector<std::int64_t>(q.begin(), q.end() - 2));
    const double products = 4.0 * batch_heads * q[q.size() - 2] * k[k.size() - 2] * q.back();
    return name.find("backward") != std::string_view::npos ? 2.0 * products : products;
  }
  return -1;
}

struct counting_context : at::ObserverContext {
  double flops = 0;
};

struct thread_state {
  flop_count* counts = nullptr;
  bool backward = false;
  int depth = 0;  // counted operators currently open (inner ones are not counted again)
};
// Autograd runs backward on other threads with this thread's callbacks; the
// state they count into is shared through a process-wide pointer guarded by
// the one counter that may be alive at a time.
std::atomic<thread_state*> active{nullptr};

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  thread_state* state = active.load();
  if (state == nullptr || state->counts == nullptr) return nullptr;
  const char* raw = fn.name();
  const std::string_view name = raw == nullptr ? std::string_view() : std::string_view(raw);
  const double flops = operator_flops(name, fn.inputs());
  if (flops < 0) return nullptr;
  auto context = std::make_unique<counting_context>();
  if (state->depth == 0) {
    context->flops = flops;
    (state->backward ? state->counts->backward : state->counts->forward) += flops;
    state->counts->by_operator[std::string(name)] += flops;
  }
  ++state->depth;
  return context;
}

void on_end(const at::RecordFunction& /*fn*/, at::ObserverContext* context) {
  thread_state* state = active.load();
  if (context != nullptr && state != nullptr && state->depth > 0) --state->depth;
}

}  // namespace

struct flop_counter::impl {
  flop_count counts;
  thread_state state;
  at::CallbackHandle handle = 0;
};

flop_counter::flop_counter() : impl_(std::make_unique<impl>()) {
  impl_->state.counts = &impl_->counts;
  thread_state* expected = nullptr;
  if (!active.compare_exchange_strong(expected, &impl_->state)) {
    throw std::logic_error("flop_counter: another flop_counter is counting; one at a time");
  }
  impl_->handle = at::addThreadLocalCallback(at::RecordFunctionCallback(&on_start, &on_end)
                                                 .needsInputs(true)
                                                 .scopes({at::RecordScope::FUNCTION}));
}

flop_counter::~flop_counter() {
  at::removeCallback(impl_->handle);
  active.store(nullptr);
}

void flop_counter::mark_backward() noexcept { impl_->state.backward = true; }
const flop_count& flop_counter::counts() const noexcept { return impl_->counts; }

flop_count measure_flops(torch::nn::Module& module, const std::function<at::Tensor()>& forward_fn,
                         const std::function<at::Tensor(const at::Tensor&)>& loss_fn) {
  std::vector<at::Tensor> parameters = module.parameters();
  std::vector<at::Tensor> saved;
  saved.reserve(parameters.size());
  for (auto& parameter : parameters) saved.push_back(parameter.grad().defined() ? parameter.grad().clone() : at::Tensor());
  flop_count counts;
  {
    flop_counter counter;
    at::Tensor output = forward_fn();
    if (loss_fn) {
      at::Tensor loss = loss_fn(output);
      counter.mark_backward();
      loss.backward();
    }
    counts = counter.counts();
  }
  for (std::size_t i = 0; i < parameters.size(); ++i) parameters[i].mutable_grad() = saved[i];
  return counts;
}

}  // namespace loom
