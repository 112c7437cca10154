// The in-process communicator: participants are threads that share memory.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>

#include "galley/parallel/communicator.h"

namespace galley::parallel {

namespace {

// State shared by the participants: published buffers and a reusable barrier.
class ThreadGroup {
 public:
  ThreadGroup(int n, CommOptions opt) : n_(n), opt_(opt), ptrs_(n), counts_(n) {}

  int size() const { return n_; }

  // Publishes this participant's buffer, then waits for everyone.
  void publish(int rank, const char* op, void* ptr, int64_t count) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ptrs_[rank] = ptr;
      counts_[rank] = count;
    }
    wait(rank, op);
    for (int r = 0; r < n_; ++r)
      GALLEY_CHECK(counts_[r] == count, "threads ", op, ": rank ", rank, " passed ", count,
                   " elements but rank ", r, " passed ", counts_[r]);
  }
  float* buffer(int r) const { return static_cast<float*>(ptrs_[r]); }

  // A barrier that fails, for everyone, once any participant has waited past the timeout.
  void wait(int rank, const char* op) {
    std::unique_lock<std::mutex> lock(mu_);
    GALLEY_CHECK(!broken_, "threads ", op, " on rank ", rank,
                 ": the group is unusable after an earlier failure (", why_, ")");
    const uint64_t gen = generation_;
    if (++arrived_ == n_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::duration<double>(opt_.timeout_seconds);
    bool done = cv_.wait_until(lock, deadline, [&] { return generation_ != gen || broken_; });
    if (!done) {
      broken_ = true;
      why_ = detail::str_cat(op, " timed out after ", opt_.timeout_seconds, " s with ", arrived_,
                             " of ", n_, " participants arrived");
      cv_.notify_all();
    }
    GALLEY_CHECK(generation_ != gen, "threads ", op, " on rank ", rank, ": ", why_);
  }

 private:
  const int n_;
  const CommOptions opt_;
  std::vector<void*> ptrs_;
  std::vector<int64_t> counts_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  bool broken_ = false;
  std::string why_;
};

class ThreadCommunicator : public Communicator {
 public:
  ThreadCommunicator(std::shared_ptr<ThreadGroup> group, int rank)
      : group_(std::move(group)), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return group_->size(); }
  std::string kind() const override { return "threads"; }
  using Communicator::all_gather;
  using Communicator::all_reduce;
  using Communicator::broadcast;

  void all_reduce(float* data, int64_t count, ReduceOp op) override {
    const int n = size();
    if (n == 1) return;
    group_->publish(rank_, "all_reduce", data, count);
    // Reduce-scatter and all-gather in one: this rank owns one slice of every buffer, sums it
    // and writes the sum back into every buffer. Slices are disjoint, so no locking.
    const int64_t chunk = (count + n - 1) / n;
    const int64_t b = std::min<int64_t>(count, rank_ * chunk), e = std::min(count, b + chunk);
    const float scale = op == ReduceOp::Avg ? 1.f / float(n) : 1.f;
    // Summed in rank order, so the result does not depend on which rank owns the slice.
    const float* first = group_->buffer(0);
    std::vector<float> acc(first + b, first + e);
    for (int r = 1; r < n; ++r) {
      const float* other = group_->buffer(r);
      for (int64_t i = b; i < e; ++i) acc[i - b] += other[i];
    }
    if (scale != 1.f)
      for (float& v : acc) v *= scale;
    for (int r = 0; r < n; ++r)
      std::memcpy(group_->buffer(r) + b, acc.data(), (e - b) * sizeof(float));
    group_->wait(rank_, "all_reduce");
  }

  void broadcast(float* data, int64_t count, int root) override {
    GALLEY_CHECK(root >= 0 && root < size(), "threads broadcast: root ", root, " out of range for ",
                 size(), " participants");
    if (size() == 1) return;
    group_->publish(rank_, "broadcast", data, count);
    if (rank_ != root) std::memcpy(data, group_->buffer(root), count * sizeof(float));
    group_->wait(rank_, "broadcast");
  }

  void all_gather(const float* data, int64_t count, float* out) override {
    group_->publish(rank_, "all_gather", const_cast<float*>(data), count);
    for (int r = 0; r < size(); ++r)
      std::memcpy(out + r * count, group_->buffer(r), count * sizeof(float));
    group_->wait(rank_, "all_gather");
  }

  void barrier() override { group_->wait(rank_, "barrier"); }

 private:
  std::shared_ptr<ThreadGroup> group_;
  int rank_;
};

}  // namespace

std::vector<std::shared_ptr<Communicator>> make_thread_communicators(int n, CommOptions options) {
  GALLEY_CHECK(n > 0, "make_thread_communicators: need at least one participant, got ", n);
  GALLEY_CHECK(options.timeout_seconds > 0, "make_thread_communicators: timeout ",
               options.timeout_seconds, " s must be positive");
  auto group = std::make_shared<ThreadGroup>(n, options);
  std::vector<std::shared_ptr<Communicator>> out;
  for (int r = 0; r < n; ++r) out.push_back(std::make_shared<ThreadCommunicator>(group, r));
  return out;
}

}  // namespace galley::parallel
