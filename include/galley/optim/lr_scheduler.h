#pragma once
/// \file Learning-rate schedules, stepped once per epoch (or per step, as the user chooses).
#include "galley/optim/optimizer.h"
#include "galley/state.h"

namespace galley::optim {

/// Base: remembers the optimizer's initial rate and sets a new one on each step().
class LRScheduler {
 public:
  explicit LRScheduler(Optimizer& optimizer);
  virtual ~LRScheduler() = default;
  /// Advances one period and sets the optimizer's learning rate.
  void step();
  /// Periods stepped so far.
  int64_t last_epoch() const { return epoch_; }
  /// The rate for period `epoch`.
  virtual double lr_at(int64_t epoch) const = 0;
  /// Periods stepped and the initial rate, for checkpoints.
  StateDict state_dict() const;
  /// Restores state_dict() and sets the optimizer's rate for the restored period.
  void load_state_dict(const StateDict& state);

 protected:
  Optimizer& opt_;
  double base_lr_;
  int64_t epoch_ = 0;
};

/// Multiplies the rate by gamma every step_size periods.
class StepLR : public LRScheduler {
 public:
  StepLR(Optimizer& optimizer, int64_t step_size, double gamma = 0.1);
  double lr_at(int64_t epoch) const override;

 private:
  int64_t step_size_;
  double gamma_;
};

/// Cosine from the initial rate down to eta_min over t_max periods (PyTorch's closed form).
class CosineAnnealingLR : public LRScheduler {
 public:
  CosineAnnealingLR(Optimizer& optimizer, int64_t t_max, double eta_min = 0.0);
  double lr_at(int64_t epoch) const override;

 private:
  int64_t t_max_;
  double eta_min_;
};

}  // namespace galley::optim
