// conv2d: shape checks, output geometry, the device switch (cuDNN's workspace from the caching
// allocator) and the autograd record. The host kernels take 16-bit activations as they are (and
// float32 weights); cuDNN takes float32, so on a GPU a 16-bit op widens its inputs, rounds its
// output once and computes its gradients in float32.
#include "src/ops/conv2d.h"

#include <algorithm>

#include "galley/autograd.h"
#include "galley/ops.h"
#include "galley/profiler.h"
#include "galley/runtime/memory.h"
#include "src/ops/autocast.h"
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

}  // namespace

namespace detail {

void conv2d_forward(Device device, const kernels::Conv2dGeometry& g, DType dtype, const void* x,
                    const float* w, const float* b, void* y) {
  if (device.is_cpu()) return cpu::conv2d_forward(g, x, w, b, y, dtype);
  GALLEY_CHECK(dtype == DType::Float32, "conv2d: the GPU kernels take float32, got ",
               dtype_name(dtype));
  Scratch scratch{device, Tensor()};
  gpu::conv2d_forward(device.index(), g, static_cast<const float*>(x), w, b, static_cast<float*>(y),
                      scratch.workspace(), stream(device));
}

void conv2d_backward(Device device, const kernels::Conv2dGeometry& g, DType dtype, const void* x,
                     const float* w, const void* gy, void* gx, float* gw, float* gb) {
  if (device.is_cpu()) return cpu::conv2d_backward(g, x, w, gy, gx, gw, gb, dtype);
  GALLEY_CHECK(dtype == DType::Float32, "conv2d: the GPU kernels take float32, got ",
               dtype_name(dtype));
  Scratch scratch{device, Tensor()};
  gpu::conv2d_backward(device.index(), g, static_cast<const float*>(x), w,
                       static_cast<const float*>(gy), static_cast<float*>(gx), gw, gb,
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
  g.oh = (g.h + 2 * g.pad - g.dilation * (g.kh - 1) - 1) / g.stride + 1;
  g.ow = (g.w + 2 * g.pad - g.dilation * (g.kw - 1) - 1) / g.stride + 1;
  GALLEY_CHECK(g.oh > 0 && g.ow > 0, "conv2d: input ", shape_str(x.shape()),
               " is smaller than the kernel ", g.kh, "x", g.kw, " (dilation ", g.dilation,
               ", padding ", g.pad, ")");
  if (bias.defined()) {
    detail::check_floating_pair("conv2d", x, bias);
    GALLEY_CHECK(bias.dim() == 1 && bias.size(0) == g.o, "conv2d: bias ", shape_str(bias.shape()),
                 " does not match ", g.o, " output channels");
  }
  const DType dtype = x.dtype();
  const Device dev = x.device();
  // The host kernels read and write 16-bit activations themselves (widened into their float32
  // buffers, rounded once on the way out); on a GPU a 16-bit call widens outside the kernels.
  // Weights and bias are widened either way (they are small).
  const DType act = dev.is_cpu() ? dtype : DType::Float32;
  Tensor cx = (act == dtype ? x : detail::widened(x)).contiguous();
  Tensor cw = detail::widened(weight).contiguous();
  Tensor cb = bias.defined() ? detail::widened(bias).contiguous() : Tensor();
  Tensor out = Tensor::empty({g.n, g.o, g.oh, g.ow}, act, dev);
  detail::conv2d_forward(dev, g, act, cx.raw_data(), cw.data_ptr<float>(),
                         cb.defined() ? cb.data_ptr<float>() : nullptr, out.raw_data());
  Tensor result = detail::rounded(out, dtype);
  if (!autograd::needs_grad({&x, &weight, &bias})) return result;
  Tensor dx = act == dtype ? cx.detach() : detail::kept_for_backward(x, cx);
  Tensor dw = detail::kept_for_backward(weight, cw);
  bool gx = x.requires_grad(), gw = weight.requires_grad(),
       gb = bias.defined() && bias.requires_grad();
  // The gradients in float32 (gx in `act`); gw and gb are rounded to dtype below or by
  // widened_backward, which also rounds a float32 gx.
  auto backward = [=](const Tensor& gy, std::vector<Tensor>& gi) {
    Tensor cgy = (gy.dtype() == act ? gy : gy.to(act)).contiguous();
    Tensor wx = act == dtype ? dx : detail::widened(dx), ww = detail::widened(dw);
    if (gx) gi[0] = Tensor::empty(wx.shape(), act, dev);
    if (gw) gi[1] = Tensor::empty(ww.shape(), DType::Float32, dev);
    if (gb) gi[2] = Tensor::empty({g.o}, DType::Float32, dev);
    detail::conv2d_backward(dev, g, act, wx.raw_data(), ww.data_ptr<float>(), cgy.raw_data(),
                            gx ? gi[0].raw_data() : nullptr, gw ? gi[1].data_ptr<float>() : nullptr,
                            gb ? gi[2].data_ptr<float>() : nullptr);
  };
  if (act != dtype)
    return autograd::record(result, "conv2d", {x, weight, bias},
                            detail::widened_backward(dtype, backward));
  return autograd::record(result, "conv2d", {x, weight, bias},
                          [=](const Tensor& gy, std::vector<Tensor>& gi) {
                            backward(gy, gi);
                            for (size_t k = 1; k < gi.size(); ++k)
                              if (gi[k].defined()) gi[k] = detail::rounded(gi[k], dtype);
                          });
}

}  // namespace galley
