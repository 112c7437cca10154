// CIFAR binary files and the uint8 image dataset.
#include "galley/data/cifar.h"

#include <sys/stat.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>

#include "galley/data/transforms.h"

namespace galley::data {

UInt8ImageDataset::UInt8ImageDataset(std::vector<uint8_t> pixels, std::vector<int64_t> labels,
                                     Shape sample_shape, float scale)
    : pixels_(std::move(pixels)),
      labels_(std::move(labels)),
      shape_(std::move(sample_shape)),
      scale_(scale) {
  GALLEY_CHECK(std::isfinite(scale) && scale > 0, "UInt8ImageDataset: scale ", scale,
               " must be finite and positive");
  for (int64_t d : shape_)
    GALLEY_CHECK(d > 0, "UInt8ImageDataset: sample shape ", shape_str(shape_),
                 " has a dimension that is not positive");
  sample_bytes_ = static_cast<size_t>(shape_numel(shape_));
  GALLEY_CHECK(pixels_.size() == labels_.size() * sample_bytes_,
               "UInt8ImageDataset: ", pixels_.size(), " bytes do not hold ", labels_.size(),
               " samples of shape ", shape_str(shape_));
}

Example UInt8ImageDataset::get(size_t index) const {
  GALLEY_CHECK(index < size(), "UInt8ImageDataset: index ", index, " out of range for ", size(),
               " examples");
  Shape d{1}, l{1};
  d.insert(d.end(), shape_.begin(), shape_.end());
  Example e{Tensor::empty(d), Tensor::empty(l, DType::Int64)};
  get_batch({index}, e.data, e.label);
  return {e.data.view(shape_), e.label.view({})};
}

void UInt8ImageDataset::get_batch(const std::vector<size_t>& indices, Tensor& data,
                                  Tensor& label) const {
  check_batch(indices.size(), data, label, "UInt8ImageDataset");
  float* pd = data.data<float>();
  int64_t* pl = label.data<int64_t>();
  for (size_t i = 0; i < indices.size(); ++i) {
    GALLEY_CHECK(indices[i] < size(), "UInt8ImageDataset: index ", indices[i], " out of range for ",
                 size(), " examples");
    uint8_to_float(pixels_.data() + indices[i] * sample_bytes_, pd + i * sample_bytes_,
                   sample_bytes_, scale_);
    pl[i] = labels_[indices[i]];
  }
}

void read_cifar_file(const std::string& path, CifarKind kind, std::vector<uint8_t>& pixels,
                     std::vector<int64_t>& labels, bool fine_labels) {
  constexpr size_t kImage = 3 * 32 * 32;
  const size_t label_bytes = kind == CifarKind::Cifar10 ? 1 : 2;
  const size_t record = label_bytes + kImage;
  const char* name = kind == CifarKind::Cifar10 ? "CIFAR-10" : "CIFAR-100";
  // The label used: CIFAR-10's only byte; CIFAR-100's first (coarse) or second (fine) byte.
  const size_t label_at = kind == CifarKind::Cifar10 ? 0 : (fine_labels ? 1 : 0);

  // (A directory opens as a stream whose size reads as the largest offset.)
  struct stat st {};
  GALLEY_CHECK(::stat(path.c_str(), &st) == 0, "cannot open ", name, " file '", path,
               "': ", std::strerror(errno));
  GALLEY_CHECK(S_ISREG(st.st_mode), name, " file '", path, "' is not a regular file");
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  GALLEY_CHECK(in.good(), "cannot open ", name, " file '", path, "': ", std::strerror(errno));
  const std::streamoff size = in.tellg();
  GALLEY_CHECK(size > 0, name, " file '", path, "' is empty");
  const size_t bytes = static_cast<size_t>(size);
  const size_t whole = bytes / record;
  GALLEY_CHECK(bytes % record == 0, name, " file '", path, "' is truncated or corrupt: record ",
               whole, " at byte ", whole * record, " has only ", bytes % record, " of its ", record,
               " bytes (file size ", bytes, ")");
  // A file larger than the memory left is galley's out-of-memory error, naming the file.
  auto hold = [&](auto& v, size_t n) {
    try {
      v.reserve(n);
    } catch (const std::bad_alloc&) {
      throw OutOfMemoryError(detail::str_cat(name, " file '", path, "' (", bytes,
                                             " bytes): its records do not fit in host memory"));
    }
  };
  std::vector<uint8_t> raw;
  hold(raw, bytes);
  raw.resize(bytes);
  in.seekg(0);
  in.read(reinterpret_cast<char*>(raw.data()), size);
  GALLEY_CHECK(in.gcount() == size, name, " file '", path, "': read failed at byte ", in.gcount(),
               " of ", bytes);

  // Every label is checked before the caller's vectors grow: a corrupt file adds nothing.
  for (size_t r = 0; r < whole; ++r) {
    const uint8_t* rec = raw.data() + r * record;
    for (size_t b = 0; b < label_bytes; ++b) {
      const int bound = kind == CifarKind::Cifar10 ? 10 : (b == 0 ? 20 : 100);
      GALLEY_CHECK(rec[b] < bound, name, " file '", path, "' is corrupt: label ", int(rec[b]),
                   " of record ", r, " at byte ", r * record + b, " is not below ", bound);
    }
  }
  const size_t first_pixel = pixels.size();
  hold(pixels, first_pixel + whole * kImage);
  hold(labels, labels.size() + whole);
  pixels.resize(first_pixel + whole * kImage);
  for (size_t r = 0; r < whole; ++r) {
    const uint8_t* rec = raw.data() + r * record;
    labels.push_back(rec[label_at]);
    std::copy(rec + label_bytes, rec + record, pixels.begin() + first_pixel + r * kImage);
  }
}

namespace {
UInt8ImageDataset load_cifar(const std::string& root, const CifarOptions& opt) {
  std::vector<std::string> files;
  const bool train = opt.split == Split::Train;
  if (opt.kind == CifarKind::Cifar10) {
    if (train)
      for (int i = 1; i <= 5; ++i)
        files.push_back(root + "/data_batch_" + std::to_string(i) + ".bin");
    else
      files.push_back(root + "/test_batch.bin");
  } else {
    files.push_back(root + (train ? "/train.bin" : "/test.bin"));
  }
  std::vector<uint8_t> pixels;
  std::vector<int64_t> labels;
  for (const std::string& f : files) read_cifar_file(f, opt.kind, pixels, labels, opt.fine_labels);
  return UInt8ImageDataset(std::move(pixels), std::move(labels), {3, 32, 32});
}
}  // namespace

CIFAR::CIFAR(const std::string& root, CifarOptions options)
    : UInt8ImageDataset(load_cifar(root, options)) {}

}  // namespace galley::data
