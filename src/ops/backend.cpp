// The device switch: CPU kernels for host tensors, CUDA launchers for GPU tensors.
#include "src/ops/backend.h"

#include <algorithm>

#include "galley/half.h"
#include "galley/runtime/memory.h"
#include "kernels/bias_relu.h"
#include "kernels/clip.h"
#include "kernels/cross_entropy.h"
#include "kernels/gemm.h"
#include "kernels/nonfinite.h"
#include "kernels/reduce.h"
#include "kernels/softmax.h"
#include "kernels/unary.h"
#include "src/ops/dispatch.h"
#include "src/runtime/device_memory.h"

namespace galley::backend {

namespace cpu = kernels::cpu;
namespace gpu = kernels::cuda;
using kernels::UnaryOp;

void* stream(Device device) {
  return detail::stream(device);
}

namespace {
bool on_gpu(const Tensor& t) {
  return t.device().is_cuda();
}
}  // namespace

void adam_update_multi(Device device, const kernels::AdamStep& s, double lr, double beta1,
                       double beta2, const std::vector<kernels::OptimizerTensor>& tensors) {
  GALLEY_CHECK(device.is_cuda(), "adam_update_multi: ", device.str(), " is not a GPU");
  if (tensors.empty()) return;
  gpu::adam_update_multi(s, lr, beta1, beta2, tensors.data(), static_cast<int>(tensors.size()),
                         stream(device));
}

void sgd_update_multi(Device device, const kernels::SGDStep& s,
                      const std::vector<kernels::OptimizerTensor>& tensors) {
  GALLEY_CHECK(device.is_cuda(), "sgd_update_multi: ", device.str(), " is not a GPU");
  if (tensors.empty()) return;
  gpu::sgd_update_multi(s, tensors.data(), static_cast<int>(tensors.size()), stream(device));
}

void adam_update(Device device, const kernels::AdamStep& s, DType dtype, int64_t n, void* p,
                 const void* g, float* m, float* v, float* vmax) {
  GALLEY_CHECK(device.is_cpu(), "adam_update: ", device.str(), " takes adam_update_multi");
  cpu::adam_update(s, dtype, n, p, g, m, v, vmax);
}

void sgd_update(Device device, const kernels::SGDStep& s, DType dtype, int64_t n, void* p,
                const void* g, float* buf) {
  GALLEY_CHECK(device.is_cpu(), "sgd_update: ", device.str(), " takes sgd_update_multi");
  cpu::sgd_update(s, dtype, n, p, g, buf);
}

int64_t first_nonfinite(const Tensor& t) {
  Tensor c = t.contiguous();
  GALLEY_CHECK(is_floating_point(c.dtype()),
               "first_nonfinite: expected a float32, bfloat16 or float16 tensor, got ",
               dtype_name(c.dtype()));
  if (!on_gpu(c)) return cpu::first_nonfinite(c.raw_data(), c.dtype(), c.numel());
  Tensor first = Tensor::empty({}, DType::Int64, c.device());
  gpu::first_nonfinite(c.raw_data(), c.dtype(), c.numel(), first.data_ptr<int64_t>(),
                       stream(c.device()));
  return first.to(Device::cpu()).data_ptr<int64_t>()[0];
}

void report_nonfinite_loss(const Tensor& loss) {
  const Device dev = loss.device();
  GALLEY_CHECK(dev.is_cuda() && loss.numel() == 1 && loss.dtype() == DType::Float32,
               "report_nonfinite_loss: expects one float32 element on a GPU");
  gpu::report_nonfinite_scalar(loss.data_ptr<float>(),
                               static_cast<int64_t>(detail::DeferredError::NonFiniteLoss),
                               detail::error_slot(dev), stream(dev));
}

Tensor grad_norm(Device device, const std::vector<kernels::GradSpan>& spans, double norm_type) {
  Tensor out = Tensor::empty({}, DType::Float32, device);
  const int count = static_cast<int>(spans.size());
  if (device.is_cpu()) {
    out.data_ptr<float>()[0] = static_cast<float>(cpu::grad_norm(spans.data(), count, norm_type));
    return out;
  }
  // One double per chunk (int64 storage: tensors have no float64 dtype), from the caching
  // allocator, so a step allocates nothing new.
  const int64_t parts = gpu::grad_norm_scratch(spans.data(), count);
  Tensor scratch = Tensor::empty({std::max<int64_t>(parts, 1)}, DType::Int64, device);
  gpu::grad_norm(spans.data(), count, norm_type, reinterpret_cast<double*>(scratch.raw_data()),
                 out.data_ptr<float>(), stream(device));
  return out;
}

void scale_grads(Device device, const std::vector<kernels::GradSpan>& spans, float scale) {
  if (device.is_cpu()) return cpu::scale_grads(spans.data(), int(spans.size()), scale);
  gpu::scale_grads(spans.data(), int(spans.size()), scale, stream(device));
}

void clamp_grads(Device device, const std::vector<kernels::GradSpan>& spans, float clip) {
  if (device.is_cpu()) return cpu::clamp_grads(spans.data(), int(spans.size()), clip);
  gpu::clamp_grads(spans.data(), int(spans.size()), clip, stream(device));
}

}  // namespace galley::backend
