// Strided copies between tensors of one device: the dimensions merged as far as both sides allow,
// then the device switch. contiguous() and every op that moves data through views run on it.
#include "kernels/copy.h"

#include "src/ops/copy.h"
#include "src/ops/dispatch.h"

namespace galley::detail {

namespace cpu = kernels::cpu;
namespace gpu = kernels::cuda;

Tensor as_strided(const Tensor& t, const Shape& shape, const Shape& strides, int64_t offset) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = t.impl()->storage;
  impl->offset = offset;
  impl->shape = shape;
  impl->strides = strides;
  impl->dtype = t.dtype();
  return Tensor(std::move(impl));
}

Tensor narrowed(const Tensor& t, int64_t dim, int64_t start, int64_t length) {
  Shape shape = t.shape();
  shape[dim] = length;
  return as_strided(t, shape, t.strides(), t.impl()->offset + start * t.strides()[dim]);
}

Tensor selected(const Tensor& t, int64_t dim, int64_t index) {
  Shape shape = t.shape(), strides = t.strides();
  shape.erase(shape.begin() + dim);
  strides.erase(strides.begin() + dim);
  return as_strided(t, shape, strides, t.impl()->offset + index * t.strides()[dim]);
}

void check_tensor(const char* op, const Tensor& t) {
  GALLEY_CHECK(t.defined(), op, ": an input tensor is undefined");
  GALLEY_CHECK(t.device().is_cpu() || t.device().index() < cuda_device_count(), op,
               ": the tensor is on ", t.device().str(), ", which does not exist here");
}

namespace {

// The copy's index space with size-1 dimensions dropped and neighbours merged where both sides
// step through them as one (a dense run on both sides becomes one dimension).
kernels::StridedCopy geometry(const Tensor& src, const Tensor& dst) {
  kernels::StridedCopy g;
  g.rank = 0;
  const Shape& sz = src.shape();
  for (size_t d = 0; d < sz.size(); ++d) {
    if (sz[d] == 1) continue;
    const int64_t ss = src.strides()[d], ds = dst.strides()[d];
    if (g.rank > 0 && g.src_strides[g.rank - 1] == ss * sz[d] &&
        g.dst_strides[g.rank - 1] == ds * sz[d]) {
      g.sizes[g.rank - 1] *= sz[d];
      g.src_strides[g.rank - 1] = ss;
      g.dst_strides[g.rank - 1] = ds;
      continue;
    }
    GALLEY_CHECK(g.rank < kernels::kMaxCopyDims, "copy: ", shape_str(sz), " with strides ",
                 shape_str(src.strides()), " and ", shape_str(dst.strides()), " has more than ",
                 kernels::kMaxCopyDims, " dimensions that cannot be merged");
    g.sizes[g.rank] = sz[d];
    g.src_strides[g.rank] = ss;
    g.dst_strides[g.rank] = ds;
    ++g.rank;
  }
  if (g.rank == 0) {  // one element
    g.rank = 1;
    g.sizes[0] = 1;
    g.src_strides[0] = g.dst_strides[0] = 1;
  }
  return g;
}

}  // namespace

void copy_strided(const Tensor& src, const Tensor& dst) {
  GALLEY_CHECK(
      src.shape() == dst.shape() && src.dtype() == dst.dtype() && src.device() == dst.device(),
      "copy: source ", shape_str(src.shape()), " ", dtype_name(src.dtype()), " on ",
      src.device().str(), " does not match destination ", shape_str(dst.shape()), " ",
      dtype_name(dst.dtype()), " on ", dst.device().str());
  if (src.numel() == 0) return;
  const kernels::StridedCopy g = geometry(src, dst);
  const Device dev = src.device();
  if (dev.is_cuda())
    gpu::strided_copy(g, dtype_size(src.dtype()), src.raw_data(), dst.raw_data(), stream(dev));
  else
    cpu::strided_copy(g, dtype_size(src.dtype()), src.raw_data(), dst.raw_data());
}

}  // namespace galley::detail
