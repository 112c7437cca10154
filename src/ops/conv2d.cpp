// conv2d: shape checks, output geometry, the device switch (cuDNN's workspace from the caching
// allocator) and the autograd record. Activations reach the kernels in their own dtype on every
// device: the host kernels take 16-bit activations with float32 weights, cuDNN every operand in
// one dtype (16-bit ones on tensor cores), and a 16-bit convolution on a GPU adds its bias as a
// separate op, as cuDNN adds biases in float32 only.
#include "src/ops/conv2d.h"

#include <algorithm>

#include "galley/autograd.h"
#include "galley/ops.h"
#include "galley/profiler.h"
#include "galley/runtime/memory.h"
#include "src/ops/autocast.h"
#include "src/ops/binary.h"
#include "src/ops/dispatch.h"

namespace galley {

namespace cpu = kernels::cpu;
namespace gpu = kernels::cuda;

namespace {

// The most workspace one convolution call may take, cap or no cap. cuDNN's hungriest algorithms
// (FFT) can ask for gigabytes to be a little faster; memory that large is better left to the
// tensors, to other jobs on the GPU, and to the allocator's pool, which one huge block fragments.
constexpr size_t kConvWorkspaceLimit = size_t(1) << 30;

// What a convolution's workspace may take on `device`: the per-call limit, lowered under a cap
// to what the cap leaves beside the tensors in use. Cached free blocks count as room, as the
// allocator returns them to make space; where that is not enough, the allocation raises
// OutOfMemoryError and the kernel layer falls back to a smaller workspace.
size_t conv_workspace_limit(Device device) {
  const MemoryStats s = memory_stats(device);
  if (s.limit == 0) return kConvWorkspaceLimit;
  return std::min(kConvWorkspaceLimit, s.limit > s.allocated ? s.limit - s.allocated : size_t(0));
}

// cuDNN's scratch, from the caching allocator. One block at a time: taking the next releases
// the previous (the calls that use them are ordered on the device's compute stream, so the
// block may be reused at once), which keeps backward's data and filter workspaces from adding
// up under a cap; the last goes when the op returns.
struct Scratch {
  Device device;
  Tensor block;
  kernels::Workspace workspace() {
    kernels::Workspace ws;
    ws.limit = conv_workspace_limit(device);
    ws.allocate = [this](size_t bytes) {
      block = Tensor();
      block = Tensor::empty({int64_t((bytes + 3) / 4)}, DType::Float32, device);
      return block.raw_data();
    };
    return ws;
  }
};

// A convolution without products (an empty batch, inputs without channels, or no output
// channels): its output is the bias (or zero) everywhere, the input's and the weight's gradients
// zero and the bias's the sum of the output gradient, on every device without the kernels
// (cuDNN refuses tensors with a zero dimension, and the host kernels' backward assumes products).
Tensor conv2d_without_products(const Tensor& x, const Tensor& weight, const Tensor& bias,
                               const kernels::Conv2dGeometry& g) {
  const Device dev = x.device();
  const DType dtype = x.dtype();
  Tensor out = zeros({g.n, g.o, g.oh, g.ow}, dtype, dev);
  if (bias.defined()) {
    NoGradGuard no_grad;
    out = add(out, bias.reshape({1, g.o, 1, 1}).to(dtype));
  }
  if (!autograd::needs_grad({&x, &weight, &bias})) return out;
  const bool gx = x.requires_grad(), gw = weight.requires_grad(),
             gb = bias.defined() && bias.requires_grad();
  const Shape x_shape = x.shape(), w_shape = weight.shape();
  const DType w_dtype = weight.dtype(), b_dtype = bias.defined() ? bias.dtype() : dtype;
  return autograd::record(
      out, "conv2d", {x, weight, bias}, [=](const Tensor& gy, std::vector<Tensor>& gi) {
        if (gx) gi[0] = zeros(x_shape, dtype, dev);
        if (gw) gi[1] = zeros(w_shape, w_dtype, dev);
        if (gb)  // as add's backward sums a broadcast bias
          gi[2] = detail::sum_to(gy.to(DType::Float32), {1, g.o, 1, 1}).reshape({g.o}).to(b_dtype);
      });
}

}  // namespace

namespace detail {

DType conv2d_weight_dtype(Device device, DType dtype) {
  return device.is_cpu() ? DType::Float32 : dtype;
}

void conv2d_forward(Device device, const kernels::Conv2dGeometry& g, DType dtype, const void* x,
                    const void* w, const void* b, void* y) {
  if (device.is_cpu())
    return cpu::conv2d_forward(g, x, static_cast<const float*>(w), static_cast<const float*>(b), y,
                               dtype);
  Scratch scratch{device, Tensor()};
  gpu::conv2d_forward(device.index(), g, dtype, x, w, static_cast<const float*>(b), y,
                      scratch.workspace(), stream(device));
}

void conv2d_backward(Device device, const kernels::Conv2dGeometry& g, DType dtype, const void* x,
                     const void* w, const void* gy, void* gx, void* gw, void* gb) {
  if (device.is_cpu())
    return cpu::conv2d_backward(g, x, static_cast<const float*>(w), gy, gx, static_cast<float*>(gw),
                                static_cast<float*>(gb), dtype);
  Scratch scratch{device, Tensor()};
  gpu::conv2d_backward(device.index(), g, dtype, x, w, gy, gx, gw, static_cast<float*>(gb),
                       scratch.workspace(), stream(device));
}

}  // namespace detail

Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, const Conv2dOptions& o) {
  if (detail::autocast_on()) {
    detail::AutocastPause pause;
    return conv2d(pause.low(x), pause.low(weight), pause.low(bias), o);
  }
  profiler::OpScope prof("conv2d", {&x, &weight, &bias});
  detail::check_floating_pair("conv2d", x, weight);
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
  GALLEY_CHECK(g.kh > 0 && g.kw > 0, "conv2d: weight ", shape_str(weight.shape()),
               " has an empty kernel (kernel sizes must be positive)");
  g.oh = detail::window_positions("conv2d", g.h, g.kh, g.dilation, g.pad, g.stride);
  g.ow = detail::window_positions("conv2d", g.w, g.kw, g.dilation, g.pad, g.stride);
  GALLEY_CHECK(g.oh > 0 && g.ow > 0, "conv2d: input ", shape_str(x.shape()),
               " is smaller than the kernel ", g.kh, "x", g.kw, " (dilation ", g.dilation,
               ", padding ", g.pad, ")");
  if (bias.defined()) {
    detail::check_floating_pair("conv2d", x, bias);
    GALLEY_CHECK(bias.dim() == 1 && bias.size(0) == g.o, "conv2d: bias ", shape_str(bias.shape()),
                 " does not match ", g.o, " output channels");
  }
  if (g.n == 0 || g.c == 0 || g.o == 0) return conv2d_without_products(x, weight, bias, g);
  const DType dtype = x.dtype();
  const Device dev = x.device();
  const DType wtype = detail::conv2d_weight_dtype(dev, dtype);
  if (bias.defined() && wtype != DType::Float32)  // cuDNN adds float32 biases only
    return add(conv2d(x, weight, Tensor(), o), bias.reshape({1, g.o, 1, 1}));
  // Weights and bias in the kernels' dtype: widened for the host kernels (they are small).
  auto as_wtype = [wtype](const Tensor& t) {
    return (wtype == t.dtype() ? t : detail::widened(t)).contiguous();
  };
  Tensor cx = x.contiguous(), cw = as_wtype(weight);
  Tensor cb = bias.defined() ? as_wtype(bias) : Tensor();
  Tensor out = Tensor::empty({g.n, g.o, g.oh, g.ow}, dtype, dev);
  detail::conv2d_forward(dev, g, dtype, cx.raw_data(), cw.raw_data(),
                         cb.defined() ? cb.raw_data() : nullptr, out.raw_data());
  if (!autograd::needs_grad({&x, &weight, &bias})) return out;
  // The backward reads x as it is and a 16-bit weight in its own bytes, widened again there.
  Tensor dx = cx.detach(), dw = (wtype == weight.dtype() ? cw : weight).detach();
  bool gx = x.requires_grad(), gw = weight.requires_grad(),
       gb = bias.defined() && bias.requires_grad();
  // gx in dtype; gw and gb in wtype, rounded to dtype once where that differs.
  return autograd::record(out, "conv2d", {x, weight, bias},
                          [=](const Tensor& gy, std::vector<Tensor>& gi) {
                            Tensor cgy = (gy.dtype() == dtype ? gy : gy.to(dtype)).contiguous();
                            Tensor ww = as_wtype(dw);
                            if (gx) gi[0] = Tensor::empty(dx.shape(), dtype, dev);
                            if (gw) gi[1] = Tensor::empty(ww.shape(), wtype, dev);
                            if (gb) gi[2] = Tensor::empty({g.o}, wtype, dev);
                            detail::conv2d_backward(dev, g, dtype, dx.raw_data(), ww.raw_data(),
                                                    cgy.raw_data(), gx ? gi[0].raw_data() : nullptr,
                                                    gw ? gi[1].raw_data() : nullptr,
                                                    gb ? gi[2].raw_data() : nullptr);
                            for (size_t k = 1; k < gi.size(); ++k)
                              if (gi[k].defined() && gi[k].dtype() != dtype)
                                gi[k] = detail::rounded(gi[k], dtype);
                          },
                          {{"input", gw ? dx : Tensor()}, {"weight", gx ? dw : Tensor()}});
}

}  // namespace galley
