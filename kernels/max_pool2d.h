#pragma once
// 2-D max pooling, NCHW, float32, with the argmax of each window kept for backward. The CUDA
// launchers take device pointers and the cudaStream_t to run on.
#include <cstdint>

namespace galley::kernels {

struct Pool2dGeometry {
  int64_t planes, h, w;  // planes = N * C
  int64_t k, stride, pad;
  int64_t oh, ow;
};

namespace cpu {

// y = max over each window; idx = offset of the winner inside its input plane.
void max_pool2d_forward(const Pool2dGeometry& g, const float* x, float* y, int32_t* idx);
// gx (overwritten) receives gy at the winners.
void max_pool2d_backward(const Pool2dGeometry& g, const float* gy, const int32_t* idx, float* gx);

}  // namespace cpu

namespace cuda {

void max_pool2d_forward(const Pool2dGeometry& g, const float* x, float* y, int32_t* idx,
                        void* stream);
void max_pool2d_backward(const Pool2dGeometry& g, const float* gy, const int32_t* idx, float* gx,
                         void* stream);

}  // namespace cuda
}  // namespace galley::kernels
