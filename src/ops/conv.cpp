// conv2d and max_pool2d: shape checks, output geometry, autograd. The kernels take float32: a
// 16-bit op widens its inputs, rounds its output once and computes its gradients in float32.
#include <memory>
#include <vector>

#include "galley/autograd.h"
#include "galley/ops.h"
#include "galley/profiler.h"
#include "src/device_scope.h"
#include "src/ops/backend.h"
#include "src/ops/dispatch.h"

namespace galley {

namespace cpu = kernels::cpu;

Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, const Conv2dOptions& o) {
  profiler::OpScope prof("conv2d", {&x, &weight, &bias});
  detail::check_floating_pair("conv2d", x, weight);
  detail::DeviceScope scope(x.device());
  GALLEY_CHECK(x.dim() == 4, "conv2d: input must be [N, C, H, W], got ", shape_str(x.shape()));
  GALLEY_CHECK(weight.dim() == 4, "conv2d: weight must be [O, C/groups, kH, kW], got ",
               shape_str(weight.shape()));
  GALLEY_CHECK(o.stride > 0 && o.dilation > 0 && o.padding >= 0 && o.groups > 0, "conv2d: stride ",
               o.stride, ", dilation ", o.dilation, ", padding ", o.padding, ", groups ", o.groups,
               " (stride, dilation, groups > 0; padding >= 0)");
  kernels::Conv2dGeometry g{};
  g.n = x.size(0), g.c = x.size(1), g.h = x.size(2), g.w = x.size(3);
  g.o = weight.size(0), g.kh = weight.size(2), g.kw = weight.size(3);
  g.stride = o.stride, g.pad = o.padding, g.dilation = o.dilation, g.groups = o.groups;
  GALLEY_CHECK(g.c % g.groups == 0 && g.o % g.groups == 0 && weight.size(1) * g.groups == g.c,
               "conv2d: input ", shape_str(x.shape()), " has ", g.c, " channels but weight ",
               shape_str(weight.shape()), " with groups=", g.groups, " expects ",
               weight.size(1) * g.groups);
  g.oh = (g.h + 2 * g.pad - g.dilation * (g.kh - 1) - 1) / g.stride + 1;
  g.ow = (g.w + 2 * g.pad - g.dilation * (g.kw - 1) - 1) / g.stride + 1;
  GALLEY_CHECK(g.oh > 0 && g.ow > 0, "conv2d: input ", shape_str(x.shape()),
               " is smaller than "
               "the kernel ",
               g.kh, "x", g.kw, " (dilation ", g.dilation, ", padding ", g.pad, ")");
  if (bias.defined()) {
    detail::check_floating_pair("conv2d", x, bias);
    GALLEY_CHECK(bias.dim() == 1 && bias.size(0) == g.o, "conv2d: bias ", shape_str(bias.shape()),
                 " does not match ", g.o, " output channels");
  }
  const DType dtype = x.dtype();
  Tensor cx = detail::widened(x).contiguous(), cw = detail::widened(weight).contiguous();
  Tensor cb = bias.defined() ? detail::widened(bias).contiguous() : Tensor();
  Tensor out = Tensor::empty({g.n, g.o, g.oh, g.ow});
  const Device dev = x.device();
  backend::conv2d_forward(dev, g, cx.data_ptr<float>(), cw.data_ptr<float>(),
                          cb.defined() ? cb.data_ptr<float>() : nullptr, out.data_ptr<float>());
  Tensor result = detail::rounded(out, dtype);
  if (!autograd::needs_grad({&x, &weight, &bias})) return result;
  Tensor dx = detail::kept_for_backward(x, cx), dw = detail::kept_for_backward(weight, cw);
  bool gx = x.requires_grad(), gw = weight.requires_grad(),
       gb = bias.defined() && bias.requires_grad();
  return autograd::record(
      result, "conv2d", {x, weight, bias},
      detail::widened_backward(dtype, [=](const Tensor& gy, std::vector<Tensor>& gi) {
        Tensor cgy = gy.contiguous();
        Tensor wx = detail::widened(dx), ww = detail::widened(dw);
        if (gx) gi[0] = Tensor::empty(wx.shape());
        if (gw) gi[1] = Tensor::empty(ww.shape());
        if (gb) gi[2] = Tensor::empty({g.o});
        backend::conv2d_backward(dev, g, wx.data_ptr<float>(), ww.data_ptr<float>(),
                                 cgy.data_ptr<float>(), gx ? gi[0].data_ptr<float>() : nullptr,
                                 gw ? gi[1].data_ptr<float>() : nullptr,
                                 gb ? gi[2].data_ptr<float>() : nullptr);
      }));
}

Tensor max_pool2d(const Tensor& x, const MaxPool2dOptions& o) {
  profiler::OpScope prof("max_pool2d", {&x});
  detail::check_floating("max_pool2d", x);
  detail::DeviceScope scope(x.device());
  GALLEY_CHECK(x.dim() == 4, "max_pool2d: input must be [N, C, H, W], got ", shape_str(x.shape()));
  int64_t stride = o.stride == 0 ? o.kernel_size : o.stride;
  GALLEY_CHECK(o.kernel_size > 0 && stride > 0 && o.padding >= 0 && 2 * o.padding <= o.kernel_size,
               "max_pool2d: kernel ", o.kernel_size, ", stride ", stride, ", padding ", o.padding,
               " (padding may be at most half the kernel)");
  kernels::Pool2dGeometry g{};
  g.planes = x.size(0) * x.size(1), g.h = x.size(2), g.w = x.size(3);
  g.k = o.kernel_size, g.stride = stride, g.pad = o.padding;
  g.oh = (g.h + 2 * g.pad - g.k) / g.stride + 1;
  g.ow = (g.w + 2 * g.pad - g.k) / g.stride + 1;
  GALLEY_CHECK(g.h + 2 * g.pad >= g.k && g.w + 2 * g.pad >= g.k && g.oh > 0 && g.ow > 0,
               "max_pool2d: input ", shape_str(x.shape()), " is smaller than the ", g.k, "x", g.k,
               " window");
  const DType dtype = x.dtype();
  Tensor cx = detail::widened(x).contiguous();
  Tensor out = Tensor::empty({x.size(0), x.size(1), g.oh, g.ow});
  // The winners' indices are kept for backward; the block comes from the host cache.
  const bool grad = autograd::needs_grad({&x});
  const Device dev = x.device();
  auto idx = std::make_shared<Storage>(out.numel() * sizeof(int32_t), dev);
  int32_t* pidx = static_cast<int32_t*>(idx->data());
  backend::max_pool2d_forward(dev, g, cx.data_ptr<float>(), out.data_ptr<float>(), pidx);
  Tensor result = detail::rounded(out, dtype);
  if (!grad) return result;
  Shape in_shape = x.shape();
  return autograd::record(
      result, "max_pool2d", {x},
      detail::widened_backward(dtype, [=](const Tensor& gy, std::vector<Tensor>& gi) {
        Tensor cgy = gy.contiguous();
        gi[0] = Tensor::empty(in_shape);
        backend::max_pool2d_backward(dev, g, cgy.data_ptr<float>(),
                                     static_cast<const int32_t*>(idx->data()),
                                     gi[0].data_ptr<float>());
      }));
}

}  // namespace galley
