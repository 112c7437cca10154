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

/// Geometry of a 2-D average pooling; stride 0 means "equal to the kernel". As PyTorch's
/// avg_pool2d (no divisor_override): padding at most half the kernel; with ceil_mode the last
/// window may hang over the edge, but starts inside the input or the left padding.
struct AvgPool2dOptions {
  int64_t kernel_size = 2;
  int64_t stride = 0;
  int64_t padding = 0;
  /// Divide by the whole window, padding included (clipped at the padded edge), as PyTorch's
  /// default; false: by the number of input elements in the window.
  bool count_include_pad = true;
  /// Round the output size up instead of down.
  bool ceil_mode = false;
};
/// Mean over kernel windows of x [N, C, H, W] (float32, bfloat16 or float16, computed in
/// float32), in x's dtype.
Tensor avg_pool2d(const Tensor& x, const AvgPool2dOptions& options);
/// Mean over adaptive windows of x [N, C, H, W] giving [N, C, oh, ow] for output_size {oh, ow}:
/// output row i averages input rows floor(i * H / oh) to ceil((i + 1) * H / oh) (exclusive),
/// columns likewise, as PyTorch's adaptive_avg_pool2d. {1, 1} is global average pooling.
Tensor adaptive_avg_pool2d(const Tensor& x, const Shape& output_size);

/// Inverted dropout: while `training`, each element of x is zeroed with probability p and the
/// others are scaled by 1 / (1 - p) (p == 1: every element times 0); not training, or p == 0,
/// returns x itself. The mask is a counter-based function (Philox-4x32-10) of one 64-bit key
/// drawn from `gen` per call and the element's index, so the same generator state gives the
/// same mask on the CPU and on a GPU, in every dtype. Backward keeps the mask as one byte per
/// element on x's device. As PyTorch, NaN and infinity stay so where dropped (x * 0). Training
/// mode inside a CUDA graph capture is an error (the key is drawn on the host, so every replay
/// would repeat the captured mask).
Tensor dropout(const Tensor& x, float p, bool training = true,
               Generator& gen = default_generator());

/// Threads the CPU kernels may use (default: GALLEY_NUM_THREADS, else the cores of the process's
/// affinity mask, capped by a cgroup CPU quota).
void set_num_threads(int n);
/// Threads the CPU kernels use now.
int num_threads();

}  // namespace galley
