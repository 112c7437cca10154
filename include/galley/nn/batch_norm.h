#pragma once
/// \file Batch normalisation layers: BatchNorm1D over [N, C] or [N, C, L], BatchNorm2D over
/// [N, C, H, W], with PyTorch's state_dict names.
#include <optional>
#include <string>

#include "galley/nn/layer.h"
#include "galley/ops.h"

namespace galley::nn {

/// Options of the batch normalisation layers; they mirror PyTorch's.
struct BatchNormLayerOptions {
  /// Added to the variance before its square root.
  double eps = 1e-5;
  /// Weight of each batch in the running statistics; nullopt: their cumulative average
  /// (momentum 1 / num_batches_tracked, which reads the counter on the host: on a GPU that waits
  /// for the device once a training step).
  std::optional<double> momentum = 0.1;
  /// A learned per-channel weight (initialised to 1) and bias (to 0).
  bool affine = true;
  /// Keep running statistics for evaluation; without them the batch statistics are used in
  /// both modes.
  bool track_running_stats = true;
  /// max(y, 0) after the normalisation (and after the residual, given one), fused into the same
  /// pass.
  bool relu = false;
};

/// Batch normalisation over the channels (dimension 1) of its input. State under PyTorch's
/// names: parameters "weight" and "bias" (with affine), buffers "running_mean", "running_var"
/// (zeros and ones) and "num_batches_tracked" (int64, +1 at every training forward) with
/// track_running_stats. The running statistics stay float32 when the layer is converted to a
/// 16-bit dtype (PyTorch converts them too): a 16-bit running average would stop moving once the
/// batch's share falls below half an ulp. The weight and bias follow the conversion; float32
/// ones also serve 16-bit inputs (master weights).
class BatchNorm : public Layer {
 public:
  /// Takes inputs of rank min_rank..max_rank ([N, C] or [N, C, L] for BatchNorm1D, [N, C, H, W]
  /// for BatchNorm2D); `kind` names the layer in messages.
  BatchNorm(const char* kind, int64_t num_features, BatchNormLayerOptions options, int min_rank,
            int max_rank);
  Tensor forward(const Tensor& x) override;
  /// `bn(x, residual)`: the normalisation of x plus the residual (x's shape), with the layer's
  /// ReLU after the sum: a residual block's tail in one pass (batch_norm_add).
  Tensor forward(const std::vector<Tensor>& inputs) override;
  std::string repr() const override;

  /// The weight parameter (undefined without affine).
  Tensor& weight() { return weight_; }
  /// The bias parameter (undefined without affine).
  Tensor& bias() { return bias_; }
  /// The running mean (undefined without track_running_stats).
  Tensor& running_mean() { return running_mean_; }
  /// The running variance (undefined without track_running_stats).
  Tensor& running_var() { return running_var_; }
  /// Training forwards seen (int64 scalar; undefined without track_running_stats).
  Tensor& num_batches_tracked() { return num_batches_tracked_; }

 private:
  const char* kind_;
  int64_t features_;
  BatchNormLayerOptions opt_;
  Tensor normalize(const Tensor& x, const Tensor& residual);
  int min_rank_, max_rank_;
  Tensor weight_, bias_, running_mean_, running_var_, num_batches_tracked_;
};

/// PyTorch's BatchNorm1d: input [N, C] or [N, C, L].
class BatchNorm1D : public BatchNorm {
 public:
  /// `num_features` is C.
  explicit BatchNorm1D(int64_t num_features, BatchNormLayerOptions options = {})
      : BatchNorm("BatchNorm1D", num_features, options, 2, 3) {}
};

/// PyTorch's BatchNorm2d: input [N, C, H, W].
class BatchNorm2D : public BatchNorm {
 public:
  /// `channels` is C.
  explicit BatchNorm2D(int64_t channels, BatchNormLayerOptions options = {})
      : BatchNorm("BatchNorm2D", channels, options, 4, 4) {}
};

}  // namespace galley::nn
