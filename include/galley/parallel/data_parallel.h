#pragma once
/// \file Data parallelism in one process: one replica per device, gradients all-reduced in
/// buckets while backward runs.
#include <memory>
#include <utility>
#include <vector>

#include "galley/device.h"
#include "galley/nn/layer.h"
#include "galley/parallel/communicator.h"

namespace galley {

/// Options of DataParallel.
struct DataParallelOptions {
  /// Gradients are grouped into buckets of at most this many bytes (a parameter larger than
  /// that gets a bucket of its own), filled in reverse registration order (the order backward
  /// produces them); each bucket is all-reduced as soon as all its gradients are ready. A model
  /// smaller than four buckets gets buckets of a quarter of its size (at least 64 KB), so that
  /// communication starts before backward ends. A bucket holds gradients of one dtype, counted
  /// at that dtype's element size: a model with float32 and bfloat16 (or float16) parameters
  /// gets buckets of each, and 16-bit buckets are reduced in their own dtype (summed in float32
  /// on the CPU and over MPI, natively by NCCL; see Communicator::all_reduce).
  int64_t bucket_bytes = 25 << 20;
  /// The dtype float32 gradients travel and are summed in: Float32 (exact), or BFloat16 or
  /// Float16 to halve the bytes on the wire (PyTorch DDP's bf16 / fp16 compression hooks). Each
  /// replica rounds its gradients once into the 16-bit bucket, the collective sums those (in
  /// float32 on the CPU and over MPI, natively by NCCL) and the result is widened back into the
  /// float32 gradients. 16-bit gradients always travel in their own dtype.
  DType reduce_dtype = DType::Float32;
  /// A collective that waits longer than this for a replica raises galley::Error.
  double timeout_seconds = 300.0;
  /// Communicator between processes (one DataParallel per process). Null means the world of
  /// galley::distributed::init_parallel_env() when that has more than one process. Gradients
  /// are summed over this process's replicas first, then averaged over the processes (each
  /// process's loss is the mean over its own batch), and parameters start as process 0's.
  std::shared_ptr<parallel::Communicator> process_group{};
  /// At every forward, every replica (and every process) first takes replica 0's buffers
  /// (running statistics, counters), as PyTorch DDP's broadcast_buffers: the replicas then
  /// compute with the same state whatever their own forwards changed. Across processes every
  /// buffer (BatchNorm's int64 num_batches_tracked too) is broadcast from process 0. Off: each
  /// replica keeps its own.
  bool broadcast_buffers = true;
};

/// Timings of the last training step (milliseconds, wall clock).
struct DataParallelStats {
  double forward_ms = 0;    ///< split, replica forwards and gather
  double backward_ms = 0;   ///< from the gathered output's gradient until gradients are reduced
  double allreduce_ms = 0;  ///< summed over replicas' communication threads
  double hidden_ms = 0;     ///< the part of allreduce_ms that ran while backward was computing
  int64_t buckets = 0;      ///< buckets per step
  /// Fraction of all-reduce time hidden behind backward (0 when nothing was reduced).
  double hidden_fraction() const { return allreduce_ms > 0 ? hidden_ms / allreduce_ms : 0.0; }
};

/// The part of DataParallel that does not depend on the model type.
class DataParallelBase {
 public:
  /// Splits the batch (dimension 0) across the replicas (the first B % N replicas get one
  /// more), runs every replica's forward at the same time on its own thread, and returns the
  /// outputs concatenated on the first device. Its backward runs every replica's backward at
  /// the same time and all-reduces the gradients (summed: a loss averaged over the whole
  /// batch weighs every sample equally, however unevenly the batch was split). Gradients
  /// accumulate as on one model: a second backward without clear_grad, or several forwards
  /// summed into one loss, add their parts to the reduced gradients once (a gradient that
  /// every replica still holds as the last reduction wrote it counts once, not per replica).
  /// An input that requires a gradient gets it, the replicas' rows gathered on its device. A
  /// gradient that reaches a replica's parameters outside this backward (a loss term on
  /// parameters(), an input computed from replica 0's parameters) is not all-reduced: it must be
  /// the same on every replica (a penalty summed over parameters() is), or they drift apart.
  Tensor forward(const Tensor& x);
  /// Same as forward().
  Tensor operator()(const Tensor& x) { return forward(x); }

  /// Every replica's parameters, replica by replica. Give these to the optimizer: each
  /// replica's parameters are updated on its own device from identical reduced gradients, so
  /// the replicas stay identical without any per-step broadcast.
  std::vector<Tensor> parameters() const;
  /// Replica 0's parameters with dotted names (for checkpoints and inspection).
  std::vector<nn::NamedTensor> named_parameters() const;
  /// Replica 0's state; load_state_dict writes every replica.
  std::map<std::string, Tensor> state_dict() const;
  /// Loads the same state into every replica; returns what nn::Layer::load_state_dict returns
  /// (the replicas are alike: the same for each).
  nn::Layer::LoadResult load_state_dict(const std::map<std::string, Tensor>& state,
                                        bool strict = true);

  /// Converts every replica's floating parameters and buffers to `dtype` (float32, bfloat16 or
  /// float16; nn::Layer::to), keeping their handles: an optimizer made from parameters() before
  /// steps them in the new dtype. The gradient buckets follow the new dtypes (they are also
  /// rebuilt at the next backward after every replica was converted through module(i).to()).
  void to(DType dtype);
  /// Training or evaluation mode for every replica.
  void train(bool on = true);
  /// Same as train(false).
  void eval() { train(false); }

  /// The devices, one replica each.
  const std::vector<Device>& devices() const;
  /// Number of replicas.
  size_t num_replicas() const { return devices().size(); }

  /// While alive, backward accumulates gradients locally without all-reducing them; the
  /// first backward after it ends reduces everything accumulated (gradient accumulation),
  /// also the gradients of parameters that this last backward does not reach.
  class NoSync {
   public:
    explicit NoSync(DataParallelBase& owner);
    ~NoSync();
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;

   private:
    DataParallelBase& owner_;
    bool prev_;
  };
  /// Starts a no-sync region: `{ auto guard = model.no_sync(); ... backward ... }`.
  NoSync no_sync() { return NoSync(*this); }

  /// Every replica's generators: "replica<i>" (the default generator of its forwards) and
  /// "replica<i>.<name>" (its layers' named_generators): what checkpoints keep.
  std::vector<std::pair<std::string, Generator*>> named_generators() const;

  /// Timings of the last step, including how much of the all-reduce was hidden behind backward.
  DataParallelStats last_stats() const;

  virtual ~DataParallelBase();
  DataParallelBase(const DataParallelBase&) = delete;
  DataParallelBase& operator=(const DataParallelBase&) = delete;

 protected:
  DataParallelBase(std::vector<std::unique_ptr<nn::Layer>> replicas, std::vector<Device> devices,
                   DataParallelOptions options);
  nn::Layer& replica_layer(size_t i) const;

 private:
  struct Impl;
  // Shared so that the graphs of its forwards and its parameters' gradient hooks can hold a weak
  // reference: a backward after the DataParallel is gone is an error, not a use after free.
  std::shared_ptr<Impl> impl_;
};

/// Keeps one replica of `Model` per device, built once (default-constructed, or from the
/// extra constructor arguments) and made identical to replica 0 at start.
///
///     auto model = galley::DataParallel<SimpleCNN>(galley::all_devices());
///     galley::optim::Adam optimizer(model.parameters(), {.learning_rate = 1e-3});
///     auto loss = loss_fn(model(data), label);  loss.backward();  optimizer.step();
template <typename Model>
class DataParallel : public DataParallelBase {
 public:
  /// One replica per device in `devices` (every GPU, else the CPU, by default).
  template <typename... Args>
  explicit DataParallel(std::vector<Device> devices = all_devices(),
                        DataParallelOptions options = {}, Args&&... args)
      : DataParallelBase(build(devices.size(), args...), devices, options) {}

  /// Replica `i` (0 is the one to checkpoint).
  Model& module(size_t i = 0) const { return static_cast<Model&>(replica_layer(i)); }

 private:
  template <typename... Args>
  static std::vector<std::unique_ptr<nn::Layer>> build(size_t n, Args&... args) {
    std::vector<std::unique_ptr<nn::Layer>> out;
    for (size_t i = 0; i < n; ++i) out.push_back(std::make_unique<Model>(args...));
    return out;
  }
};

}  // namespace galley
