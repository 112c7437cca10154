#pragma once
// Threading helpers of the CPU kernels: parallel_for over [0, n) in chunks on galley's worker
// threads (serial below `grain` items), per-thread scratch buffers, and rounding to whole blocks.
#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/cpu/aligned.h"

namespace galley {
// The threads the CPU kernels may use now (galley/ops.h's public setting, defined by the core).
int num_threads();
}  // namespace galley

namespace galley::kernels::cpu {

// A parallel region: fn(ctx, t) for t in [0, threads), t = 0 on the calling thread and the rest
// on worker threads of the caller's own (thread_pool.cpp). Returns when all are done; the first
// exception any of them threw is rethrown here as it was thrown.
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

// Calls f(begin, end, first) on the chunks [k * chunk, (k + 1) * chunk) of [0, n), k = 0, 1, ...,
// which the threads take one after another as each comes free: a thread that runs slower
// (preempted, or its core shared with another job) does fewer chunks, and the others do not wait
// for it as they would for parallel_for's fixed share. `first` is true on a thread's first chunk
// of the call (to set up its scratch once). Which thread runs a chunk varies between calls, so
// f's results must not depend on it: a reduction keeps a partial sum per chunk (index
// begin / chunk) and adds them in chunk order, which gives the same bits on every run.
template <typename F>
void parallel_chunks(int64_t n, int64_t chunk, F&& f) {
  if (n <= 0) return;
  chunk = std::max<int64_t>(chunk, 1);
  const int64_t chunks = (n + chunk - 1) / chunk;
  const int threads = static_cast<int>(std::min<int64_t>(num_threads(), chunks));
  if (threads <= 1 || in_region()) {
    for (int64_t b = 0; b < n; b += chunk) f(b, std::min(n, b + chunk), b == 0);
    return;
  }
  struct Region {
    F& f;
    int64_t n, chunk;
    std::atomic<int64_t> next{0};
  } region{f, n, chunk};
  run_region(
      threads,
      [](void* ctx, int) {
        auto& r = *static_cast<Region*>(ctx);
        for (bool first = true;; first = false) {
          const int64_t b = r.next.fetch_add(r.chunk, std::memory_order_relaxed);
          if (b >= r.n) return;
          r.f(b, std::min(r.n, b + r.chunk), first);
        }
      },
      &region);
}

// Chunks for parallel_chunks when each chunk keeps a partial sum: `per_thread` chunks a thread,
// so that a slow thread's share can shrink, without more partial sums than that to add.
// One thread takes everything in one chunk.
inline int64_t balanced_chunk(int64_t n, int64_t grain, int per_thread = 4) {
  const int threads = num_threads();
  if (threads <= 1) return std::max<int64_t>(n, 1);
  const int64_t parts = int64_t(threads) * per_thread;
  return std::max<int64_t>(grain, (n + parts - 1) / parts);
}

// Partial sums for a reduction under parallel_chunks(n, chunk, ...): each chunk adds into its own
// `elems` floats (start(begin) zeroes them and returns them; at(begin) returns them as they are,
// for a chunk whose first step overwrites every element the caller reads), and total() adds the
// chunks in chunk
// order, so the sum has the same bits whichever thread ran which chunk. The buffer is the calling
// thread's, kept between calls (fresh pages each call would cost more than the sums): one
// ChunkSums a thread at a time.
class ChunkSums {
 public:
  ChunkSums(int64_t n, int64_t chunk, int64_t elems)
      : chunk_(std::max<int64_t>(chunk, 1)), elems_(elems), chunks_((n + chunk_ - 1) / chunk_) {
    thread_local aligned_vector<float> buf;
    if (buf.size() < size_t(chunks_ * elems_)) buf.resize(size_t(chunks_ * elems_));
    data_ = buf.data();
  }
  float* start(int64_t begin) const {
    float* p = at(begin);
    std::fill_n(p, elems_, 0.f);
    return p;
  }
  // The part of the chunk from `begin`, as it is: for a chunk that writes all of it first.
  float* at(int64_t begin) const { return data_ + (begin / chunk_) * elems_; }
  // The sum of every chunk's part (in the first chunk's buffer); call once, after the chunks.
  const float* total() const {
    if (chunks_ > 1) {
      parallel_for(elems_, kSumGrain, [&](int64_t b, int64_t e) {
        for (int64_t k = 1; k < chunks_; ++k) {
          const float* part = data_ + k * elems_;
#pragma omp simd
          for (int64_t i = b; i < e; ++i) data_[i] += part[i];
        }
      });
    }
    return data_;
  }

 private:
  static constexpr int64_t kSumGrain = 1 << 14;
  int64_t chunk_, elems_, chunks_;
  float* data_ = nullptr;
};

// parallel_chunks for a loop of independent items: chunks of at least `grain` items, about
// four a thread (balanced_chunk), f(begin, end) on each.
template <typename F>
void parallel_balanced(int64_t n, int64_t grain, F&& f) {
  parallel_chunks(n, balanced_chunk(n, grain), [&](int64_t b, int64_t e, bool) { f(b, e); });
}

// Elementwise loops below this many items stay on one thread: forking costs more.
constexpr int64_t kElementwiseGrain = 1 << 15;

// A per-thread buffer of at least `floats` floats, kept between calls so that steady-state
// training allocates nothing. Slots are independent buffers for a kernel that needs several at
// once; what a buffer holds is the caller's only until its next kernel call on this thread.
// A buffer begins on a cache line (aligned_vector), so that the kernels' vectors at whole-vector
// offsets into it do not straddle two lines.
inline float* thread_scratch(int slot, size_t floats) {
  thread_local aligned_vector<float> bufs[6];
  auto& b = bufs[slot];
  if (b.size() < floats) b.resize(floats);
  return b.data();
}

// a rounded up to a multiple of b (b > 0).
constexpr int64_t round_up(int64_t a, int64_t b) {
  return (a + b - 1) / b * b;
}

}  // namespace galley::kernels::cpu
