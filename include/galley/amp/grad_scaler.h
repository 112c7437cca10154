#pragma once
/// \file Dynamic loss scaling for float16 training (PyTorch's torch.amp.GradScaler).
///
///     galley::amp::GradScaler scaler;
///     for (auto& [x, y] : loader) {
///       Tensor loss;
///       {
///         galley::amp::Autocast autocast(galley::DType::Float16);
///         loss = loss_fn(model(x), y);
///       }
///       scaler.scale(loss).backward();  // gradients of loss * scale: small ones survive fp16
///       scaler.unscale_(optimizer);     // optional: gradients / scale, e.g. to clip them
///       scaler.step(optimizer);         // skipped when a gradient is Inf or NaN
///       scaler.update();                // halve after Infs, double after 2000 clean steps
///       optimizer.clear_grad();
///     }
///
/// bfloat16 has float32's range and needs no scaling; a scaler works with it all the same.
#include <cstdint>
#include <map>

#include "galley/optim/optimizer.h"
#include "galley/state.h"
#include "galley/tensor.h"

namespace galley::amp {

/// Options of GradScaler: PyTorch's defaults.
struct GradScalerOptions {
  double init_scale = 65536.0;  ///< the first scale, 2^16
  double growth_factor = 2.0;   ///< the scale is multiplied by it after growth_interval clean steps
  double backoff_factor = 0.5;  ///< ... and by this after a step with Inf or NaN gradients
  int64_t growth_interval = 2000;
  bool enabled = true;  ///< false: every call passes through (scale 1, steps always taken)
};

/// Scales the loss so that float16 gradients do not underflow, and unscales them before the
/// optimizer uses them, with PyTorch's dynamic scheme:
/// - scale(loss) = loss * scale, in float32; backward from it is allowed to be non-finite (the
///   loss guard of backward() lets it through: the scaler handles such a step).
/// - unscale_(optimizer) divides every gradient of the optimizer's parameters by the scale (one
///   multiply by the float32 reciprocal, as PyTorch) in one pass per device, and notes whether
///   any is Inf or NaN. At most once per optimizer between update()s.
/// - step(optimizer) unscales first if unscale_ was not called, then runs optimizer.step() only
///   when every gradient was finite. At most once per optimizer between update()s.
/// - update() multiplies the scale by backoff_factor if any optimizer stepped over non-finite
///   gradients since the last update (and restarts the count of clean steps), else counts a clean
///   step and multiplies by growth_factor every growth_interval of them (when the result is
///   finite). The scale is a float32 value, computed in double and rounded, as PyTorch's.
///
/// DataParallel: its parameters() list every replica's, whose gradients are all-reduced (summed)
/// before the step, so an Inf in any replica or process reaches every replica's gradients and
/// every one skips the same steps. Reading the verdict waits for each device once per step.
class GradScaler {
 public:
  explicit GradScaler(const GradScalerOptions& options = {});

  /// loss * scale (float32); `loss` itself when disabled.
  Tensor scale(const Tensor& loss) const;
  /// Divides the optimizer's gradients by the scale in place; see the class comment.
  void unscale_(optim::Optimizer& optimizer);
  /// Steps the optimizer unless its gradients hold an Inf or NaN. Returns whether it stepped.
  bool step(optim::Optimizer& optimizer);
  /// Adjusts the scale for the next iteration; see the class comment.
  void update();
  /// Sets the scale to `new_scale` (> 0, finite) instead of the dynamic rule, as PyTorch's
  /// update(new_scale).
  void update(double new_scale);

  /// The current scale (1 when disabled).
  double get_scale() const;
  /// Clean steps counted towards the next growth.
  int64_t growth_tracker() const { return growth_tracker_; }
  /// Whether the last step(optimizer) skipped (false before any step).
  bool last_step_skipped() const { return last_skipped_; }
  bool is_enabled() const { return options_.enabled; }
  const GradScalerOptions& options() const { return options_; }

  /// scale, growth_factor, backoff_factor, growth_interval and the growth tracker (PyTorch's
  /// state_dict keys: "scale", ..., "_growth_tracker"); empty when disabled.
  StateDict state_dict() const;
  /// Restores state_dict(); an empty state (from a disabled scaler) is an error, as in PyTorch.
  void load_state_dict(const StateDict& state);

 private:
  enum class Stage { Ready, Unscaled, Stepped };
  struct PerOptimizer {
    Stage stage = Stage::Ready;
    bool found_inf = false;
    bool checked = false;  // unscale_ found at least one gradient
  };
  PerOptimizer& state_of(const optim::Optimizer& optimizer);

  GradScalerOptions options_;
  float scale_;
  int64_t growth_tracker_ = 0;
  bool last_skipped_ = false;
  std::map<const optim::Optimizer*, PerOptimizer> per_optimizer_;
};

}  // namespace galley::amp
