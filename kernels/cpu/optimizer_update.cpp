#include "kernels/optimizer_update.h"

#include <algorithm>
#include <cmath>

#include "kernels/cpu/parallel.h"

namespace galley::kernels::cpu {

namespace {
// The AMSGrad branch is a template parameter so the loop has no control flow and vectorises.
template <bool kAmsgrad>
void adam_range(const AdamStep& s, int64_t b, int64_t e, float* p, const float* g, float* m,
                float* v, float* vmax) {
  const float l2 = s.decoupled ? 0.f : s.weight_decay;
  const float shrink = s.decoupled ? 1.f - s.lr * s.weight_decay : 1.f;
  // Locals, not reads through `s`: the stores below could alias it, which would block
  // vectorisation.
  const float beta1 = s.beta1, beta2 = s.beta2, bias2_sqrt = s.bias2_sqrt, eps = s.eps,
              step_size = s.step_size;
#pragma omp simd
  for (int64_t i = b; i < e; ++i) {
    const float pi = p[i] * shrink;
    const float gi = g[i] + l2 * pi;
    const float mi = m[i] * beta1 + (1.f - beta1) * gi;
    const float vi = v[i] * beta2 + (1.f - beta2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    float vv = vi;
    if constexpr (kAmsgrad) {
      const float old = vmax[i];
      vv = old < vi ? vi : old;  // std::max, spelled so that the loop vectorises
      vmax[i] = vv;
    }
    const float denom = std::sqrt(vv) / bias2_sqrt + eps;  // vectorises with -fno-math-errno
    p[i] = pi - step_size * (mi / denom);
  }
}
}  // namespace

void adam_update(const AdamStep& s, int64_t n, float* p, const float* g, float* m, float* v,
                 float* vmax) {
  parallel_for(n, kElementwiseGrain, [&](int64_t b, int64_t e) {
    if (s.amsgrad)
      adam_range<true>(s, b, e, p, g, m, v, vmax);
    else
      adam_range<false>(s, b, e, p, g, m, v, vmax);
  });
}

namespace {
// Momentum is a template parameter so the loop has no control flow and vectorises.
template <bool kMomentum>
void sgd_range(const SGDStep& s, int64_t b, int64_t e, float* p, const float* g, float* buf) {
  const float weight_decay = s.weight_decay, momentum = s.momentum, dampening = s.dampening,
              lr = s.lr;
  const bool first = s.first, nesterov = s.nesterov;
#pragma omp simd
  for (int64_t i = b; i < e; ++i) {
    float d = g[i] + weight_decay * p[i];
    if constexpr (kMomentum) {
      const float bi = first ? d : buf[i] * momentum + (1.f - dampening) * d;
      buf[i] = bi;
      d = nesterov ? d + momentum * bi : bi;
    }
    p[i] -= lr * d;
  }
}
}  // namespace

void sgd_update(const SGDStep& s, int64_t n, float* p, const float* g, float* buf) {
  parallel_for(n, kElementwiseGrain, [&](int64_t b, int64_t e) {
    if (s.momentum != 0.f)
      sgd_range<true>(s, b, e, p, g, buf);
    else
      sgd_range<false>(s, b, e, p, g, buf);
  });
}

}  // namespace galley::kernels::cpu
