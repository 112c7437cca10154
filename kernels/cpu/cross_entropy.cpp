#include "kernels/cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace galley::kernels::cpu {

int64_t cross_entropy_forward(const float* logits, const int64_t* labels, int64_t n, int64_t c,
                              float eps, int64_t ignore_index, float* loss, float* prob,
                              int64_t* bad_row) {
  int64_t count = 0;
  *bad_row = -1;
  for (int64_t i = 0; i < n; ++i) {
    const float* x = logits + i * c;
    float* p = prob + i * c;
    const int64_t y = labels[i];
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < c; ++j) m = std::max(m, x[j]);
    double s = 0.0, sum_x = 0.0;
    for (int64_t j = 0; j < c; ++j) {
      double e = std::exp(double(x[j]) - m);
      p[j] = static_cast<float>(e);
      s += e;
      sum_x += x[j];
    }
    const double lse = m + std::log(s);
    const float inv = static_cast<float>(1.0 / s);
    for (int64_t j = 0; j < c; ++j) p[j] *= inv;
    if (y == ignore_index) {
      loss[i] = 0.f;
      continue;
    }
    if (y < 0 || y >= c) {
      if (*bad_row < 0) *bad_row = i;
      loss[i] = 0.f;
      continue;
    }
    const double nll = lse - x[y];
    const double smooth = lse - sum_x / double(c);  // mean over classes of -log p
    // Without smoothing the loss is nll alone: a class masked out with a logit of -inf makes
    // smooth infinite, and 0 * inf would be NaN.
    loss[i] = static_cast<float>(eps > 0 ? (1.0 - eps) * nll + eps * smooth : nll);
    ++count;
  }
  return count;
}

void cross_entropy_backward(const float* prob, const int64_t* labels, const float* row_scale,
                            int64_t n, int64_t c, float eps, int64_t ignore_index, float* gx) {
  const float off = eps / float(c);
  for (int64_t i = 0; i < n; ++i) {
    float* g = gx + i * c;
    const int64_t y = labels[i];
    if (y == ignore_index || y < 0 || y >= c) {
      std::fill_n(g, c, 0.f);
      continue;
    }
    const float s = row_scale[i];
    const float* p = prob + i * c;
#pragma omp simd
    for (int64_t j = 0; j < c; ++j) g[j] = s * (p[j] - off);
    g[y] -= s * (1.f - eps);
  }
}

}  // namespace galley::kernels::cpu
