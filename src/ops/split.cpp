// split: views of consecutive slices of one dimension, each recorded as narrow is (its gradient
// written into its slice of zeros; autograd sums the slices' gradients).
#include <algorithm>
#include <vector>

#include "galley/ops.h"
#include "galley/profiler.h"
#include "src/ops/copy.h"
#include "src/ops/dispatch.h"
#include "src/ops/narrow.h"

namespace galley {

namespace {

std::vector<Tensor> split_at(const Tensor& x, int64_t d, const std::vector<int64_t>& sizes) {
  std::vector<Tensor> parts;
  parts.reserve(sizes.size());
  int64_t start = 0;
  for (int64_t len : sizes) {
    parts.push_back(detail::narrow_view(x, d, start, len, "split"));
    start += len;
  }
  return parts;
}

}  // namespace

std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim) {
  profiler::OpScope prof("split", {&x});
  detail::check_tensor("split", x);
  GALLEY_CHECK(x.dim() > 0, "split: a scalar has no dimension to split");
  const int64_t d = detail::wrap_dim("split", dim, x.dim());
  const int64_t size = x.shape()[d];
  GALLEY_CHECK(split_size > 0 || (split_size == 0 && size == 0), "split: split_size ", split_size,
               " for dimension ", dim, " of shape ", shape_str(x.shape()),
               " (it must be positive; 0 only splits an empty dimension)");
  // As PyTorch: pieces of split_size, the last one shorter; an empty dimension gives one piece.
  std::vector<int64_t> sizes;
  for (int64_t s = 0; s < size; s += sizes.back())  // (s + split_size may overflow)
    sizes.push_back(std::min(split_size, size - s));
  if (sizes.empty()) sizes.push_back(0);
  return split_at(x, d, sizes);
}

std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& split_sizes, int64_t dim) {
  profiler::OpScope prof("split", {&x});
  detail::check_tensor("split", x);
  GALLEY_CHECK(x.dim() > 0, "split: a scalar has no dimension to split");
  const int64_t d = detail::wrap_dim("split", dim, x.dim());
  int64_t total = 0;
  for (int64_t s : split_sizes) {
    GALLEY_CHECK(s >= 0, "split: negative size in ", shape_str(split_sizes));
    GALLEY_CHECK(s <= x.shape()[d] - total, "split: sizes ", shape_str(split_sizes),
                 " add up to more than the size ", x.shape()[d], " of dimension ", dim,
                 " of shape ", shape_str(x.shape()));
    total += s;
  }
  GALLEY_CHECK(total == x.shape()[d], "split: sizes ", shape_str(split_sizes), " add up to ", total,
               ", not to the size ", x.shape()[d], " of dimension ", dim, " of shape ",
               shape_str(x.shape()));
  return split_at(x, d, split_sizes);
}

}  // namespace galley
