// Collectives between processes over MPI. Every call is non-blocking underneath and polled
// against a deadline, so a peer that died or never arrived becomes a galley::Error.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "galley/distributed.h"
#include "galley/half.h"
#include "src/parallel/mpi.h"

namespace galley::distributed {

bool mpi_available() {
  return true;
}

namespace detail {
namespace {

#define MPI_CHECK(call)                                                                       \
  do {                                                                                        \
    int mpi_rc_ = (call);                                                                     \
    if (mpi_rc_ != MPI_SUCCESS) {                                                             \
      char mpi_msg_[MPI_MAX_ERROR_STRING];                                                    \
      int mpi_len_ = 0;                                                                       \
      MPI_Error_string(mpi_rc_, mpi_msg_, &mpi_len_);                                         \
      GALLEY_CHECK(false, "MPI call failed: ", #call, ": ", std::string(mpi_msg_, mpi_len_)); \
    }                                                                                         \
  } while (0)

// Finalises MPI at exit if galley initialised it.
struct MpiSession {
  bool owned = false;
  ~MpiSession() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (owned && !finalized) MPI_Finalize();
  }
};
MpiSession& session() {
  static MpiSession s;
  return s;
}

class MpiCommunicator : public parallel::Communicator {
 public:
  explicit MpiCommunicator(parallel::CommOptions opt) : opt_(opt) {
    MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank_));
    MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size_));
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string kind() const override { return "mpi"; }
  using Communicator::all_gather;
  using Communicator::all_reduce;
  using Communicator::broadcast;

  // A collective still posted keeps its buffer for good: MPI may write into it at any time.
  ~MpiCommunicator() override {
    progress();
    for (auto& a : abandoned_) (void)a.buffer.data.release();
  }

  // Every collective runs in a buffer of the communicator's own (stage()), copied in and out:
  // 16-bit data is widened into it as float32, reduced as float32 and rounded back once. One
  // call at a time (a lock): the buffer is shared.
  void all_reduce(void* data, int64_t count, DType dtype, parallel::ReduceOp op) override {
    std::lock_guard<std::mutex> lock(mu_);
    check_usable("all_reduce");
    check_count(count, "all_reduce");
    check_reducible(dtype);
    dispatch_floating(dtype, "mpi all_reduce", [&](auto tag) {
      using T = typename decltype(tag)::type;
      T* x = static_cast<T*>(data);
      float* wide = reinterpret_cast<float*>(stage(size_t(count) * sizeof(float)));
      std::copy_n(x, count, wide);
      MPI_Request req;
      MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, wide, static_cast<int>(count), MPI_FLOAT, MPI_SUM,
                               MPI_COMM_WORLD, &req));
      wait(req, "all_reduce");
      const float scale = op == parallel::ReduceOp::Avg ? 1.f / float(size_) : 1.f;  // (x 1 exact)
      for (int64_t i = 0; i < count; ++i) x[i] = T(wide[i] * scale);
    });
    unstage();
  }
  void broadcast(void* data, int64_t count, DType dtype, int root) override {
    std::lock_guard<std::mutex> lock(mu_);
    check_usable("broadcast");
    check_count(count, "broadcast");
    GALLEY_CHECK(root >= 0 && root < size_, "mpi broadcast: root ", root, " out of range for ",
                 size_, " processes");
    const MPI_Datatype type = element_type(dtype);
    const size_t bytes = size_t(count) * dtype_size(dtype);
    unsigned char* buf = stage(bytes);
    if (rank_ == root) copy_bytes(buf, data, bytes);
    MPI_Request req;
    MPI_CHECK(MPI_Ibcast(buf, static_cast<int>(count), type, root, MPI_COMM_WORLD, &req));
    wait(req, "broadcast");
    copy_bytes(data, buf, bytes);
    unstage();
  }
  void all_gather(const void* data, int64_t count, DType dtype, void* out) override {
    std::lock_guard<std::mutex> lock(mu_);
    check_usable("all_gather");
    check_count(count, "all_gather");
    const MPI_Datatype type = element_type(dtype);
    const size_t bytes = size_t(count) * dtype_size(dtype);
    unsigned char* buf = stage(bytes * size_t(size_));  // everyone's parts, this rank's in place
    copy_bytes(buf + bytes * size_t(rank_), data, bytes);
    MPI_Request req;
    MPI_CHECK(MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, static_cast<int>(count), type,
                             MPI_COMM_WORLD, &req));
    wait(req, "all_gather");
    copy_bytes(out, buf, bytes * size_t(size_));
    unstage();
  }
  void barrier() override {
    std::lock_guard<std::mutex> lock(mu_);
    check_usable("barrier");
    MPI_Request req;
    MPI_CHECK(MPI_Ibarrier(MPI_COMM_WORLD, &req));
    wait(req, "barrier");
  }

 private:
  // The MPI type that carries `dtype`'s elements (16-bit floats as their bits), for the
  // collectives that copy them (broadcast, all_gather): every dtype.
  static MPI_Datatype element_type(DType dtype) {
    switch (dtype) {
      case DType::Float32:
        return MPI_FLOAT;
      case DType::Float16:
      case DType::BFloat16:
        return MPI_UINT16_T;
      case DType::Int64:
        return MPI_INT64_T;
      case DType::UInt8:
        return MPI_UINT8_T;
    }
    return MPI_BYTE;  // not reached
  }
  void check_count(int64_t count, const char* op) const {
    GALLEY_CHECK(count >= 0 && count <= INT32_MAX, "mpi ", op, ": ", count,
                 " elements exceed one MPI call; use smaller buckets");
  }
  // Fails at once where an earlier collective timed out, after letting the abandoned
  // collectives progress (a late peer's call completes only as this process polls them).
  void check_usable(const char* op) {
    progress();
    GALLEY_CHECK(why_.empty(), "mpi ", op, " on rank ", rank_, " of ", size_,
                 ": the group is unusable after an earlier failure (", why_, ")");
  }
  // Polls the abandoned collectives; those that completed free their buffers.
  void progress() {
    for (size_t i = 0; i < abandoned_.size();) {
      int done = 0;
      if (MPI_Test(&abandoned_[i].request, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && done)
        abandoned_.erase(abandoned_.begin() + std::ptrdiff_t(i));
      else
        ++i;
    }
  }
  // The communicator's buffer of at least `bytes` (not zeroed). The collective runs there rather
  // than in the caller's memory: one that times out stays posted, and MPI writes its result
  // whenever the late peers arrive. Its buffer is then kept (abandoned_) until it completes,
  // where the caller's memory would long since have been reused (a tensor freed after the error,
  // and another allocated in its place, took the late sum). The copies in and out cost about a
  // memory copy of the data each (DataParallel's buckets: 25 MB in 5 ms on one core), beside
  // the transfer itself.
  unsigned char* stage(size_t bytes) {
    if (stage_.size < bytes) {
      stage_ = {};  // (the old one first: both at once could be too much memory)
      stage_ = {std::unique_ptr<unsigned char[]>(new unsigned char[bytes]), bytes};
    }
    return stage_.data.get();
  }
  // After a call: a buffer past kKeptStageBytes is given back rather than held for good (one
  // large parameter's bucket, or an all_gather of many ranks, would pin its size).
  void unstage() {
    if (stage_.size > kKeptStageBytes) stage_ = {};
  }
  static constexpr size_t kKeptStageBytes = size_t(64) << 20;
  static void copy_bytes(void* dst, const void* src, size_t bytes) {
    if (bytes) std::memcpy(dst, src, bytes);  // (an empty tensor's pointer may be null)
  }
  // Polls the request until it completes or the deadline passes. On the deadline the group is
  // unusable, as the threads and NCCL groups become: every later call fails at once (the
  // collective still posted would pair with the peers' next one).
  void wait(MPI_Request& req, const char* op) {
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::duration<double>(opt_.timeout_seconds);
    int done = 0;
    for (int spins = 0;; ++spins) {
      MPI_CHECK(MPI_Test(&req, &done, MPI_STATUS_IGNORE));
      if (done) return;
      if (std::chrono::steady_clock::now() >= deadline) {
        why_ = galley::detail::str_cat("mpi ", op, " on rank ", rank_, " of ", size_,
                                       " timed out after ", opt_.timeout_seconds,
                                       " s: a peer process died or never called it");
        abandoned_.push_back({req, std::move(stage_)});
        stage_ = {};
        GALLEY_CHECK(false, why_);
      }
      if (spins > 1000) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  parallel::CommOptions opt_;
  int rank_ = 0, size_ = 1;
  std::string why_;  // the failure that made the group unusable; empty while usable
  std::mutex mu_;    // one call at a time: the calls share stage_
  struct Buffer {
    std::unique_ptr<unsigned char[]> data;
    size_t size = 0;
  };
  Buffer stage_;
  // Collectives that timed out, still posted, with the buffers they write into.
  struct Abandoned {
    MPI_Request request;
    Buffer buffer;
  };
  std::vector<Abandoned> abandoned_;
};

}  // namespace

std::shared_ptr<parallel::Communicator> make_mpi_world(parallel::CommOptions options) {
  int initialized = 0;
  MPI_CHECK(MPI_Initialized(&initialized));
  if (!initialized) {
    // Collectives are issued from DataParallel's communication threads, not only from main.
    int provided = 0;
    MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided));
    session().owned = true;
    GALLEY_CHECK(provided >= MPI_THREAD_SERIALIZED, "MPI provides thread level ", provided,
                 "; galley needs at least MPI_THREAD_SERIALIZED");
  }
  return std::make_shared<MpiCommunicator>(options);
}

}  // namespace detail
}  // namespace galley::distributed
