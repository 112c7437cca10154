// Reductions, softmax, argmax and the fused cross-entropy loss.
#include <memory>

#include "galley/autograd.h"
#include "galley/ops.h"
#include "galley/profiler.h"
#include "kernels/cross_entropy.h"
#include "kernels/reduce.h"
#include "kernels/softmax.h"
#include "src/device_scope.h"
#include "src/ops/backend.h"
#include "src/ops/dispatch.h"

namespace galley {

namespace cpu = kernels::cpu;

namespace {
struct Split3 {
  int64_t outer = 1, len = 1, inner = 1;
};
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
Shape reduced_shape(const Shape& s, int64_t dim, bool keepdim) {
  Shape out = s;
  if (out.empty()) return out;
  if (keepdim)
    out[dim] = 1;
  else
    out.erase(out.begin() + dim);
  return out;
}

Tensor scaled_sum_all(const Tensor& x, float scale, const char* name) {
  profiler::OpScope prof(name, {&x});
  detail::check_floating(name, x);
  detail::DeviceScope scope(x.device());
  const DType dtype = x.dtype();
  Tensor out = detail::rounded(backend::sum_all(detail::widened(x), scale), dtype);
  if (!autograd::needs_grad({&x})) return out;
  Shape in_shape = x.shape();
  const Device dev = x.device();
  return autograd::record(out, name, {x}, [=](const Tensor& g, std::vector<Tensor>& gi) {
    // Every element's gradient is g * scale: one row of len numel() fed by the scalar.
    Tensor cg = detail::widened(g).contiguous();
    Tensor grad = Tensor::empty(in_shape, DType::Float32, dev);
    backend::expand_dim(dev, cg.data_ptr<float>(), 1, shape_numel(in_shape), 1, scale,
                        grad.data_ptr<float>());
    gi[0] = detail::rounded(grad, dtype);
  });
}

Tensor scaled_sum_dim(const Tensor& x, int64_t dim, bool keepdim, bool mean, const char* name) {
  profiler::OpScope prof(name, {&x});
  detail::check_floating(name, x);
  detail::DeviceScope scope(x.device());
  int64_t d = detail::wrap_dim(name, dim, x.dim());
  if (x.dim() == 0) return scaled_sum_all(x, 1.f, name);
  Split3 sp = split_at(x.shape(), d);
  const float scale = mean ? 1.f / float(sp.len) : 1.f;
  const DType dtype = x.dtype();
  const Device dev = x.device();
  Tensor cx = detail::widened(x).contiguous();
  Tensor sums = Tensor::empty(reduced_shape(x.shape(), d, keepdim), DType::Float32, dev);
  backend::sum_dim(dev, cx.data_ptr<float>(), sp.outer, sp.len, sp.inner, scale,
                   sums.data_ptr<float>());
  Tensor out = detail::rounded(sums, dtype);
  if (!autograd::needs_grad({&x})) return out;
  Shape in_shape = x.shape();
  return autograd::record(out, name, {x}, [=](const Tensor& g, std::vector<Tensor>& gi) {
    Tensor cg = detail::widened(g).contiguous();
    Tensor grad = Tensor::empty(in_shape, DType::Float32, dev);
    backend::expand_dim(dev, cg.data_ptr<float>(), sp.outer, sp.len, sp.inner, scale,
                        grad.data_ptr<float>());
    gi[0] = detail::rounded(grad, dtype);
  });
}

Tensor softmax_impl(const Tensor& x, int64_t dim, bool log, const char* name) {
  profiler::OpScope prof(name, {&x});
  detail::check_floating(name, x);
  detail::DeviceScope scope(x.device());
  int64_t d = detail::wrap_dim(name, dim, x.dim());
  Split3 sp = x.dim() == 0 ? Split3{} : split_at(x.shape(), d);
  const DType dtype = x.dtype();
  const Device dev = x.device();
  Tensor cx = detail::widened(x).contiguous();
  Tensor y = Tensor::empty(x.shape(), DType::Float32, dev);
  backend::softmax_forward(dev, cx.data_ptr<float>(), sp.outer, sp.len, sp.inner, log,
                           y.data_ptr<float>());
  Tensor out = detail::rounded(y, dtype);
  if (!autograd::needs_grad({&x})) return out;
  // The backward reads the float32 probabilities (the 16-bit output's rounding stays out of
  // it) through a handle of its own: `out` may be `y` itself, and holding the graph's output
  // from its own node would keep both alive for ever.
  y = y.detach();
  return autograd::record(out, name, {x}, [=](const Tensor& g, std::vector<Tensor>& gi) {
    Tensor cg = detail::widened(g).contiguous();
    Tensor grad = Tensor::empty(y.shape(), DType::Float32, dev);
    backend::softmax_backward(dev, y.data_ptr<float>(), cg.data_ptr<float>(), sp.outer, sp.len,
                              sp.inner, log, grad.data_ptr<float>());
    gi[0] = detail::rounded(grad, dtype);
  });
}
}  // namespace

Tensor sum(const Tensor& x) {
  return scaled_sum_all(x, 1.f, "sum");
}
Tensor mean(const Tensor& x) {
  GALLEY_CHECK(x.defined() && x.numel() > 0, "mean: the tensor is empty");
  return scaled_sum_all(x, 1.f / float(x.numel()), "mean");
}
Tensor sum(const Tensor& x, int64_t dim, bool keepdim) {
  return scaled_sum_dim(x, dim, keepdim, false, "sum");
}
Tensor mean(const Tensor& x, int64_t dim, bool keepdim) {
  return scaled_sum_dim(x, dim, keepdim, true, "mean");
}
Tensor softmax(const Tensor& x, int64_t dim) {
  return softmax_impl(x, dim, false, "softmax");
}
Tensor log_softmax(const Tensor& x, int64_t dim) {
  return softmax_impl(x, dim, true, "log_softmax");
}

Tensor argmax(const Tensor& x, int64_t dim, bool keepdim) {
  profiler::OpScope prof("argmax", {&x});
  detail::check_floating("argmax", x);
  detail::DeviceScope scope(x.device());
  int64_t d = detail::wrap_dim("argmax", dim, x.dim());
  Split3 sp = x.dim() == 0 ? Split3{} : split_at(x.shape(), d);
  GALLEY_CHECK(sp.len > 0, "argmax: dimension ", dim, " of ", shape_str(x.shape()), " is empty");
  // Widening is exact, so the winner is the one among the input's own values.
  Tensor cx = detail::widened(x).contiguous();
  Tensor out = Tensor::empty(reduced_shape(x.shape(), d, keepdim), DType::Int64);
  backend::argmax_dim(x.device(), cx.data_ptr<float>(), sp.outer, sp.len, sp.inner,
                      out.data_ptr<int64_t>());
  return out;
}

Tensor cross_entropy(const Tensor& logits, const Tensor& labels, const CrossEntropyOptions& o) {
  profiler::OpScope prof("cross_entropy", {&logits, &labels});
  detail::check_floating("cross_entropy", logits);
  detail::DeviceScope scope(logits.device());
  GALLEY_CHECK(labels.defined() && labels.dtype() == DType::Int64,
               "cross_entropy: labels must be an int64 tensor of class indices",
               labels.defined() ? ", got " + dtype_name(labels.dtype()) : std::string());
  GALLEY_CHECK(logits.dim() == 2, "cross_entropy: logits must be [N, C], got ",
               shape_str(logits.shape()));
  GALLEY_CHECK(labels.dim() == 1 && labels.size(0) == logits.size(0), "cross_entropy: logits ",
               shape_str(logits.shape()), " and labels ", shape_str(labels.shape()),
               " disagree (labels must be [N] with N = ", logits.size(0), ")");
  GALLEY_CHECK(o.label_smoothing >= 0.f && o.label_smoothing <= 1.f,
               "cross_entropy: label_smoothing ", o.label_smoothing, " is outside [0, 1]");
  const int64_t n = logits.size(0), c = logits.size(1);
  // The loss comes in the logits' dtype (as PyTorch's); it is computed in float32, and so is the
  // gradient from the float32 probabilities kept here.
  const DType dtype = logits.dtype();
  Tensor cx = detail::widened(logits).contiguous(), cy = labels.contiguous();
  Tensor per_row = Tensor::empty({n});
  Tensor prob = Tensor::empty({n, c});
  GALLEY_CHECK(labels.device() == logits.device(), "cross_entropy: logits on ",
               logits.device().str(), " but labels on ", labels.device().str());
  const Device dev = logits.device();
  int64_t bad = -1;
  Tensor count_dev;  // on a GPU the rows counted stay on the device
  const int64_t count = backend::cross_entropy_forward(
      dev, cx.data_ptr<float>(), cy.data_ptr<int64_t>(), n, c, o.label_smoothing, o.ignore_index,
      per_row.data_ptr<float>(), prob.data_ptr<float>(), &bad, &count_dev);
  GALLEY_CHECK(bad < 0, "cross_entropy: label ",
               bad >= 0 ? cy.to(Device::cpu()).data_ptr<int64_t>()[bad] : 0, " at row ", bad,
               " is outside [0, ", c, ")");
  const bool mean = o.reduction == Reduction::Mean;
  Tensor out;
  if (o.reduction == Reduction::None) {
    out = per_row;
  } else if (dev.is_cpu()) {
    double s = cpu::sum_all(per_row.data_ptr<float>(), n);
    // A mean over no counted rows (all ignored) is defined as 0 with zero gradient.
    if (mean) s = count > 0 ? s / double(count) : 0.0;
    out = Tensor::empty({});
    out.data_ptr<float>()[0] = static_cast<float>(s);
  } else {
    out = backend::sum_all(per_row, 1.f);
    if (mean) out = backend::row_scales(out, 1.f, 1, count_dev).view({});
  }
  Tensor result = detail::rounded(out, dtype);
  if (!autograd::needs_grad({&logits})) return result;
  const Reduction red = o.reduction;
  const float eps = o.label_smoothing;
  const int64_t ignore = o.ignore_index;
  return autograd::record(
      result, "cross_entropy", {logits},
      detail::widened_backward(dtype, [=](const Tensor& g, std::vector<Tensor>& gi) {
        Tensor scale;
        if (red == Reduction::None) {
          scale = g.contiguous();
        } else if (dev.is_cpu()) {
          float s = g.item();
          if (red == Reduction::Mean) s = count > 0 ? s / float(count) : 0.f;
          scale = full({n}, s);
        } else {
          scale = backend::row_scales(g, 1.f, n, mean ? count_dev : Tensor());
        }
        gi[0] = Tensor::empty({n, c});
        backend::cross_entropy_backward(dev, prob.data_ptr<float>(), cy.data_ptr<int64_t>(), scale,
                                        n, c, eps, ignore, gi[0].data_ptr<float>());
      }));
}

}  // namespace galley
