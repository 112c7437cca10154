#pragma once
// Elementwise, reduction, softmax, loss, pooling and optimizer kernels on CUDA: the GPU twins of
// kernels/cpu (same arguments, device pointers, plus the stream to run on). Declared without
// CUDA types so that the C++ op layer can call the launchers; `stream` is a cudaStream_t
// (null: the legacy default stream). Launchers only enqueue: they never synchronise.
#include <cstdint>

#include "galley/dtype.h"
#include "kernels/cpu/cross_entropy.h"
#include "kernels/cpu/max_pool2d.h"
#include "kernels/cpu/optimizer_update.h"

namespace galley::kernels::cuda {

// ----------------------------------------------------------------------------------------------
// launchers

// The elementwise launchers below (binary to relu_backward) take arrays of `dtype` float32,
// bfloat16 or float16, all of that one dtype, and compute in float32 (sum_to accumulates in
// float32 too); any other dtype throws galley::Error naming the op.
enum class Binary { Add, Sub, Mul, Div };
// out = a (op) b with NumPy broadcasting. Shapes are given as `rank` sizes each, already
// aligned to the output's rank (missing leading dimensions are 1); sizes of 1 broadcast.
void binary(Binary op, DType dtype, const void* a, const int64_t* a_shape, const void* b,
            const int64_t* b_shape, void* out, const int64_t* out_shape, int rank, void* stream);
// out = reduction of g (shape g_shape) to `shape` (aligned like binary): sums over broadcast dims.
void sum_to(DType dtype, const void* g, const int64_t* g_shape, void* out, const int64_t* shape,
            int rank, void* stream);
// sum_to's float32 case: reduce.cu's deterministic split reduction (sum_to calls it).
void sum_to_float32(const float* g, const int64_t* g_shape, float* out, const int64_t* shape,
                    int rank, void* stream);
// acc[i] += g[i]
void add_inplace(DType dtype, void* acc, const void* g, int64_t n, void* stream);

enum class Unary { Affine, Exp, Log, Pow, Relu };
// out = f(a): Affine a*p0+p1, Exp, Log, Pow a^p0, Relu (NaN stays NaN). out may equal a.
void unary(Unary op, DType dtype, const void* a, void* out, int64_t n, float p0, float p1,
           void* stream);
// out = grad * p * a^(p-1)
void pow_backward(DType dtype, const void* grad, const void* a, void* out, int64_t n, float p,
                  void* stream);
// out = out_fwd > 0 ? grad : 0. out may equal grad.
void relu_backward(DType dtype, const void* grad, const void* out_fwd, void* out, int64_t n,
                   void* stream);

// x viewed as [outer, len, inner]:
// out[o, i] = scale * sum_l x[o, l, i]
void sum_dim(const float* x, int64_t outer, int64_t len, int64_t inner, float scale, float* out,
             void* stream);
// out[0] = scale * sum of all n elements (accumulated in double, in an order set by n alone).
void sum_all(const float* x, int64_t n, float scale, float* out, void* stream);
// out[o, l, i] = g[o, i] * scale (outer = inner = 1 spreads g[0]: the backward of sum_all).
void expand_dim(const float* g, int64_t outer, int64_t len, int64_t inner, float scale, float* out,
                void* stream);
// out[o, i] = argmax_l x[o, l, i] (first of equal maxima; NaN wins)
void argmax_dim(const float* x, int64_t outer, int64_t len, int64_t inner, int64_t* out,
                void* stream);
// out[j] = sum over rows of g[i, j] (+ out[j] when accumulate) — bias gradients. Many rows are
// split across blocks, with partial sums added in a fixed order: the same bits at every run.
void column_sums(const float* g, int64_t rows, int64_t n, float* out, bool accumulate,
                 void* stream);
// out[r, j] = bias[j] for a rows x n matrix (seeding a GEMM that then adds into it).
void broadcast_rows(const float* bias, int64_t rows, int64_t n, float* out, void* stream);
// y[n, o, p] = bias[o] for a [N, O, P] tensor (seeding a convolution's output).
void broadcast_channels(const float* bias, int64_t n, int64_t o, int64_t p, float* out,
                        void* stream);

// Softmax / log-softmax along len of [outer, len, inner], forward and backward (as kernels/cpu).
void softmax_forward(const float* x, int64_t outer, int64_t len, int64_t inner, bool log, float* y,
                     void* stream);
void softmax_backward(const float* y, const float* gy, int64_t outer, int64_t len, int64_t inner,
                      bool log, float* gx, void* stream);

// Fused softmax cross-entropy, as kernels/cpu/cross_entropy.h, with the row count and the first
// bad row written to device scalars (count: int64, bad_row: int64, -1 when none). A bad row is
// also reported in `error_slot` (may be null) as {1, row, label, c} when its word 0 is clear:
// the host checks it at its next synchronisation, so no step waits for the labels' check.
void cross_entropy_forward(const float* logits, const int64_t* labels, int64_t n, int64_t c,
                           float eps, int64_t ignore_index, float* loss, float* prob,
                           int64_t* count, int64_t* bad_row, int64_t* error_slot, void* stream);
// row_scale is a device array of n floats.
void cross_entropy_backward(const float* prob, const int64_t* labels, const float* row_scale,
                            int64_t n, int64_t c, float eps, int64_t ignore_index, float* gx,
                            void* stream);
// out[i] = *scalar * factor for all i (mean/sum reductions' backward), divided by *count when
// `count` is not null (0 when *count is 0: the mean over no rows), all read on the device.
void fill_scaled(const float* scalar, float factor, const int64_t* count, float* out, int64_t n,
                 void* stream);

// Bias add and ReLU in one pass, as kernels/cpu/bias_relu.h. The bias gradient is summed in a
// fixed order (the same bits at every run), over a grid of channels x chunks.
void bias_relu_forward(const float* x, const float* b, int64_t outer, int64_t channels,
                       int64_t inner, float* y, void* stream);
void bias_relu_backward(const float* gy, const float* y, int64_t outer, int64_t channels,
                        int64_t inner, float* gx, float* gb, void* stream);

// Max pooling with winner indices, as kernels/cpu/max_pool2d.h.
void max_pool2d_forward(const cpu::Pool2dGeometry& g, const float* x, float* y, int32_t* idx,
                        void* stream);
void max_pool2d_backward(const cpu::Pool2dGeometry& g, const float* gy, const int32_t* idx,
                         float* gx, void* stream);

// Fused optimizer updates (torch.optim.Adam / AdamW / SGD, as kernels/cpu/optimizer_update.h)
// over many tensors at once. Parameters and gradients are float32, bfloat16 or float16 (`dtype`,
// per tensor), the state float32; the update is computed in float32 and the parameter rounded
// once. Tensors of different dtypes may be mixed in one call (each dtype gets its own launches).
// One tensor of a multi-tensor update. `step` (Adam) is a device int64 holding the steps this
// tensor has taken; `buf` (SGD) its momentum buffer, `first` whether that buffer starts now.
struct OptimizerTensor {
  void* p;        // `dtype`
  const void* g;  // `dtype`
  float* m;       // Adam: exp_avg
  float* v;       // Adam: exp_avg_sq
  float* vmax;    // Adam with amsgrad: max_exp_avg_sq, else null
  int64_t* step;  // Adam: device step counter
  float* buf;     // SGD: momentum buffer (null without momentum)
  int64_t n;
  bool first;                    // SGD: the momentum buffer starts as the gradient
  DType dtype = DType::Float32;  // of p and g
};
// Adam / AdamW over `count` tensors in a few launches (one per 32 tensors of a dtype, plus one
// that advances the step counters). lr, beta1 and beta2 come in double: each block computes its
// tensor's lr / (1 - beta1^t) and sqrt(1 - beta2^t) from t = *step + 1 exactly as the host
// does, so nothing is read back and the launches can be captured in a CUDA graph (whose replays
// then keep counting steps). s's other fields (eps, weight_decay, decoupled, amsgrad) apply to
// every tensor.
void adam_update_multi(const cpu::AdamStep& s, double lr, double beta1, double beta2,
                       const OptimizerTensor* tensors, int count, void* stream);
// SGD over `count` tensors, one launch per 32 of a dtype (s.first is ignored; each tensor has
// its own).
void sgd_update_multi(const cpu::SGDStep& s, const OptimizerTensor* tensors, int count,
                      void* stream);

}  // namespace galley::kernels::cuda
