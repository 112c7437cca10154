#include "src/ops/dispatch.h"

namespace galley::detail {

void check_float(const char* op, const Tensor& t) {
  GALLEY_CHECK(t.defined(), op, ": an input tensor is undefined");
  GALLEY_CHECK(t.dtype() == DType::Float32, op, ": expected a float32 tensor, got ",
               dtype_name(t.dtype()), " of shape ", shape_str(t.shape()));
  GALLEY_CHECK(t.device().is_cpu() || t.device().index() < cuda_device_count(), op,
               ": the tensor is on ", t.device().str(), ", which does not exist here");
}

void check_float_pair(const char* op, const Tensor& a, const Tensor& b) {
  check_float(op, a);
  check_float(op, b);
  GALLEY_CHECK(a.device() == b.device(), op, ": inputs on different devices (", a.device().str(),
               " and ", b.device().str(), ")");
}

int64_t wrap_dim(const char* op, int64_t dim, int64_t rank) {
  int64_t r = rank == 0 ? 1 : rank;
  GALLEY_CHECK(dim >= -r && dim < r, op, ": dimension ", dim, " out of range for rank ", rank);
  return dim < 0 ? dim + r : dim;
}

}  // namespace galley::detail
