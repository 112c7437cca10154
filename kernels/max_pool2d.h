#pragma once
// 2-D max pooling, NCHW, with the argmax of each window kept for backward. On the host in
// float32, bfloat16 or float16 (a 16-bit plane widened and rounded in per-thread buffers, with the
// float32 kernel's bits); the CUDA launchers take float32 device pointers and the cudaStream_t to
// run on.
#include <cstdint>

#include "galley/dtype.h"

namespace galley::kernels {

struct Pool2dGeometry {
  int64_t planes, h, w;  // planes = N * C
  int64_t k, stride, pad;
  int64_t oh, ow;
};

namespace cpu {

// y = max over each window; idx = offset of the winner inside its input plane. x and y hold
// `dtype` elements.
void max_pool2d_forward(const Pool2dGeometry& g, const void* x, void* y, int32_t* idx,
                        DType dtype = DType::Float32);
// gx (overwritten) receives gy at the winners (summed where windows overlap, in float32).
void max_pool2d_backward(const Pool2dGeometry& g, const void* gy, const int32_t* idx, void* gx,
                         DType dtype = DType::Float32);

}  // namespace cpu

namespace cuda {

void max_pool2d_forward(const Pool2dGeometry& g, const float* x, float* y, int32_t* idx,
                        void* stream);
void max_pool2d_backward(const Pool2dGeometry& g, const float* gy, const int32_t* idx, float* gx,
                         void* stream);

}  // namespace cuda
}  // namespace galley::kernels
