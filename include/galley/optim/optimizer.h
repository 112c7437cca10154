#pragma once
/// \file The base of every optimizer.
#include <functional>
#include <optional>
#include <vector>

#include "galley/state.h"
#include "galley/tensor.h"

namespace galley::optim {

/// Holds the parameters it updates (handles shared with the model) and a learning rate.
///
/// Parameters may be float32, bfloat16 or float16 (mixed in one optimizer too), each with a
/// gradient of its own dtype. As in torch.optim, the update of a 16-bit parameter is computed in
/// float32 and the parameter rounded to its dtype once per step. The optimizer state (momentum
/// buffers, Adam's moments) is float32 for every parameter dtype: PyTorch keeps it in the
/// parameter's dtype, where small updates of exp_avg_sq underflow or round away; float32 state
/// costs 8 bytes (Adam) or 4 (SGD) per element and tracks a float32 run closely. state_dict()
/// saves it as float32; load_state_dict() also takes 16-bit state and widens it.
class Optimizer {
 public:
  /// Every parameter must be a defined float32, bfloat16 or float16 leaf.
  Optimizer(std::vector<Tensor> params, double learning_rate);
  virtual ~Optimizer() = default;

  /// Applies one update from the parameters' accumulated gradients (those without one are
  /// skipped). Runs without recording a graph.
  virtual void step() = 0;
  /// Clears every parameter's gradient (sets it undefined, so the next backward writes it).
  void clear_grad();
  /// Alias of clear_grad() for libtorch users.
  void zero_grad() { clear_grad(); }

  /// Current learning rate.
  double learning_rate() const { return lr_; }
  /// Changes the learning rate (schedulers call this).
  void set_learning_rate(double lr);
  /// The rate when the first learning-rate scheduler was made on this optimizer (PyTorch's
  /// param_group['initial_lr'], which a OneCycleLR sets to its own max_lr / div_factor): every
  /// schedule made on the optimizer takes it as its base, even after its first schedule is gone,
  /// and SequentialLR starts its schedules from it. Unset before any scheduler.
  std::optional<double> initial_learning_rate() const { return initial_lr_; }
  /// Forgets initial_learning_rate() (PyTorch's `del group['initial_lr']`): the next schedule
  /// made takes the current rate as its base, as a first one does. For a new phase of training
  /// with schedules of its own after the rate was set by hand.
  void clear_initial_learning_rate() { initial_lr_.reset(); }
  /// The parameters, in the order given.
  const std::vector<Tensor>& parameters() const { return params_; }
  /// Index of `param` in parameters(); throws if it is not one of them.
  size_t index_of(const Tensor& param) const;

  /// Learning rate and per-parameter state ("state.<index>.<name>"), for checkpoints.
  virtual StateDict state_dict() const;
  /// Restores state_dict(); shapes are checked against the parameters before anything changes.
  virtual void load_state_dict(const StateDict& state);
  /// Name used in error messages.
  virtual std::string name() const { return "Optimizer"; }

 protected:
  /// Refuses a state saved for another number of parameters, naming both counts.
  void check_num_params(const StateDict& state) const;
  /// For each parameter that has a gradient (which must have the parameter's shape, dtype and
  /// device), without recording a graph: first prepare(index, param) for all of them (it makes
  /// the state a step needs, and may fail: then no parameter has changed), then
  /// update(index, param, gradient) for all of them (it must not fail), then launch() where
  /// given (the batched GPU launches of what update queued). A parameter that is not contiguous
  /// (a transposed or narrowed leaf) is updated as a dense copy, made before any update and
  /// written back through its strides after launch(): the kernels take dense memory.
  void for_each_gradient(const std::function<void(size_t, Tensor&)>& prepare,
                         const std::function<void(size_t, Tensor&, const Tensor&)>& update,
                         const std::function<void()>& launch = nullptr);

  std::vector<Tensor> params_;
  double lr_;

 private:
  friend class LRScheduler;
  friend class OneCycleLR;
  std::optional<double> initial_lr_;
};

}  // namespace galley::optim
