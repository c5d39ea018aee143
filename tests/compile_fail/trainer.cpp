// Each case_* function must fail to compile with the sentence trainer.expect
// gives for it: a module that misses a part of the trainable contract.
#include <loom/loom.hpp>
#include <loom/trainer/trainer.hpp>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <memory>

namespace {
using batch = torch::data::Example<>;
std::shared_ptr<torch::optim::SGD> sgd_for(torch::nn::Module& module) {
  return std::make_shared<torch::optim::SGD>(module.parameters(), torch::optim::SGDOptions(0.1));
}

struct NoTrainingStepImpl : torch::nn::Module {
  auto configure_optimizers() { return sgd_for(*this); }
};
TORCH_MODULE(NoTrainingStep);

struct WrongSignatureImpl : torch::nn::Module {
  at::Tensor training_step(int /*not a batch*/) { return {}; }
  auto configure_optimizers() { return sgd_for(*this); }
};
TORCH_MODULE(WrongSignature);

struct NoOptimizersImpl : torch::nn::Module {
  at::Tensor training_step(const batch& b, std::int64_t) { return b.data.sum(); }
};
TORCH_MODULE(NoOptimizers);

struct BadOptimizersImpl : torch::nn::Module {
  at::Tensor training_step(const batch& b, std::int64_t) { return b.data.sum(); }
  torch::optim::SGD* configure_optimizers() { return nullptr; }
};
TORCH_MODULE(BadOptimizers);

struct DoubleLossImpl : torch::nn::Module {
  double training_step(const batch&, std::int64_t) { return 0.0; }
  auto configure_optimizers() { return sgd_for(*this); }
};
TORCH_MODULE(DoubleLoss);

struct NoValidationImpl : torch::nn::Module {
  at::Tensor training_step(const batch& b, std::int64_t) { return b.data.sum(); }
  auto configure_optimizers() { return sgd_for(*this); }
};
TORCH_MODULE(NoValidation);

loom::data::tensor_dataset data() { return loom::data::tensor_dataset(at::zeros({4, 2}), at::zeros({4})); }

template <class Module>
void fit(Module module) {
  loom::Fabric<loom::cpu> fabric;
  loom::trainer(fabric).fit(module, data());
}
}  // namespace

void case_no_training_step() { fit(NoTrainingStep()); }
void case_wrong_training_step_signature() { fit(WrongSignature()); }
void case_no_configure_optimizers() { fit(NoOptimizers()); }
void case_bad_configure_optimizers() { fit(BadOptimizers()); }
void case_training_step_returns_double() { fit(DoubleLoss()); }
void case_validation_data_without_validation_step() {
  loom::Fabric<loom::cpu> fabric;
  loom::trainer(fabric).fit(NoValidation(), data(), data());
}
