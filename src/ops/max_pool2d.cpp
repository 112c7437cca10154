// max_pool2d: checks, output geometry, the device switch and the autograd record (the winners'
// indices kept for backward). The host kernels take every floating dtype; the GPU's take float32.
#include "kernels/max_pool2d.h"

#include <memory>

#include "galley/autograd.h"
#include "galley/ops.h"
#include "galley/profiler.h"
#include "src/ops/dispatch.h"

namespace galley {

namespace cpu = kernels::cpu;
namespace gpu = kernels::cuda;

Tensor max_pool2d(const Tensor& x, const MaxPool2dOptions& o) {
  profiler::OpScope prof("max_pool2d", {&x});
  detail::check_floating("max_pool2d", x);
  GALLEY_CHECK(x.dim() == 4, "max_pool2d: input must be [N, C, H, W], got ", shape_str(x.shape()));
  detail::check_pool_planes("max_pool2d", x);
  int64_t stride = o.stride == 0 ? o.kernel_size : o.stride;
  GALLEY_CHECK(o.kernel_size > 0 && stride > 0 && o.padding >= 0 && o.padding <= o.kernel_size / 2,
               "max_pool2d: kernel ", o.kernel_size, ", stride ", stride, ", padding ", o.padding,
               " (padding may be at most half the kernel)");
  kernels::Pool2dGeometry g{};
  g.planes = x.size(0) * x.size(1), g.h = x.size(2), g.w = x.size(3);
  g.k = o.kernel_size, g.stride = stride, g.pad = o.padding;
  g.oh = detail::window_positions("max_pool2d", g.h, g.k, 1, g.pad, g.stride);
  g.ow = detail::window_positions("max_pool2d", g.w, g.k, 1, g.pad, g.stride);
  GALLEY_CHECK(g.oh > 0 && g.ow > 0, "max_pool2d: input ", shape_str(x.shape()),
               " is smaller than the ", g.k, "x", g.k, " window");
  const DType dtype = x.dtype();
  const Device dev = x.device();
  // The host kernels take 16-bit planes as they are; the GPU's take float32, so there a 16-bit
  // op widens its input, rounds its output once and computes its gradient in float32.
  if (dev.is_cpu()) {
    Tensor cx = x.contiguous();
    Tensor result = Tensor::empty({x.size(0), x.size(1), g.oh, g.ow}, dtype, dev);
    auto idx = std::make_shared<Storage>(result.numel() * sizeof(int32_t), dev);
    cpu::max_pool2d_forward(g, cx.raw_data(), result.raw_data(), static_cast<int32_t*>(idx->data()),
                            dtype);
    if (!autograd::needs_grad({&x})) return result;
    Shape in_shape = x.shape();
    return autograd::record(
        result, "max_pool2d", {x}, [=](const Tensor& gy, std::vector<Tensor>& gi) {
          Tensor cgy = gy.to(dtype).contiguous();
          gi[0] = Tensor::empty(in_shape, dtype, dev);
          cpu::max_pool2d_backward(g, cgy.raw_data(), static_cast<const int32_t*>(idx->data()),
                                   gi[0].raw_data(), dtype);
        });
  }
  Tensor cx = detail::widened(x).contiguous();
  Tensor out = Tensor::empty({x.size(0), x.size(1), g.oh, g.ow}, DType::Float32, dev);
  // The winners' indices are kept for backward; the block comes from the host cache.
  auto idx = std::make_shared<Storage>(out.numel() * sizeof(int32_t), dev);
  int32_t* pidx = static_cast<int32_t*>(idx->data());
  gpu::max_pool2d_forward(g, cx.data_ptr<float>(), out.data_ptr<float>(), pidx,
                          detail::stream(dev));
  Tensor result = detail::rounded(out, dtype);
  if (!autograd::needs_grad({&x})) return result;
  Shape in_shape = x.shape();
  return autograd::record(
      result, "max_pool2d", {x},
      detail::widened_backward(dtype, [=](const Tensor& gy, std::vector<Tensor>& gi) {
        Tensor cgy = gy.contiguous();
        gi[0] = Tensor::empty(in_shape, DType::Float32, dev);
        gpu::max_pool2d_backward(g, cgy.data_ptr<float>(), static_cast<const int32_t*>(idx->data()),
                                 gi[0].data_ptr<float>(), detail::stream(dev));
      }));
}

}  // namespace galley
