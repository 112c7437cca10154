#pragma once
// How many threads the CPU kernels called from this thread may use (internal).
//
// Data-parallel replicas on CPU devices each run on their own thread; each gets a share of the
// cores so that N replicas do not each fork every core and oversubscribe the machine.
namespace galley::detail {

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
