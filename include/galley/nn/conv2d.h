#pragma once
/// \file 2-D convolution layer.
#include "galley/nn/layer.h"
#include "galley/ops.h"

namespace galley::nn {

/// Options of Conv2D beyond the channel counts and kernel size.
struct Conv2DOptions {
  int64_t stride = 1;
  int64_t padding = 0;
  int64_t dilation = 1;
  int64_t groups = 1;
  bool bias = true;
  /// A ReLU after the bias, fused with it into one pass over the output (forward and
  /// backward): the layer returns relu(conv(x) + b).
  bool relu = false;
};

/// Convolution over [N, C, H, W] with a square kernel; weight [out, in/groups, k, k], bias [out].
/// Initialised as PyTorch does: kaiming-uniform (a = sqrt(5)), bias uniform in +-1/sqrt(fan_in).
class Conv2D : public Layer {
 public:
  /// Checks the geometry and initialises the parameters from the default generator.
  Conv2D(int64_t in_channels, int64_t out_channels, int64_t kernel_size,
         Conv2DOptions options = {});
  /// Convolves; the input must be [N, in_channels, H, W].
  Tensor forward(const Tensor& x) override;
  std::string repr() const override;

  /// The weight parameter.
  Tensor& weight() { return weight_; }
  /// The bias parameter (undefined without bias).
  Tensor& bias() { return bias_; }

 private:
  int64_t in_, out_, k_;
  Conv2DOptions opt_;
  Tensor weight_, bias_;
};

}  // namespace galley::nn
