#pragma once
// parallel_for over [0, n) in chunks on galley's OpenMP threads; serial below `grain` items.
#include <omp.h>

#include <algorithm>
#include <cstdint>

#include "galley/ops.h"

namespace galley::kernels::cpu {

// Calls f(begin, end) on disjoint chunks covering [0, n). Each thread gets one contiguous chunk,
// so per-thread scratch can be indexed by omp_get_thread_num().
template <typename F>
void parallel_for(int64_t n, int64_t grain, F&& f) {
  if (n <= 0) return;
  int threads = static_cast<int>(std::min<int64_t>(num_threads(), (n + grain - 1) / grain));
  if (threads <= 1 || omp_in_parallel()) {
    f(int64_t(0), n);
    return;
  }
#pragma omp parallel num_threads(threads)
  {
    int t = omp_get_thread_num(), nt = omp_get_num_threads();
    int64_t chunk = (n + nt - 1) / nt;
    int64_t b = std::min<int64_t>(n, t * chunk), e = std::min<int64_t>(n, b + chunk);
    if (b < e) f(b, e);
  }
}

// Elementwise loops below this many items stay on one thread: forking costs more.
constexpr int64_t kElementwiseGrain = 1 << 15;

}  // namespace galley::kernels::cpu
