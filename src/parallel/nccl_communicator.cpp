// Collectives between GPUs over NCCL. Each communicator queues its collectives on its own
// high-priority stream, after an event on the device's compute stream, and polls a second event
// against the timeout, watching NCCL's asynchronous errors, so a dead or missing peer becomes a
// galley::Error rather than a hang. Without the CUDA backend both factories are errors.
#include <climits>
#include <cstring>

#include "galley/parallel/communicator.h"

#ifdef GALLEY_HAVE_CUDA
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <iostream>
#include <mutex>
#include <new>
#include <thread>

#include "src/runtime/device_memory.h"

#if NCCL_VERSION_CODE < NCCL_VERSION(2, 14, 0)
#error "galley needs NCCL 2.14 or newer (non-blocking communicators, ncclCommFinalize)"
#endif
#endif

namespace galley::parallel {

namespace {

// Checks that need no GPU, so that they give the same answer in every build.
void check_timeout(const char* fn, const CommOptions& options) {
  GALLEY_CHECK(options.timeout_seconds > 0, fn, ": timeout ", options.timeout_seconds,
               " s must be positive");
}

void check_device_list(const char* fn, const std::vector<Device>& devices) {
  GALLEY_CHECK(!devices.empty(), fn, ": the device list is empty");
  for (const Device& d : devices)
    GALLEY_CHECK(d.is_cuda(), fn, ": ", d.str(),
                 " is not a CUDA device; NCCL communicates between GPUs (replicas on the CPU "
                 "use make_thread_communicators)");
  for (size_t i = 0; i < devices.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      GALLEY_CHECK(devices[i] != devices[j], fn, ": ", devices[i].str(),
                   " is listed twice (positions ", j, " and ", i, "); NCCL needs one rank per GPU");
}

#ifndef GALLEY_HAVE_CUDA
[[noreturn]] void no_backend(const char* fn) {
  throw Error(detail::str_cat(fn,
                              ": this build of galley has no CUDA backend, so no NCCL (configure "
                              "with the CUDA toolkit, cuDNN and NCCL present, GALLEY_WITH_CUDA="
                              "AUTO or ON)"));
}
#else

void check_exists(const char* fn, Device device) {
  GALLEY_CHECK(device.index() >= 0 && device.index() < cuda_device_count(), fn, ": ", device.str(),
               " does not exist: this machine has ", cuda_device_count(), " CUDA device(s)");
}

// ---------------------------------------------------------------------------------------------
// Checks and small RAII helpers

// One generic checker; the macros add the failed call and where it was made.
void check_status(bool ok, const char* lib, const char* call, const char* file, int line,
                  const std::string& detail) {
  if (!ok) galley::detail::throw_error(file, line, call, std::string(lib) + " error: " + detail);
}

std::string nccl_error_text(ncclResult_t rc) {
  std::string text = ncclGetErrorString(rc);
  // NCCL's own last message says which step failed (it may be left over from an earlier
  // failure, so it is given as NCCL's words, not as the cause).
  const char* last = ncclGetLastError(nullptr);
  if (last && *last) text += detail::str_cat(" (NCCL's last message: ", last, ")");
  return text;
}

std::string cuda_error_text(cudaError_t rc) {
  (void)cudaGetLastError();  // clears a non-sticky error so it is not reported twice
  return cudaGetErrorString(rc);
}

#define NCCL_CHECK(call)                                                               \
  do {                                                                                 \
    ncclResult_t nccl_rc_ = (call);                                                    \
    check_status(nccl_rc_ == ncclSuccess, "NCCL", #call, __FILE__, __LINE__,           \
                 nccl_rc_ == ncclSuccess ? std::string() : nccl_error_text(nccl_rc_)); \
  } while (0)
#define CUDA_CHECK(call)                                                               \
  do {                                                                                 \
    cudaError_t cuda_rc_ = (call);                                                     \
    check_status(cuda_rc_ == cudaSuccess, "CUDA", #call, __FILE__, __LINE__,           \
                 cuda_rc_ == cudaSuccess ? std::string() : cuda_error_text(cuda_rc_)); \
  } while (0)

// For destructors: never throws, says what went wrong on stderr.
void warn(const std::string& msg) noexcept {
  try {
    std::cerr << "galley: warning: " << msg << std::endl;
  } catch (...) {
  }
}

using detail::CurrentDevice;

using Clock = std::chrono::steady_clock;

// Communicators are created non-blocking, so that a bootstrap that never completes (a peer that
// never arrives, a wedged network) is aborted at the timeout instead of hanging the process; any
// NCCL call on them may then return ncclInProgress, after which NCCL's state is polled until the
// call has finished. Returns the final state (ncclSuccess, or the error), or ncclInProgress if
// `deadline` passed first.
ncclResult_t settle(ncclComm_t comm, ncclResult_t rc, Clock::time_point deadline) {
  for (int polls = 0; rc == ncclInProgress; ++polls) {
    if (Clock::now() >= deadline) return ncclInProgress;
    if (polls < 1000)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    const ncclResult_t q = ncclCommGetAsyncError(comm, &rc);
    if (q != ncclSuccess) return q;
  }
  return rc;
}

Clock::time_point deadline_after(double seconds) {
  return Clock::now() +
         std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

// Owns an ncclComm_t: destroyed when healthy, aborted after a failure. Never throws.
class CommHandle {
 public:
  CommHandle() = default;
  CommHandle(ncclComm_t comm, int device) : comm_(comm), device_(device) {}
  CommHandle(CommHandle&& o) noexcept : comm_(o.comm_), device_(o.device_) { o.comm_ = nullptr; }
  CommHandle& operator=(CommHandle&& o) noexcept {
    if (this != &o) {
      release(false);
      comm_ = o.comm_;
      device_ = o.device_;
      o.comm_ = nullptr;
    }
    return *this;
  }
  ~CommHandle() { release(false); }

  ncclComm_t get() const { return comm_; }
  // Makes whatever NCCL still runs for this communicator stop, and frees it.
  void abort() noexcept { release(true); }
  void destroy() noexcept { release(false); }

 private:
  void release(bool abort) noexcept {
    if (!comm_) return;
    CurrentDevice current(Device::cuda(device_));
    ncclResult_t rc = ncclSuccess;
    if (!abort) {
      // A non-blocking communicator finishes its work in ncclCommFinalize, which may return
      // before it is done; one that does not finish in time is aborted instead.
      rc = settle(comm_, ncclCommFinalize(comm_), deadline_after(30));
      abort = rc != ncclSuccess;
      if (abort)
        warn(detail::str_cat(
            "ncclCommFinalize on cuda:", device_, " failed (",
            rc == ncclInProgress ? "still running after 30 s" : ncclGetErrorString(rc),
            "); aborting the communicator"));
    }
    rc = abort ? ncclCommAbort(comm_) : ncclCommDestroy(comm_);
    if (rc != ncclSuccess)
      warn(detail::str_cat(abort ? "ncclCommAbort" : "ncclCommDestroy", " on cuda:", device_,
                           " failed: ", ncclGetErrorString(rc)));
    comm_ = nullptr;
  }

  ncclComm_t comm_ = nullptr;
  int device_ = 0;
};

// What the communicators of one group in this process share: once one has failed, its peers
// here fail at once instead of each waiting out its own timeout.
class GroupState {
 public:
  bool broken() const { return broken_.load(std::memory_order_acquire); }
  std::string why() const {
    std::lock_guard<std::mutex> lock(mu_);
    return why_;
  }
  void mark_broken(const std::string& why) {
    std::lock_guard<std::mutex> lock(mu_);
    if (broken_.load(std::memory_order_relaxed)) return;
    why_ = why;
    broken_.store(true, std::memory_order_release);
  }

 private:
  mutable std::mutex mu_;
  std::atomic<bool> broken_{false};
  std::string why_;
};

// Creates ranks first_rank .. first_rank + devices.size() - 1 of an `nranks`-rank group with
// `id`, one per device of this process, non-blocking, and waits for them under the timeout: a
// bootstrap that does not complete is aborted and reported rather than left hanging.
std::vector<CommHandle> init_ranks(const char* fn, const ncclUniqueId& id, int nranks,
                                   int first_rank, const std::vector<Device>& devices,
                                   double timeout_seconds) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  const size_t n = devices.size();
  std::vector<ncclComm_t> raw(n, nullptr);
  ncclResult_t rc = ncclSuccess;
  if (n > 1) NCCL_CHECK(ncclGroupStart());
  for (size_t i = 0; i < n && (rc == ncclSuccess || rc == ncclInProgress); ++i) {
    CurrentDevice current(devices[i]);
    rc = ncclCommInitRankConfig(&raw[i], nranks, id, first_rank + static_cast<int>(i), &config);
  }
  if (n > 1) {
    const ncclResult_t end = ncclGroupEnd();
    if (rc == ncclSuccess || rc == ncclInProgress) rc = end;
  }
  std::string failure;
  if (rc != ncclSuccess && rc != ncclInProgress) failure = nccl_error_text(rc);
  const auto deadline = deadline_after(timeout_seconds);
  for (size_t i = 0; i < n && failure.empty(); ++i) {
    const ncclResult_t r = raw[i] ? settle(raw[i], ncclInProgress, deadline) : ncclInternalError;
    if (r == ncclInProgress)
      failure = detail::str_cat("it did not complete within timeout_seconds = ", timeout_seconds,
                                " s (a peer never joined, or the network between them is blocked)");
    else if (r != ncclSuccess)
      failure = detail::str_cat(devices[i].str(), ": ", nccl_error_text(r));
  }
  if (!failure.empty()) {
    for (size_t i = 0; i < n; ++i)
      if (raw[i]) {
        CurrentDevice current(devices[i]);
        (void)ncclCommAbort(raw[i]);
      }
    throw Error(detail::str_cat(fn, ": creating NCCL rank", n > 1 ? "s " : " ", first_rank,
                                n > 1 ? detail::str_cat("-", first_rank + int(n) - 1) : "", " of ",
                                nranks, " failed: ", failure));
  }
  std::vector<CommHandle> handles;
  handles.reserve(n);
  for (size_t i = 0; i < n; ++i) handles.emplace_back(raw[i], devices[i].index());
  return handles;
}

// ---------------------------------------------------------------------------------------------
// The communicator

class NcclCommunicator : public Communicator {
 public:
  NcclCommunicator(CommHandle comm, Device device, int rank, int size, CommOptions options,
                   std::shared_ptr<GroupState> group)
      : comm_(std::move(comm)),
        device_(device),
        rank_(rank),
        size_(size),
        options_(options),
        group_(std::move(group)) {
    try {
      CurrentDevice current(device_);
      // The highest priority lets the collectives overlap a backward pass that fills the GPU.
      int least = 0, greatest = 0;
      CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
      // Non-blocking: the stream never waits implicitly for the legacy default stream, whose
      // work reaches it only through the compute-stream event.
      CUDA_CHECK(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, greatest));
      CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
      CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
      CUDA_CHECK(cudaMalloc(&scratch_, sizeof(float)));
      CUDA_CHECK(cudaMemsetAsync(scratch_, 0, sizeof(float), stream_));
      CUDA_CHECK(cudaStreamSynchronize(stream_));
    } catch (...) {
      comm_.destroy();
      release_cuda(/*free_scratch=*/true);
      throw;
    }
  }

  ~NcclCommunicator() override {
    // A healthy communicator has nothing in flight (every call waits for its collective); after
    // a failure the kernels may still be waiting for a peer, and only an abort stops them.
    const bool failed = broken_ || group_->broken();
    if (failed)
      comm_.abort();
    else
      comm_.destroy();
    // After a failure the scratch float is left to the driver: cudaFree waits for the whole
    // device, and a destructor must not hang.
    release_cuda(/*free_scratch=*/!failed);
  }

  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string kind() const override { return "nccl"; }
  Device device() const override { return device_; }
  void wait_for_event(void* cuda_event) override {
    std::lock_guard<std::mutex> lock(mu_);
    pending_ = static_cast<cudaEvent_t>(cuda_event);
  }
  using Communicator::all_gather;
  using Communicator::all_reduce;
  using Communicator::broadcast;

  // bfloat16 and float16 travel and reduce natively.
  void all_reduce(void* data, int64_t count, DType dtype, ReduceOp op) override {
    check_reducible(dtype);
    const ncclDataType_t type = nccl_type(dtype);
    const ncclRedOp_t nccl_op = op == ReduceOp::Avg ? ncclAvg : ncclSum;
    run("all_reduce", count, [&] {
      return ncclAllReduce(data, data, size_t(count), type, nccl_op, comm_.get(), stream_);
    });
  }

  void broadcast(void* data, int64_t count, DType dtype, int root) override {
    const ncclDataType_t type = nccl_type(dtype);
    GALLEY_CHECK(root >= 0 && root < size_, "nccl broadcast: root ", root, " out of range for ",
                 size_, " ranks");
    run("broadcast", count,
        [&] { return ncclBroadcast(data, data, size_t(count), type, root, comm_.get(), stream_); });
  }

  void all_gather(const void* data, int64_t count, DType dtype, void* out) override {
    const ncclDataType_t type = nccl_type(dtype);
    run("all_gather", count,
        [&] { return ncclAllGather(data, out, size_t(count), type, comm_.get(), stream_); });
  }

  // An all-reduce completes on a rank only once every rank has contributed to it.
  void barrier() override {
    run("barrier", 1, [&] {
      return ncclAllReduce(scratch_, scratch_, 1, ncclFloat, ncclSum, comm_.get(), stream_);
    });
  }

  // The first all-reduce of an in-process group, issued for every rank from one thread inside
  // one NCCL group (make_nccl_communicators): queue_warm_up for every rank between
  // ncclGroupStart and ncclGroupEnd, then finish_warm_up for every rank.
  void queue_warm_up() {
    CurrentDevice current(device_);
    // Inside a group the call only records the collective; a non-blocking communicator may say
    // ncclInProgress, which ncclGroupEnd's wait covers.
    const ncclResult_t rc =
        ncclAllReduce(scratch_, scratch_, 1, ncclFloat, ncclSum, comm_.get(), stream_);
    GALLEY_CHECK(rc == ncclSuccess || rc == ncclInProgress, "ncclAllReduce: ", nccl_error_text(rc));
  }
  // After the group's ncclGroupEnd returned ncclInProgress: waits until this rank's part is
  // queued, or `deadline`.
  ncclResult_t settle_queued(Clock::time_point deadline) {
    return settle(comm_.get(), ncclInProgress, deadline);
  }
  void finish_warm_up() {
    std::lock_guard<std::mutex> lock(mu_);
    CurrentDevice current(device_);
    try {
      CUDA_CHECK(cudaEventRecord(done_, stream_));
    } catch (const Error& e) {
      fail("set-up all-reduce", detail::str_cat("could not be queued: ", e.what()));
    }
    wait("set-up all-reduce");
  }
  // After a failure during set-up: the destructor aborts instead of destroying.
  void mark_failed(const std::string& why) {
    broken_ = true;
    group_->mark_broken(why);
  }

 private:
  // Queues one collective after the compute stream's work and waits for it. `issue` makes the
  // NCCL call on stream_ and returns its result.
  template <typename Issue>
  void run(const char* op, int64_t count, Issue&& issue) {
    std::lock_guard<std::mutex> lock(mu_);
    check_usable(op);
    GALLEY_CHECK(
        count >= 0 && count <= INT_MAX, "nccl ", op, " on rank ", rank_, " (", device_.str(),
        "): ", count, " elements",
        count < 0 ? " is negative" : " exceed one call (at most 2^31 - 1); use smaller buckets");
    if (count == 0) return;
    CurrentDevice current(device_);
    ncclResult_t queued = ncclSuccess;
    try {
      if (pending_) {  // the input's own event (wait_for_event)
        CUDA_CHECK(cudaStreamWaitEvent(stream_, pending_, 0));
        pending_ = nullptr;
      } else {
        auto compute = static_cast<cudaStream_t>(detail::compute_stream(device_));
        CUDA_CHECK(cudaEventRecord(ready_, compute));
        CUDA_CHECK(cudaStreamWaitEvent(stream_, ready_, 0));
      }
      // On a non-blocking communicator the call may still be queueing when it returns: done_
      // is recorded only once it is on the stream.
      queued = settle(comm_.get(), issue(), deadline_after(options_.timeout_seconds));
      if (queued == ncclSuccess) CUDA_CHECK(cudaEventRecord(done_, stream_));
    } catch (const Error& e) {
      // A peer may have queued its part already: this rank can no longer take part.
      fail(op, detail::str_cat("could not be queued: ", e.what()));
    }
    if (queued == ncclInProgress)
      fail(op, detail::str_cat("was still being queued after timeout_seconds = ",
                               options_.timeout_seconds, " s"));
    if (queued != ncclSuccess)
      fail(op, detail::str_cat("could not be queued: ", nccl_error_text(queued)));
    wait(op);
  }

  // The NCCL type of `dtype`'s elements: every dtype for the collectives that copy them
  // (broadcast, all_gather); all_reduce checks for a floating one first (check_reducible).
  static ncclDataType_t nccl_type(DType dtype) {
    switch (dtype) {
      case DType::Float32:
        return ncclFloat;
      case DType::BFloat16:
        return ncclBfloat16;
      case DType::Float16:
        return ncclFloat16;
      case DType::Int64:
        return ncclInt64;
      case DType::UInt8:
        return ncclUint8;
    }
    return ncclFloat;  // not reached
  }

  void check_usable(const char* op) const {
    if (broken_ || group_->broken())
      throw Error(detail::str_cat("nccl ", op, " on rank ", rank_, " of ", size_, " (",
                                  device_.str(),
                                  "): the communicator is unusable after an earlier failure (",
                                  broken_ ? why_ : group_->why(), ")"));
  }

  // Polls done_ until the collective is complete, NCCL reports an error, a peer of this process
  // fails, or the timeout passes. The first polls only yield, so that short collectives return
  // quickly; later ones sleep, so that a long wait does not take a CPU core from the replicas.
  void wait(const char* op) {
    const auto start = Clock::now();
    const auto deadline = start + std::chrono::duration<double>(options_.timeout_seconds);
    bool saw_not_ready = false;
    for (int polls = 0;; ++polls) {
      const cudaError_t rc = cudaEventQuery(done_);
      if (rc == cudaSuccess) break;
      if (rc != cudaErrorNotReady)
        fail(op, detail::str_cat("failed on the GPU: ", cuda_error_text(rc)));
      saw_not_ready = true;
      ncclResult_t async = ncclSuccess;
      const ncclResult_t q = ncclCommGetAsyncError(comm_.get(), &async);
      if (q != ncclSuccess)
        fail(op, detail::str_cat("could not query NCCL's state: ", nccl_error_text(q)));
      if (async != ncclSuccess && async != ncclInProgress)
        fail(op, detail::str_cat("failed in NCCL: ", nccl_error_text(async)));
      if (group_->broken())
        fail(op, detail::str_cat("stopped because another rank of this process failed (",
                                 group_->why(), ")"));
      const auto now = Clock::now();
      if (now >= deadline)
        fail(op, detail::str_cat("did not complete after ",
                                 std::chrono::duration<double>(now - start).count(),
                                 " s (timeout_seconds = ", options_.timeout_seconds,
                                 "): a peer rank died, hangs, or called a different collective"));
      if (polls < 1000)
        std::this_thread::yield();
      else
        std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    // cudaErrorNotReady is a status, not a failure: keep it from reaching a later
    // cudaGetLastError on this thread.
    if (saw_not_ready && cudaPeekAtLastError() == cudaErrorNotReady) (void)cudaGetLastError();
  }

  // Aborts the communicator (stopping its kernels), marks it and its in-process group unusable,
  // and throws.
  [[noreturn]] void fail(const char* op, const std::string& why) {
    const std::string msg = detail::str_cat(
        "nccl ", op, " on rank ", rank_, " of ", size_, " (", device_.str(), ") ", why,
        "; the communicator has been aborted and every later call on its group fails");
    comm_.abort();
    broken_ = true;
    why_ = msg;
    group_->mark_broken(msg);
    throw Error(msg);
  }

  void release_cuda(bool free_scratch) noexcept {
    CurrentDevice current(device_);
    auto quiet = [&](cudaError_t rc, const char* what) {
      if (rc == cudaSuccess) return;
      (void)cudaGetLastError();
      warn(detail::str_cat(what, " on ", device_.str(), " failed: ", cudaGetErrorString(rc)));
    };
    if (done_) quiet(cudaEventDestroy(done_), "cudaEventDestroy");
    if (ready_) quiet(cudaEventDestroy(ready_), "cudaEventDestroy");
    if (stream_) quiet(cudaStreamDestroy(stream_), "cudaStreamDestroy");
    if (scratch_ && free_scratch) quiet(cudaFree(scratch_), "cudaFree");
    done_ = ready_ = nullptr;
    stream_ = nullptr;
    scratch_ = nullptr;
  }

  CommHandle comm_;
  const Device device_;
  const int rank_, size_;
  const CommOptions options_;
  std::shared_ptr<GroupState> group_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t ready_ = nullptr;    // recorded on the compute stream; stream_ waits for it
  cudaEvent_t done_ = nullptr;     // recorded on stream_ after the collective; polled
  cudaEvent_t pending_ = nullptr;  // set by wait_for_event for the next collective only
  float* scratch_ = nullptr;       // one device float for barrier()
  std::mutex mu_;                  // one call at a time
  bool broken_ = false;
  std::string why_;
};

#endif  // GALLEY_HAVE_CUDA

}  // namespace

std::vector<std::shared_ptr<Communicator>> make_nccl_communicators(
    const std::vector<Device>& devices, CommOptions options) {
  const char* fn = "make_nccl_communicators";
  check_timeout(fn, options);
  check_device_list(fn, devices);
#ifndef GALLEY_HAVE_CUDA
  no_backend(fn);
#else
  for (const Device& d : devices) check_exists(fn, d);
  const int n = static_cast<int>(devices.size());
  ncclUniqueId id;
  NCCL_CHECK(ncclGetUniqueId(&id));
  std::vector<CommHandle> handles = init_ranks(fn, id, n, 0, devices, options.timeout_seconds);

  auto group = std::make_shared<GroupState>();
  std::vector<std::shared_ptr<NcclCommunicator>> comms;
  for (int i = 0; i < n; ++i)
    comms.push_back(std::make_shared<NcclCommunicator>(std::move(handles[i]), devices[i], i, n,
                                                       options, group));

  // One all-reduce over every rank, from this thread as one NCCL group: NCCL connects the ranks
  // now, while no other thread queues work on these GPUs, and a group that cannot communicate
  // fails here rather than in the first training step.
  try {
    NCCL_CHECK(ncclGroupStart());
    try {
      for (auto& c : comms) c->queue_warm_up();
    } catch (...) {
      (void)ncclGroupEnd();
      throw;
    }
    const ncclResult_t end = ncclGroupEnd();
    GALLEY_CHECK(end == ncclSuccess || end == ncclInProgress,
                 "ncclGroupEnd: ", nccl_error_text(end));
    const auto deadline = deadline_after(options.timeout_seconds);
    for (auto& c : comms) {
      const ncclResult_t r = c->settle_queued(deadline);
      GALLEY_CHECK(
          r == ncclSuccess, "queueing the first all-reduce: ",
          r == ncclInProgress ? std::string("not done within the timeout") : nccl_error_text(r));
    }
    for (auto& c : comms) c->finish_warm_up();
  } catch (const Error& e) {
    const std::string why =
        detail::str_cat(fn, ": the first all-reduce over ", n, " GPUs failed: ", e.what());
    for (auto& c : comms) c->mark_failed(why);  // the destructors abort
    throw Error(why);
  }
  return {comms.begin(), comms.end()};
#endif
}

std::shared_ptr<Communicator> make_nccl_communicator(Device device, Communicator& bootstrap,
                                                     CommOptions options) {
  const char* fn = "make_nccl_communicator";
  check_timeout(fn, options);
  check_device_list(fn, {device});
#ifndef GALLEY_HAVE_CUDA
  (void)bootstrap;
  no_backend(fn);
#else
  check_exists(fn, device);
  const int rank = bootstrap.rank(), n = bootstrap.size();

  // Participant 0 creates the id; its 128 bytes travel as floats (copied bit for bit), with one
  // more float that says whether participant 0 succeeded, so that the others fail with it
  // instead of waiting in ncclCommInitRank for a rank that never comes.
  constexpr int kIdFloats = NCCL_UNIQUE_ID_BYTES / sizeof(float);
  static_assert(NCCL_UNIQUE_ID_BYTES % sizeof(float) == 0, "the NCCL id packs into floats");
  ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  std::string root_error;
  float ok = 1.f;
  if (rank == 0) {
    try {
      CurrentDevice current(device);
      NCCL_CHECK(ncclGetUniqueId(&id));
    } catch (const Error& e) {
      root_error = e.what();
      ok = 0.f;
    }
  }
  std::vector<float> packed(kIdFloats + 1);
  std::memcpy(packed.data(), &id, sizeof(id));
  packed[kIdFloats] = ok;
  // Through a host tensor, so that any kind of bootstrap communicator can carry it.
  Tensor message = Tensor::from_host(packed.data(), {kIdFloats + 1}, DType::Float32, Device::cpu());
  bootstrap.broadcast(message, 0);
  message.copy_to_host(packed.data());
  GALLEY_CHECK(packed[kIdFloats] == 1.f, fn, ": participant 0 of the ", bootstrap.kind(),
               " group could not create the NCCL id",
               root_error.empty() ? std::string() : ": " + root_error);
  std::memcpy(&id, packed.data(), sizeof(id));

  std::vector<CommHandle> handle = init_ranks(fn, id, n, rank, {device}, options.timeout_seconds);
  auto comm = std::make_shared<NcclCommunicator>(std::move(handle[0]), device, rank, n, options,
                                                 std::make_shared<GroupState>());
  // The first collective, under the timeout: NCCL connects the ranks here, and a group that
  // cannot communicate fails now.
  comm->barrier();
  return comm;
#endif
}

}  // namespace galley::parallel
