#include "src/ops/nonfinite.h"

#include "galley/half.h"
#include "kernels/nonfinite.h"
#include "src/ops/dispatch.h"
#include "src/runtime/device_memory.h"

namespace galley::detail {

int64_t first_nonfinite(const Tensor& t) {
  Tensor c = t.contiguous();
  GALLEY_CHECK(is_floating_point(c.dtype()),
               "first_nonfinite: expected a float32, bfloat16 or float16 tensor, got ",
               dtype_name(c.dtype()));
  if (c.device().is_cpu()) return kernels::cpu::first_nonfinite(c.raw_data(), c.dtype(), c.numel());
  Tensor first = Tensor::empty({}, DType::Int64, c.device());
  kernels::cuda::first_nonfinite(c.raw_data(), c.dtype(), c.numel(), first.data_ptr<int64_t>(),
                                 stream(c.device()));
  return first.to(Device::cpu()).data_ptr<int64_t>()[0];
}

void report_nonfinite_loss(const Tensor& loss) {
  const Device dev = loss.device();
  GALLEY_CHECK(dev.is_cuda() && loss.numel() == 1 && loss.dtype() == DType::Float32,
               "report_nonfinite_loss: expects one float32 element on a GPU");
  kernels::cuda::report_nonfinite_scalar(loss.data_ptr<float>(),
                                         static_cast<int64_t>(DeferredError::NonFiniteLoss),
                                         error_slot(dev), stream(dev));
}

}  // namespace galley::detail
