#pragma once
/// \file Fully connected layer.
#include "galley/nn/layer.h"

namespace galley::nn {

/// Options of Linear beyond the feature counts.
struct LinearOptions {
  bool bias = true;
  /// A ReLU after the bias, fused with it into one pass: the layer returns relu(x W^T + b).
  bool relu = false;
};

/// y = x W^T + b with weight [out, in] and bias [out], initialised as in PyTorch.
class Linear : public Layer {
 public:
  /// Initialises the parameters from the default generator.
  Linear(int64_t in_features, int64_t out_features, bool bias = true);
  /// With options (bias, fused ReLU).
  Linear(int64_t in_features, int64_t out_features, LinearOptions options);
  /// The input's last dimension must be in_features.
  Tensor forward(const Tensor& x) override;
  std::string repr() const override;

  /// The weight parameter.
  Tensor& weight() { return weight_; }
  /// The bias parameter (undefined without bias).
  Tensor& bias() { return bias_; }

 private:
  int64_t in_, out_;
  bool relu_ = false;
  Tensor weight_, bias_;
};

}  // namespace galley::nn
