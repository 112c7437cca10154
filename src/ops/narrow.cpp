// narrow and select: views of a slice of one dimension (no copy). The backward writes the
// gradient into the slice of a zero gradient of the input's shape.
#include "src/ops/narrow.h"
#include "galley/autograd.h"
#include "galley/ops.h"
#include "galley/profiler.h"
#include "src/ops/copy.h"
#include "src/ops/dispatch.h"

namespace galley {

namespace detail {

Tensor narrow_view(const Tensor& x, int64_t dim, int64_t start, int64_t length, const char* name) {
  Tensor out = narrowed(x, dim, start, length);
  if (!autograd::needs_grad({&x})) return out;
  const Shape in_shape = x.shape();
  return autograd::record(out, name, {x}, [=](const Tensor& g, std::vector<Tensor>& gi) {
    Tensor gx = zeros(in_shape, g.dtype(), g.device());
    copy_strided(g, narrowed(gx, dim, start, length));
    gi[0] = gx;
  });
}

}  // namespace detail

Tensor narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length) {
  profiler::OpScope prof("narrow", {&x});
  detail::check_tensor("narrow", x);
  GALLEY_CHECK(x.dim() > 0, "narrow: a scalar has no dimension to narrow");
  const int64_t d = detail::wrap_dim("narrow", dim, x.dim());
  const int64_t size = x.shape()[d];
  GALLEY_CHECK(start >= -size && start <= size, "narrow: start ", start,
               " out of range for dimension ", dim, " of shape ", shape_str(x.shape()));
  const int64_t s = start < 0 ? start + size : start;
  GALLEY_CHECK(length >= 0 && length <= size - s, "narrow: [", s, ", ", s, " + ", length,
               ") exceeds dimension ", dim, " of shape ", shape_str(x.shape()));
  return detail::narrow_view(x, d, s, length, "narrow");
}

Tensor select(const Tensor& x, int64_t dim, int64_t index) {
  profiler::OpScope prof("select", {&x});
  detail::check_tensor("select", x);
  GALLEY_CHECK(x.dim() > 0, "select: a scalar has no dimension to select from");
  const int64_t d = detail::wrap_dim("select", dim, x.dim());
  const int64_t size = x.shape()[d];
  GALLEY_CHECK(index >= -size && index < size, "select: index ", index,
               " out of range for dimension ", dim, " of shape ", shape_str(x.shape()));
  const int64_t i = index < 0 ? index + size : index;
  Tensor out = detail::selected(x, d, i);
  if (!autograd::needs_grad({&x})) return out;
  const Shape in_shape = x.shape();
  return autograd::record(out, "select", {x}, [=](const Tensor& g, std::vector<Tensor>& gi) {
    Tensor gx = zeros(in_shape, g.dtype(), g.device());
    detail::copy_strided(g, detail::selected(gx, d, i));
    gi[0] = gx;
  });
}

Tensor Tensor::narrow(int64_t dim, int64_t start, int64_t length) const {
  return galley::narrow(*this, dim, start, length);
}

Tensor Tensor::select(int64_t dim, int64_t index) const {
  return galley::select(*this, dim, index);
}

}  // namespace galley
