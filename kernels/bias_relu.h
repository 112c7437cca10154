#pragma once
// Bias add and ReLU in one pass: y = max(x + b[c], 0) over float32 x laid out
// [outer, channels, inner] (the channels of a convolution's output, or the features of a linear
// layer's). The CUDA launchers take device pointers and the cudaStream_t to run on.
#include <cstdint>

namespace galley::kernels {
namespace cpu {

void bias_relu_forward(const float* x, const float* b, int64_t outer, int64_t channels,
                       int64_t inner, float* y);
// gx = gy where y > 0, else 0 (gx may be gy); gb[c] = the sum of gx over outer and inner (gb may
// be null).
void bias_relu_backward(const float* gy, const float* y, int64_t outer, int64_t channels,
                        int64_t inner, float* gx, float* gb);

}  // namespace cpu

namespace cuda {

// The bias gradient is summed in a fixed order (the same bits at every run), over a grid of
// channels x chunks.
void bias_relu_forward(const float* x, const float* b, int64_t outer, int64_t channels,
                       int64_t inner, float* y, void* stream);
void bias_relu_backward(const float* gy, const float* y, int64_t outer, int64_t channels,
                        int64_t inner, float* gx, float* gb, void* stream);

}  // namespace cuda
}  // namespace galley::kernels
