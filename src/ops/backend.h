#pragma once
// The device switch of the op layer (internal): each function runs the CPU kernel or the CUDA
// launcher according to its inputs' device and returns tensors on that device. The ops in
// src/ops call these instead of a backend directly, so dispatch happens at one place per op.
#include "galley/tensor.h"
#include "kernels/clip.h"
#include "kernels/optimizer_update.h"

namespace galley::backend {

// The CUDA stream of `device` (null for the host).
void* stream(Device device);

// One parameter tensor on the host: p and g of `dtype` (float32, bfloat16 or float16), the
// state float32.
void adam_update(Device device, const kernels::AdamStep& s, DType dtype, int64_t n, void* p,
                 const void* g, float* m, float* v, float* vmax);
void sgd_update(Device device, const kernels::SGDStep& s, DType dtype, int64_t n, void* p,
                const void* g, float* buf);
// Every tensor of `tensors` (all on the GPU `device`) in a few launches; see
// kernels/optimizer_update.h.
using kernels::OptimizerTensor;
void adam_update_multi(Device device, const kernels::AdamStep& s, double lr, double beta1,
                       double beta2, const std::vector<kernels::OptimizerTensor>& tensors);
void sgd_update_multi(Device device, const kernels::SGDStep& s,
                      const std::vector<kernels::OptimizerTensor>& tensors);

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
using kernels::GradSpan;
Tensor grad_norm(Device device, const std::vector<kernels::GradSpan>& spans, double norm_type);
void scale_grads(Device device, const std::vector<kernels::GradSpan>& spans, float scale);
void clamp_grads(Device device, const std::vector<kernels::GradSpan>& spans, float clip);

}  // namespace galley::backend
