// galley's own worker threads for parallel_for (see parallel.h).
//
// Why not OpenMP's: its idle threads spin for a long while (GOMP_SPINCOUNT, set when the library
// loads) before they sleep. A job alone on the machine gains little from that, and two jobs side
// by side lose everything: each job's spinning threads hold the cores the other job's threads
// need to finish their share of a parallel region, so every region waits out scheduler slices.
// Here a waiting thread spins only briefly, and not at all while it is being preempted often (the
// machine is oversubscribed), then sleeps on a futex and gives its core away.
#include <linux/futex.h>
#include <pthread.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "galley/error.h"
#include "kernels/cpu/parallel.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define GALLEY_CPU_RELAX() _mm_pause()
#else
#define GALLEY_CPU_RELAX() ((void)0)
#endif

namespace galley::kernels::cpu {

namespace {

using Clock = std::chrono::steady_clock;

void futex_wait(std::atomic<uint32_t>* word, uint32_t expected) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT_PRIVATE, expected, nullptr,
          nullptr, 0);
}
void futex_wake_all(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr,
          nullptr, 0);
}

// How long a waiting thread spins before it sleeps. Long enough to bridge the serial work
// between two parallel regions of a training step (op dispatch, autograd bookkeeping), short
// enough to cost little when it is wasted. GALLEY_SPIN_US overrides it (0: sleep at once).
int default_spin_us() {
  if (const char* env = std::getenv("GALLEY_SPIN_US"); env && *env) {
    char* end = nullptr;
    const long v = std::strtol(env, &end, 10);
    if (end && *end == '\0' && v >= 0 && v <= 100000) return static_cast<int>(v);
  }
  return 50;
}
const int kSpinUs = default_spin_us();

// Involuntary context switches of the calling thread: they rise when the thread is preempted,
// that is when more threads want to run than the machine has cores.
long preemptions() {
  rusage u{};
  if (getrusage(RUSAGE_THREAD, &u) != 0) return 0;
  return u.ru_nivcsw;
}

// Adaptive spinning, per thread: after a wait that did not end at once, the thread counts its
// preemptions since its last look. Several within a short while (kOversubscribed in kWindow) mean
// that more threads want to run than the machine has cores, and spinning only takes a core from a
// thread that has work, so it stops spinning for a while (kQuiet); it spins again once the
// preemptions stop. A preemption now and then is the machine's own housekeeping: on an otherwise
// idle 2-core AMD EPYC virtual machine each thread of a training step was preempted about 14 times
// a second, and two such jobs side by side about 600 times. Going quiet on every one of those
// sporadic preemptions, as this did at first, kept the threads asleep nearly all the time: a
// sleeping thread's wake-up costs a system call and a context switch on each side of every
// parallel region (about 1,000 a ResNet step).
class Spinner {
 public:
  // Spins until `done()` or the budget runs out; returns done().
  template <typename Done>
  bool spin(Done&& done) {
    if (done()) return true;
    const int us = quiet_until_ > Clock::now() ? 0 : kSpinUs;
    const auto until = Clock::now() + std::chrono::microseconds(us);
    while (Clock::now() < until) {
      for (int i = 0; i < 64; ++i) {
        if (done()) return true;
        GALLEY_CPU_RELAX();
      }
    }
    return done();
  }
  void adapt() {
    const long now = preemptions();
    if (now > last_preemptions_) {
      const Clock::time_point t = Clock::now();
      if (t - window_start_ > kWindow) window_start_ = t, in_window_ = 0;
      in_window_ += now - last_preemptions_;
      if (in_window_ >= kOversubscribed) quiet_until_ = t + kQuiet;
    }
    last_preemptions_ = now;
  }

 private:
  static constexpr std::chrono::milliseconds kQuiet{200};
  static constexpr std::chrono::milliseconds kWindow{50};
  static constexpr long kOversubscribed = 4;
  Clock::time_point quiet_until_{};
  Clock::time_point window_start_{};
  long in_window_ = 0;  // preemptions seen since window_start_
  long last_preemptions_ = preemptions();
};

thread_local Spinner spinner;

// Waits until `done()`, sleeping on `word` (which a waker bumps after making done() true) once
// the spin is over. `sleepers` counts threads asleep on it, so that a waker makes the wake-up
// system call only when someone sleeps: the sleeper's seq_cst increment of `sleepers` before
// its last check of done(), against the waker's seq_cst bump of `word` before it reads
// `sleepers`, guarantees that one of the two sees the other.
template <typename Done>
void await(Done&& done, std::atomic<uint32_t>& word, std::atomic<int>& sleepers) {
  if (done()) return;
  if (!spinner.spin(done)) {
    sleepers.fetch_add(1, std::memory_order_seq_cst);
    for (;;) {
      const uint32_t w = word.load(std::memory_order_seq_cst);
      if (done()) break;
      futex_wait(&word, w);
    }
    sleepers.fetch_sub(1, std::memory_order_relaxed);
  }
  spinner.adapt();
}

void signal_change(std::atomic<uint32_t>& word, std::atomic<int>& sleepers) {
  word.fetch_add(1, std::memory_order_seq_cst);
  if (sleepers.load(std::memory_order_seq_cst) > 0) futex_wake_all(&word);
}

thread_local int tls_index = 0;
thread_local bool tls_in_region = false;

// The worker threads of one calling thread: a caller's regions never wait for another caller's
// (DataParallel's CPU replicas each run their own regions at the same time), as OpenMP gives each
// thread that starts a region its own team.
class Pool {
 public:
  ~Pool() {
    if (workers_.empty()) return;
    stop_.store(true, std::memory_order_relaxed);
    publish(0);
    for (auto& t : workers_) t.join();
  }

  void run(int threads, RegionFn fn, void* ctx) {
    grow(threads - 1);
    fn_ = fn;
    ctx_ = ctx;
    error_ = nullptr;
    remaining_.store(threads - 1, std::memory_order_relaxed);
    publish(threads);
    execute(0);
    // Until every worker of this region is done; finished_ is only the word to sleep on (a bump
    // left over from an earlier region merely rechecks).
    await([this] { return remaining_.load(std::memory_order_acquire) == 0; }, finished_,
          finished_sleepers_);
    // The region's first exception as it was thrown, whichever thread threw it: the caller
    // catches what one thread would have thrown (an OutOfMemoryError stays one; it became a
    // plain Error naming "a worker thread").
    if (error_) {
      std::exception_ptr e = nullptr;
      std::swap(e, error_);
      std::rethrow_exception(e);
    }
  }

 private:
  // Announces a region of `threads` threads (0: stop): its number and thread count go out in
  // one atomic word, after the fields above (release), so that a worker never pairs one
  // region's number with another's count; then the sleepers are woken.
  void publish(int threads) {
    const uint64_t next = (region_.load(std::memory_order_relaxed) >> 32) + 1;
    region_.store(next << 32 | uint32_t(threads), std::memory_order_seq_cst);
    signal_change(start_, start_sleepers_);
  }

  void grow(int workers) {
    while (static_cast<int>(workers_.size()) < workers) {
      const int index = static_cast<int>(workers_.size()) + 1;
      const uint32_t seen = uint32_t(region_.load(std::memory_order_relaxed) >> 32);
      workers_.emplace_back([this, index, seen] { loop(index, seen); });
    }
  }

  void loop(int index, uint32_t seen) {
    for (;;) {
      await([&] { return uint32_t(region_.load(std::memory_order_acquire) >> 32) != seen; }, start_,
            start_sleepers_);
      const uint64_t region = region_.load(std::memory_order_acquire);
      seen = uint32_t(region >> 32);
      if (stop_.load(std::memory_order_relaxed)) return;
      // Not one of this region's threads. A later region cannot be announced before every
      // thread of this one has finished, so a worker that skips ahead misses no region of its.
      if (index >= int(uint32_t(region))) continue;
      execute(index);
      if (remaining_.fetch_sub(1, std::memory_order_acq_rel) == 1)
        signal_change(finished_, finished_sleepers_);
    }
  }

  void execute(int index) {
    tls_index = index;
    tls_in_region = true;
    try {
      fn_(ctx_, index);
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mu_);
      if (!error_) error_ = std::current_exception();
    }
    tls_in_region = false;
    tls_index = 0;
  }

  std::vector<std::thread> workers_;
  // Written by the caller before it bumps start_, read by the workers after they see the bump.
  RegionFn fn_ = nullptr;
  void* ctx_ = nullptr;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> region_{0};  // the region's number << 32 | its thread count
  std::atomic<uint32_t> start_{0};   // bumped with each announcement: the word sleepers wait on
  std::atomic<int> start_sleepers_{0};
  std::atomic<int> remaining_{0};      // workers of this region still running
  std::atomic<uint32_t> finished_{0};  // bumped when the last worker of a region is done
  std::atomic<int> finished_sleepers_{0};
  std::mutex error_mu_;
  std::exception_ptr error_;  // the region's first exception
};

}  // namespace

namespace {
// Counts forks, in the children: a forked child has only the thread that forked, so the team it
// inherited has no workers behind it (its first region waited for ever).
std::atomic<uint64_t> forks{0};
void count_fork() {
  forks.fetch_add(1, std::memory_order_relaxed);
}
}  // namespace

void run_region(int threads, RegionFn fn, void* ctx) {
  static std::once_flag at_fork;
  std::call_once(at_fork, [] { pthread_atfork(nullptr, nullptr, count_fork); });
  thread_local std::unique_ptr<Pool> pool;
  thread_local uint64_t pool_forks = 0;
  const uint64_t now = forks.load(std::memory_order_relaxed);
  // A team from before a fork is let go, not destroyed: its workers stayed in the parent.
  if (pool && pool_forks != now) (void)pool.release();
  if (!pool) pool = std::make_unique<Pool>(), pool_forks = now;
  pool->run(threads, fn, ctx);
}

int region_thread() {
  return tls_index;
}

bool in_region() {
  return tls_in_region;
}

}  // namespace galley::kernels::cpu
