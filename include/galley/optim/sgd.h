#pragma once
/// \file Stochastic gradient descent with momentum.
#include "galley/optim/optimizer.h"

namespace galley::optim {

/// Options of SGD (PyTorch's semantics).
struct SGDOptions {
  double learning_rate = 1e-2;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
  /// Ascends the objective: the update takes the negated gradient (PyTorch's maximize), before
  /// the weight decay is added.
  bool maximize = false;
};

/// SGD with optional momentum, dampening, Nesterov and L2 weight decay, as torch.optim.SGD.
/// Parameters are float32, bfloat16 or float16; the update is computed in float32 with a
/// float32 momentum buffer ("momentum_buffer" in state_dict()), and a 16-bit parameter rounded
/// once per step.
class SGD : public Optimizer {
 public:
  /// Validates the options (Nesterov needs momentum > 0 and zero dampening).
  SGD(std::vector<Tensor> params, SGDOptions options = {});
  void step() override;
  StateDict state_dict() const override;
  void load_state_dict(const StateDict& state) override;
  std::string name() const override { return "SGD"; }
  /// The options in force.
  const SGDOptions& options() const { return opt_; }

 private:
  SGDOptions opt_;
  std::vector<Tensor> momentum_;
};

}  // namespace galley::optim
