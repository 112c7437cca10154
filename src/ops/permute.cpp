// permute and transpose: views with their dimensions reordered (strides permuted, no copy); the
// backward reorders the gradient back.
#include <vector>

#include "galley/autograd.h"
#include "galley/ops.h"
#include "galley/profiler.h"
#include "src/ops/copy.h"
#include "src/ops/dispatch.h"

namespace galley {

namespace {

Tensor permute_impl(const Tensor& x, const std::vector<int64_t>& order, const char* name) {
  Shape shape(order.size()), strides(order.size());
  for (size_t i = 0; i < order.size(); ++i) {
    shape[i] = x.shape()[order[i]];
    strides[i] = x.strides()[order[i]];
  }
  Tensor out = detail::as_strided(x, shape, strides, x.impl()->offset);
  if (!autograd::needs_grad({&x})) return out;
  std::vector<int64_t> inverse(order.size());
  for (size_t i = 0; i < order.size(); ++i) inverse[order[i]] = static_cast<int64_t>(i);
  return autograd::record(out, name, {x}, [inverse](const Tensor& g, std::vector<Tensor>& gi) {
    Shape gs(inverse.size()), gst(inverse.size());
    for (size_t i = 0; i < inverse.size(); ++i) {
      gs[i] = g.shape()[inverse[i]];
      gst[i] = g.strides()[inverse[i]];
    }
    gi[0] = detail::as_strided(g, gs, gst, g.impl()->offset).contiguous();
  });
}

}  // namespace

Tensor permute(const Tensor& x, const std::vector<int64_t>& dims) {
  profiler::OpScope prof("permute", {&x});
  detail::check_tensor("permute", x);
  const int64_t rank = x.dim();
  GALLEY_CHECK(static_cast<int64_t>(dims.size()) == rank, "permute: ", dims.size(),
               " dimensions given for a tensor of shape ", shape_str(x.shape()));
  std::vector<int64_t> order(dims.size());
  std::vector<bool> seen(dims.size(), false);
  for (size_t i = 0; i < dims.size(); ++i) {
    order[i] = detail::wrap_dim("permute", dims[i], rank);
    GALLEY_CHECK(!seen[order[i]], "permute: dimension ", dims[i], " appears twice in ",
                 shape_str(dims), " (shape ", shape_str(x.shape()), ")");
    seen[order[i]] = true;
  }
  return permute_impl(x, order, "permute");
}

Tensor transpose(const Tensor& x, int64_t dim0, int64_t dim1) {
  profiler::OpScope prof("transpose", {&x});
  detail::check_tensor("transpose", x);
  const int64_t rank = x.dim();
  const int64_t d0 = detail::wrap_dim("transpose", dim0, rank);
  const int64_t d1 = detail::wrap_dim("transpose", dim1, rank);
  std::vector<int64_t> order(rank);
  for (int64_t i = 0; i < rank; ++i) order[i] = i;
  if (rank > 0) std::swap(order[d0], order[d1]);
  return permute_impl(x, order, "transpose");
}

Tensor Tensor::permute(const std::vector<int64_t>& dims) const {
  return galley::permute(*this, dims);
}

Tensor Tensor::transpose(int64_t dim0, int64_t dim1) const {
  return galley::transpose(*this, dim0, dim1);
}

}  // namespace galley
