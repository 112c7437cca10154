#pragma once
// Strided copies: dst[i] = src[i] over an n-dimensional index space, each side with its own
// strides (in elements), for elements of 1, 2, 4 or 8 bytes (any dtype: a copy moves bits). What
// contiguous() of a view, cat, narrow's backward and in-place writes into views run on. The op
// layer merges dimensions first (see src/ops/copy.cpp), so the kernels see few of them. The CUDA
// launcher takes device pointers and the cudaStream_t to run on; it only enqueues.
#include <cstddef>
#include <cstdint>

namespace galley::kernels {

// The most dimensions a copy has after merging (PyTorch's limit on a tensor's rank as well).
constexpr int kMaxCopyDims = 25;

// The index space of one copy, outermost dimension first; rank >= 1 and every size >= 1.
struct StridedCopy {
  int rank = 1;
  int64_t sizes[kMaxCopyDims];
  int64_t src_strides[kMaxCopyDims];
  int64_t dst_strides[kMaxCopyDims];
};

namespace cpu {

// Copies every element of `g`'s index space from src to dst (which must not overlap).
void strided_copy(const StridedCopy& g, size_t element_size, const void* src, void* dst);

}  // namespace cpu

namespace cuda {

void strided_copy(const StridedCopy& g, size_t element_size, const void* src, void* dst,
                  void* stream);

}  // namespace cuda
}  // namespace galley::kernels
