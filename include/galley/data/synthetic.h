#pragma once
/// \file A synthetic dataset of any shape, generated on demand: for benchmarks and tests.
#include <cstddef>
#include <cstdint>

#include "galley/data/dataset.h"

namespace galley::data {

/// Options of SyntheticDataset.
struct SyntheticOptions {
  /// Number of examples.
  size_t size = 1024;
  /// Shape of one example's data.
  Shape data_shape = {3, 32, 32};
  /// Labels are in [0, num_classes).
  int64_t num_classes = 10;
  /// Example i depends only on (seed, i).
  uint64_t seed = 0;
};

/// Examples made up on demand from (seed, index), holding no memory: pixels are random bytes
/// scaled to [0, 1] (so a batch costs about what decoding uint8 images costs), labels random
/// classes. Any number of threads may read it at once.
class SyntheticDataset : public Dataset {
 public:
  /// Validates the options.
  explicit SyntheticDataset(SyntheticOptions options);
  size_t size() const override { return opt_.size; }
  Example get(size_t index) const override;
  Shape data_shape() const override { return opt_.data_shape; }
  void get_batch(const std::vector<size_t>& indices, Tensor& data, Tensor& label) const override;

  /// The label of example `index` (without building its data).
  int64_t label(size_t index) const;

 private:
  SyntheticOptions opt_;
  size_t numel_;
};

}  // namespace galley::data
