// Gradient clipping: the gradients grouped by device, one fused reduction and one fused scaling
// (or clamping) pass per device, dispatched to kernels/cpu/clip.cpp or kernels/cuda/clip.cu.
// Gradients may be float32, bfloat16 or float16 (mixed too): norms accumulate in double.
#include "galley/nn/clip.h"

#include <algorithm>
#include <cmath>

#include "galley/half.h"
#include "kernels/clip.h"
#include "src/nn/grad_groups.h"
#include "src/ops/dispatch.h"
#include "src/ops/nonfinite.h"

namespace galley::nn {

namespace {

[[noreturn]] void nonfinite_error(const detail::GradGroup& group, float total, double norm_type) {
  // An error path: finding the culprit may read every gradient back.
  std::string culprit;
  for (size_t k = 0; k < group.grads.size() && culprit.empty(); ++k) {
    if (detail::first_nonfinite(group.grads[k]) >= 0)
      culprit = detail::str_cat("; the first parameter with a non-finite gradient is number ",
                                group.param[k], " of the list (shape ",
                                shape_str(group.grads[k].shape()), ")");
  }
  throw Error(detail::str_cat("clip_grad_norm_: the total norm of order ", norm_type,
                              " of the gradients on ", group.device.str(), " is ",
                              std::isnan(total) ? "nan" : detail::str_cat(total), culprit,
                              ". No gradient was changed; pass {.error_if_nonfinite = false} to "
                              "scale them by the non-finite norm anyway, as PyTorch does by "
                              "default (under loss scaling, so that amp::GradScaler's step skips "
                              "the step)"));
}

// Clamps the group's gradients in place (each counts a write, as detail::scale_grads').
void clamp_grads(const detail::GradGroup& group, float clip) {
  for (const Tensor& g : group.grads) g.bump_version();
  const auto& spans = group.spans;
  if (group.device.is_cpu())
    return kernels::cpu::clamp_grads(spans.data(), int(spans.size()), clip);
  kernels::cuda::clamp_grads(spans.data(), int(spans.size()), clip, detail::stream(group.device));
}

}  // namespace

float clip_grad_norm_(const std::vector<Tensor>& parameters, double max_norm,
                      const ClipGradNormOptions& options) {
  GALLEY_CHECK(max_norm >= 0, "clip_grad_norm_: max_norm ", max_norm, " must be >= 0");
  GALLEY_CHECK(options.norm_type > 0, "clip_grad_norm_: norm_type ", options.norm_type,
               " must be positive (or INFINITY)");
  std::vector<detail::GradGroup> groups =
      detail::group_grads_by_device("clip_grad_norm_", parameters);
  if (groups.empty()) return 0.f;
  NoGradGuard no_grad;
  // Every device's reduction is queued before any is read back, so GPUs work side by side.
  std::vector<Tensor> norms;
  for (auto& g : groups) {
    norms.push_back(detail::grad_norm(g.device, g.spans, options.norm_type));
  }
  std::vector<float> totals;
  for (auto& n : norms) totals.push_back(n.item());
  if (options.error_if_nonfinite)
    for (size_t k = 0; k < groups.size(); ++k)
      if (!std::isfinite(totals[k])) nonfinite_error(groups[k], totals[k], options.norm_type);
  for (size_t k = 0; k < groups.size(); ++k) {
    // PyTorch: clip_coef = max_norm / (total_norm + 1e-6), a float32 tensor divided into a
    // Python float, which Tensor.__rtruediv__ computes as reciprocal() * max_norm; then clamped
    // to at most 1 and multiplied in. A coefficient of 1 changes nothing, so it is skipped.
    const float coef = (1.f / (totals[k] + 1e-6f)) * static_cast<float>(max_norm);
    if (coef >= 1.f) continue;  // NaN scales, as in PyTorch
    detail::scale_grads(groups[k], coef);
  }
  return totals[0];
}

float clip_grad_norm_(const std::vector<Tensor>& parameters, double max_norm, double norm_type) {
  return clip_grad_norm_(parameters, max_norm, ClipGradNormOptions{.norm_type = norm_type});
}

void clip_grad_value_(const std::vector<Tensor>& parameters, double clip_value) {
  GALLEY_CHECK(clip_value >= 0, "clip_grad_value_: clip_value ", clip_value, " must be >= 0");
  NoGradGuard no_grad;
  for (auto& g : detail::group_grads_by_device("clip_grad_value_", parameters))
    clamp_grads(g, static_cast<float>(clip_value));
}

}  // namespace galley::nn
