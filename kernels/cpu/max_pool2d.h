#pragma once
// 2-D max pooling, NCHW, float32, with the argmax of each window kept for backward.
#include <cstdint>

namespace galley::kernels::cpu {

struct Pool2dGeometry {
  int64_t planes, h, w;  // planes = N * C
  int64_t k, stride, pad;
  int64_t oh, ow;
};

// y = max over each window; idx = offset of the winner inside its input plane.
void max_pool2d_forward(const Pool2dGeometry& g, const float* x, float* y, int32_t* idx);
// gx (overwritten) receives gy at the winners.
void max_pool2d_backward(const Pool2dGeometry& g, const float* gy, const int32_t* idx, float* gx);

}  // namespace galley::kernels::cpu
