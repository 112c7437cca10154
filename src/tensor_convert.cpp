// Tensor::to(DType): conversion between float32, bfloat16 and float16 (and the int64/uint8 casts
// from and to float32), on the host or on the tensor's device.
#include "galley/autograd.h"
#include "galley/tensor.h"
#include "kernels/convert.h"
#include "runtime/device_memory.h"

namespace galley {

#define GALLEY_CHECK_DEFINED(what) GALLEY_CHECK(impl_, what, ": the tensor is undefined")

Tensor Tensor::to(DType dtype) const {
  GALLEY_CHECK_DEFINED("to");
  if (dtype == this->dtype()) return *this;
  const bool floating = is_floating_point(this->dtype()) && is_floating_point(dtype);
  GALLEY_CHECK(is_convertible(this->dtype(), dtype), "to: cannot convert ",
               dtype_name(this->dtype()), " to ", dtype_name(dtype),
               " directly (go through float32)");
  Tensor c = contiguous();
  Tensor out = empty(shape(), dtype, device());
  if (device().is_cpu())
    kernels::cpu::convert(c.raw_data(), c.dtype(), out.raw_data(), dtype, numel());
  else
    detail::convert_elements(device(), c.raw_data(), c.dtype(), out.raw_data(), dtype,
                             static_cast<size_t>(numel()));
  if (!floating || !autograd::needs_grad({this})) return out;
  const DType from = this->dtype();
  return autograd::record(out, "to", {*this},
                          [from](const Tensor& g, std::vector<Tensor>& gi) { gi[0] = g.to(from); });
}

Tensor Tensor::to(Device device, DType dtype) const {
  // Converted where there are fewer bytes to move: before a copy that narrows, after one that
  // widens.
  if (dtype_size(dtype) <= dtype_size(this->dtype())) return to(dtype).to(device);
  return to(device).to(dtype);
}

#undef GALLEY_CHECK_DEFINED

}  // namespace galley
