// Datasets in memory and the synchronous batch iterator.
#include "galley/data/dataset.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <tuple>

namespace galley::data {

namespace {
Shape with_batch(int64_t b, const Shape& s) {
  Shape out{b};
  out.insert(out.end(), s.begin(), s.end());
  return out;
}
}  // namespace

void Dataset::check_batch(size_t count, const Tensor& data, const Tensor& label,
                          const char* owner) const {
  const int64_t n = static_cast<int64_t>(count);
  for (const auto& [t, what, dtype, shape] :
       {std::tuple{&data, "data", DType::Float32, data_shape()},
        std::tuple{&label, "label", label_dtype(), label_shape()}}) {
    GALLEY_CHECK(t->defined() && t->device().is_cpu() && t->is_contiguous(), owner,
                 ": the batch's ", what, " tensor must be a contiguous tensor on the host");
    GALLEY_CHECK(t->dtype() == dtype && t->numel() == n * shape_numel(shape), owner,
                 ": the batch's ", what, " tensor is ", dtype_name(t->dtype()), " ",
                 shape_str(t->shape()), ", which does not hold ", count, " examples of ",
                 dtype_name(dtype), " ", shape_str(shape));
  }
}

void Dataset::get_batch(const std::vector<size_t>& indices, Tensor& data, Tensor& label) const {
  check_batch(indices.size(), data, label);
  const size_t dbytes = shape_numel(data_shape()) * dtype_size(DType::Float32);
  const size_t lbytes = shape_numel(label_shape()) * dtype_size(label_dtype());
  char* pd = static_cast<char*>(data.raw_data());
  char* pl = static_cast<char*>(label.raw_data());
  for (size_t i = 0; i < indices.size(); ++i) {
    Example e = get(indices[i]);
    GALLEY_CHECK(e.data.shape() == data_shape() && e.label.numel() == shape_numel(label_shape()),
                 "dataset: example ", indices[i], " has data ", shape_str(e.data.shape()),
                 " and label ", shape_str(e.label.shape()), ", expected ", shape_str(data_shape()),
                 " and ", shape_str(label_shape()));
    // The batch's slots hold float32 data and label_dtype() labels: bytes of another dtype would
    // be misread (or, wider, written past the slot).
    GALLEY_CHECK(e.data.dtype() == DType::Float32 && e.label.dtype() == label_dtype(),
                 "dataset: example ", indices[i], " has ", dtype_name(e.data.dtype()), " data and ",
                 dtype_name(e.label.dtype()), " labels, expected float32 and ",
                 dtype_name(label_dtype()));
    e.data.copy_to_host(pd + i * dbytes);
    e.label.copy_to_host(pl + i * lbytes);
  }
}

TensorDataset::TensorDataset(Tensor data, Tensor labels)
    : data_(data.defined() ? data.detach().to(Device::cpu()).contiguous() : data),
      labels_(labels.defined() ? labels.detach().to(Device::cpu()).contiguous() : labels) {
  GALLEY_CHECK(data_.defined() && labels_.defined(),
               "TensorDataset: data and labels must be "
               "defined");
  GALLEY_CHECK(data_.dim() >= 1 && labels_.dim() >= 1 && data_.size(0) == labels_.size(0),
               "TensorDataset: data ", shape_str(data_.shape()), " and labels ",
               shape_str(labels_.shape()), " must have the same first dimension");
  GALLEY_CHECK(data_.dtype() == DType::Float32, "TensorDataset: data must be float32, got ",
               dtype_name(data_.dtype()));
}

size_t TensorDataset::size() const {
  return static_cast<size_t>(data_.size(0));
}

Shape TensorDataset::data_shape() const {
  return Shape(data_.shape().begin() + 1, data_.shape().end());
}
Shape TensorDataset::label_shape() const {
  return Shape(labels_.shape().begin() + 1, labels_.shape().end());
}
DType TensorDataset::label_dtype() const {
  return labels_.dtype();
}

Example TensorDataset::get(size_t index) const {
  GALLEY_CHECK(index < size(), "TensorDataset: index ", index, " out of range for ", size(),
               " examples");
  Tensor d = Tensor::empty(data_shape()), l = Tensor::empty(label_shape(), label_dtype());
  get_batch({index}, d, l);
  return {d, l};
}

void TensorDataset::get_batch(const std::vector<size_t>& indices, Tensor& data,
                              Tensor& label) const {
  check_batch(indices.size(), data, label, "TensorDataset");
  const size_t dbytes = shape_numel(data_shape()) * sizeof(float);
  const size_t lbytes = shape_numel(label_shape()) * dtype_size(label_dtype());
  const char* sd = static_cast<const char*>(data_.raw_data());
  const char* sl = static_cast<const char*>(labels_.raw_data());
  char* pd = static_cast<char*>(data.raw_data());
  char* pl = static_cast<char*>(label.raw_data());
  for (size_t i = 0; i < indices.size(); ++i) {
    GALLEY_CHECK(indices[i] < size(), "TensorDataset: index ", indices[i], " out of range for ",
                 size(), " examples");
    std::memcpy(pd + i * dbytes, sd + indices[i] * dbytes, dbytes);
    std::memcpy(pl + i * lbytes, sl + indices[i] * lbytes, lbytes);
  }
}

// ---------------------------------------------------------------------------------------------
// BatchIterator

BatchIterator::BatchIterator(const Dataset& dataset, BatchOptions options)
    : ds_(dataset), opt_(options) {
  GALLEY_CHECK(opt_.batch_size > 0, "BatchIterator: batch_size ", opt_.batch_size,
               " must be positive");
}

size_t BatchIterator::size() const {
  const size_t n = ds_.size(), b = static_cast<size_t>(opt_.batch_size);
  return opt_.drop_last ? n / b : (n + b - 1) / b;
}

BatchIterator::iterator BatchIterator::begin() {
  order_.resize(ds_.size());
  std::iota(order_.begin(), order_.end(), size_t(0));
  if (opt_.shuffle) {
    // Fisher-Yates from a generator seeded by (seed, epoch): the order is reproducible.
    Generator gen(opt_.seed * 0x9e3779b97f4a7c15ULL + epoch_);
    for (size_t i = order_.size(); i > 1; --i) std::swap(order_[i - 1], order_[gen.next_u64() % i]);
  }
  ++epoch_;
  return iterator(this, 0);
}

BatchIterator::iterator BatchIterator::end() {
  return iterator(this, size());
}

Example BatchIterator::load(size_t b) const {
  GALLEY_CHECK(b < size(), "BatchIterator: batch ", b, " out of range for ", size(),
               " batches per epoch");
  GALLEY_CHECK(order_.size() == ds_.size(), "BatchIterator: load() before begin()");
  const size_t start = b * opt_.batch_size;
  const size_t count = std::min<size_t>(opt_.batch_size, order_.size() - start);
  std::vector<size_t> idx(order_.begin() + start, order_.begin() + start + count);
  Example e{Tensor::empty(with_batch(count, ds_.data_shape())),
            Tensor::empty(with_batch(count, ds_.label_shape()), ds_.label_dtype())};
  ds_.get_batch(idx, e.data, e.label);
  return e;
}

Example& BatchIterator::iterator::operator*() {
  if (!loaded_) {
    owner_->current_ = owner_->load(batch_);
    loaded_ = true;
  }
  return owner_->current_;
}

BatchIterator::iterator& BatchIterator::iterator::operator++() {
  ++batch_;
  loaded_ = false;
  return *this;
}

}  // namespace galley::data
