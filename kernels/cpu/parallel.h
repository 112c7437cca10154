#pragma once
// Threading helpers of the CPU kernels: parallel_for over [0, n) in chunks on galley's worker
// threads (serial below `grain` items), per-thread scratch buffers, and rounding to whole blocks.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace galley {
// The threads the CPU kernels may use now (galley/ops.h's public setting, defined by the core).
int num_threads();
}  // namespace galley

namespace galley::kernels::cpu {

// A parallel region: fn(ctx, t) for t in [0, threads), t = 0 on the calling thread and the rest
// on worker threads of the caller's own (thread_pool.cpp). Returns when all are done; an
// exception on a worker is rethrown here as a galley::Error.
using RegionFn = void (*)(void* ctx, int thread);
void run_region(int threads, RegionFn fn, void* ctx);
// Inside a region: the index of the calling thread in it; 0 outside.
int region_thread();
// True on a thread while it runs its part of a region (parallel_for then runs serially).
bool in_region();

// Calls f(begin, end) on disjoint chunks covering [0, n). Each thread gets one contiguous chunk
// (the same split for the same n and thread count, so results are deterministic), so per-thread
// scratch and partial sums can be indexed by region_thread().
template <typename F>
void parallel_for(int64_t n, int64_t grain, F&& f) {
  if (n <= 0) return;
  const int threads = static_cast<int>(std::min<int64_t>(num_threads(), (n + grain - 1) / grain));
  if (threads <= 1 || in_region()) {
    f(int64_t(0), n);
    return;
  }
  struct Region {
    F& f;
    int64_t n;
    int threads;
  } region{f, n, threads};
  run_region(
      threads,
      [](void* ctx, int t) {
        auto& r = *static_cast<Region*>(ctx);
        const int64_t chunk = (r.n + r.threads - 1) / r.threads;
        const int64_t b = std::min<int64_t>(r.n, t * chunk), e = std::min<int64_t>(r.n, b + chunk);
        if (b < e) r.f(b, e);
      },
      &region);
}

// Elementwise loops below this many items stay on one thread: forking costs more.
constexpr int64_t kElementwiseGrain = 1 << 15;

// A per-thread buffer of at least `floats` floats, kept between calls so that steady-state
// training allocates nothing. Slots are independent buffers for a kernel that needs several at
// once; what a buffer holds is the caller's only until its next kernel call on this thread.
inline float* thread_scratch(int slot, size_t floats) {
  thread_local std::vector<float> bufs[6];
  auto& b = bufs[slot];
  if (b.size() < floats) b.resize(floats);
  return b.data();
}

// a rounded up to a multiple of b (b > 0).
constexpr int64_t round_up(int64_t a, int64_t b) {
  return (a + b - 1) / b * b;
}

}  // namespace galley::kernels::cpu
