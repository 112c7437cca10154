#pragma once
/// \file Datasets: random access to (data, label) examples, and batches of them.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "galley/tensor.h"

namespace galley::data {

/// One example or one batch: data and label tensors. Binds as `auto& [data, label]`.
struct Example {
  Tensor data{};
  Tensor label{};
};

/// Random-access collection of examples that all have the same shapes.
class Dataset {
 public:
  virtual ~Dataset() = default;
  /// Number of examples.
  virtual size_t size() const = 0;
  /// Example `index` (throws galley::Error when out of range).
  virtual Example get(size_t index) const = 0;
  /// Shape of one example's data.
  virtual Shape data_shape() const = 0;
  /// Shape of one example's label (empty for a scalar class index).
  virtual Shape label_shape() const { return {}; }
  /// Dtype of the labels.
  virtual DType label_dtype() const { return DType::Int64; }
  /// Writes the examples at `indices` into `data` [B, ...] and `label` [B, ...], which the
  /// caller preallocates. The default calls get() per example; datasets held in memory
  /// override it with straight copies.
  virtual void get_batch(const std::vector<size_t>& indices, Tensor& data, Tensor& label) const;
  /// Refuses (galley::Error naming `owner`) batch tensors that cannot take `count` examples:
  /// each must be a contiguous host tensor, data float32 with count x data_shape() elements,
  /// label label_dtype() with count x label_shape(). Every get_batch calls it before writing.
  void check_batch(size_t count, const Tensor& data, const Tensor& label,
                   const char* owner = "dataset") const;
};

/// Examples held in two tensors: data [N, ...] and labels [N, ...].
class TensorDataset : public Dataset {
 public:
  /// Both must have the same first dimension.
  TensorDataset(Tensor data, Tensor labels);
  size_t size() const override;
  Example get(size_t index) const override;
  Shape data_shape() const override;
  Shape label_shape() const override;
  DType label_dtype() const override;
  void get_batch(const std::vector<size_t>& indices, Tensor& data, Tensor& label) const override;

  /// All the data.
  const Tensor& data() const { return data_; }
  /// All the labels.
  const Tensor& labels() const { return labels_; }

 private:
  Tensor data_, labels_;
};

/// Options of BatchIterator.
struct BatchOptions {
  int64_t batch_size = 64;
  bool shuffle = false;
  uint64_t seed = 0;
  bool drop_last = false;
};

/// Synchronous batches over a Dataset, in the caller's thread. The order of an epoch depends
/// only on the seed and the epoch number. Range-for yields Example batches.
class BatchIterator {
 public:
  /// The dataset must outlive the iterator.
  BatchIterator(const Dataset& dataset, BatchOptions options);
  /// Number of batches per epoch.
  size_t size() const;
  /// Selects the epoch whose order the next begin() yields (default: one more per begin()).
  void set_epoch(uint64_t epoch) { epoch_ = epoch; }

  class iterator {
   public:
    iterator(BatchIterator* owner, size_t batch) : owner_(owner), batch_(batch) {}
    Example& operator*();
    iterator& operator++();
    bool operator!=(const iterator& o) const { return batch_ != o.batch_; }

   private:
    BatchIterator* owner_;
    size_t batch_;
    bool loaded_ = false;
  };
  /// Starts an epoch (shuffling from seed and epoch).
  iterator begin();
  iterator end();

  /// Loads batch `b` of the current epoch into a fresh pair of tensors.
  Example load(size_t b) const;

 private:
  const Dataset& ds_;
  BatchOptions opt_;
  uint64_t epoch_ = 0;
  std::vector<size_t> order_;
  Example current_;
};

}  // namespace galley::data
