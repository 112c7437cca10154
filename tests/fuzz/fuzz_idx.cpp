// libFuzzer target for the IDX readers (raw or gzip-compressed): any bytes must either load as
// images or labels or raise galley::Error. A crash, a sanitizer report, another exception type,
// or an allocation far beyond what the input holds is a bug.
#include "fuzz_input.h"
#include "galley/data/idx.h"

namespace {

// Reads every element, so that a tensor claiming more than it holds is caught by ASan.
template <typename T>
void touch(const galley::Tensor& t) {
  const T* p = t.data<T>();
  T sum = 0;
  for (int64_t i = 0, n = t.numel(); i < n; ++i) sum += p[i];
  volatile T sink = sum;
  (void)sink;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = galley::fuzz::write_input(data, size, ".idx");
  if (path.empty()) return 0;
  // The same bytes through both readers: one of them rejects the magic number at least.
  try {
    touch<float>(galley::data::read_idx_images(path));
  } catch (const galley::Error&) {
  }
  try {
    touch<int64_t>(galley::data::read_idx_labels(path));
  } catch (const galley::Error&) {
  }
  return 0;
}
