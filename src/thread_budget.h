#pragma once
// How many threads the CPU kernels called from this thread may use (internal).
//
// Data-parallel replicas on CPU devices each run on their own thread; each gets a share of the
// cores so that N replicas do not each fork every core and oversubscribe the machine.
namespace galley::detail {

// The cores this process may use: its affinity mask, capped by a cgroup CPU quota. The default
// thread count, so that a job pinned to some cores (or sharing the machine under a launcher)
// starts no more threads than it has cores.
int cpus_available();

class ThreadBudget {
 public:
  // Kernels called from this thread use at most `threads` threads while this is alive.
  explicit ThreadBudget(int threads);
  ~ThreadBudget();
  ThreadBudget(const ThreadBudget&) = delete;
  ThreadBudget& operator=(const ThreadBudget&) = delete;

 private:
  int prev_;
};

}  // namespace galley::detail
