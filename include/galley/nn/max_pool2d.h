#pragma once
/// \file 2-D max pooling layer.
#include "galley/nn/layer.h"
#include "galley/ops.h"

namespace galley::nn {

/// Max pooling over [N, C, H, W]; stride defaults to the kernel size.
class MaxPool2D : public Layer {
 public:
  /// A square window of `kernel_size`, `stride` (0: equal to the kernel) and `padding`.
  explicit MaxPool2D(int64_t kernel_size, int64_t stride = 0, int64_t padding = 0);
  Tensor forward(const Tensor& x) override;
  std::string repr() const override;

 private:
  MaxPool2dOptions opt_;
};

}  // namespace galley::nn
