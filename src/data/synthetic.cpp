// Synthetic examples generated from (seed, index).
#include "galley/data/synthetic.h"

#include <cstring>

namespace galley::data {

namespace {
uint64_t splitmix(uint64_t& s) {
  uint64_t z = (s += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}
uint64_t example_state(uint64_t seed, size_t index) {
  uint64_t s = seed ^ 0x5851f42d4c957f2dULL;
  return splitmix(s) ^ (static_cast<uint64_t>(index) * 0xd1342543de82ef95ULL);
}
}  // namespace

SyntheticDataset::SyntheticDataset(SyntheticOptions options) : opt_(std::move(options)) {
  for (int64_t d : opt_.data_shape)
    GALLEY_CHECK(d > 0, "SyntheticDataset: data_shape ", shape_str(opt_.data_shape),
                 " has a dimension that is not positive");
  GALLEY_CHECK(opt_.num_classes > 0, "SyntheticDataset: num_classes ", opt_.num_classes,
               " must be positive");
  numel_ = static_cast<size_t>(shape_numel(opt_.data_shape));
}

int64_t SyntheticDataset::label(size_t index) const {
  uint64_t s = example_state(opt_.seed, index);
  return static_cast<int64_t>(splitmix(s) % static_cast<uint64_t>(opt_.num_classes));
}

Example SyntheticDataset::get(size_t index) const {
  Shape d{1};
  d.insert(d.end(), opt_.data_shape.begin(), opt_.data_shape.end());
  Example e{Tensor::empty(d), Tensor::empty({1}, DType::Int64)};
  get_batch({index}, e.data, e.label);
  return {e.data.view(opt_.data_shape), e.label.view({})};
}

void SyntheticDataset::get_batch(const std::vector<size_t>& indices, Tensor& data,
                                 Tensor& label) const {
  check_batch(indices.size(), data, label, "SyntheticDataset");
  float* pd = data.data<float>();
  int64_t* pl = label.data<int64_t>();
  for (size_t i = 0; i < indices.size(); ++i) {
    GALLEY_CHECK(indices[i] < opt_.size, "SyntheticDataset: index ", indices[i],
                 " out of range for ", opt_.size, " examples");
    uint64_t s = example_state(opt_.seed, indices[i]);
    pl[i] = static_cast<int64_t>(splitmix(s) % static_cast<uint64_t>(opt_.num_classes));
    float* out = pd + i * numel_;
    for (size_t k = 0; k < numel_; k += 8) {
      uint64_t bits = splitmix(s);
      for (size_t b = 0; b < 8 && k + b < numel_; ++b, bits >>= 8)
        out[k + b] = static_cast<float>(bits & 0xff) * (1.f / 255.f);
    }
  }
}

}  // namespace galley::data
