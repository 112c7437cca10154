#include "kernels/softmax.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/cpu/parallel.h"

namespace galley::kernels::cpu {

void softmax_forward(const float* x, int64_t outer, int64_t len, int64_t inner, bool log,
                     float* y) {
  parallel_balanced(outer * inner, std::max<int64_t>(1, 4096 / std::max<int64_t>(len, 1)),
                    [&](int64_t r0, int64_t r1) {
                      for (int64_t r = r0; r < r1; ++r) {
                        const int64_t o = r / inner, i = r % inner;
                        const float* xp = x + o * len * inner + i;
                        float* yp = y + o * len * inner + i;
                        float m = -std::numeric_limits<float>::infinity();
                        for (int64_t l = 0; l < len; ++l) m = std::max(m, xp[l * inner]);
                        double s = 0.0;
                        for (int64_t l = 0; l < len; ++l) s += std::exp(double(xp[l * inner]) - m);
                        if (log) {
                          // (x - m) - log s, as PyTorch: x - (m + log s) rounds the sum to m's
                          // ulp, which for logits near 1e7 is 1 (outputs 0, -1, -2).
                          const float ls = static_cast<float>(std::log(s));
                          for (int64_t l = 0; l < len; ++l)
                            yp[l * inner] = (xp[l * inner] - m) - ls;
                        } else {
                          const double inv = 1.0 / s;
                          for (int64_t l = 0; l < len; ++l)
                            yp[l * inner] =
                                static_cast<float>(std::exp(double(xp[l * inner]) - m) * inv);
                        }
                      }
                    });
}

void softmax_backward(const float* y, const float* gy, int64_t outer, int64_t len, int64_t inner,
                      bool log, float* gx) {
  parallel_balanced(outer * inner, std::max<int64_t>(1, 4096 / std::max<int64_t>(len, 1)),
                    [&](int64_t r0, int64_t r1) {
                      for (int64_t r = r0; r < r1; ++r) {
                        const int64_t o = r / inner, i = r % inner, base = o * len * inner + i;
                        double s = 0.0;
                        if (log) {
                          for (int64_t l = 0; l < len; ++l) s += gy[base + l * inner];
                          for (int64_t l = 0; l < len; ++l) {
                            int64_t k = base + l * inner;
                            gx[k] = gy[k] - std::exp(y[k]) * static_cast<float>(s);
                          }
                        } else {
                          for (int64_t l = 0; l < len; ++l)
                            s += double(gy[base + l * inner]) * y[base + l * inner];
                          for (int64_t l = 0; l < len; ++l) {
                            int64_t k = base + l * inner;
                            gx[k] = y[k] * (gy[k] - static_cast<float>(s));
                          }
                        }
                      }
                    });
}

}  // namespace galley::kernels::cpu
