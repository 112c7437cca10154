#include "kernels/bias_relu.h"

#include <algorithm>

#include "kernels/cpu/parallel.h"
#include "kernels/unary_math.h"

namespace galley::kernels::cpu {

void bias_relu_forward(const float* x, const float* b, int64_t outer, int64_t channels,
                       int64_t inner, float* y) {
  const int64_t rows = outer * channels;
  parallel_balanced(rows, std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(inner, 1)),
                    [&](int64_t r0, int64_t r1) {
                      for (int64_t r = r0; r < r1; ++r) {
                        const float bc = b[r % channels];
                        const float* xr = x + r * inner;
                        float* yr = y + r * inner;
                        for (int64_t i = 0; i < inner; ++i) yr[i] = unary_math::relu(xr[i] + bc);
                      }
                    });
}

void bias_relu_backward(const float* gy, const float* y, int64_t outer, int64_t channels,
                        int64_t inner, float* gx, float* gb) {
  // By channel, so that each bias gradient is summed by one thread in a fixed order.
  parallel_balanced(channels,
                    std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(outer * inner, 1)),
                    [&](int64_t c0, int64_t c1) {
                      for (int64_t c = c0; c < c1; ++c) {
                        double sum = 0;
                        for (int64_t o = 0; o < outer; ++o) {
                          const int64_t base = (o * channels + c) * inner;
                          float part = 0.f;
                          for (int64_t i = 0; i < inner; ++i) {
                            const float g = unary_math::relu_backward(gy[base + i], y[base + i]);
                            gx[base + i] = g;
                            part += g;
                          }
                          sum += part;
                        }
                        if (gb) gb[c] = static_cast<float>(sum);
                      }
                    });
}

}  // namespace galley::kernels::cpu
