#pragma once
/// \file Fully connected layer.
#include "galley/nn/layer.h"

namespace galley::nn {

/// y = x W^T + b with weight [out, in] and bias [out], initialised as in PyTorch.
class Linear : public Layer {
 public:
  /// Initialises the parameters from the default generator.
  Linear(int64_t in_features, int64_t out_features, bool bias = true);
  /// The input's last dimension must be in_features.
  Tensor forward(const Tensor& x) override;
  std::string repr() const override;

  /// The weight parameter.
  Tensor& weight() { return weight_; }
  /// The bias parameter (undefined without bias).
  Tensor& bias() { return bias_; }

 private:
  int64_t in_, out_;
  Tensor weight_, bias_;
};

}  // namespace galley::nn
