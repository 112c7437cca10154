// softmax and log_softmax along a dimension: checks, the device switch and the autograd record.
// The kernels take float32: a 16-bit input is computed in float32 and the result rounded once.
#include "kernels/softmax.h"

#include "galley/autograd.h"
#include "galley/ops.h"
#include "galley/profiler.h"
#include "src/ops/autocast.h"
#include "src/ops/dispatch.h"

namespace galley {

namespace cpu = kernels::cpu;
namespace gpu = kernels::cuda;

namespace {

Tensor softmax_impl(const Tensor& x, int64_t dim, bool log, const char* name) {
  profiler::OpScope prof(name, {&x});
  detail::check_floating(name, x);
  int64_t d = detail::wrap_dim(name, dim, x.dim());
  const detail::Split3 sp = x.dim() == 0 ? detail::Split3{} : detail::split_at(x.shape(), d);
  const DType dtype = x.dtype();
  const Device dev = x.device();
  Tensor cx = detail::widened(x).contiguous();
  Tensor y = Tensor::empty(x.shape(), DType::Float32, dev);
  if (dev.is_cuda())
    gpu::softmax_forward(cx.data_ptr<float>(), sp.outer, sp.len, sp.inner, log, y.data_ptr<float>(),
                         detail::stream(dev));
  else
    cpu::softmax_forward(cx.data_ptr<float>(), sp.outer, sp.len, sp.inner, log,
                         y.data_ptr<float>());
  Tensor out = detail::rounded(y, dtype);
  if (!autograd::needs_grad({&x})) return out;
  // The backward reads the float32 probabilities (the 16-bit output's rounding stays out of
  // it) through a handle of its own: `out` may be `y` itself, and holding the graph's output
  // from its own node would keep both alive for ever.
  y = y.detach();
  return autograd::record(
      out, name, {x},
      [=](const Tensor& g, std::vector<Tensor>& gi) {
        Tensor cg = detail::widened(g).contiguous();
        Tensor grad = Tensor::empty(y.shape(), DType::Float32, dev);
        if (dev.is_cuda())
          gpu::softmax_backward(y.data_ptr<float>(), cg.data_ptr<float>(), sp.outer, sp.len,
                                sp.inner, log, grad.data_ptr<float>(), detail::stream(dev));
        else
          cpu::softmax_backward(y.data_ptr<float>(), cg.data_ptr<float>(), sp.outer, sp.len,
                                sp.inner, log, grad.data_ptr<float>());
        gi[0] = detail::rounded(grad, dtype);
      },
      {{"output", y}});
}

}  // namespace

Tensor softmax(const Tensor& x, int64_t dim) {
  if (detail::autocast_on())
    return softmax_impl(detail::AutocastPause().f32(x), dim, false, "softmax");
  return softmax_impl(x, dim, false, "softmax");
}
Tensor log_softmax(const Tensor& x, int64_t dim) {
  if (detail::autocast_on())
    return softmax_impl(detail::AutocastPause().f32(x), dim, true, "log_softmax");
  return softmax_impl(x, dim, true, "log_softmax");
}

}  // namespace galley
