#pragma once
/// \file The prefetching DataLoader: worker threads fill a fixed pool of batch buffers ahead of
/// the training loop, which receives them in order.
///
///     galley::data::DataLoader train_loader(dataset, {.batch_size = 256, .shuffle = true,
///                                                     .num_workers = 4});
///     for (int epoch = 0; epoch < 5; ++epoch)
///       for (auto& [data, label] : train_loader) { ... }
///
/// How it works (Caffe's prefetching data layer, with libtorch's ordering):
/// - At construction the loader allocates a pool of num_workers * prefetch + 1 batch buffers
///   (data [batch_size, ...] and label [batch_size, ...]) and starts the workers. Buffers cycle
///   through a free list and a ready ring: a worker takes a free buffer, claims the next batch
///   number of the epoch, fills it (Dataset::get_batch, then the transforms), and files it in the
///   ready ring under its number. The consumer takes batch k from the ring when it is there.
///   Claims are made in order and only by a worker holding a buffer, so the consumer never waits
///   on a batch nobody is filling, and workers run at most the pool size ahead.
/// - Batch k of epoch e holds the same examples in the same order for any num_workers: the
///   sampler fixes the epoch's index order from (seed, e), batch k is positions
///   [k * batch_size, (k + 1) * batch_size) of it, and transforms are seeded per sample from
///   (seed, e, index).
/// - Recycling: the batch handed out by `*it` stays the consumer's until `++it`, however long the
///   step takes; only then does its buffer go back to the free list, so a worker never writes
///   into a batch the consumer is still using. If the consumer kept a handle to it beyond that
///   (a stored copy of `data`, a view, an autograd graph still alive), the loader sees the extra
///   reference, leaves that memory to the consumer and gives the slot a fresh buffer: the kept
///   tensor stays valid, at the cost of one allocation (counted in LoaderStats::reallocations).
///   In the usual loop nothing is kept and an epoch allocates nothing per batch.
/// - Errors: an exception in a worker (from the dataset or a transform) travels with its batch
///   and is rethrown on the consumer's thread when the loop reaches that batch, as a
///   galley::Error that names the sample index (the original is nested inside it).
/// - Stopping: leaving the loop early is fine. The next begin() or the destructor stops the
///   epoch, waits for batches being filled (a dataset call is never interrupted) and takes every
///   buffer back; nothing hangs or leaks.
/// - Devices: `device` is where batches are delivered. On a CPU device the host buffer is the
///   batch (allocated with that device's tag) and there is nothing to copy. On a GPU each slot
///   also has a host buffer (page-locked with pin_memory, which makes the copy asynchronous and
///   about twice as fast): the worker fills it, then copies it into the slot's device tensors on
///   its own CUDA stream and records an event; the consumer makes the compute stream wait on
///   that event when it takes the batch, so the copy overlaps the previous step's kernels and
///   the host never waits for it. When the consumer hands the batch back (`++it`), an event on
///   the compute stream marks its last use, and the next copy into that slot waits for it.
///
/// Datasets are read from several threads at once through their const methods: they must allow
/// that (every dataset in galley does).
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <iterator>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "galley/data/dataset.h"
#include "galley/data/sampler.h"
#include "galley/data/transforms.h"
#include "galley/device.h"

namespace galley::data {

/// Options of DataLoader.
struct DataLoaderOptions {
  /// Examples per batch.
  int64_t batch_size = 64;
  /// A fresh random order each epoch, from (seed, epoch). Leave false when giving a sampler.
  bool shuffle = false;
  /// Seeds the shuffle and the transforms.
  uint64_t seed = 0;
  /// Skip the last batch of an epoch when it would be smaller than batch_size.
  bool drop_last = false;
  /// Threads that load batches; 0 loads each batch in the caller's thread when it is needed.
  int num_workers = 0;
  /// Batches each worker may have ready or in progress ahead of the consumer.
  int prefetch = 2;
  /// Page-locked host buffers for asynchronous host-to-device copies. No effect on CPU devices.
  bool pin_memory = false;
  /// Where batches are delivered: a CPU device, or a GPU (copied on side streams; see the file
  /// comment).
  Device device = Device::cpu();
  /// Chooses each epoch's indices; null means RandomSampler(seed) when shuffle is true, else
  /// SequentialSampler. Its dataset_size() must equal the dataset's size.
  std::shared_ptr<const Sampler> sampler{};
  /// Run by the workers on each sample's data, in order, after the dataset has written it.
  std::vector<Transform> transforms{};
};

/// Timing of one epoch, as the consumer saw it.
struct LoaderStats {
  /// The epoch these figures describe.
  uint64_t epoch = 0;
  /// Batches handed to the consumer so far.
  size_t batches = 0;
  /// Examples in those batches.
  size_t samples = 0;
  /// Time the consumer spent waiting for batches (with num_workers = 0: all the loading time).
  double wait_seconds = 0;
  /// Of wait_seconds, the wait for the epoch's first batch (the pipeline filling up; the batch
  /// begin() started from, for an epoch resumed with set_position).
  double first_wait_seconds = 0;
  /// From begin() to the end of the epoch (or to now, while it runs: an epoch left early, a loop
  /// broken out of, runs until the next begin()).
  double wall_seconds = 0;
  /// Time workers spent filling batches, summed over workers.
  double load_seconds = 0;
  /// Slots given fresh memory because the consumer kept a batch past `++it`.
  size_t reallocations = 0;
  /// Fraction of the wall time the consumer was starved: wait_seconds / wall_seconds.
  double starvation() const { return wall_seconds > 0 ? wait_seconds / wall_seconds : 0; }
  /// The same once warm: the first batch's wait left out.
  double steady_starvation() const {
    return wall_seconds > 0 ? (wait_seconds - first_wait_seconds) / wall_seconds : 0;
  }
};

/// Batches of a Dataset, loaded ahead of the consumer by worker threads into recycled buffers
/// and delivered in order. Range-for runs one epoch; each begin() starts the next epoch.
class DataLoader {
 public:
  /// Validates the options, allocates the batch buffers and starts the workers. The dataset
  /// (and the sampler) must outlive the loader.
  DataLoader(const Dataset& dataset, DataLoaderOptions options = {});
  /// Stops the workers (after the batches they are filling) and joins them.
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  /// Batches per epoch.
  size_t size() const { return num_batches_; }
  /// Selects the epoch the next begin() runs (default: 0, then one more per begin()).
  void set_epoch(uint64_t epoch);
  /// The epoch the next begin() runs.
  uint64_t epoch() const { return next_epoch_; }
  /// The next begin() runs `epoch` from batch `batch` on (the batches before it are neither
  /// loaded nor returned), as after a resume from a checkpoint taken mid-epoch. The order is
  /// the epoch's usual one, so the run continues exactly where it stopped.
  void set_position(uint64_t epoch, size_t batch);
  /// The options in force.
  const DataLoaderOptions& options() const { return opt_; }
  /// Timing of the epoch in progress, or of the last one.
  LoaderStats stats() const;

  /// Input iterator over one epoch's batches. `*it` waits for the batch if it is not ready yet;
  /// the reference stays valid until `++it`.
  class iterator {
   public:
    using iterator_category = std::input_iterator_tag;
    using value_type = Example;
    using difference_type = std::ptrdiff_t;
    using pointer = Example*;
    using reference = Example&;

    iterator(DataLoader* loader, size_t batch) : loader_(loader), batch_(batch) {}
    /// The current batch (rethrows a worker's exception for it).
    Example& operator*() const { return loader_->batch(batch_); }
    /// The current batch.
    Example* operator->() const { return &**this; }
    /// Hands the current batch back and moves to the next.
    iterator& operator++();
    /// Same position.
    bool operator==(const iterator& o) const { return batch_ == o.batch_; }
    /// Different position.
    bool operator!=(const iterator& o) const { return batch_ != o.batch_; }

   private:
    DataLoader* loader_;
    size_t batch_;
  };
  /// Starts an epoch: stops what is left of the previous one, orders the indices and sets the
  /// workers going. Iterators of the previous epoch become invalid.
  iterator begin();
  /// One past the last batch of the epoch.
  iterator end() { return iterator(this, num_batches_); }

 private:
  struct Slot;
  using Clock = std::chrono::steady_clock;

  Example& batch(size_t k);
  void advance(size_t k);
  void worker_loop(int worker);
  void fill(Slot& slot, size_t k, uint64_t epoch, int worker);
  // fill, any exception that escapes it kept as the batch's error (a worker thread must not
  // throw, and the consumer's own fill must give its slot back).
  void fill_guarded(Slot& slot, size_t k, uint64_t epoch, int worker);
  void release(Slot* slot);
  void stop_epoch(std::unique_lock<std::mutex>& lock);
  void allocate(Slot& slot);
  Shape batch_shape(const Shape& sample, int64_t rows) const;

  const Dataset& ds_;
  DataLoaderOptions opt_;
  std::shared_ptr<const Sampler> sampler_;
  Shape data_shape_, label_shape_;
  DType label_dtype_;
  size_t num_batches_ = 0;
  size_t epoch_size_ = 0;  // the sampler's size when the loader was made: the buffers' measure
  uint64_t next_epoch_ = 0;
  size_t next_start_ = 0;  // first batch of the next begin() (set_position)

  std::vector<std::unique_ptr<Slot>> slots_;
  std::vector<size_t> order_;  // this epoch's indices; written only while no worker is filling
  std::vector<std::thread> workers_;
  std::vector<void*> copy_streams_;  // GPU delivery: one CUDA stream per worker

  mutable std::mutex mu_;
  std::condition_variable work_cv_;   // workers: a free slot and a batch to claim, or shutdown
  std::condition_variable ready_cv_;  // consumer: a batch filed, or the last filler done
  std::vector<Slot*> free_;           // stack of free slots (capacity: the pool)
  std::vector<Slot*> ready_;          // ring: batch k at k % pool size
  Slot* held_ = nullptr;              // the batch the consumer has (at held_batch_)
  size_t held_batch_ = 0;
  size_t next_consume_ = 0;  // next batch number the consumer takes
  size_t first_batch_ = 0;   // the batch the epoch began from (set_position)
  size_t next_claim_ = 0;    // next batch number a worker will take
  bool active_ = false;      // an epoch is running
  bool shutdown_ = false;
  int busy_ = 0;             // workers filling a slot
  uint64_t generation_ = 0;  // bumped when an epoch is stopped; stale fills are discarded
  uint64_t epoch_ = 0;       // epoch running
  LoaderStats stats_;
  Clock::time_point epoch_start_;
  bool epoch_done_ = false;
};

}  // namespace galley::data
