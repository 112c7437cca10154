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
  /// Combines `count` floats at `data` across the group, in place.
  virtual void all_reduce(float* data, int64_t count, ReduceOp op) = 0;
  /// Copies `count` floats at `data` from participant `root` to every other participant.
  virtual void broadcast(float* data, int64_t count, int root) = 0;
  /// Writes every participant's `count` floats, in rank order, into `out` (size() * count).
  virtual void all_gather(const float* data, int64_t count, float* out) = 0;
  /// Returns once every participant has called it.
  virtual void barrier() = 0;
  /// Short description for messages ("threads", "mpi", "nccl").
  virtual std::string kind() const = 0;
  /// Where the memory given to the pointer calls above must live: the host (Device::cpu(), any
  /// CPU index) for "threads" and "mpi", the communicator's own GPU for "nccl".
  virtual Device device() const { return Device::cpu(); }

  // The tensor calls work in place when the tensor lives in device()'s memory, and otherwise
  // through a copy there and back: a GPU tensor on a host communicator, a host tensor on an
  // NCCL one. A tensor on a different GPU from an NCCL communicator's is an error.

  /// all_reduce of a contiguous float32 tensor, in place.
  void all_reduce(Tensor& t, ReduceOp op = ReduceOp::Sum);
  /// broadcast of a contiguous float32 tensor, in place.
  void broadcast(Tensor& t, int root = 0);
  /// all_gather of a float32 tensor: the result is [size(), ...t.shape()], on t's device.
  Tensor all_gather(const Tensor& t);
};

/// `n` communicators over one shared-memory group, for `n` threads of this process: rank i goes
/// to the thread that drives replica i. Reductions are split across the participants (each sums
/// one slice of every buffer and writes it back to all), so no data passes through a lock.
std::vector<std::shared_ptr<Communicator>> make_thread_communicators(int n,
                                                                     CommOptions options = {});

}  // namespace galley::parallel
