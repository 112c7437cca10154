// sum and mean (of all elements or along a dimension) and argmax: checks, the device switch and
// the autograd record. The kernels take float32: a 16-bit input is summed in float32 and the
// result rounded once.
#include "src/ops/reduce.h"

#include "galley/autograd.h"
#include "galley/ops.h"
#include "galley/profiler.h"
#include "kernels/reduce.h"
#include "src/ops/autocast.h"
#include "src/ops/dispatch.h"

namespace galley {

namespace cpu = kernels::cpu;
namespace gpu = kernels::cuda;

namespace detail {
Tensor sum_all(const Tensor& x, double divisor) {
  Tensor cx = x.contiguous();
  Tensor out = Tensor::empty({}, DType::Float32, x.device());
  if (x.device().is_cuda()) {
    gpu::sum_all(cx.data_ptr<float>(), cx.numel(), divisor, out.data_ptr<float>(),
                 stream(x.device()));
  } else {
    out.data_ptr<float>()[0] =
        static_cast<float>(cpu::sum_all(cx.data_ptr<float>(), cx.numel()) / divisor);
  }
  return out;
}
}  // namespace detail

namespace {

Shape reduced_shape(const Shape& s, int64_t dim, bool keepdim) {
  Shape out = s;
  if (out.empty()) return out;
  if (keepdim)
    out[dim] = 1;
  else
    out.erase(out.begin() + dim);
  return out;
}

// out[o, l, i] = g[o, i] / divisor on `dev`: the backward of a sum divided by `divisor` (a
// division, as PyTorch's mean backward; of the small reduced gradient, before it is spread).
Tensor expand_dim(const Tensor& g, const Shape& shape, const detail::Split3& sp, double divisor) {
  const Device dev = g.device();
  Tensor cg = detail::widened(g).contiguous();
  if (divisor != 1.0) cg = div(cg, static_cast<float>(divisor));
  Tensor grad = Tensor::empty(shape, DType::Float32, dev);
  if (dev.is_cuda())
    gpu::expand_dim(cg.data_ptr<float>(), sp.outer, sp.len, sp.inner, grad.data_ptr<float>(),
                    detail::stream(dev));
  else
    cpu::expand_dim(cg.data_ptr<float>(), sp.outer, sp.len, sp.inner, grad.data_ptr<float>());
  return grad;
}

// The sum / divisor (1 for a sum, the count for a mean); its backward spreads g / divisor.
Tensor divided_sum_all(const Tensor& x, double divisor, const char* name) {
  profiler::OpScope prof(name, {&x});
  detail::check_floating(name, x);
  const DType dtype = x.dtype();
  Tensor out = detail::rounded(detail::sum_all(detail::widened(x), divisor), dtype);
  if (!autograd::needs_grad({&x})) return out;
  Shape in_shape = x.shape();
  return autograd::record(out, name, {x}, [=](const Tensor& g, std::vector<Tensor>& gi) {
    // Every element's gradient is g / divisor: one row of len numel() fed by the scalar.
    detail::Split3 one_row;
    one_row.len = shape_numel(in_shape);
    gi[0] = detail::rounded(expand_dim(g, in_shape, one_row, divisor), dtype);
  });
}

Tensor divided_sum_dim(const Tensor& x, int64_t dim, bool keepdim, bool mean, const char* name) {
  profiler::OpScope prof(name, {&x});
  detail::check_floating(name, x);
  int64_t d = detail::wrap_dim(name, dim, x.dim());
  if (x.dim() == 0) return divided_sum_all(x, 1.0, name);
  const detail::Split3 sp = detail::split_at(x.shape(), d);
  const double divisor = mean ? double(sp.len) : 1.0;
  const DType dtype = x.dtype();
  const Device dev = x.device();
  Tensor cx = detail::widened(x).contiguous();
  Tensor sums = Tensor::empty(reduced_shape(x.shape(), d, keepdim), DType::Float32, dev);
  float* ps = sums.data_ptr<float>();
  if (dev.is_cuda()) {
    gpu::sum_dim(cx.data_ptr<float>(), sp.outer, sp.len, sp.inner, divisor, ps,
                 detail::stream(dev));
  } else {
    cpu::sum_dim(cx.data_ptr<float>(), sp.outer, sp.len, sp.inner, ps, divisor);
  }
  Tensor out = detail::rounded(sums, dtype);
  if (!autograd::needs_grad({&x})) return out;
  Shape in_shape = x.shape();
  return autograd::record(out, name, {x}, [=](const Tensor& g, std::vector<Tensor>& gi) {
    gi[0] = detail::rounded(expand_dim(g, in_shape, sp, divisor), dtype);
  });
}

// Under autocast the reductions take and return float32.
Tensor autocast_f32(const Tensor& x) {
  return detail::autocast_on() ? detail::AutocastPause().f32(x) : x;
}

}  // namespace

Tensor sum(const Tensor& x) {
  return divided_sum_all(autocast_f32(x), 1.0, "sum");
}
Tensor mean(const Tensor& x) {
  GALLEY_CHECK(x.defined(), "mean: the tensor is undefined");
  // Of no elements: 0 / 0, NaN, as PyTorch's and as the mean over an empty dimension.
  return divided_sum_all(autocast_f32(x), double(x.numel()), "mean");
}
Tensor sum(const Tensor& x, int64_t dim, bool keepdim) {
  return divided_sum_dim(autocast_f32(x), dim, keepdim, false, "sum");
}
Tensor mean(const Tensor& x, int64_t dim, bool keepdim) {
  return divided_sum_dim(autocast_f32(x), dim, keepdim, true, "mean");
}

Tensor argmax(const Tensor& x, int64_t dim, bool keepdim) {
  profiler::OpScope prof("argmax", {&x});
  detail::check_floating("argmax", x);
  int64_t d = detail::wrap_dim("argmax", dim, x.dim());
  const detail::Split3 sp = x.dim() == 0 ? detail::Split3{} : detail::split_at(x.shape(), d);
  GALLEY_CHECK(sp.len > 0, "argmax: dimension ", dim, " of ", shape_str(x.shape()), " is empty");
  const Device dev = x.device();
  // Widening is exact, so the winner is the one among the input's own values.
  Tensor cx = detail::widened(x).contiguous();
  Tensor out = Tensor::empty(reduced_shape(x.shape(), d, keepdim), DType::Int64, dev);
  if (dev.is_cuda())
    gpu::argmax_dim(cx.data_ptr<float>(), sp.outer, sp.len, sp.inner, out.data_ptr<int64_t>(),
                    detail::stream(dev));
  else
    cpu::argmax_dim(cx.data_ptr<float>(), sp.outer, sp.len, sp.inner, out.data_ptr<int64_t>());
  return out;
}

}  // namespace galley
