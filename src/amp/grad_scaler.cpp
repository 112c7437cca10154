// The dynamic loss scaler: the scale is kept on the host (a float32 value, as PyTorch's tensor);
// the gradients are checked and unscaled by the multi-tensor kernels of gradient clipping, one
// pass of each per device, and the verdict read back once per device and step.
#include "galley/amp/grad_scaler.h"

#include <cmath>
#include <limits>

#include "galley/autograd.h"
#include "galley/ops.h"
#include "src/nn/grad_groups.h"

namespace galley::amp {

GradScaler::GradScaler(const GradScalerOptions& options)
    : options_(options), scale_(static_cast<float>(options.init_scale)) {
  // The scale is a float32 (as PyTorch's): the value must stay finite and positive there too.
  GALLEY_CHECK(std::isfinite(scale_) && scale_ > 0, "amp::GradScaler: init_scale ",
               options.init_scale, " must be finite and > 0 as a float32");
  GALLEY_CHECK(options.growth_factor > 1.0, "amp::GradScaler: growth_factor ",
               options.growth_factor, " must be > 1");
  GALLEY_CHECK(options.backoff_factor > 0.0 && options.backoff_factor < 1.0,
               "amp::GradScaler: backoff_factor ", options.backoff_factor, " must be in (0, 1)");
  GALLEY_CHECK(options.growth_interval > 0, "amp::GradScaler: growth_interval ",
               options.growth_interval, " must be > 0");
}

Tensor GradScaler::scale(const Tensor& loss) const {
  GALLEY_CHECK(loss.defined(), "amp::GradScaler::scale: the loss is undefined");
  if (!options_.enabled) return loss;
  GALLEY_CHECK(is_floating_point(loss.dtype()), "amp::GradScaler::scale: the loss is ",
               dtype_name(loss.dtype()), "; expected a floating tensor");
  // Multiplied in float32, as PyTorch promotes the loss to its float32 scale.
  Tensor scaled = mul(loss.to(DType::Float32), scale_);
  if (scaled.impl()->grad_fn) scaled.impl()->grad_fn->nonfinite_loss_ok = true;
  return scaled;
}

GradScaler::PerOptimizer& GradScaler::state_of(const optim::Optimizer& optimizer) {
  return per_optimizer_[&optimizer];
}

void GradScaler::unscale_(optim::Optimizer& optimizer) {
  if (!options_.enabled) return;
  PerOptimizer& st = state_of(optimizer);
  GALLEY_CHECK(st.stage != Stage::Unscaled,
               "amp::GradScaler::unscale_: already called on this optimizer (", optimizer.name(),
               ") since the last update()");
  GALLEY_CHECK(st.stage != Stage::Stepped, "amp::GradScaler::unscale_: called after step() on ",
               "this optimizer (", optimizer.name(), "); call update() first");
  // PyTorch: inv_scale = scale.double().reciprocal().float().
  const float inv_scale = static_cast<float>(1.0 / static_cast<double>(scale_));
  NoGradGuard no_grad;
  const std::vector<Tensor>& params = optimizer.parameters();
  std::vector<detail::GradGroup> groups =
      detail::group_grads_by_device("amp::GradScaler::unscale_", params);
  // As PyTorch: a float16 gradient has lost what the scale kept (its parameter should be a
  // float32 master weight, with autocast computing in float16).
  for (auto& g : groups)
    for (size_t i = 0; i < g.grads.size(); ++i)
      GALLEY_CHECK(g.grads[i].dtype() != DType::Float16, "amp::GradScaler::unscale_: parameter ",
                   g.param[i], " of ", optimizer.name(), " (shape ",
                   shape_str(params[g.param[i]].shape()),
                   ") has a float16 gradient; keep the parameters float32 and compute in float16 "
                   "under amp::Autocast");
  // Every device's check is queued before any is read, so GPUs work side by side; the largest
  // magnitude is NaN or infinite exactly when an element is.
  std::vector<Tensor> largest;
  for (auto& g : groups) largest.push_back(detail::grad_norm(g.device, g.spans, INFINITY));
  for (auto& g : groups) detail::scale_grads(g, inv_scale);
  bool found = false;
  // Non-finite before unscaling (what PyTorch checks) or after: a gradient whose largest
  // magnitude is finite can still overflow when a scale that backed off far is divided out, and
  // that step is skipped too (PyTorch would step with the infinite gradient).
  for (auto& m : largest) found = found || !std::isfinite(m.item() * inv_scale);
  st.found_inf = found;
  st.checked = !groups.empty();
  st.stage = Stage::Unscaled;
}

bool GradScaler::step(optim::Optimizer& optimizer) {
  if (!options_.enabled) {
    optimizer.step();
    last_skipped_ = false;
    return true;
  }
  PerOptimizer& st = state_of(optimizer);
  GALLEY_CHECK(st.stage != Stage::Stepped, "amp::GradScaler::step: already called on this ",
               "optimizer (", optimizer.name(), ") since the last update()");
  if (st.stage == Stage::Ready) unscale_(optimizer);
  GALLEY_CHECK(st.checked, "amp::GradScaler::step: no parameter of ", optimizer.name(),
               " has a gradient to check; run backward from scale(loss) first");
  last_skipped_ = st.found_inf;
  if (!st.found_inf) optimizer.step();
  st.stage = Stage::Stepped;
  return !last_skipped_;
}

void GradScaler::update() {
  if (!options_.enabled) return;
  // Only optimizers whose gradients were checked count (as PyTorch's found_inf_per_device): a
  // step that failed, or an unscale_ of an optimizer without gradients, checked nothing.
  bool checked = false, found = false;
  for (auto& [opt, st] : per_optimizer_) {
    checked = checked || st.checked;
    found = found || (st.checked && st.found_inf);
  }
  GALLEY_CHECK(checked, "amp::GradScaler::update: no gradients were checked since the last ",
               "update(); call unscale_(optimizer) or step(optimizer) after a backward first");
  // PyTorch's _amp_update_scale_: the float32 scale times a double factor, rounded to float32.
  if (found) {
    scale_ = static_cast<float>(static_cast<double>(scale_) * options_.backoff_factor);
    growth_tracker_ = 0;
  } else if (growth_tracker_ + 1 == options_.growth_interval) {
    const float grown = static_cast<float>(static_cast<double>(scale_) * options_.growth_factor);
    if (std::isfinite(grown)) scale_ = grown;
    growth_tracker_ = 0;
  } else {
    ++growth_tracker_;
  }
  per_optimizer_.clear();
}

void GradScaler::update(double new_scale) {
  if (!options_.enabled) return;
  const float as_float = static_cast<float>(new_scale);
  GALLEY_CHECK(std::isfinite(as_float) && as_float > 0, "amp::GradScaler::update: new_scale ",
               new_scale, " must be finite and > 0 as a float32");
  scale_ = as_float;
  per_optimizer_.clear();
}

double GradScaler::get_scale() const {
  return options_.enabled ? static_cast<double>(scale_) : 1.0;
}

StateDict GradScaler::state_dict() const {
  StateDict s;
  if (!options_.enabled) return s;
  s.set("scale", static_cast<double>(scale_));
  s.set("growth_factor", options_.growth_factor);
  s.set("backoff_factor", options_.backoff_factor);
  s.set("growth_interval", options_.growth_interval);
  s.set("_growth_tracker", growth_tracker_);
  return s;
}

void GradScaler::load_state_dict(const StateDict& state) {
  if (!options_.enabled) return;
  GALLEY_CHECK(!state.values.empty(), "amp::GradScaler::load_state_dict: the state is empty, ",
               "possibly because it was saved from a disabled GradScaler");
  const std::string owner = "amp::GradScaler";
  GradScalerOptions o = options_;
  const double scale = state.get_double("scale", owner);
  o.growth_factor = state.get_double("growth_factor", owner);
  o.backoff_factor = state.get_double("backoff_factor", owner);
  o.growth_interval = state.get_int("growth_interval", owner);
  const int64_t tracker = state.get_int("_growth_tracker", owner);
  o.init_scale = scale;
  GradScaler checked(o);  // validates every value before anything changes
  GALLEY_CHECK(tracker >= 0 && tracker < o.growth_interval, owner, ": _growth_tracker ", tracker,
               " must be in [0, growth_interval ", o.growth_interval, ")");
  options_.growth_factor = o.growth_factor;
  options_.backoff_factor = o.backoff_factor;
  options_.growth_interval = o.growth_interval;
  scale_ = static_cast<float>(scale);
  growth_tracker_ = tracker;
}

}  // namespace galley::amp
