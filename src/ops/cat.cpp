// cat and stack: every input copied into its slab of one new tensor along a dimension. The
// backward hands each input the matching slab of the gradient.
#include <vector>

#include "galley/autograd.h"
#include "galley/ops.h"
#include "galley/profiler.h"
#include "src/ops/autocast.h"
#include "src/ops/copy.h"
#include "src/ops/dispatch.h"

namespace galley {

namespace {

// Every input defined, on one device and of one dtype (the errors name the input's index).
void check_parts(const char* op, const std::vector<Tensor>& ts) {
  GALLEY_CHECK(!ts.empty(), op, ": expected at least one tensor");
  for (size_t k = 0; k < ts.size(); ++k) {
    GALLEY_CHECK(ts[k].defined(), op, ": tensor ", k, " is undefined");
    detail::check_tensor(op, ts[k]);
    GALLEY_CHECK(ts[k].dtype() == ts[0].dtype(), op, ": tensor ", k, " is ",
                 dtype_name(ts[k].dtype()), " ", shape_str(ts[k].shape()), " but tensor 0 is ",
                 dtype_name(ts[0].dtype()), " ", shape_str(ts[0].shape()),
                 "; convert one with .to(dtype)");
    GALLEY_CHECK(ts[k].device() == ts[0].device(), op, ": tensor ", k, " is on ",
                 ts[k].device().str(), " but tensor 0 is on ", ts[0].device().str());
  }
}

// The inputs (equal in every dimension but `dim`) copied one after another along `dim`.
Tensor concat(const std::vector<Tensor>& parts, int64_t dim) {
  Shape shape = parts[0].shape();
  shape[dim] = 0;
  for (const Tensor& t : parts) shape[dim] += t.shape()[dim];
  Tensor out = Tensor::empty(shape, parts[0].dtype(), parts[0].device());
  int64_t start = 0;
  for (const Tensor& t : parts) {
    detail::copy_strided(t, detail::narrowed(out, dim, start, t.shape()[dim]));
    start += t.shape()[dim];
  }
  return out;
}

// Which inputs want a gradient, so that backward cuts only their slabs.
std::vector<bool> wanting_grad(const std::vector<Tensor>& ts) {
  std::vector<bool> want(ts.size());
  for (size_t k = 0; k < ts.size(); ++k) want[k] = ts[k].requires_grad();
  return want;
}

bool any_needs_grad(const std::vector<Tensor>& ts) {
  for (const Tensor& t : ts)
    if (autograd::needs_grad({&t})) return true;
  return false;
}

}  // namespace

Tensor cat(const std::vector<Tensor>& tensors, int64_t dim) {
  if (detail::autocast_on()) {
    detail::AutocastPause pause;
    return cat(pause.widened(tensors), dim);
  }
  profiler::OpScope prof("cat");
  check_parts("cat", tensors);
  const Tensor& first = tensors[0];
  GALLEY_CHECK(first.dim() > 0, "cat: tensor 0 is a scalar, which has no dimension to join along");
  const int64_t d = detail::wrap_dim("cat", dim, first.dim());
  for (size_t k = 1; k < tensors.size(); ++k) {
    const Shape& s = tensors[k].shape();
    bool same = s.size() == first.shape().size();
    for (size_t i = 0; same && i < s.size(); ++i)
      same = static_cast<int64_t>(i) == d || s[i] == first.shape()[i];
    GALLEY_CHECK(same, "cat: tensor ", k, " has shape ", shape_str(s), " but tensor 0 has ",
                 shape_str(first.shape()), "; they must match in every dimension but ", dim);
  }
  Tensor out = concat(tensors, d);
  if (!any_needs_grad(tensors)) return out;
  std::vector<int64_t> sizes;
  for (const Tensor& t : tensors) sizes.push_back(t.shape()[d]);
  const std::vector<bool> want = wanting_grad(tensors);
  return autograd::record(out, "cat", tensors, [=](const Tensor& g, std::vector<Tensor>& gi) {
    int64_t start = 0;
    for (size_t k = 0; k < sizes.size(); ++k) {
      if (want[k]) gi[k] = detail::narrowed(g, d, start, sizes[k]).contiguous();
      start += sizes[k];
    }
  });
}

Tensor stack(const std::vector<Tensor>& tensors, int64_t dim) {
  if (detail::autocast_on()) {
    detail::AutocastPause pause;
    return stack(pause.widened(tensors), dim);
  }
  profiler::OpScope prof("stack");
  check_parts("stack", tensors);
  const Tensor& first = tensors[0];
  for (size_t k = 1; k < tensors.size(); ++k)
    GALLEY_CHECK(tensors[k].shape() == first.shape(), "stack: tensor ", k, " has shape ",
                 shape_str(tensors[k].shape()), " but tensor 0 has ", shape_str(first.shape()),
                 "; stacked tensors must have one shape");
  const int64_t d = detail::wrap_dim("stack", dim, first.dim() + 1);
  // Each input as a view with a dimension of size 1 at `d`, joined along it.
  std::vector<Tensor> views;
  views.reserve(tensors.size());
  for (const Tensor& t : tensors) {
    Shape shape = t.shape(), strides = t.strides();
    const int64_t inner = d < t.dim() ? strides[d] * shape[d] : 1;
    shape.insert(shape.begin() + d, 1);
    strides.insert(strides.begin() + d, inner);
    views.push_back(detail::as_strided(t, shape, strides, t.impl()->offset));
  }
  Tensor out = concat(views, d);
  if (!any_needs_grad(tensors)) return out;
  const std::vector<bool> want = wanting_grad(tensors);
  return autograd::record(out, "stack", tensors, [=](const Tensor& g, std::vector<Tensor>& gi) {
    for (size_t k = 0; k < want.size(); ++k)
      if (want[k]) gi[k] = detail::selected(g, d, static_cast<int64_t>(k)).contiguous();
  });
}

}  // namespace galley
