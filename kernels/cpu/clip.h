#pragma once
// Gradient clipping over many tensors at once (torch.nn.utils.clip_grad_norm_ /
// clip_grad_value_): one reduction pass over every gradient for the total norm, one pass that
// scales or clamps them all.
#include <cstdint>

#include "galley/dtype.h"

namespace galley::kernels::cpu {

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
// data-parallel replica). The CUDA kernels use the same chunks.
constexpr int64_t kClipChunk = 8192;

// The norm of all the spans' elements taken together, as one vector: (sum |x|^p)^(1/p), with
// the sum in double; p = inf gives max |x|. NaN when an element is NaN; inf when one is
// infinite (and none is NaN). p must be positive (or inf). 0 for no elements.
double grad_norm(const GradSpan* spans, int count, double norm_type);
// x *= scale for every element.
void scale_grads(const GradSpan* spans, int count, float scale);
// x = min(max(x, -clip), clip) for every element; NaN stays NaN.
void clamp_grads(const GradSpan* spans, int count, float clip);

}  // namespace galley::kernels::cpu
