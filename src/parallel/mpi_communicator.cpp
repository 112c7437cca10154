// Collectives between processes over MPI. Every call is non-blocking underneath and polled
// against a deadline, so a peer that died or never arrived becomes a galley::Error.
#include <mpi.h>

#include <chrono>
#include <mutex>
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

  // 16-bit data is widened into a float32 buffer, reduced as float32 and rounded back once.
  void all_reduce(void* data, int64_t count, DType dtype, parallel::ReduceOp op) override {
    check_count(count, "all_reduce");
    check_reducible(dtype);
    if (dtype == DType::Float32) return all_reduce_floats(static_cast<float*>(data), count, op);
    dispatch_floating(dtype, "mpi all_reduce", [&](auto tag) {
      using T = typename decltype(tag)::type;
      T* x = static_cast<T*>(data);
      std::vector<float> wide(x, x + count);
      all_reduce_floats(wide.data(), count, op);
      for (int64_t i = 0; i < count; ++i) x[i] = T(wide[size_t(i)]);
    });
  }
  void broadcast(void* data, int64_t count, DType dtype, int root) override {
    check_count(count, "broadcast");
    GALLEY_CHECK(root >= 0 && root < size_, "mpi broadcast: root ", root, " out of range for ",
                 size_, " processes");
    const MPI_Datatype type = element_type(dtype);
    MPI_Request req;
    MPI_CHECK(MPI_Ibcast(data, static_cast<int>(count), type, root, MPI_COMM_WORLD, &req));
    wait(req, "broadcast");
  }
  void all_gather(const void* data, int64_t count, DType dtype, void* out) override {
    check_count(count, "all_gather");
    const MPI_Datatype type = element_type(dtype);
    MPI_Request req;
    MPI_CHECK(MPI_Iallgather(data, static_cast<int>(count), type, out, static_cast<int>(count),
                             type, MPI_COMM_WORLD, &req));
    wait(req, "all_gather");
  }
  void barrier() override {
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
  void all_reduce_floats(float* data, int64_t count, parallel::ReduceOp op) {
    MPI_Request req;
    MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, data, static_cast<int>(count), MPI_FLOAT, MPI_SUM,
                             MPI_COMM_WORLD, &req));
    wait(req, "all_reduce");
    if (op == parallel::ReduceOp::Avg) {
      const float scale = 1.f / float(size_);
      for (int64_t i = 0; i < count; ++i) data[i] *= scale;
    }
  }
  void check_count(int64_t count, const char* op) const {
    GALLEY_CHECK(count >= 0 && count <= INT32_MAX, "mpi ", op, ": ", count,
                 " elements exceed one MPI call; use smaller buckets");
  }
  // Polls the request until it completes or the deadline passes.
  void wait(MPI_Request& req, const char* op) {
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::duration<double>(opt_.timeout_seconds);
    int done = 0;
    for (int spins = 0;; ++spins) {
      MPI_CHECK(MPI_Test(&req, &done, MPI_STATUS_IGNORE));
      if (done) return;
      GALLEY_CHECK(std::chrono::steady_clock::now() < deadline, "mpi ", op, " on rank ", rank_,
                   " of ", size_, " timed out after ", opt_.timeout_seconds,
                   " s: a peer process died or never called it");
      if (spins > 1000) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  parallel::CommOptions opt_;
  int rank_ = 0, size_ = 1;
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
