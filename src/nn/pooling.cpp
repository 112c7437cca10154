// The average pooling layers: AvgPool2D and AdaptiveAvgPool2D.
#include "galley/nn/pooling.h"

namespace galley::nn {

AvgPool2D::AvgPool2D(int64_t kernel_size, int64_t stride, int64_t padding)
    : AvgPool2D(
          AvgPool2dOptions{.kernel_size = kernel_size, .stride = stride, .padding = padding}) {}

AvgPool2D::AvgPool2D(const AvgPool2dOptions& options) : opt_(options) {
  if (opt_.stride == 0) opt_.stride = opt_.kernel_size;
  GALLEY_CHECK(opt_.kernel_size > 0 && opt_.stride > 0 && opt_.padding >= 0 &&
                   opt_.padding <= opt_.kernel_size / 2,
               "AvgPool2D: kernel ", opt_.kernel_size, ", stride ", opt_.stride, ", padding ",
               opt_.padding, " are invalid (padding at most half the kernel)");
}

Tensor AvgPool2D::forward(const Tensor& x) {
  try {
    return avg_pool2d(x, opt_);
  } catch (...) {
    detail::rethrow_with_prefix(repr() + ": ");
  }
}

std::string AvgPool2D::repr() const {
  return detail::str_cat("AvgPool2D(kernel=", opt_.kernel_size, ", stride=", opt_.stride,
                         ", padding=", opt_.padding,
                         opt_.count_include_pad ? "" : ", count_include_pad=false",
                         opt_.ceil_mode ? ", ceil_mode=true" : "", ")");
}

AdaptiveAvgPool2D::AdaptiveAvgPool2D(int64_t output_size)
    : AdaptiveAvgPool2D(output_size, output_size) {}

AdaptiveAvgPool2D::AdaptiveAvgPool2D(int64_t output_h, int64_t output_w)
    : size_{output_h, output_w} {
  GALLEY_CHECK(output_h > 0 && output_w > 0, "AdaptiveAvgPool2D: output size ", output_h, "x",
               output_w, " must be positive");
}

Tensor AdaptiveAvgPool2D::forward(const Tensor& x) {
  try {
    return adaptive_avg_pool2d(x, size_);
  } catch (...) {
    detail::rethrow_with_prefix(repr() + ": ");
  }
}

std::string AdaptiveAvgPool2D::repr() const {
  return detail::str_cat("AdaptiveAvgPool2D(", size_[0], ", ", size_[1], ")");
}

}  // namespace galley::nn
