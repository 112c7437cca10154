#pragma once
// Float32 softmax and log-softmax along one dimension of a tensor viewed as [outer, len, inner],
// forward and backward. The CUDA launchers take device pointers and the cudaStream_t to run on.
#include <cstdint>

namespace galley::kernels {
namespace cpu {

// y = softmax (or log-softmax when `log`) of x along len.
void softmax_forward(const float* x, int64_t outer, int64_t len, int64_t inner, bool log, float* y);
// Softmax: gx = y * (gy - sum(gy * y)); log-softmax: gx = gy - exp(y) * sum(gy).
void softmax_backward(const float* y, const float* gy, int64_t outer, int64_t len, int64_t inner,
                      bool log, float* gx);

}  // namespace cpu

namespace cuda {

void softmax_forward(const float* x, int64_t outer, int64_t len, int64_t inner, bool log, float* y,
                     void* stream);
void softmax_backward(const float* y, const float* gy, int64_t outer, int64_t len, int64_t inner,
                      bool log, float* gx, void* stream);

}  // namespace cuda
}  // namespace galley::kernels
