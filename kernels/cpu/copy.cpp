// Strided copies on the host: rows of the innermost dimension, split over threads.
#include "kernels/copy.h"

#include <algorithm>
#include <cstring>

#include "galley/error.h"
#include "kernels/cpu/parallel.h"

namespace galley::kernels::cpu {
namespace {

// Rows [begin, end) of the index space: every dimension but the innermost, flattened.
template <typename T>
void copy_rows(const StridedCopy& g, const T* src, T* dst, int64_t begin, int64_t end) {
  const int inner = g.rank - 1;
  const int64_t n = g.sizes[inner], ss = g.src_strides[inner], ds = g.dst_strides[inner];
  for (int64_t row = begin; row < end; ++row) {
    int64_t so = 0, dof = 0;
    for (int64_t d = inner - 1, r = row; d >= 0; --d) {
      const int64_t i = r % g.sizes[d];
      r /= g.sizes[d];
      so += i * g.src_strides[d];
      dof += i * g.dst_strides[d];
    }
    const T* s = src + so;
    T* o = dst + dof;
    if (ss == 1 && ds == 1) {
      std::memcpy(o, s, size_t(n) * sizeof(T));
    } else {
      for (int64_t i = 0; i < n; ++i) o[i * ds] = s[i * ss];
    }
  }
}

template <typename T>
void copy_typed(const StridedCopy& g, const void* src, void* dst) {
  const int64_t n = g.sizes[g.rank - 1];
  int64_t rows = 1;
  for (int d = 0; d + 1 < g.rank; ++d) rows *= g.sizes[d];
  const int64_t grain = std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(n, 1));
  parallel_balanced(rows, grain, [&](int64_t b, int64_t e) {
    copy_rows(g, static_cast<const T*>(src), static_cast<T*>(dst), b, e);
  });
}

}  // namespace

void strided_copy(const StridedCopy& g, size_t element_size, const void* src, void* dst) {
  switch (element_size) {
    case 1:
      return copy_typed<uint8_t>(g, src, dst);
    case 2:
      return copy_typed<uint16_t>(g, src, dst);
    case 4:
      return copy_typed<uint32_t>(g, src, dst);
    case 8:
      return copy_typed<uint64_t>(g, src, dst);
    default:
      GALLEY_CHECK(false, "strided_copy: elements of ", element_size, " bytes are not supported");
  }
}

}  // namespace galley::kernels::cpu
