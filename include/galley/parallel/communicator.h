#pragma once
/// \file Collective communication between the replicas of a data-parallel job.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "galley/tensor.h"

namespace galley::parallel {

/// How all_reduce combines the participants' values.
enum class ReduceOp { Sum, Avg };

/// Options shared by every communicator.
struct CommOptions {
  /// A collective that waits longer than this for a peer raises galley::Error instead of
  /// hanging; the whole group is then unusable (every later call fails at once).
  double timeout_seconds = 300.0;
};

/// One participant's handle to a group. Every participant must call the same collectives in
/// the same order with the same sizes; each call returns when the collective is complete for
/// this participant.
class Communicator {
 public:
  virtual ~Communicator() = default;
  /// This participant's index in [0, size()).
  virtual int rank() const = 0;
  /// Number of participants.
  virtual int size() const = 0;
  /// Combines `count` elements of `dtype` (float32, bfloat16 or float16) at `data` across the
  /// group, in place. 16-bit data is summed in float32 and rounded to its dtype once ("threads"
  /// and "mpi": each element is widened, the participants' values added in float32, in rank
  /// order for "threads", and the sum, or the average, rounded), so the result is a float32 sum
  /// rounded once, however many participants there are. "nccl" reduces bfloat16 and float16
  /// natively (ncclBfloat16 / ncclFloat16), which may round at each step of its ring.
  virtual void all_reduce(void* data, int64_t count, DType dtype, ReduceOp op) = 0;
  /// all_reduce of `count` float32 values.
  void all_reduce(float* data, int64_t count, ReduceOp op) {
    all_reduce(data, count, DType::Float32, op);
  }
  /// Copies `count` elements of `dtype` (any dtype) at `data` from participant `root` to every
  /// other participant, bit for bit.
  virtual void broadcast(void* data, int64_t count, DType dtype, int root) = 0;
  /// broadcast of `count` float32 values.
  void broadcast(float* data, int64_t count, int root) {
    broadcast(data, count, DType::Float32, root);
  }
  /// Writes every participant's `count` elements of `dtype` (any dtype), in rank order, into
  /// `out` (size() * count elements), bit for bit.
  virtual void all_gather(const void* data, int64_t count, DType dtype, void* out) = 0;
  /// all_gather of `count` float32 values.
  void all_gather(const float* data, int64_t count, float* out) {
    all_gather(data, count, DType::Float32, out);
  }
  /// Returns once every participant has called it.
  virtual void barrier() = 0;
  /// Short description for messages ("threads", "mpi", "nccl").
  virtual std::string kind() const = 0;
  /// GPU communicators: the next collective waits only for `cuda_event` (a cudaEvent_t recorded
  /// on the compute stream right after its input was written) rather than for everything
  /// queued on the compute stream so far, so it can run while later work (the rest of backward)
  /// still computes. Host communicators ignore it.
  virtual void wait_for_event(void* cuda_event) { (void)cuda_event; }
  /// Where the memory given to the pointer calls above must live: the host (Device::cpu(), any
  /// CPU index) for "threads" and "mpi", the communicator's own GPU for "nccl".
  virtual Device device() const { return Device::cpu(); }

  // The tensor calls work in place when the tensor lives in device()'s memory, and otherwise
  // through a copy there and back: a GPU tensor on a host communicator, a host tensor on an
  // NCCL one. A tensor on a different GPU from an NCCL communicator's is an error. ("mpi" runs
  // every collective in a buffer of its own, copied in and out, so that one that timed out, and
  // stays posted, never writes into the caller's memory afterwards; one call at a time.)

  /// all_reduce of a contiguous float32, bfloat16 or float16 tensor, in place.
  void all_reduce(Tensor& t, ReduceOp op = ReduceOp::Sum);
  /// broadcast of a contiguous tensor of any dtype, in place.
  void broadcast(Tensor& t, int root = 0);
  /// all_gather of a tensor of any dtype: the result is [size(), ...t.shape()],
  /// of t's dtype, on t's device.
  Tensor all_gather(const Tensor& t);

 protected:
  /// For the implementations of all_reduce: an error naming kind() and `dtype` unless it is
  /// float32, bfloat16 or float16 (the sums are floating; the copying collectives take any).
  void check_reducible(DType dtype) const;
};

/// `n` communicators over one shared-memory group, for `n` threads of this process: rank i goes
/// to the thread that drives replica i. Reductions are split across the participants (each sums
/// one slice of every buffer and writes it back to all), so no data passes through a lock.
std::vector<std::shared_ptr<Communicator>> make_thread_communicators(int n,
                                                                     CommOptions options = {});

// NCCL communicators, for CUDA device memory.
//
// The pointers given to an NCCL communicator's calls are device pointers on its GPU (device()).
// A call is ordered after all work already queued on that GPU's compute stream (the stream
// galley's ops run on), runs on the communicator's own high-priority stream, and returns when
// the collective is complete, like every other communicator: work queued afterwards sees the
// result, and the caller may free or reuse the buffers at once. While a call waits it watches
// CommOptions::timeout_seconds and NCCL's asynchronous errors; a collective that times out or
// fails aborts the communicator, and every later call on it (and, in-process, on every
// communicator of its group) raises galley::Error at once. The timeout covers the wait for the
// collective to complete, not NCCL's own set-up inside the factories, which waits for every
// rank without a limit.
//
// Each rank is driven by its own thread (one per replica, as in DataParallel): every call is
// issued on its own, never inside an NCCL group (ncclGroupStart/End), so the ranks of one
// process must be called from different threads, concurrently. A communicator takes one call
// at a time.

/// One NCCL communicator per GPU of this process (ncclCommInitAll): rank i works on devices[i].
/// Every device must be a CUDA device that exists, each listed once. Before returning, the
/// communicators run one all-reduce together, so that a group that cannot communicate fails
/// here. Raises galley::Error in a build without the CUDA backend.
std::vector<std::shared_ptr<Communicator>> make_nccl_communicators(
    const std::vector<Device>& devices, CommOptions options = {});

/// This process's NCCL communicator in a group of processes, one GPU each (ncclCommInitRank).
/// Every participant of `bootstrap` (the MPI world, say) calls it with its own GPU; participant
/// 0 creates the NCCL id and `bootstrap` broadcasts it, and the new communicator has the same
/// rank and size as `bootstrap`. Raises galley::Error in a build without the CUDA backend.
std::shared_ptr<Communicator> make_nccl_communicator(Device device, Communicator& bootstrap,
                                                     CommOptions options = {});

}  // namespace galley::parallel
