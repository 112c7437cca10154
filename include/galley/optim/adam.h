#pragma once
/// \file Adam and AdamW.
#include <optional>

#include "galley/optim/optimizer.h"

namespace galley::optim {

/// Options of Adam and AdamW, with PyTorch's defaults. A weight_decay left unset is the
/// optimizer's default, whatever else is given: 0 for Adam, 1e-2 for AdamW (so
/// `AdamW(params, {.learning_rate = 3e-4})` decays by 1e-2, as torch.optim.AdamW(lr=3e-4) does).
/// options() holds the value in force.
struct AdamOptions {
  double learning_rate = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  std::optional<double> weight_decay{};
  bool amsgrad = false;
  /// Ascends the objective: the update takes the negated gradient (PyTorch's maximize),
  /// before the weight decay is added.
  bool maximize = false;
};

/// Moments of one parameter: float32 whatever the parameter's dtype (see Optimizer).
struct AdamState {
  /// Steps taken, as counted by the host (eager steps).
  int64_t step = 0;
  Tensor exp_avg, exp_avg_sq, max_exp_avg_sq;
  /// For a parameter on a GPU: the step count on the device (one int64), which the update
  /// reads and advances itself, so that a step replayed from a CUDA graph counts too. Once it
  /// exists it is the count state_dict() saves.
  Tensor device_step{};
};

/// Adam (Kingma & Ba) with L2 weight decay added to the gradient, as torch.optim.Adam.
/// Parameters are float32, bfloat16 or float16; the update is computed in float32 with float32
/// moments (exp_avg, exp_avg_sq, max_exp_avg_sq), and a 16-bit parameter rounded once per step.
class Adam : public Optimizer {
 public:
  /// Validates the options (lr >= 0, betas in [0, 1), eps >= 0, weight_decay >= 0).
  Adam(std::vector<Tensor> params, AdamOptions options = {})
      : Adam(std::move(params), options, false) {}
  void step() override;
  StateDict state_dict() const override;
  void load_state_dict(const StateDict& state) override;
  std::string name() const override { return "Adam"; }
  /// The moments of `param` (empty before its first update).
  const AdamState& state(const Tensor& param) const { return state_.at(index_of(param)); }
  /// The options in force (weight_decay set).
  const AdamOptions& options() const { return opt_; }

 protected:
  /// `decoupled`: AdamW's weight decay (and its default) rather than Adam's L2 decay.
  Adam(std::vector<Tensor> params, AdamOptions options, bool decoupled);

 private:
  /// Decoupled (AdamW) rather than L2 weight decay.
  bool decoupled_ = false;
  AdamOptions opt_;
  std::vector<AdamState> state_;
};

/// Adam with decoupled weight decay (Loshchilov & Hutter), as torch.optim.AdamW.
class AdamW : public Adam {
 public:
  /// Adam's options; an unset weight_decay is 1e-2, PyTorch's default.
  AdamW(std::vector<Tensor> params, AdamOptions options = {})
      : Adam(std::move(params), options, true) {}
  std::string name() const override { return "AdamW"; }
};

}  // namespace galley::optim
