#include "src/ops/dispatch.h"

#include <utility>
#include <vector>

#include "src/runtime/device_memory.h"

namespace galley::detail {

int64_t window_positions(const char* op, int64_t in, int64_t k, int64_t dilation, int64_t pad,
                         int64_t stride, bool ceil_mode) {
  // PyTorch's rule: floor((span + (ceil_mode ? stride - 1 : 0)) / stride) + 1 windows, the last
  // one dropped where ceil_mode would start it past the input and its left padding. A negative
  // numerator gives none (floor below -1 + 1); under ceil_mode an input shorter than the window
  // still gives one, which the kernels clip.
  const __int128 span = __int128(in) + 2 * __int128(pad) - __int128(dilation) * (k - 1) - 1;
  const __int128 num = span + (ceil_mode ? stride - 1 : 0);
  if (num < 0) return 0;
  __int128 out = num / stride + 1;
  if (ceil_mode && (out - 1) * stride >= __int128(in) + pad) --out;
  GALLEY_CHECK(out <= INT64_MAX, op, ": ", in, " elements, padding ", pad, ", a kernel of ", k,
               " dilated by ", dilation, " and stride ", stride,
               ": the output's size overflows a 64-bit count");
  return int64_t(out);
}

void check_pool_planes(const char* op, const Tensor& x) {
  GALLEY_CHECK(x.size(1) > 0 && x.size(2) > 0 && x.size(3) > 0, op, ": input ",
               shape_str(x.shape()),
               " has no channels or an empty plane; only the batch may be empty");
}

void* stream(Device device) {
  if (!device.is_cuda()) return nullptr;
  // CUDA takes work for a device's streams only from a thread where that device is current.
  make_current(device);
  return compute_stream(device);
}

std::vector<int64_t> aligned(const Shape& s, size_t rank) {
  std::vector<int64_t> out(rank - s.size(), 1);
  out.insert(out.end(), s.begin(), s.end());
  return out;
}

void check_floating(const char* op, const Tensor& t) {
  GALLEY_CHECK(t.defined(), op, ": an input tensor is undefined");
  GALLEY_CHECK(is_floating_point(t.dtype()), op,
               ": expected a float32, bfloat16 or float16 tensor, got ", dtype_name(t.dtype()),
               " of shape ", shape_str(t.shape()));
  GALLEY_CHECK(t.device().is_cpu() || t.device().index() < cuda_device_count(), op,
               ": the tensor is on ", t.device().str(), ", which does not exist here");
}

void check_floating_pair(const char* op, const Tensor& a, const Tensor& b) {
  check_floating(op, a);
  check_floating(op, b);
  GALLEY_CHECK(a.dtype() == b.dtype(), op, ": inputs of different dtypes (", dtype_name(a.dtype()),
               " ", shape_str(a.shape()), " and ", dtype_name(b.dtype()), " ", shape_str(b.shape()),
               "); convert one with .to(dtype)");
  GALLEY_CHECK(a.device() == b.device(), op, ": inputs on different devices (", a.device().str(),
               " and ", b.device().str(), ")");
}

Tensor widened(const Tensor& t) {
  return t.dtype() == DType::Float32 ? t : t.detach().to(DType::Float32);
}

Tensor rounded(const Tensor& t, DType dtype) {
  return t.dtype() == dtype ? t : t.detach().to(dtype);
}

Tensor kept_for_backward(const Tensor& t, const Tensor& wide) {
  return t.dtype() == DType::Float32 ? wide.detach() : t.detach();
}

autograd::BackwardFn widened_backward(DType dtype, autograd::BackwardFn f32) {
  if (dtype == DType::Float32) return f32;
  return [dtype, f32 = std::move(f32)](const Tensor& g, std::vector<Tensor>& gi) {
    f32(widened(g), gi);
    for (Tensor& t : gi)
      if (t.defined()) t = rounded(t, dtype);
  };
}

bool sole_owner(const Tensor& t) {
  return t.impl_ptr().use_count() == 1 && t.impl()->storage.use_count() == 1 && t.is_contiguous();
}

int64_t wrap_dim(const char* op, int64_t dim, int64_t rank) {
  int64_t r = rank == 0 ? 1 : rank;
  GALLEY_CHECK(dim >= -r && dim < r, op, ": dimension ", dim, " out of range for rank ", rank,
               " (expected one in [", -r, ", ", r - 1, "])");
  return dim < 0 ? dim + r : dim;
}

Split3 split_at(const Shape& s, int64_t dim) {
  Split3 r;
  for (int64_t i = 0; i < static_cast<int64_t>(s.size()); ++i) {
    if (i < dim)
      r.outer *= s[i];
    else if (i == dim)
      r.len = s[i];
    else
      r.inner *= s[i];
  }
  return r;
}

}  // namespace galley::detail
