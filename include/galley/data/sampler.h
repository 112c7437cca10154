#pragma once
/// \file Samplers: which examples an epoch visits, in which order.
///
/// A sampler's order depends only on its settings and the epoch number, so the same seed gives
/// the same batches on every run, whatever the number of loader workers.
#include <cstddef>
#include <cstdint>
#include <vector>

namespace galley::data {

/// Writes the permutation of 0..n-1 for (`seed`, `epoch`) into `out` (resized to n). This is the
/// shuffle BatchIterator uses, so a DataLoader with the same seed visits the same order.
void shuffled_indices(size_t n, uint64_t seed, uint64_t epoch, std::vector<size_t>& out);

/// Chooses the dataset indices of each epoch. Implementations must be safe to call from one
/// thread while other threads only read the sampler's settings.
class Sampler {
 public:
  virtual ~Sampler() = default;
  /// Number of indices one epoch yields.
  virtual size_t size() const = 0;
  /// Number of examples in the dataset the indices refer to (checked by the DataLoader).
  virtual size_t dataset_size() const = 0;
  /// Writes epoch `epoch`'s indices into `out` (resized to size(); no allocation once `out`
  /// has the capacity).
  virtual void indices(uint64_t epoch, std::vector<size_t>& out) const = 0;
};

/// 0, 1, ..., n-1 every epoch.
class SequentialSampler : public Sampler {
 public:
  /// Visits all `n` examples in order.
  explicit SequentialSampler(size_t n) : n_(n) {}
  size_t size() const override { return n_; }
  size_t dataset_size() const override { return n_; }
  void indices(uint64_t epoch, std::vector<size_t>& out) const override;

 private:
  size_t n_;
};

/// A fresh permutation of all `n` examples each epoch, from (seed, epoch).
class RandomSampler : public Sampler {
 public:
  /// Shuffles `n` examples; the order of epoch e is shuffled_indices(n, seed, e).
  explicit RandomSampler(size_t n, uint64_t seed = 0) : n_(n), seed_(seed) {}
  size_t size() const override { return n_; }
  size_t dataset_size() const override { return n_; }
  void indices(uint64_t epoch, std::vector<size_t>& out) const override;

 private:
  size_t n_;
  uint64_t seed_;
};

/// Options of DistributedSampler.
struct DistributedSamplerOptions {
  /// This process's rank, in [0, world_size).
  int rank = 0;
  /// Number of processes sharing the dataset.
  int world_size = 1;
  /// Shuffle the whole dataset each epoch (the same permutation on every rank) before splitting.
  bool shuffle = true;
  /// Seed of the shuffle; must be the same on every rank.
  uint64_t seed = 0;
  /// When the dataset does not divide by world_size: false pads by repeating indices from the
  /// start of the (shuffled) order, as PyTorch's DistributedSampler does, so a few examples are
  /// seen twice per epoch; true drops the tail so that every example is seen at most once.
  bool drop_last = false;
};

/// One rank's share of the dataset. Every rank computes the same permutation of 0..n-1 from
/// (seed, epoch), pads or truncates it to a multiple of world_size, and takes the indices at
/// positions rank, rank + world_size, ... So within an epoch the ranks' shares are disjoint
/// (apart from the padding), their union is the whole dataset (or all but the dropped tail) and
/// they all have the same size, which keeps collective calls in step.
class DistributedSampler : public Sampler {
 public:
  /// Validates rank and world_size.
  DistributedSampler(size_t n, DistributedSamplerOptions options);
  size_t size() const override;
  size_t dataset_size() const override { return n_; }
  void indices(uint64_t epoch, std::vector<size_t>& out) const override;
  /// The options this sampler was built with.
  const DistributedSamplerOptions& options() const { return opt_; }

 private:
  size_t n_;
  DistributedSamplerOptions opt_;
  size_t total_;  // indices over all ranks after padding or dropping
};

}  // namespace galley::data
