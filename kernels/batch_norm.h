#pragma once
// Batch normalisation over the channels of x laid out [outer, channels, inner] ([N, C] or
// [N, C, *] with N the outer and the spatial positions the inner dimension). x, y and the
// gradients of x are float32, bfloat16 or float16 (computed in float32; any other dtype throws
// galley::Error naming the op); the per-channel arrays (statistics, weight, bias and their
// gradients) are float32. Every per-channel sum is split into blocks by a rule that depends on
// the shape alone and the blocks are combined in a fixed order, so the results have the same
// bits at every run, whatever the thread count (CPU) or the GPU. The CUDA launchers take device
// pointers and the cudaStream_t to run on; they only enqueue.
#include <cstdint>

#include "galley/dtype.h"

namespace galley::kernels {

// x as [outer, channels, inner].
struct BatchNormGeometry {
  int64_t outer = 1;
  int64_t channels = 1;
  int64_t inner = 1;
};

// The per-channel update of the running statistics after batch_norm_stats:
// running_mean = (1 - momentum) running_mean + momentum mean and the same for running_var with
// the unbiased batch variance (var * n / (n - 1), n = outer * inner). Null pointers: no update.
struct BatchNormRunning {
  float* mean = nullptr;
  float* var = nullptr;
  float momentum = 0.1f;
};

// The per-channel arrays the normalisation reads: mean and biased var (batch or running
// statistics), eps, and weight and bias (null: 1 and 0).
struct BatchNormParams {
  const float* mean = nullptr;
  const float* var = nullptr;
  float eps = 1e-5f;
  const float* weight = nullptr;
  const float* bias = nullptr;
};

namespace cpu {

// mean[c] and biased var[c] of channel c over outer and inner, in one pass of shifted sums
// accumulated in double; then the running update when `running.mean` is set.
void batch_norm_stats(DType dtype, const void* x, BatchNormGeometry g, BatchNormRunning running,
                      float* mean, float* var);
// y = (x - mean[c]) / sqrt(var[c] + eps) * weight[c] + bias[c]; plus residual (x's shape and
// dtype) when given, added to the normalised value rounded to the dtype (the bits of
// batch_norm then add_); then max(y, 0) when `relu`.
void batch_norm_forward(DType dtype, const void* x, BatchNormGeometry g, BatchNormParams p,
                        bool relu, void* y, const void* residual = nullptr);
// batch_norm_stats, then batch_norm_forward with the batch's statistics (p's mean and var are
// ignored: mean and var receive the statistics and normalise), the same bits as the two calls;
// long planes go a channel at a time, normalised while the channel is still in cache.
void batch_norm_train_forward(DType dtype, const void* x, BatchNormGeometry g,
                              BatchNormRunning running, float* mean, float* var, BatchNormParams p,
                              bool relu, void* y, const void* residual = nullptr);
// The backward of batch_norm_forward for the incoming gradient gy, masked by y > 0 when y is
// given (the forward had relu; p is the forward's, bias included; without a residual, the
// float32 host kernel recomputes the mask from x with the forward's affine, the same bits,
// instead of reading y). gweight[c] = sum(gy xhat) and gbias[c] = sum(gy) (either may be null,
// except that both are needed for gx in training); gx (may be null) is, with batch statistics
// (`training`), the full backward through the mean and variance, else gy * weight /
// sqrt(var + eps). `residual_added`: the forward added a residual, so the mask comes from y;
// gresidual (may be null) receives the residual's gradient, gy masked.
void batch_norm_backward(DType dtype, const void* gy, const void* x, const void* y,
                         BatchNormGeometry g, BatchNormParams p, bool training, void* gx,
                         float* gweight, float* gbias, bool residual_added = false,
                         void* gresidual = nullptr);
// True where batch_norm_backward takes a fused ReLU's mask from x and the forward's affine (the
// bias included) rather than from y: float32 planes of more than one element, no residual.
inline bool batch_norm_relu_mask_from_x(DType dtype, const BatchNormGeometry& g,
                                        bool residual_added) {
  return dtype == DType::Float32 && g.inner > 1 && !residual_added;
}

}  // namespace cpu

namespace cuda {

void batch_norm_stats(DType dtype, const void* x, BatchNormGeometry g, BatchNormRunning running,
                      float* mean, float* var, void* stream);
void batch_norm_forward(DType dtype, const void* x, BatchNormGeometry g, BatchNormParams p,
                        bool relu, void* y, const void* residual, void* stream);
void batch_norm_backward(DType dtype, const void* gy, const void* x, const void* y,
                         BatchNormGeometry g, BatchNormParams p, bool training, void* gx,
                         float* gweight, float* gbias, void* gresidual, void* stream);
// *counter += 1 (a layer's num_batches_tracked, kept on its device).
void batch_norm_count(int64_t* counter, void* stream);

// cuDNN's batch normalisation in float32 on `device` (cudnnBatchNormalizationForwardTraining
// and cudnnBatchNormalizationBackward, spatial mode, or CUDNN_BATCHNORM_SPATIAL_PERSISTENT when
// `persistent`): the reference galley's kernels above are checked and timed against, on no op's
// path. Training forward: y with the batch's statistics, the running update when running.mean
// is set (unbiased variance, as above), and what cuDNN keeps for its backward: the batch mean
// and 1 / sqrt(var + eps). The backward takes those and writes gx, gweight and gbias. weight
// and bias are required.
void batch_norm_cudnn_train_forward(int device, const float* x, BatchNormGeometry g,
                                    BatchNormRunning running, const float* weight,
                                    const float* bias, float eps, float* y, float* save_mean,
                                    float* save_invstd, bool persistent, void* stream);
void batch_norm_cudnn_backward(int device, const float* gy, const float* x, BatchNormGeometry g,
                               const float* weight, float eps, const float* save_mean,
                               const float* save_invstd, float* gx, float* gweight, float* gbias,
                               bool persistent, void* stream);
// Whether cuDNN flagged a numerical overflow in this thread's persistent-mode calls on `device`
// since the last query (cudnnQueryRuntimeError, which waits for them): that mode sums NCHW data
// in a way that may overflow, and says so only here.
bool batch_norm_cudnn_overflowed(int device);

}  // namespace cuda
}  // namespace galley::kernels
