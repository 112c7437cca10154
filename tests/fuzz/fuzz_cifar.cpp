// libFuzzer target for the CIFAR-10 / CIFAR-100 binary reader: any bytes must either load as
// records or raise galley::Error, under each of the three label layouts. What loads must also
// make a dataset whose every sample can be fetched.
#include <vector>

#include "fuzz_input.h"
#include "galley/data/cifar.h"

namespace {

void read_as(const std::string& path, galley::data::CifarKind kind, bool fine_labels) {
  std::vector<uint8_t> pixels;
  std::vector<int64_t> labels;
  try {
    galley::data::read_cifar_file(path, kind, pixels, labels, fine_labels);
  } catch (const galley::Error&) {
    return;
  }
  galley::data::UInt8ImageDataset set(std::move(pixels), std::move(labels), {3, 32, 32});
  std::vector<size_t> all(set.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = i;
  galley::Tensor images = galley::Tensor::empty({int64_t(all.size()), 3, 32, 32});
  galley::Tensor targets = galley::Tensor::empty({int64_t(all.size())}, galley::DType::Int64);
  set.get_batch(all, images, targets);
  const int64_t classes = kind == galley::data::CifarKind::Cifar10 ? 10 : fine_labels ? 100 : 20;
  const int64_t* t = targets.data<int64_t>();
  for (size_t i = 0; i < all.size(); ++i)
    if (t[i] < 0 || t[i] >= classes) __builtin_trap();  // a label the reader should have refused
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = galley::fuzz::write_input(data, size, ".bin");
  if (path.empty()) return 0;
  read_as(path, galley::data::CifarKind::Cifar10, true);
  read_as(path, galley::data::CifarKind::Cifar100, true);
  read_as(path, galley::data::CifarKind::Cifar100, false);
  return 0;
}
