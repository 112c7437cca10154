#pragma once
// Threading helpers of the CPU kernels: parallel_for over [0, n) in chunks on galley's OpenMP
// threads (serial below `grain` items), per-thread scratch buffers, and rounding to whole blocks.
#include <omp.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

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

// A per-thread buffer of at least `floats` floats, kept between calls so that steady-state
// training allocates nothing. Slots are independent buffers for a kernel that needs several at
// once; what a buffer holds is the caller's only until its next kernel call on this thread.
inline float* thread_scratch(int slot, size_t floats) {
  thread_local std::vector<float> bufs[4];
  auto& b = bufs[slot];
  if (b.size() < floats) b.resize(floats);
  return b.data();
}

// a rounded up to a multiple of b (b > 0).
constexpr int64_t round_up(int64_t a, int64_t b) {
  return (a + b - 1) / b * b;
}

}  // namespace galley::kernels::cpu
