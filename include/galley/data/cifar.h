#pragma once
/// \file CIFAR-10 / CIFAR-100 binary files, and the in-memory uint8 image dataset they load into.
#include <cstdint>
#include <string>
#include <vector>

#include "galley/data/dataset.h"
#include "galley/data/idx.h"

namespace galley::data {

/// Images held as bytes, labels as int64; a batch comes out as float32 (byte * scale), converted
/// by whoever calls get_batch (the DataLoader's workers). Holds a quarter of the memory of the
/// same images in float32.
class UInt8ImageDataset : public Dataset {
 public:
  /// `pixels` holds labels.size() samples of `sample_shape` each, row-major.
  UInt8ImageDataset(std::vector<uint8_t> pixels, std::vector<int64_t> labels, Shape sample_shape,
                    float scale = 1.f / 255.f);
  size_t size() const override { return labels_.size(); }
  Example get(size_t index) const override;
  Shape data_shape() const override { return shape_; }
  void get_batch(const std::vector<size_t>& indices, Tensor& data, Tensor& label) const override;

  /// All samples' bytes.
  const std::vector<uint8_t>& pixels() const { return pixels_; }
  /// All labels.
  const std::vector<int64_t>& labels() const { return labels_; }

 private:
  std::vector<uint8_t> pixels_;
  std::vector<int64_t> labels_;
  Shape shape_;
  size_t sample_bytes_;
  float scale_;
};

/// Which CIFAR.
enum class CifarKind { Cifar10, Cifar100 };

/// Options of CIFAR.
struct CifarOptions {
  /// CIFAR-10 (10 classes) or CIFAR-100.
  CifarKind kind = CifarKind::Cifar10;
  /// Training or test images.
  Split split = Split::Train;
  /// CIFAR-100 only: the 100 fine labels (true) or the 20 coarse superclasses (false).
  bool fine_labels = true;
};

/// Appends the records of one CIFAR binary file to `pixels` (3 x 32 x 32 bytes each, channel
/// planes R, G, B) and `labels`. A CIFAR-10 record is <label byte><3072 pixel bytes>, a CIFAR-100
/// record <coarse byte><fine byte><3072 pixel bytes>. A missing, empty or truncated file, or a
/// label out of range, is a galley::Error naming the file and the byte offset.
void read_cifar_file(const std::string& path, CifarKind kind, std::vector<uint8_t>& pixels,
                     std::vector<int64_t>& labels, bool fine_labels = true);

/// CIFAR-10 or CIFAR-100 from the directory of the official binary version:
/// data_batch_1.bin ... data_batch_5.bin and test_batch.bin (CIFAR-10), train.bin and test.bin
/// (CIFAR-100). Samples are [3, 32, 32] float32 in [0, 1]; labels int64.
class CIFAR : public UInt8ImageDataset {
 public:
  /// Reads every file of the split; errors name the file and byte offset at fault.
  explicit CIFAR(const std::string& root, CifarOptions options = {});
};

}  // namespace galley::data
