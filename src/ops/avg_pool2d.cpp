// avg_pool2d and adaptive_avg_pool2d: checks, output geometry (PyTorch's, ceil_mode included),
// the device switch and the autograd record. The kernels take every floating dtype and compute
// in float32, so a 16-bit input is pooled as it is; backward needs only the geometry.
#include "kernels/avg_pool2d.h"

#include "galley/autograd.h"
#include "galley/ops.h"
#include "galley/profiler.h"
#include "src/ops/dispatch.h"

namespace galley {

namespace cpu = kernels::cpu;
namespace gpu = kernels::cuda;

namespace {

// Pools x with geometry g (planes and sizes filled in here) and records the backward.
Tensor pool(const char* op, const Tensor& x, kernels::AvgPool2dGeometry g) {
  g.planes = x.size(0) * x.size(1), g.h = x.size(2), g.w = x.size(3);
  const DType dtype = x.dtype();
  const Device dev = x.device();
  Tensor cx = x.contiguous();
  Tensor out = Tensor::empty({x.size(0), x.size(1), g.oh, g.ow}, dtype, dev);
  if (dev.is_cuda())
    gpu::avg_pool2d_forward(g, dtype, cx.raw_data(), out.raw_data(), detail::stream(dev));
  else
    cpu::avg_pool2d_forward(g, dtype, cx.raw_data(), out.raw_data());
  if (!autograd::needs_grad({&x})) return out;
  const Shape in_shape = x.shape();
  return autograd::record(out, op, {x}, [=](const Tensor& gy, std::vector<Tensor>& gi) {
    Tensor cgy = gy.to(dtype).contiguous();
    gi[0] = Tensor::empty(in_shape, dtype, dev);
    if (dev.is_cuda())
      gpu::avg_pool2d_backward(g, dtype, cgy.raw_data(), gi[0].raw_data(), detail::stream(dev));
    else
      cpu::avg_pool2d_backward(g, dtype, cgy.raw_data(), gi[0].raw_data());
  });
}

}  // namespace

Tensor avg_pool2d(const Tensor& x, const AvgPool2dOptions& o) {
  profiler::OpScope prof("avg_pool2d", {&x});
  detail::check_floating("avg_pool2d", x);
  GALLEY_CHECK(x.dim() == 4, "avg_pool2d: input must be [N, C, H, W], got ", shape_str(x.shape()),
               " (", dtype_name(x.dtype()), ")");
  detail::check_pool_planes("avg_pool2d", x);
  const int64_t stride = o.stride == 0 ? o.kernel_size : o.stride;
  GALLEY_CHECK(o.kernel_size > 0 && stride > 0 && o.padding >= 0 && o.padding <= o.kernel_size / 2,
               "avg_pool2d: kernel ", o.kernel_size, ", stride ", stride, ", padding ", o.padding,
               " (padding may be at most half the kernel)");
  kernels::AvgPool2dGeometry g{};
  g.k = o.kernel_size, g.stride = stride, g.pad = o.padding;
  g.count_include_pad = o.count_include_pad;
  g.oh = detail::window_positions("avg_pool2d", x.size(2), g.k, 1, g.pad, stride, o.ceil_mode);
  g.ow = detail::window_positions("avg_pool2d", x.size(3), g.k, 1, g.pad, stride, o.ceil_mode);
  GALLEY_CHECK(g.oh > 0 && g.ow > 0, "avg_pool2d: input ", shape_str(x.shape()),
               " is smaller than the ", g.k, "x", g.k, " window with padding ", g.pad);
  return pool("avg_pool2d", x, g);
}

Tensor adaptive_avg_pool2d(const Tensor& x, const Shape& output_size) {
  profiler::OpScope prof("adaptive_avg_pool2d", {&x});
  detail::check_floating("adaptive_avg_pool2d", x);
  GALLEY_CHECK(x.dim() == 4, "adaptive_avg_pool2d: input must be [N, C, H, W], got ",
               shape_str(x.shape()), " (", dtype_name(x.dtype()), ")");
  GALLEY_CHECK(output_size.size() == 2 && output_size[0] > 0 && output_size[1] > 0,
               "adaptive_avg_pool2d: output size must be {h, w}, both positive, got ",
               shape_str(output_size));
  detail::check_pool_planes("adaptive_avg_pool2d", x);
  kernels::AvgPool2dGeometry g{};
  g.oh = output_size[0], g.ow = output_size[1];
  return pool("adaptive_avg_pool2d", x, g);
}

}  // namespace galley
