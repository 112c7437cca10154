#pragma once
/// \file Learning-rate schedules, stepped once per epoch (or per step, as the user chooses).
#include <functional>
#include <utility>
#include <vector>

#include "galley/optim/optimizer.h"
#include "galley/state.h"

namespace galley::optim {

/// Base: remembers the optimizer's initial rate and sets a new one on each step().
///
/// Every schedule but ReduceLROnPlateau gives its rates in closed form from a base rate, PyTorch's
/// closed forms (equal to its recursive forms up to rounding) while it alone sets the optimizer's
/// rate. Once something else has moved the rate since the schedule last set it (another schedule
/// stepped on the same optimizer, a ReduceLROnPlateau, set_learning_rate, an optimizer state
/// loaded), the schedule is chained: from then on each step() takes PyTorch's recursive
/// ("chainable") form from the optimizer's current rate, as PyTorch does at every step. StepLR,
/// MultiStepLR, ExponentialLR, LinearLR and CosineAnnealingLR so carry on from the moved rate
/// (two stepped together multiply; a warm-up past its end leaves a plateau's cut alone);
/// LambdaLR, OneCycleLR and CosineAnnealingWarmRestarts, closed forms in PyTorch too, set their
/// own rate over it.
class LRScheduler {
 public:
  /// Its base is the optimizer's initial_learning_rate(), which the first scheduler made on an
  /// optimizer sets to the rate then (PyTorch's setdefault of initial_lr, and its base_lrs).
  /// A schedule made after another moved the rate off that base is chained from the start: it
  /// goes on from the current rate by the recursive form, as PyTorch's does.
  explicit LRScheduler(Optimizer& optimizer);
  virtual ~LRScheduler() = default;
  /// Advances one period and sets the optimizer's learning rate.
  virtual void step();
  /// Periods stepped so far.
  int64_t last_epoch() const { return epoch_; }
  /// The rate for period `epoch`.
  virtual double lr_at(int64_t epoch) const = 0;
  /// The rate the schedule's closed form starts from: the optimizer's initial_learning_rate()
  /// (its rate when its first schedule was made), a OneCycleLR's max_lr / div_factor, or the one
  /// a SequentialLR gives its schedules.
  double base_lr() const { return base_lr_; }
  /// Whether the rate was moved off the schedule's own (by another schedule, before this one was
  /// made or since, or by the user) and the schedule steps by PyTorch's recursive form.
  bool chained() const { return chained_; }
  /// Periods stepped, the base rate, whether chained and the rate last set, for checkpoints.
  virtual StateDict state_dict() const;
  /// Restores state_dict() and sets the optimizer's rate for the restored period (the rate the
  /// schedule last set, where chained). io::load_checkpoint then puts back the optimizer's own
  /// saved rate, so a rate moved after the schedule's last step is followed at the next.
  virtual void load_state_dict(const StateDict& state);

 protected:
  /// With record_initial false the optimizer's initial_learning_rate() is left unset, as
  /// PyTorch's ReduceLROnPlateau leaves initial_lr.
  LRScheduler(Optimizer& optimizer, bool record_initial);
  /// The rate set before the first step (the initial rate unless the schedule starts elsewhere).
  virtual double start_lr() const { return base_lr_; }
  /// What a schedule whose rate starts elsewhere than its base sets when it is made (PyTorch's
  /// first step): the closed form's period 0, or where chained the recursive form's from the
  /// current rate.
  void initial_step();
  /// Sets the optimizer's rate and remembers it as the one this schedule last set.
  void set_rate(double lr);
  /// The rate of period `epoch` from the optimizer's current rate `lr` by PyTorch's recursive
  /// (chainable) get_lr, which a chained schedule steps by; a schedule that is a closed form in
  /// PyTorch too keeps this default, its closed form.
  virtual double chained_rate(double /*lr*/, int64_t epoch) const { return lr_at(epoch); }

  Optimizer& opt_;
  double base_lr_;
  int64_t epoch_ = 0;
  bool chained_ = false;
  double last_set_;  // the optimizer's rate as this schedule last left it

 private:
  friend class SequentialLR;  // re-bases its children on one initial rate, as PyTorch does
};

/// Multiplies the rate by gamma every step_size periods.
class StepLR : public LRScheduler {
 public:
  StepLR(Optimizer& optimizer, int64_t step_size, double gamma = 0.1);
  double lr_at(int64_t epoch) const override;

 protected:
  double chained_rate(double lr, int64_t epoch) const override;

 private:
  int64_t step_size_;
  double gamma_;
};

/// Multiplies the rate by gamma at each milestone (a period; a milestone given twice counts
/// twice, as PyTorch's Counter does), in any order; milestones are 0 or more.
class MultiStepLR : public LRScheduler {
 public:
  /// Sets the optimizer's rate to period 0's (a milestone at 0 applies at once).
  MultiStepLR(Optimizer& optimizer, std::vector<int64_t> milestones, double gamma = 0.1);
  double lr_at(int64_t epoch) const override;

 protected:
  double start_lr() const override { return lr_at(0); }
  double chained_rate(double lr, int64_t epoch) const override;

 private:
  std::vector<int64_t> milestones_;  // sorted
  double gamma_;
};

/// The initial rate times factor(epoch), a function of the caller's (PyTorch's LambdaLR). Its
/// state is the period alone: a restored scheduler needs the same function.
class LambdaLR : public LRScheduler {
 public:
  /// Sets the optimizer's rate to period 0's; factor must give a finite value of 0 or more.
  LambdaLR(Optimizer& optimizer, std::function<double(int64_t)> factor);
  double lr_at(int64_t epoch) const override;

 protected:
  double start_lr() const override { return lr_at(0); }

 private:
  std::function<double(int64_t)> factor_;
};

/// Multiplies the rate by gamma every period.
class ExponentialLR : public LRScheduler {
 public:
  ExponentialLR(Optimizer& optimizer, double gamma);
  double lr_at(int64_t epoch) const override;

 protected:
  double chained_rate(double lr, int64_t epoch) const override;

 private:
  double gamma_;
};

/// SGDR (Loshchilov & Hutter): a cosine from the initial rate down to eta_min over t_0
/// periods, restarted at the initial rate, each cycle t_mult times as long as the one before
/// (PyTorch's CosineAnnealingWarmRestarts stepped once per period).
class CosineAnnealingWarmRestarts : public LRScheduler {
 public:
  CosineAnnealingWarmRestarts(Optimizer& optimizer, int64_t t_0, int64_t t_mult = 1,
                              double eta_min = 0.0);
  double lr_at(int64_t epoch) const override;

 private:
  int64_t t_0_, t_mult_;
  double eta_min_;
};

/// Cosine from the initial rate down to eta_min over t_max periods (PyTorch's closed form).
class CosineAnnealingLR : public LRScheduler {
 public:
  CosineAnnealingLR(Optimizer& optimizer, int64_t t_max, double eta_min = 0.0);
  double lr_at(int64_t epoch) const override;

 protected:
  double chained_rate(double lr, int64_t epoch) const override;

 private:
  int64_t t_max_;
  double eta_min_;
};

/// Options of LinearLR (PyTorch's defaults).
struct LinearLROptions {
  /// Factor of the initial rate in period 0, in [0, 1].
  double start_factor = 1.0 / 3;
  /// Factor reached at period total_iters and kept after, in [0, 1].
  double end_factor = 1.0;
  /// Periods of the linear change, > 0.
  int64_t total_iters = 5;
};

/// Scales the initial rate by a factor going linearly from start_factor to end_factor over
/// total_iters periods (a warm-up with the defaults). Sets the optimizer's rate to period 0's
/// when constructed, as PyTorch's first implicit step does.
class LinearLR : public LRScheduler {
 public:
  /// Validates the options and sets the optimizer's rate to period 0's.
  LinearLR(Optimizer& optimizer, LinearLROptions options = {});
  double lr_at(int64_t epoch) const override;

 protected:
  double start_lr() const override { return lr_at(0); }
  double chained_rate(double lr, int64_t epoch) const override;

 private:
  LinearLROptions o_;
};

/// How OneCycleLR moves between two rates within a phase.
enum class AnnealStrategy { Cos, Linear };

/// Options of OneCycleLR. Give total_steps, or epochs and steps_per_epoch (total_steps wins).
struct OneCycleLROptions {
  /// Peak rate, > 0.
  double max_lr = 0.0;
  /// Steps in the cycle; 0 to use epochs * steps_per_epoch.
  int64_t total_steps = 0;
  /// Epochs of training, with steps_per_epoch, when total_steps is 0.
  int64_t epochs = 0;
  /// Batches per epoch.
  int64_t steps_per_epoch = 0;
  /// Fraction of the cycle spent rising to max_lr, in [0, 1].
  double pct_start = 0.3;
  /// Cosine (PyTorch's "cos") or linear annealing.
  AnnealStrategy anneal_strategy = AnnealStrategy::Cos;
  /// The cycle starts at max_lr / div_factor.
  double div_factor = 25.0;
  /// ... and ends at max_lr / div_factor / final_div_factor.
  double final_div_factor = 1e4;
  /// Three phases (up, back down to the start, then down to the minimum) instead of two.
  bool three_phase = false;
};

/// The 1cycle policy, stepped once per batch: rises from max_lr / div_factor to max_lr, then
/// anneals to the minimum, with PyTorch's phase boundaries and formulas. The optimizer's own
/// rate is replaced by the starting rate when constructed. Rates exist for periods 0 to
/// total_steps (the last one past the cycle, held at 0 where a linear anneal would make it
/// negative); stepping past that is an error, as in PyTorch. Momentum is not cycled (PyTorch's
/// cycle_momentum = false). A pct_start that leaves a phase with no steps is rejected.
class OneCycleLR : public LRScheduler {
 public:
  /// Validates the options and sets the optimizer's rate to max_lr / div_factor.
  OneCycleLR(Optimizer& optimizer, OneCycleLROptions options);
  double lr_at(int64_t epoch) const override;
  /// Steps in the cycle.
  int64_t total_steps() const { return total_steps_; }

 protected:
  double start_lr() const override { return lr_at(0); }

 private:
  struct Phase {
    double end_step, start_lr, end_lr;
  };
  OneCycleLROptions o_;
  int64_t total_steps_;
  std::vector<Phase> phases_;
};

/// Which way ReduceLROnPlateau's metric improves.
enum class PlateauMode { Min, Max };
/// Whether ReduceLROnPlateau's threshold is relative to the best value or absolute.
enum class ThresholdMode { Rel, Abs };

/// Options of ReduceLROnPlateau (PyTorch's defaults).
struct ReduceLROnPlateauOptions {
  /// Min: the metric should fall (a loss); Max: it should rise (an accuracy).
  PlateauMode mode = PlateauMode::Min;
  /// The rate is multiplied by factor on a plateau, in (0, 1).
  double factor = 0.1;
  /// Periods without improvement tolerated before reducing, >= 0.
  int64_t patience = 10;
  /// Smallest improvement that counts, >= 0.
  double threshold = 1e-4;
  /// Rel: better than best * (1 -/+ threshold); Abs: better than best -/+ threshold.
  ThresholdMode threshold_mode = ThresholdMode::Rel;
  /// Periods after a reduction during which bad periods are not counted, >= 0.
  int64_t cooldown = 0;
  /// Floor of the rate, >= 0.
  double min_lr = 0.0;
  /// A reduction smaller than eps is skipped, >= 0.
  double eps = 1e-8;
};

/// Reduces the rate when a metric has stopped improving, as PyTorch's ReduceLROnPlateau. It
/// reads and changes the optimizer's current rate, so the rate is known only for the current
/// period, and step() needs the metric.
class ReduceLROnPlateau : public LRScheduler {
 public:
  /// Validates the options; the rate starts as the optimizer's.
  ReduceLROnPlateau(Optimizer& optimizer, ReduceLROnPlateauOptions options = {});
  /// Advances one period with the metric measured in it (e.g. the validation loss).
  void step(double metric);
  /// An error: this schedule needs the metric.
  void step() override;
  /// The current rate; any other period is an error (it depends on metrics not yet seen).
  double lr_at(int64_t epoch) const override;
  /// Best metric so far (+inf in Min mode, -inf in Max mode before the first step).
  double best() const { return best_; }
  /// Consecutive periods without improvement.
  int64_t num_bad_epochs() const { return num_bad_epochs_; }
  /// Periods of cooldown left.
  int64_t cooldown_counter() const { return cooldown_counter_; }
  /// Periods, best metric, counters and the current rate.
  StateDict state_dict() const override;
  /// Restores state_dict(), including the optimizer's rate.
  void load_state_dict(const StateDict& state) override;

 private:
  bool is_better(double a) const;
  ReduceLROnPlateauOptions o_;
  double best_;
  int64_t num_bad_epochs_ = 0;
  int64_t cooldown_counter_ = 0;
};

/// Runs `schedulers` one after another: the first until milestones[0], the second from period
/// milestones[0] (where it starts at its own period 0), and so on, as PyTorch's SequentialLR.
/// The children must be on the same optimizer and outlive this; they all start from the first
/// child's initial rate (PyTorch's shared `initial_lr`), and the optimizer's rate is set to the
/// first child's period 0. Step this, not the children (their last_epoch() follows).
class SequentialLR : public LRScheduler {
 public:
  /// Needs one milestone fewer than schedulers, positive and increasing.
  SequentialLR(Optimizer& optimizer, std::vector<LRScheduler*> schedulers,
               std::vector<int64_t> milestones);
  void step() override;
  double lr_at(int64_t epoch) const override;
  /// Restores state_dict() and re-bases the children on the restored initial rate.
  void load_state_dict(const StateDict& state) override;

 protected:
  double start_lr() const override;
  double chained_rate(double lr, int64_t epoch) const override;  // the running schedule's

 private:
  /// Gives this schedule and every child (nested ones too) the initial rate `base`.
  void rebase(double base);
  /// Index of the child in charge of period `epoch`, and the child's own period.
  std::pair<size_t, int64_t> locate(int64_t epoch) const;
  std::vector<LRScheduler*> children_;
  std::vector<int64_t> milestones_;
};

}  // namespace galley::optim
