#pragma once
/// \file Functional ops. Each checks its arguments, dispatches on the device of its inputs
/// to a CPU or CUDA kernel, and records itself for autograd.
#include <cstdint>
#include <optional>

#include "galley/tensor.h"

namespace galley {

/// Elementwise a + b with NumPy broadcasting.
Tensor add(const Tensor& a, const Tensor& b);
/// Elementwise a - b with broadcasting.
Tensor sub(const Tensor& a, const Tensor& b);
/// Elementwise a * b with broadcasting.
Tensor mul(const Tensor& a, const Tensor& b);
/// Elementwise a / b with broadcasting.
Tensor div(const Tensor& a, const Tensor& b);
/// a + s.
Tensor add(const Tensor& a, float s);
/// a * s.
Tensor mul(const Tensor& a, float s);
/// -a.
Tensor neg(const Tensor& a);
/// e^a.
Tensor exp(const Tensor& a);
/// Natural log of a.
Tensor log(const Tensor& a);
/// a^p elementwise.
Tensor pow(const Tensor& a, float p);
/// max(a, 0); NaN stays NaN.
Tensor relu(const Tensor& a);
/// max(a, 0) on a temporary: when nothing else holds its data, the result reuses its buffer.
Tensor relu(Tensor&& a);
/// relu(x + bias) in one pass over memory, with bias [x.size(dim)] broadcast along dimension
/// `dim` (1: the channels of [N, C, H, W]; -1: the features of a linear layer's output).
/// Backward masks the gradient and sums the bias gradient in one pass as well.
Tensor bias_relu(const Tensor& x, const Tensor& bias, int64_t dim = 1);

// The activations: computed in float32 for every floating dtype, with PyTorch's formulas and
// operation order. A NaN input gives a NaN output; finite inputs of any size give no NaN,
// forward or backward.

/// How gelu computes the Gaussian CDF: exactly (erf) or with PyTorch's tanh approximation
/// (`approximate='none'` / `'tanh'`).
enum class GeluApproximate { None, Tanh };
/// x * Phi(x): 0.5 x (1 + erf(x / sqrt 2)), or with Tanh
/// 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))). Backward keeps the input.
Tensor gelu(const Tensor& x, GeluApproximate approximate = GeluApproximate::None);
/// x * sigmoid(x) (also called swish). Backward keeps the input.
Tensor silu(const Tensor& x);
/// 1 / (1 + e^-x): 0 and 1 at the extremes. Backward keeps the output: grad * y (1 - y).
Tensor sigmoid(const Tensor& x);
/// tanh x. Backward keeps the output: grad * (1 - y^2).
Tensor tanh(const Tensor& x);
/// x > 0 ? x : negative_slope * x (finite slope). Backward keeps the input; its gradient at
/// x == 0 is the slope, as in PyTorch.
Tensor leaky_relu(const Tensor& x, float negative_slope = 0.01f);

inline Tensor operator+(const Tensor& a, const Tensor& b) {
  return add(a, b);
}
inline Tensor operator-(const Tensor& a, const Tensor& b) {
  return sub(a, b);
}
inline Tensor operator*(const Tensor& a, const Tensor& b) {
  return mul(a, b);
}
inline Tensor operator/(const Tensor& a, const Tensor& b) {
  return div(a, b);
}
inline Tensor operator+(const Tensor& a, float s) {
  return add(a, s);
}
inline Tensor operator+(float s, const Tensor& a) {
  return add(a, s);
}
inline Tensor operator-(const Tensor& a, float s) {
  return add(a, -s);
}
inline Tensor operator-(float s, const Tensor& a) {
  return add(neg(a), s);
}
inline Tensor operator*(const Tensor& a, float s) {
  return mul(a, s);
}
inline Tensor operator*(float s, const Tensor& a) {
  return mul(a, s);
}
inline Tensor operator/(const Tensor& a, float s) {
  return mul(a, 1.f / s);
}
inline Tensor operator-(const Tensor& a) {
  return neg(a);
}

/// Matrix product of 2-D tensors [m, k] x [k, n] -> [m, n].
Tensor matmul(const Tensor& a, const Tensor& b);
/// x [.., in] times weight [out, in] transposed, plus bias [out] when defined.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());

/// Geometry of a 2-D convolution.
struct Conv2dOptions {
  int64_t stride = 1;
  int64_t padding = 0;
  int64_t dilation = 1;
  int64_t groups = 1;
};
/// x [N, C, H, W] convolved with weight [O, C/groups, kH, kW], plus bias [O] when defined.
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(),
              const Conv2dOptions& options = {});

/// Geometry of a 2-D max pooling; stride 0 means "equal to the kernel".
struct MaxPool2dOptions {
  int64_t kernel_size = 2;
  int64_t stride = 0;
  int64_t padding = 0;
};
/// Max over kernel windows of x [N, C, H, W].
Tensor max_pool2d(const Tensor& x, const MaxPool2dOptions& options);

/// Merges dimensions start_axis..end_axis into one.
Tensor flatten(const Tensor& x, int64_t start_axis = 0, int64_t end_axis = -1);
/// Same data with a new shape.
Tensor reshape(const Tensor& x, const Shape& shape);

/// Sum of every element (a scalar).
Tensor sum(const Tensor& x);
/// Sum along `dim`.
Tensor sum(const Tensor& x, int64_t dim, bool keepdim = false);
/// Mean of every element.
Tensor mean(const Tensor& x);
/// Mean along `dim`.
Tensor mean(const Tensor& x, int64_t dim, bool keepdim = false);
/// Softmax along `dim`.
Tensor softmax(const Tensor& x, int64_t dim = -1);
/// Log-softmax along `dim`.
Tensor log_softmax(const Tensor& x, int64_t dim = -1);
/// Index of the largest element along `dim` (int64, no gradient).
Tensor argmax(const Tensor& x, int64_t dim = -1, bool keepdim = false);

/// How a loss reduces over the batch.
enum class Reduction { Mean, Sum, None };

/// Options of cross_entropy; they mirror PyTorch's.
struct CrossEntropyOptions {
  Reduction reduction = Reduction::Mean;
  float label_smoothing = 0.f;
  int64_t ignore_index = -100;
};
/// Softmax cross-entropy of logits [N, C] against int64 class labels [N], fused.
Tensor cross_entropy(const Tensor& logits, const Tensor& labels,
                     const CrossEntropyOptions& options = {});

/// Threads the CPU kernels may use (default: GALLEY_NUM_THREADS, else the cores of the process's
/// affinity mask, capped by a cgroup CPU quota).
void set_num_threads(int n);
/// Threads the CPU kernels use now.
int num_threads();

}  // namespace galley
