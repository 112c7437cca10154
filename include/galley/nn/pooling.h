#pragma once
/// \file Average pooling layers: fixed windows and adaptive (output-sized) windows.
#include <string>

#include "galley/nn/layer.h"
#include "galley/ops.h"

namespace galley::nn {

/// Average pooling over [N, C, H, W] (PyTorch's AvgPool2d); stride defaults to the kernel size.
class AvgPool2D : public Layer {
 public:
  /// A square window of `kernel_size`, `stride` (0: equal to the kernel) and `padding`, the
  /// divisor counting the padding (PyTorch's default).
  explicit AvgPool2D(int64_t kernel_size, int64_t stride = 0, int64_t padding = 0);
  /// Every option of avg_pool2d (count_include_pad, ceil_mode).
  explicit AvgPool2D(const AvgPool2dOptions& options);
  Tensor forward(const Tensor& x) override;
  std::string repr() const override;

 private:
  AvgPool2dOptions opt_;
};

/// Average pooling to a fixed output size (PyTorch's AdaptiveAvgPool2d); AdaptiveAvgPool2D(1)
/// is global average pooling.
class AdaptiveAvgPool2D : public Layer {
 public:
  /// A square output of `output_size` x `output_size`.
  explicit AdaptiveAvgPool2D(int64_t output_size);
  /// An output of `output_h` x `output_w`.
  AdaptiveAvgPool2D(int64_t output_h, int64_t output_w);
  Tensor forward(const Tensor& x) override;
  std::string repr() const override;

 private:
  Shape size_;
};

}  // namespace galley::nn
