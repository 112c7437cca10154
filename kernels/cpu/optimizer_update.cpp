#include "kernels/optimizer_update.h"

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "kernels/convert.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/staged.h"

namespace galley::kernels::cpu {

namespace {

// Runs `update(0, m, fp, fg, off)` over float32 copies of blocks of the elements [b, e) of a
// 16-bit parameter p and its gradient g, where `off` is the index of the block's first element
// (for the float32 state): the block is widened on the stack, updated in float32 and the
// parameter rounded back once.
template <typename T, typename Update>
void staged(int64_t b, int64_t e, T* p, const T* g, Update update) {
  float fp[kStageBlock], fg[kStageBlock];
  for (int64_t i = b; i < e; i += kStageBlock) {
    const int64_t m = std::min(kStageBlock, e - i);
    to_float(p + i, fp, m);
    to_float(g + i, fg, m);
    update(int64_t(0), m, fp, fg, i);
    from_float(fp, p + i, m);
  }
}

// The AMSGrad branch is a template parameter so the loop has no control flow and vectorises.
template <bool kAmsgrad>
void adam_range(const AdamStep& s, int64_t b, int64_t e, float* p, const float* g, float* m,
                float* v, float* vmax) {
  const float l2 = s.decoupled ? 0.f : s.weight_decay;
  const float shrink = s.decoupled ? s.shrink : 1.f;
  // Locals, not reads through `s`: the stores below could alias it, which would block
  // vectorisation.
  const float beta1 = s.beta1, beta2 = s.beta2, bias2_sqrt = s.bias2_sqrt, eps = s.eps,
              step_size = s.step_size, one_minus_beta1 = s.one_minus_beta1,
              one_minus_beta2 = s.one_minus_beta2;
  const bool l2_on = l2 != 0.f, maximize = s.maximize;
#pragma omp simd
  for (int64_t i = b; i < e; ++i) {
    const float pi = p[i] * shrink;
    const float gs = maximize ? -g[i] : g[i];
    const float gi = l2_on ? gs + l2 * pi : gs;
    const float mi = m[i] * beta1 + one_minus_beta1 * gi;
    const float vi = v[i] * beta2 + one_minus_beta2 * gi * gi;
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

template <typename T>
void adam_typed(const AdamStep& s, int64_t n, T* p, const T* g, float* m, float* v, float* vmax) {
  parallel_balanced(n, kElementwiseGrain, [&](int64_t b, int64_t e) {
    if constexpr (std::is_same_v<T, float>) {
      if (s.amsgrad)
        adam_range<true>(s, b, e, p, g, m, v, vmax);
      else
        adam_range<false>(s, b, e, p, g, m, v, vmax);
    } else {
      staged(b, e, p, g, [&](int64_t sb, int64_t se, float* fp, const float* fg, int64_t off) {
        if (s.amsgrad)
          adam_range<true>(s, sb, se, fp, fg, m + off, v + off, vmax + off);
        else
          adam_range<false>(s, sb, se, fp, fg, m + off, v + off, nullptr);
      });
    }
  });
}

// Momentum is a template parameter so the loop has no control flow and vectorises.
template <bool kMomentum>
void sgd_range(const SGDStep& s, int64_t b, int64_t e, float* p, const float* g, float* buf) {
  const float weight_decay = s.weight_decay, momentum = s.momentum,
              one_minus_dampening = s.one_minus_dampening, lr = s.lr;
  const bool decay = weight_decay != 0.f;
  const bool first = s.first, nesterov = s.nesterov, maximize = s.maximize;
#pragma omp simd
  for (int64_t i = b; i < e; ++i) {
    const float gs = maximize ? -g[i] : g[i];
    float d = decay ? gs + weight_decay * p[i] : gs;
    if constexpr (kMomentum) {
      const float bi = first ? d : buf[i] * momentum + one_minus_dampening * d;
      buf[i] = bi;
      d = nesterov ? d + momentum * bi : bi;
    }
    p[i] -= lr * d;
  }
}

template <typename T>
void sgd_typed(const SGDStep& s, int64_t n, T* p, const T* g, float* buf) {
  parallel_balanced(n, kElementwiseGrain, [&](int64_t b, int64_t e) {
    if constexpr (std::is_same_v<T, float>) {
      if (s.momentum != 0.f)
        sgd_range<true>(s, b, e, p, g, buf);
      else
        sgd_range<false>(s, b, e, p, g, buf);
    } else {
      staged(b, e, p, g, [&](int64_t sb, int64_t se, float* fp, const float* fg, int64_t off) {
        if (s.momentum != 0.f)
          sgd_range<true>(s, sb, se, fp, fg, buf + off);
        else
          sgd_range<false>(s, sb, se, fp, fg, nullptr);
      });
    }
  });
}

}  // namespace

void adam_update(const AdamStep& s, DType dtype, int64_t n, void* p, const void* g, float* m,
                 float* v, float* vmax) {
  dispatch_floating(dtype, "adam_update", [&](auto tag) {
    using T = typename decltype(tag)::type;
    adam_typed(s, n, static_cast<T*>(p), static_cast<const T*>(g), m, v, vmax);
  });
}

void adam_update(const AdamStep& s, int64_t n, float* p, const float* g, float* m, float* v,
                 float* vmax) {
  adam_typed(s, n, p, g, m, v, vmax);
}

void sgd_update(const SGDStep& s, DType dtype, int64_t n, void* p, const void* g, float* buf) {
  dispatch_floating(dtype, "sgd_update", [&](auto tag) {
    using T = typename decltype(tag)::type;
    sgd_typed(s, n, static_cast<T*>(p), static_cast<const T*>(g), buf);
  });
}

void sgd_update(const SGDStep& s, int64_t n, float* p, const float* g, float* buf) {
  sgd_typed(s, n, p, g, buf);
}

}  // namespace galley::kernels::cpu
