#pragma once
/// \file Functional ops. Each checks its arguments, dispatches on the device of its inputs
/// to a CPU or CUDA kernel, and records itself for autograd.
#include <cstdint>
#include <optional>
#include <vector>

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
/// a / s, a true division (as PyTorch's; not a product with 1 / s).
Tensor div(const Tensor& a, float s);
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
  return div(a, s);
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

/// Options of cross_entropy; they mirror PyTorch's, with one difference: a mean over no counted
/// rows (every label ignore_index, or no rows) is 0 with a zero gradient, where PyTorch's is NaN
/// (a batch of padding would otherwise make the step's loss, and a GradScaler, see an Inf/NaN).
struct CrossEntropyOptions {
  Reduction reduction = Reduction::Mean;
  float label_smoothing = 0.f;
  int64_t ignore_index = -100;
};
/// Softmax cross-entropy of logits [N, C] against int64 class labels [N], fused.
Tensor cross_entropy(const Tensor& logits, const Tensor& labels,
                     const CrossEntropyOptions& options = {});

// Joining, slicing and views. These ops move data without computing on it: they take every
// dtype (float32, bfloat16, float16, int64, uint8) on the CPU and CUDA, return their input's dtype,
// and record gradients of floating inputs. A view shares its input's storage (writing one shows
// in the other) and has its own shape, strides and offset; contiguous() makes a dense copy.

/// Joins tensors of one dtype and device along `dim` (negative counts from the end); they must
/// match in every other dimension (the error names the tensor's index and both shapes).
/// Backward hands each input its slab of the gradient. PyTorch's torch.cat, without its dtype
/// promotion: mixing dtypes is an error naming both.
Tensor cat(const std::vector<Tensor>& tensors, int64_t dim = 0);
/// Joins tensors of one shape along a new dimension `dim` (in [-rank - 1, rank]): the result has
/// shape [.., tensors.size(), ..]. Backward hands each input its index of the gradient.
/// PyTorch's torch.stack.
Tensor stack(const std::vector<Tensor>& tensors, int64_t dim = 0);
/// Views of consecutive pieces of `dim`, `split_size` long each (the last one shorter); a
/// dimension of size 0 gives one empty piece. PyTorch's torch.split with an int.
std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim = 0);
/// Views of consecutive pieces of `dim` of the given sizes, which must add up to its size; a size
/// of 0 gives an empty piece. PyTorch's torch.split with a list.
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& split_sizes,
                          int64_t dim = 0);
/// A view of x's elements start..start + length - 1 along `dim` (start may be negative). Its
/// backward writes the gradient into that slice of zeros. PyTorch's torch.narrow.
Tensor narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length);
/// A view of index `index` (negative counts from the end) of `dim`, without that dimension: x[i]
/// for dim 0. PyTorch's torch.select.
Tensor select(const Tensor& x, int64_t dim, int64_t index);
/// A view with dimensions dim0 and dim1 swapped (strides swapped, no copy). Backward swaps the
/// gradient back. PyTorch's torch.transpose.
Tensor transpose(const Tensor& x, int64_t dim0, int64_t dim1);
/// A view with the dimensions reordered: dimension i of the result is dimension dims[i] of x
/// (strides permuted, no copy). Backward applies the inverse order. PyTorch's torch.permute.
Tensor permute(const Tensor& x, const std::vector<int64_t>& dims);

/// a += b in place, with b broadcast to a's shape (a does not grow); one floating dtype, one
/// device. Returns a handle to `a`. Residual blocks use it to sum into a branch's output without
/// a new tensor: `out.add_(identity)`.
///
/// Autograd: when a or b requires a gradient (and no NoGradGuard is alive), the add is recorded
/// and `a` becomes its output (its previous history moves onto the recorded node), as in PyTorch.
/// A recorded add_ refuses, with an error:
/// - `a` a leaf that requires a gradient (a parameter: the same error as PyTorch's);
/// - anything but the caller's one handle referring to `a` or its data: another handle, an op
///   that took `a` as input (its graph would see the new history), a view of `a` or `a` itself a
///   view, or a copy an op kept for its backward.
/// An op's fresh output held by one variable (the residual case) passes. Every add_, recorded or
/// not, counts a write on a's data (Tensor::version()): a backward that reads data an unrecorded
/// add_ changed (one under NoGradGuard) is refused when it runs.
Tensor add_(const Tensor& a, const Tensor& b);
/// Options of batch_norm; they mirror PyTorch's F.batch_norm (plus a fused ReLU).
struct BatchNormOptions {
  /// Normalise with the batch statistics and update the running ones; else use the running
  /// statistics (which must then be given).
  bool training = false;
  /// Weight of the batch statistics in the running update.
  double momentum = 0.1;
  /// Added to the variance before its square root.
  double eps = 1e-5;
  /// max(y, 0) after the affine transform, in the same pass (and the mask in backward).
  bool relu = false;
};
/// Batch normalisation of x [N, C] or [N, C, *] over every dimension but the channels (dim 1):
/// y = (x - mean) / sqrt(var + eps) * weight + bias, as PyTorch's F.batch_norm. In training,
/// mean and var are the batch's (the biased variance), and running_mean / running_var, when
/// given, are updated in place: running = (1 - momentum) running + momentum batch, with the
/// unbiased batch variance for running_var. In evaluation (training false) the running
/// statistics normalise, and must be given (an error otherwise, as in PyTorch). The running
/// statistics are float32 [C] (also for a 16-bit x: they are accumulated over many steps);
/// weight and bias [C] (either may be undefined: 1 and 0) are in x's dtype or float32 (master
/// weights beside 16-bit activations), and get gradients in their own dtype. The result has x's
/// dtype; statistics and normalisation are computed in float32 with double accumulation.
Tensor batch_norm(const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                  const Tensor& weight, const Tensor& bias, const BatchNormOptions& options = {});
/// batch_norm(x, ...) + residual, then max(., 0) when options.relu: a residual block's tail
/// (normalise, add the shortcut, ReLU) in one pass over the data forward and one backward,
/// where batch_norm, add_ and relu take three (cuDNN's batch-norm-add-activation). residual has
/// x's shape, dtype and device; the result has the bits of the three ops in turn (the
/// normalised value rounded to the dtype before the sum), and so have the gradients, the
/// residual's being the incoming gradient masked by the ReLU.
Tensor batch_norm_add(const Tensor& x, const Tensor& residual, const Tensor& running_mean,
                      const Tensor& running_var, const Tensor& weight, const Tensor& bias,
                      const BatchNormOptions& options = {});
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
/// returns x itself. The mask is a counter-based function (Philox-4x32-10) of one 64-bit key drawn
/// from `gen` per call (by default default_generator(): inside a DataParallel replica's forward,
/// that replica's own stream) and the element's index, so the same generator state gives the same
/// mask on the CPU and on a GPU, in every dtype. Backward keeps the mask as one byte per element on
/// x's device. As PyTorch, NaN and infinity stay so where dropped (x * 0). Training mode inside a
/// CUDA graph capture is an error (the key is drawn on the host, so every replay would repeat the
/// captured mask).
Tensor dropout(const Tensor& x, float p, bool training = true,
               Generator& gen = default_generator());

/// Threads the CPU kernels may use (default: GALLEY_NUM_THREADS, else the cores of the process's
/// affinity mask, capped by a cgroup CPU quota).
void set_num_threads(int n);
/// Threads the CPU kernels use now.
int num_threads();

}  // namespace galley
