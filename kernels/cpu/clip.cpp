#include "kernels/clip.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "kernels/convert.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/staged.h"

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

// Calls f(c, span, begin, len) for every chunk c in [0, chunks) (elements [begin, begin + len)
// of `span`), spread over the threads.
template <typename F>
void for_chunks(const GradSpan* spans, int count, F f) {
  const std::vector<int64_t>& first = chunk_starts(spans, count);
  const int64_t chunks = first.back();
  parallel_balanced(
      chunks, std::max<int64_t>(1, kElementwiseGrain / kClipChunk), [&](int64_t c0, int64_t c1) {
        // The span holding chunk c0: the last k with first[k] <= c0.
        int k = int(std::upper_bound(first.begin(), first.end(), c0) - first.begin()) - 1;
        for (int64_t c = c0; c < c1; ++c) {
          while (first[k + 1] <= c) ++k;
          const int64_t begin = (c - first[k]) * kClipChunk;
          f(c, spans[k], begin, std::min(kClipChunk, spans[k].n - begin));
        }
      });
}

// Calls f(x, len) with x the `len` elements of `span` from `begin`, as T*.
template <typename F>
void with_elements(const GradSpan& span, int64_t begin, int64_t len, F f) {
  dispatch_floating(span.dtype, "clip_grad", [&](auto tag) {
    using T = typename decltype(tag)::type;
    f(static_cast<T*>(span.data) + begin, len);
  });
}

enum class Norm { One, Two, Inf, Other };

// The chunk's sum of |x|^p (max |x| for Inf, NaN when an element is NaN) over float32 values.
double partial_of(Norm kind, double p, const float* x, int64_t n) {
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

// The same for a chunk of element type T: 16-bit elements are widened a block at a time on the
// stack, and the blocks' partials added (maxed for Inf) in order.
template <typename T>
double chunk_partial(Norm kind, double p, const T* x, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    return partial_of(kind, p, x, n);
  } else {
    float fx[kStageBlock];
    double total = 0.0;
    for (int64_t i = 0; i < n; i += kStageBlock) {
      const int64_t m = std::min(kStageBlock, n - i);
      to_float(x + i, fx, m);
      const double v = partial_of(kind, p, fx, m);
      if (kind != Norm::Inf)
        total += v;
      else if (std::isnan(v) || v > total)
        total = v;
      if (kind == Norm::Inf && std::isnan(total)) break;
    }
    return total;
  }
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
  for_chunks(spans, count, [&](int64_t c, const GradSpan& span, int64_t begin, int64_t len) {
    with_elements(span, begin, len,
                  [&](auto* x, int64_t n) { out[c] = chunk_partial(kind, norm_type, x, n); });
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
  for_chunks(spans, count, [scale](int64_t, const GradSpan& span, int64_t begin, int64_t len) {
    with_elements(span, begin, len, [scale](auto* x, int64_t n) {
      map_n(x, x, n, [scale](float v) { return v * scale; });
    });
  });
}

void clamp_grads(const GradSpan* spans, int count, float clip) {
  const float lo = -clip, hi = clip;
  for_chunks(spans, count, [lo, hi](int64_t, const GradSpan& span, int64_t begin, int64_t len) {
    // Comparisons with NaN are false: a NaN passes through, as in torch.clamp.
    with_elements(span, begin, len, [lo, hi](auto* x, int64_t n) {
      map_n(x, x, n, [lo, hi](float v) { return v < lo ? lo : (v > hi ? hi : v); });
    });
  });
}

}  // namespace galley::kernels::cpu
