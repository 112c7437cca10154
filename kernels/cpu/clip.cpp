#include "kernels/clip.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/parallel.h"

namespace galley::kernels::cpu {

namespace {

// The spans' chunks: first[k] is span k's first chunk; first[count] is the number of chunks.
const std::vector<int64_t>& chunk_starts(const GradSpan* spans, int count) {
  thread_local std::vector<int64_t> first;
  first.assign(size_t(count) + 1, 0);
  for (int k = 0; k < count; ++k)
    first[k + 1] = first[k] + (std::max<int64_t>(spans[k].n, 0) + kClipChunk - 1) / kClipChunk;
  return first;
}

// Calls f(x, len) for every chunk in [0, chunks), spread over the threads, with the chunk's
// index passed too.
template <typename F>
void for_chunks(const GradSpan* spans, int count, F f) {
  const std::vector<int64_t>& first = chunk_starts(spans, count);
  const int64_t chunks = first.back();
  parallel_for(chunks, std::max<int64_t>(1, kElementwiseGrain / kClipChunk),
               [&](int64_t c0, int64_t c1) {
                 // The span holding chunk c0: the last k with first[k] <= c0.
                 int k = int(std::upper_bound(first.begin(), first.end(), c0) - first.begin()) - 1;
                 for (int64_t c = c0; c < c1; ++c) {
                   while (first[k + 1] <= c) ++k;
                   const int64_t begin = (c - first[k]) * kClipChunk;
                   f(c, spans[k].data + begin, std::min(kClipChunk, spans[k].n - begin));
                 }
               });
}

enum class Norm { One, Two, Inf, Other };

// The chunk's sum of |x|^p (max |x| for Inf, NaN when an element is NaN).
double chunk_partial(Norm kind, double p, const float* x, int64_t n) {
  double s = 0.0;
  switch (kind) {
    case Norm::Two:
#pragma omp simd reduction(+ : s)
      for (int64_t i = 0; i < n; ++i) s += double(x[i]) * double(x[i]);
      return s;
    case Norm::One:
#pragma omp simd reduction(+ : s)
      for (int64_t i = 0; i < n; ++i) s += std::fabs(double(x[i]));
      return s;
    case Norm::Inf: {
      // A vector max may drop a NaN: NaNs are counted beside it.
      float m = 0.f;
      int nan = 0;
#pragma omp simd reduction(max : m) reduction(| : nan)
      for (int64_t i = 0; i < n; ++i) {
        const float a = std::fabs(x[i]);
        m = a > m ? a : m;
        nan |= a != a;
      }
      return nan ? std::numeric_limits<double>::quiet_NaN() : double(m);
    }
    case Norm::Other:
      for (int64_t i = 0; i < n; ++i) s += std::pow(std::fabs(double(x[i])), p);
      return s;
  }
  return s;
}

}  // namespace

double grad_norm(const GradSpan* spans, int count, double norm_type) {
  const Norm kind = std::isinf(norm_type) ? Norm::Inf
                    : norm_type == 2.0    ? Norm::Two
                    : norm_type == 1.0    ? Norm::One
                                          : Norm::Other;
  thread_local std::vector<double> partials;
  partials.assign(size_t(chunk_starts(spans, count).back()), 0.0);
  double* out = partials.data();
  for_chunks(spans, count, [&](int64_t c, float* x, int64_t n) {
    out[c] = chunk_partial(kind, norm_type, x, n);
  });
  // In chunk order, whatever the threads did.
  double total = 0.0;
  for (double v : partials) {
    if (kind != Norm::Inf)
      total += v;
    else if (std::isnan(v) || v > total)
      total = v;
    if (kind == Norm::Inf && std::isnan(total)) break;
  }
  switch (kind) {
    case Norm::Two:
      return std::sqrt(total);
    case Norm::One:
    case Norm::Inf:
      return total;
    case Norm::Other:
      return std::pow(total, 1.0 / norm_type);
  }
  return total;
}

void scale_grads(const GradSpan* spans, int count, float scale) {
  for_chunks(spans, count, [scale](int64_t, float* x, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) x[i] *= scale;
  });
}

void clamp_grads(const GradSpan* spans, int count, float clip) {
  const float lo = -clip, hi = clip;
  for_chunks(spans, count, [lo, hi](int64_t, float* x, int64_t n) {
  // Comparisons with NaN are false: a NaN passes through, as in torch.clamp.
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) {
      const float v = x[i];
      x[i] = v < lo ? lo : (v > hi ? hi : v);
    }
  });
}

}  // namespace galley::kernels::cpu
