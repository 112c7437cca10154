#include "kernels/cpu/optimizer_update.h"

#include <algorithm>
#include <cmath>

#include "kernels/cpu/parallel.h"

namespace galley::kernels::cpu {

void adam_update(const AdamStep& s, int64_t n, float* p, const float* g, float* m, float* v,
                 float* vmax) {
  const float l2 = s.decoupled ? 0.f : s.weight_decay;
  const float shrink = s.decoupled ? 1.f - s.lr * s.weight_decay : 1.f;
  parallel_for(n, kElementwiseGrain, [&](int64_t b, int64_t e) {
#pragma omp simd
    for (int64_t i = b; i < e; ++i) {
      const float pi = p[i] * shrink;
      const float gi = g[i] + l2 * pi;
      const float mi = m[i] * s.beta1 + (1.f - s.beta1) * gi;
      const float vi = v[i] * s.beta2 + (1.f - s.beta2) * gi * gi;
      m[i] = mi;
      v[i] = vi;
      float vv = vi;
      if (s.amsgrad) {
        vv = std::max(vmax[i], vi);
        vmax[i] = vv;
      }
      const float denom = std::sqrt(vv) / s.bias2_sqrt + s.eps;
      p[i] = pi - s.step_size * (mi / denom);
    }
  });
}

void sgd_update(const SGDStep& s, int64_t n, float* p, const float* g, float* buf) {
  parallel_for(n, kElementwiseGrain, [&](int64_t b, int64_t e) {
#pragma omp simd
    for (int64_t i = b; i < e; ++i) {
      float d = g[i] + s.weight_decay * p[i];
      if (s.momentum != 0.f) {
        const float bi = s.first ? d : buf[i] * s.momentum + (1.f - s.dampening) * d;
        buf[i] = bi;
        d = s.nesterov ? d + s.momentum * bi : bi;
      }
      p[i] -= s.lr * d;
    }
  });
}

}  // namespace galley::kernels::cpu
