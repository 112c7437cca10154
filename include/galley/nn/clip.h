#pragma once
/// \file Gradient clipping (PyTorch's torch.nn.utils.clip_grad_norm_ and clip_grad_value_).
///
///     loss.backward();
///     float norm = nn::clip_grad_norm_(model.parameters(), /*max_norm=*/1.0);
///     optimizer.step();
///
/// Each works on all the gradients of a device at once: one reduction pass over every gradient
/// for the norm and one pass that scales (or clamps) them all, never one op per tensor.
/// Parameters without a gradient are skipped. Parameters are grouped by their gradient's device
/// and each device is clipped on its own: a DataParallel model's parameters() lists every
/// replica's, whose gradients are equal after the all-reduce, so every replica computes the same
/// norm (the reduction's order depends on the sizes alone) and applies the same scale, and the
/// replicas stay equal. (A model split across devices, with different parameters on each, would
/// need one norm over all of them: that is not what these functions compute.)
#include <vector>

#include "galley/tensor.h"

namespace galley::nn {

/// Options of clip_grad_norm_.
struct ClipGradNormOptions {
  /// The p of the norm: any p > 0, or INFINITY for the largest absolute value.
  double norm_type = 2.0;
  /// When the total norm is NaN or infinite, raise a galley::Error (naming the first parameter
  /// with a non-finite gradient) and leave every gradient unchanged. PyTorch's default is false
  /// (documented there as due to become true); galley's is true, so a diverging step stops with
  /// a message instead of turning every weight into NaN. With false, a NaN norm scales every
  /// gradient by NaN, exactly as PyTorch does (the caller may test the returned norm). Under
  /// loss scaling pass false: amp::GradScaler's overflow steps have an infinite norm, which its
  /// step() skips (docs/mixed_precision.md).
  bool error_if_nonfinite = true;
};

/// Scales the gradients so that their total norm (of all gradients taken as one vector) is at
/// most `max_norm`: with total = that norm, every gradient is multiplied by
/// max_norm / (total + 1e-6) when that is below 1 (PyTorch's formula, in float32), and left as
/// it is otherwise. Returns the total norm before clipping, as float32 (0 when no parameter has a
/// gradient), of the first device's gradients (every device's, for DataParallel). Gradients must
/// be contiguous float32, bfloat16 or float16 (mixed dtypes are fine): 16-bit elements are
/// widened and the norm accumulated in double, and a scaled gradient is rounded to its dtype
/// once; `max_norm` must be >= 0. On a GPU the norm is read back: the host waits
/// for the device once per call (as loss.item() does), so a CUDA graph capture cannot contain
/// it.
float clip_grad_norm_(const std::vector<Tensor>& parameters, double max_norm,
                      const ClipGradNormOptions& options);
/// Same with the norm's p (2: the Euclidean norm) and the other options at their defaults.
float clip_grad_norm_(const std::vector<Tensor>& parameters, double max_norm,
                      double norm_type = 2.0);

/// Clamps every gradient element into [-clip_value, clip_value] (NaN stays NaN, as in
/// torch.clamp), in one pass per device; nothing is read back. `clip_value` must be >= 0.
void clip_grad_value_(const std::vector<Tensor>& parameters, double clip_value);

}  // namespace galley::nn
