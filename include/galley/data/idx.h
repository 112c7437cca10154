#pragma once
/// \file IDX files (MNIST, Fashion-MNIST), raw or gzip-compressed.
#include <string>

#include "galley/data/dataset.h"

namespace galley::data {

/// Reads an IDX3 image file (magic 0x00000803) as float32 [N, 1, rows, cols] scaled to [0, 1].
/// Errors name the file and the byte offset or field at fault.
Tensor read_idx_images(const std::string& path);
/// Reads an IDX1 label file (magic 0x00000801) as int64 [N].
Tensor read_idx_labels(const std::string& path);

/// Where Fashion-MNIST is looked for: $GALLEY_FASHION_MNIST_DIR, else the directory the
/// Debian package dataset-fashion-mnist installs.
std::string default_fashion_mnist_dir();

/// Which half of MNIST-style data.
enum class Split { Train, Test };

/// MNIST or Fashion-MNIST from a directory holding the four standard files
/// ({train,t10k}-{images-idx3,labels-idx1}-ubyte, optionally .gz).
class MNIST : public TensorDataset {
 public:
  /// Classes of MNIST and Fashion-MNIST; a label file's labels must be below it.
  static constexpr int64_t kNumClasses = 10;
  /// Loads and checks that image and label counts agree and that every label is below
  /// kNumClasses (an error names the label file, the record and its byte). `normalize` applies
  /// (x - mean) / std with the given statistics after scaling to [0, 1]. The defaults are
  /// Fashion-MNIST's training set's; MNIST's own are 0.1307 and 0.3081.
  explicit MNIST(const std::string& root, Split split = Split::Train, bool normalize = false,
                 float mean = 0.2860f, float std = 0.3530f);
};

}  // namespace galley::data
