// The in-process communicator: participants are threads that share memory.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <mutex>
#include <type_traits>
#include <vector>

#include "galley/half.h"
#include "galley/parallel/communicator.h"
#include "src/parallel/peer_failed.h"

namespace galley::parallel {

namespace {

// State shared by the participants: published buffers and a reusable barrier.
class ThreadGroup {
 public:
  ThreadGroup(int n, CommOptions opt) : n_(n), opt_(opt), ptrs_(n), counts_(n), dtypes_(n) {}

  int size() const { return n_; }

  // Publishes this participant's buffer, then waits for everyone.
  void publish(int rank, const char* op, void* ptr, int64_t count, DType dtype) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ptrs_[rank] = ptr;
      counts_[rank] = count;
      dtypes_[rank] = dtype;
    }
    wait(rank, op);
    for (int r = 0; r < n_; ++r) {
      GALLEY_CHECK(counts_[r] == count, "threads ", op, ": rank ", rank, " passed ", count,
                   " elements but rank ", r, " passed ", counts_[r]);
      GALLEY_CHECK(dtypes_[r] == dtype, "threads ", op, ": rank ", rank, " passed ",
                   dtype_name(dtype), " data but rank ", r, " passed ", dtype_name(dtypes_[r]));
    }
  }
  void* buffer(int r) const { return ptrs_[r]; }

  // A barrier that fails, for everyone, once any participant has waited past the timeout.
  // Returns whether any participant arrived with `failed` (its share of the collective failed:
  // the others' results are incomplete, but the group stays usable).
  bool wait(int rank, const char* op, bool failed = false) {
    std::unique_lock<std::mutex> lock(mu_);
    GALLEY_CHECK(!broken_, "threads ", op, " on rank ", rank,
                 ": the group is unusable after an earlier failure (", why_, ")");
    const uint64_t gen = generation_;
    round_failed_ = round_failed_ || failed;
    if (++arrived_ == n_) {
      // (stable until every participant has left: the next round needs them all to arrive)
      last_round_failed_ = round_failed_;
      round_failed_ = false;
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return last_round_failed_;
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
    return last_round_failed_;
  }

 private:
  const int n_;
  const CommOptions opt_;
  std::vector<void*> ptrs_;
  std::vector<int64_t> counts_;
  std::vector<DType> dtypes_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  bool broken_ = false;
  bool round_failed_ = false, last_round_failed_ = false;
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

  void all_reduce(void* data, int64_t count, DType dtype, ReduceOp op) override {
    check_reducible(dtype);
    const int n = size();
    if (n == 1) return;
    group_->publish(rank_, "all_reduce", data, count, dtype);
    // Reduce-scatter and all-gather in one: this rank owns one slice of every buffer, sums it
    // and writes the sum back into every buffer. Slices are disjoint, so no locking.
    const int64_t chunk = (count + n - 1) / n;
    const int64_t b = std::min<int64_t>(count, rank_ * chunk), e = std::min(count, b + chunk);
    // A share that fails (out of memory for its accumulator) still reaches the barrier, where
    // every participant learns of it: the peers no longer wait out the timeout for it, and the
    // group stays usable for the next call.
    std::exception_ptr error;
    try {
      dispatch_floating(dtype, "threads all_reduce", [&](auto tag) {
        using T = typename decltype(tag)::type;
        reduce_slice<T>(b, e, op == ReduceOp::Avg ? 1.f / float(n) : 1.f);
      });
    } catch (...) {
      error = std::current_exception();
    }
    const bool failed = group_->wait(rank_, "all_reduce", error != nullptr);
    if (error) std::rethrow_exception(error);
    if (failed)
      throw detail::PeerFailedError(
          detail::str_cat("threads all_reduce on rank ", rank_,
                          ": another participant failed to reduce its share; the result "
                          "is incomplete"));
  }

  void broadcast(void* data, int64_t count, DType dtype, int root) override {
    GALLEY_CHECK(root >= 0 && root < size(), "threads broadcast: root ", root, " out of range for ",
                 size(), " participants");
    if (size() == 1) return;
    group_->publish(rank_, "broadcast", data, count, dtype);
    if (rank_ != root) std::memcpy(data, group_->buffer(root), count * dtype_size(dtype));
    group_->wait(rank_, "broadcast");
  }

  void all_gather(const void* data, int64_t count, DType dtype, void* out) override {
    group_->publish(rank_, "all_gather", const_cast<void*>(data), count, dtype);
    const size_t bytes = count * dtype_size(dtype);
    for (int r = 0; r < size(); ++r)
      std::memcpy(static_cast<char*>(out) + r * bytes, group_->buffer(r), bytes);
    group_->wait(rank_, "all_gather");
  }

  void barrier() override { group_->wait(rank_, "barrier"); }

 private:
  // Sums elements [b, e) of every participant's buffer in rank order, scales the sum, and
  // writes it into every buffer. float32 adds in place in a float32 accumulator; 16-bit
  // elements are widened to float32, added and scaled there, and rounded to T once.
  template <typename T>
  void reduce_slice(int64_t b, int64_t e, float scale) {
    const int n = size();
    constexpr int64_t kBlock = 4096;  // the widened slice, a block at a time
    std::vector<float> acc(size_t(std::min(e - b, kBlock)));
    std::vector<T> rounded(std::is_same_v<T, float> ? 0 : acc.size());
    for (int64_t s = b; s < e; s += kBlock) {
      const int64_t m = std::min(kBlock, e - s);
      const T* first = static_cast<const T*>(group_->buffer(0)) + s;
      for (int64_t i = 0; i < m; ++i) acc[i] = float(first[i]);
      for (int r = 1; r < n; ++r) {
        const T* other = static_cast<const T*>(group_->buffer(r)) + s;
        for (int64_t i = 0; i < m; ++i) acc[i] += float(other[i]);
      }
      if (scale != 1.f)
        for (int64_t i = 0; i < m; ++i) acc[i] *= scale;
      const void* result = acc.data();
      if constexpr (!std::is_same_v<T, float>) {
        for (int64_t i = 0; i < m; ++i) rounded[i] = T(acc[i]);
        result = rounded.data();
      }
      for (int r = 0; r < n; ++r)
        std::memcpy(static_cast<T*>(group_->buffer(r)) + s, result, size_t(m) * sizeof(T));
    }
  }

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
