// bias_relu: relu(x + bias) along one dimension in one pass, and its fused backward. The kernels
// take float32: a 16-bit op widens its inputs, rounds its output once and computes its gradients
// in float32 (masked by the rounded output, as a 16-bit relu is).
#include "kernels/bias_relu.h"

#include "galley/autograd.h"
#include "galley/ops.h"
#include "galley/profiler.h"
#include "src/ops/autocast.h"
#include "src/ops/dispatch.h"

namespace galley {

namespace cpu = kernels::cpu;
namespace gpu = kernels::cuda;

Tensor bias_relu(const Tensor& x, const Tensor& bias, int64_t dim) {
  if (detail::autocast_on()) {
    detail::AutocastPause pause;
    return bias_relu(x, pause.to(bias, x.dtype()), dim);
  }
  profiler::OpScope prof("bias_relu", {&x, &bias});
  detail::check_floating_pair("bias_relu", x, bias);
  const int64_t d = dim < 0 ? dim + x.dim() : dim;
  GALLEY_CHECK(x.dim() >= 1 && d >= 0 && d < x.dim(), "bias_relu: dimension ", dim,
               " is out of range for ", shape_str(x.shape()));
  GALLEY_CHECK(bias.dim() == 1 && bias.size(0) == x.size(d), "bias_relu: bias ",
               shape_str(bias.shape()), " does not match dimension ", dim, " of ",
               shape_str(x.shape()));
  int64_t outer = 1, inner = 1;
  for (int64_t k = 0; k < d; ++k) outer *= x.size(k);
  for (int64_t k = d + 1; k < x.dim(); ++k) inner *= x.size(k);
  const int64_t channels = x.size(d);
  const DType dtype = x.dtype();
  const Device dev = x.device();
  Tensor cx = detail::widened(x).contiguous(), cb = detail::widened(bias).contiguous();
  Tensor out = Tensor::empty(x.shape(), DType::Float32, dev);
  if (dev.is_cuda())
    gpu::bias_relu_forward(cx.data_ptr<float>(), cb.data_ptr<float>(), outer, channels, inner,
                           out.data_ptr<float>(), detail::stream(dev));
  else
    cpu::bias_relu_forward(cx.data_ptr<float>(), cb.data_ptr<float>(), outer, channels, inner,
                           out.data_ptr<float>());
  Tensor result = detail::rounded(out, dtype);
  if (!autograd::needs_grad({&x, &bias})) return result;
  Tensor dout = result.detach();
  const bool gx = x.requires_grad(), gb = bias.requires_grad();
  return autograd::record(
      result, "bias_relu", {x, bias},
      detail::widened_backward(
          dtype,
          [=](const Tensor& g, std::vector<Tensor>& gi) {
            // The masked gradient goes into the incoming one when nothing else holds it.
            const bool reuse = gx && detail::sole_owner(g);
            Tensor cg = g.contiguous();
            Tensor wout = detail::widened(dout);
            Tensor gxt = reuse ? cg : Tensor::empty(wout.shape(), DType::Float32, dev);
            if (gb) gi[1] = Tensor::empty({channels}, DType::Float32, dev);
            float* pgb = gb ? gi[1].data_ptr<float>() : nullptr;
            if (dev.is_cuda())
              gpu::bias_relu_backward(cg.data_ptr<float>(), wout.data_ptr<float>(), outer, channels,
                                      inner, gxt.data_ptr<float>(), pgb, detail::stream(dev));
            else
              cpu::bias_relu_backward(cg.data_ptr<float>(), wout.data_ptr<float>(), outer, channels,
                                      inner, gxt.data_ptr<float>(), pgb);
            if (gx) gi[0] = gxt;
          }),
      {{"output", dout}});
}

}  // namespace galley
