#pragma once
// The device switch of the op layer (internal): each function runs the CPU kernel or the CUDA
// launcher according to its inputs' device and returns tensors on that device. The ops in
// src/ops call these instead of a backend directly, so dispatch happens at one place per op.
#include "galley/tensor.h"
#include "kernels/cpu/binary.h"
#include "kernels/cpu/clip.h"
#include "kernels/cpu/conv2d.h"
#include "kernels/cpu/max_pool2d.h"
#include "kernels/cpu/optimizer_update.h"
#include "kernels/cuda/elementwise.cuh"

namespace galley::backend {

using kernels::cpu::BinaryOp;

// The CUDA stream of `device` (null for the host).
void* stream(Device device);

Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b);
Tensor sum_to(const Tensor& g, const Shape& shape);
void add_inplace(Tensor& acc, const Tensor& g);
Tensor affine(const Tensor& a, float scale, float shift);
Tensor exp(const Tensor& a);
Tensor log(const Tensor& a);
Tensor pow(const Tensor& a, float p);
Tensor pow_backward(const Tensor& grad, const Tensor& a, float p);
Tensor relu(const Tensor& a);
void relu_(Tensor& a);
Tensor relu_backward(const Tensor& grad, const Tensor& out);
void relu_backward_(Tensor& grad, const Tensor& out);

// Row-major GEMM on the tensors' device (pointers into tensors on `device`).
void gemm(Device device, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
          const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
          int64_t ldc);
// out[r, :] = bias for r < rows (seeding C before a GEMM with beta = 1).
void broadcast_rows(Device device, const float* bias, int64_t rows, int64_t n, float* out);
void column_sums(Device device, const float* g, int64_t rows, int64_t n, float* out);

void conv2d_forward(Device device, const kernels::cpu::Conv2dGeometry& g, const float* x,
                    const float* w, const float* b, float* y);
void conv2d_backward(Device device, const kernels::cpu::Conv2dGeometry& g, const float* x,
                     const float* w, const float* gy, float* gx, float* gw, float* gb);

// relu(x + b) over [outer, channels, inner], and its backward (gb may be null).
void bias_relu_forward(Device device, const float* x, const float* b, int64_t outer,
                       int64_t channels, int64_t inner, float* y);
void bias_relu_backward(Device device, const float* gy, const float* y, int64_t outer,
                        int64_t channels, int64_t inner, float* gx, float* gb);

void max_pool2d_forward(Device device, const kernels::cpu::Pool2dGeometry& g, const float* x,
                        float* y, int32_t* idx);
void max_pool2d_backward(Device device, const kernels::cpu::Pool2dGeometry& g, const float* gy,
                         const int32_t* idx, float* gx);

// Scaled sum of every element into a one-element tensor on the same device.
Tensor sum_all(const Tensor& x, float scale);
void sum_dim(Device device, const float* x, int64_t outer, int64_t len, int64_t inner, float scale,
             float* out);
void expand_dim(Device device, const float* g, int64_t outer, int64_t len, int64_t inner,
                float scale, float* out);
void argmax_dim(Device device, const float* x, int64_t outer, int64_t len, int64_t inner,
                int64_t* out);
void softmax_forward(Device device, const float* x, int64_t outer, int64_t len, int64_t inner,
                     bool log, float* y);
void softmax_backward(Device device, const float* y, const float* gy, int64_t outer, int64_t len,
                      int64_t inner, bool log, float* gx);

// Per-row losses and probabilities. On the host: returns the rows counted and sets *bad_row as
// in kernels/cpu. On a GPU nothing waits for the device: *count receives a one-element int64
// device tensor with the rows counted, a bad label is reported at the device's next
// synchronisation (detail::check_deferred_errors), *bad_row is -1 and the result is -1.
int64_t cross_entropy_forward(Device device, const float* logits, const int64_t* labels, int64_t n,
                              int64_t c, float eps, int64_t ignore_index, float* loss, float* prob,
                              int64_t* bad_row, Tensor* count);
// n copies of g_scalar[0] * factor, on g_scalar's device (the row scales of a reduced loss),
// divided by `count` (a device int64 scalar; 0 when it is 0) when it is defined.
Tensor row_scales(const Tensor& g_scalar, float factor, int64_t n, const Tensor& count = Tensor());
// row_scale: a tensor of n scales on the device.
void cross_entropy_backward(Device device, const float* prob, const int64_t* labels,
                            const Tensor& row_scale, int64_t n, int64_t c, float eps,
                            int64_t ignore_index, float* gx);

// One parameter tensor on the host: p and g of `dtype` (float32, bfloat16 or float16), the
// state float32.
void adam_update(Device device, const kernels::cpu::AdamStep& s, DType dtype, int64_t n, void* p,
                 const void* g, float* m, float* v, float* vmax);
void sgd_update(Device device, const kernels::cpu::SGDStep& s, DType dtype, int64_t n, void* p,
                const void* g, float* buf);
// Every tensor of `tensors` (all on the GPU `device`) in a few launches; see
// kernels/cuda/elementwise.cuh.
using kernels::cuda::OptimizerTensor;
void adam_update_multi(Device device, const kernels::cpu::AdamStep& s, double lr, double beta1,
                       double beta2, const std::vector<OptimizerTensor>& tensors);
void sgd_update_multi(Device device, const kernels::cpu::SGDStep& s,
                      const std::vector<OptimizerTensor>& tensors);

// The index of the first NaN or infinite element of `t` (float32, bfloat16 or float16, any
// layout) in row-major
// order, -1 when every element is finite. On a GPU it waits for the answer: for anomaly
// detection and error reports, never the default path.
int64_t first_nonfinite(const Tensor& t);
// Queues the loss guard's check of a one-element float32 GPU tensor: a NaN or infinite value is
// reported at the device's next synchronisation (detail::DeferredError::NonFiniteLoss).
void report_nonfinite_loss(const Tensor& loss);

// Gradient clipping over every span at once, all on `device` (kernels/cpu/clip.h). grad_norm
// returns the norm as a one-element float32 tensor on the device, queued on a GPU.
using kernels::cpu::GradSpan;
Tensor grad_norm(Device device, const std::vector<GradSpan>& spans, double norm_type);
void scale_grads(Device device, const std::vector<GradSpan>& spans, float scale);
void clamp_grads(Device device, const std::vector<GradSpan>& spans, float clip);

}  // namespace galley::backend
