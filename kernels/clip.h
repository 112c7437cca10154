#pragma once
// Gradient clipping over many tensors at once (torch.nn.utils.clip_grad_norm_ /
// clip_grad_value_): one reduction pass over every gradient for the total norm, one pass that
// scales or clamps them all. The CUDA launchers take device spans and the cudaStream_t to run
// on (each dtype's spans launched together); they only enqueue.
#include <cstdint>

#include "galley/dtype.h"

namespace galley::kernels {

// One gradient: n contiguous elements of `dtype` (float32, bfloat16 or float16). The spans of
// one call may have different dtypes; a 16-bit element is widened to float32 for the
// arithmetic (norms accumulate in double) and a changed element rounded back once.
struct GradSpan {
  void* data;
  int64_t n;
  DType dtype = DType::Float32;
};

// The spans are cut into chunks of this many elements (a span's last chunk is shorter); each
// chunk's partial result is computed on its own and the partials are combined in chunk order,
// so the result depends on the sizes alone, not on the thread count (the same bits for every
// data-parallel replica on one kind of device). The CPU and CUDA kernels use the same chunks;
// a GPU combines the partials in another order (by dtype, then a tree), so the two may differ in
// the last bit.
constexpr int64_t kClipChunk = 8192;

namespace cpu {

// The norm of all the spans' elements taken together, as one vector: (sum |x|^p)^(1/p), with
// the sum in double; p = inf gives max |x|. NaN when an element is NaN; inf when one is
// infinite (and none is NaN). p must be positive (or inf). 0 for no elements.
double grad_norm(const GradSpan* spans, int count, double norm_type);
// x *= scale for every element.
void scale_grads(const GradSpan* spans, int count, float scale);
// x = min(max(x, -clip), clip) for every element; NaN stays NaN.
void clamp_grads(const GradSpan* spans, int count, float clip);

}  // namespace cpu

namespace cuda {

// The doubles of device scratch grad_norm needs for these spans (one per chunk).
int64_t grad_norm_scratch(const GradSpan* spans, int count);
// *total (a device float) = the norm, as cpu::grad_norm. One launch per 64 spans writes one
// partial per chunk into `scratch`, a last one adds them by a fixed tree, never by atomics.
void grad_norm(const GradSpan* spans, int count, double norm_type, double* scratch, float* total,
               void* stream);
// x *= scale for every element (one launch per 64 spans).
void scale_grads(const GradSpan* spans, int count, float scale, void* stream);
// x = min(max(x, -clip), clip) for every element; NaN stays NaN.
void clamp_grads(const GradSpan* spans, int count, float clip, void* stream);

}  // namespace cuda
}  // namespace galley::kernels
