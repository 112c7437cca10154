// The prefetching DataLoader: a fixed pool of batch buffers cycling between a free list, the
// workers and an ordered ready ring.
#include "galley/data/dataloader.h"

#include <algorithm>
#include <atomic>

#include "galley/profiler.h"
#include "src/runtime/device_memory.h"

namespace galley::data {

struct DataLoader::Slot {
  Example buffer;  // batch_size rows on the loader's device, allocated once (again only if the
                   // user kept it)
  Example tail;    // views of the first tail_rows rows, for the short last batch
  // GPU only: where workers write, host memory (page-locked with pin_memory) copied into
  // `buffer` on the worker's stream, and its tail views. On a CPU device workers write `buffer`.
  Example host, host_tail;
  int64_t tail_rows = 0;
  Example out;                  // the handles the consumer gets: buffer's or tail's
  std::vector<size_t> indices;  // capacity batch_size
  size_t rows = 0;
  std::exception_ptr error;  // set by a failed fill; rethrown by the consumer
  detail::Event copied;      // GPU: the copy of the last fill into `buffer`
  detail::Event consumed;    // GPU: the consumer's work queued before the slot came back
};

namespace {

// The first `rows` rows of `t`, sharing its storage.
Tensor first_rows(const Tensor& t, int64_t rows) {
  auto impl = std::make_shared<detail::TensorImpl>();
  impl->storage = t.impl()->storage;
  impl->offset = t.impl()->offset;
  impl->shape = t.shape();
  impl->shape[0] = rows;
  impl->strides = t.strides();
  impl->dtype = t.dtype();
  return Tensor(std::move(impl));
}

// Only the loader's own handles (`impls` tensor views) refer to `t`'s memory.
bool sole_owner(const Tensor& t, long impls) {
  return t.impl_ptr().use_count() == 1 && t.impl()->storage.use_count() == impls;
}

// An error with `msg`, holding the exception being handled as its nested exception (typed as
// detail::raise_nested types it).
std::exception_ptr nested_error(const std::string& msg) {
  try {
    detail::raise_nested(msg);
  } catch (...) {
    return std::current_exception();
  }
}

}  // namespace

DataLoader::DataLoader(const Dataset& dataset, DataLoaderOptions options)
    : ds_(dataset), opt_(std::move(options)) {
  GALLEY_CHECK(opt_.batch_size > 0, "DataLoader: batch_size ", opt_.batch_size,
               " must be positive");
  GALLEY_CHECK(opt_.num_workers >= 0 && opt_.num_workers <= 1024, "DataLoader: num_workers ",
               opt_.num_workers, " must be in [0, 1024]");
  GALLEY_CHECK(opt_.prefetch >= 1, "DataLoader: prefetch ", opt_.prefetch,
               " must be at least 1 batch per worker");
  GALLEY_CHECK(opt_.device.is_cpu() ||
                   (opt_.device.index() >= 0 && opt_.device.index() < cuda_device_count()),
               "DataLoader: device ", opt_.device.str(), " does not exist: this machine has ",
               cuda_device_count(), " CUDA device(s)");
  GALLEY_CHECK(!(opt_.sampler && opt_.shuffle),
               "DataLoader: give either shuffle = true or a sampler, not both (a sampler decides "
               "the order itself)");
  if (opt_.sampler) {
    GALLEY_CHECK(opt_.sampler->dataset_size() == ds_.size(), "DataLoader: the sampler is for ",
                 opt_.sampler->dataset_size(), " examples but the dataset has ", ds_.size());
    sampler_ = opt_.sampler;
  } else if (opt_.shuffle) {
    sampler_ = std::make_shared<RandomSampler>(ds_.size(), opt_.seed);
  } else {
    sampler_ = std::make_shared<SequentialSampler>(ds_.size());
  }
  data_shape_ = ds_.data_shape();
  label_shape_ = ds_.label_shape();
  label_dtype_ = ds_.label_dtype();
  const size_t n = epoch_size_ = sampler_->size(), b = static_cast<size_t>(opt_.batch_size);
  num_batches_ = opt_.drop_last ? n / b : (n + b - 1) / b;
  order_.reserve(std::max(n, ds_.size()));

  // Never more buffers than an epoch has batches (and one for the consumer): a deep prefetch on
  // a small dataset would only allocate buffers that no batch fills.
  const size_t pool =
      opt_.num_workers == 0
          ? 1
          : std::min(static_cast<size_t>(opt_.num_workers) * opt_.prefetch + 1, num_batches_ + 1);
  try {  // (the streams made so far are destroyed if a buffer or a thread cannot be had)
    // One copy stream per worker (the caller's thread loads when there are none).
    if (opt_.device.is_cuda())
      for (int w = 0; w < std::max(1, opt_.num_workers); ++w)
        copy_streams_.push_back(detail::create_stream(opt_.device));
    for (size_t i = 0; i < pool; ++i) {
      slots_.push_back(std::make_unique<Slot>());
      allocate(*slots_.back());
      slots_.back()->indices.reserve(std::min(b, n));
    }
    free_.reserve(pool);
    for (auto& s : slots_) free_.push_back(s.get());
    ready_.assign(pool, nullptr);
    epoch_done_ = true;
    for (int w = 0; w < opt_.num_workers; ++w) workers_.emplace_back([this, w] { worker_loop(w); });
  } catch (...) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      shutdown_ = true;
    }
    work_cv_.notify_all();
    for (auto& t : workers_) t.join();
    for (void* st : copy_streams_) detail::destroy_stream(opt_.device, st);
    throw;
  }
}

DataLoader::~DataLoader() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    shutdown_ = true;
    active_ = false;
    ++generation_;
  }
  work_cv_.notify_all();
  for (auto& t : workers_) t.join();
  // Copies still queued finish on their own; the buffers they touch outlive them only if
  // nothing is left in flight, so wait for them before the slots go.
  for (auto& slot : slots_) {
    try {
      slot->copied.synchronize();
    } catch (...) {
      // A GPU that has failed already reported it; nothing is left to wait for.
    }
  }
  for (void* st : copy_streams_) detail::destroy_stream(opt_.device, st);
}

Shape DataLoader::batch_shape(const Shape& sample, int64_t rows) const {
  Shape s{rows};
  s.insert(s.end(), sample.begin(), sample.end());
  return s;
}

void DataLoader::allocate(Slot& slot) {
  // No batch has more rows than the sampler gives indices (a batch_size past the dataset's size
  // is one short batch, for which batch_size rows would be reserved in vain).
  const int64_t rows = std::min<int64_t>(opt_.batch_size, int64_t(epoch_size_));
  const Shape ds = batch_shape(data_shape_, rows);
  const Shape ls = batch_shape(label_shape_, rows);
  slot.buffer.data = Tensor::empty(ds, DType::Float32, opt_.device);
  slot.buffer.label = Tensor::empty(ls, label_dtype_, opt_.device);
  if (opt_.device.is_cuda() &&
      !slot.host.data.defined()) {  // the host side is never handed out: kept as it is
    slot.host.data = opt_.pin_memory ? Tensor::empty_pinned(ds) : Tensor::empty(ds);
    slot.host.label =
        opt_.pin_memory ? Tensor::empty_pinned(ls, label_dtype_) : Tensor::empty(ls, label_dtype_);
    slot.copied = detail::Event(opt_.device);
    slot.consumed = detail::Event(opt_.device);
  }
  // The new device buffers come from the caching allocator, whose blocks may have been freed
  // by the host while kernels queued on the compute stream still use them: the first copy
  // into them waits for that work.
  if (opt_.device.is_cuda()) slot.consumed.record(detail::compute_stream(opt_.device));
  slot.tail = Example{};
  slot.host_tail = Example{};
  slot.tail_rows = 0;
}

void DataLoader::set_epoch(uint64_t epoch) {
  next_epoch_ = epoch;
  next_start_ = 0;
}

void DataLoader::set_position(uint64_t epoch, size_t batch) {
  GALLEY_CHECK(batch <= num_batches_, "DataLoader: set_position: batch ", batch,
               " is past the end of an epoch of ", num_batches_, " batches");
  next_epoch_ = epoch;
  next_start_ = batch;
}

LoaderStats DataLoader::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  LoaderStats s = stats_;
  if (!epoch_done_)
    s.wall_seconds = std::chrono::duration<double>(Clock::now() - epoch_start_).count();
  return s;
}

// ---------------------------------------------------------------------------------------------
// Epochs

void DataLoader::stop_epoch(std::unique_lock<std::mutex>& lock) {
  ++generation_;
  active_ = false;
  // Fills in progress finish (a dataset call is not interruptible) and return their slots.
  ready_cv_.wait(lock, [&] { return busy_ == 0; });
  for (Slot*& r : ready_) {
    if (!r) continue;
    r->error = nullptr;
    free_.push_back(r);
    r = nullptr;
  }
}

DataLoader::iterator DataLoader::begin() {
  if (held_) {
    release(held_);
    held_ = nullptr;
  }
  size_t start = 0;
  {
    std::unique_lock<std::mutex> lock(mu_);
    stop_epoch(lock);
    // The epoch is taken only once its indices are good: a failed begin() can be retried.
    const uint64_t epoch = next_epoch_;
    // No worker is filling now, so order_ may change; workers read it only after claiming a
    // batch under the lock, which orders these writes before their reads.
    try {
      sampler_->indices(epoch, order_);
    } catch (...) {
      detail::raise_nested(
          detail::str_cat("DataLoader: the sampler failed to give the indices of epoch ", epoch,
                          ": ", detail::current_what()));
    }
    // Every batch reads order_ by position: a sampler must give the indices its size says, each
    // an example of the dataset.
    // (Its size when the loader was made: the buffers and the batch count were sized by it.)
    GALLEY_CHECK(order_.size() == epoch_size_, "DataLoader: the sampler gave ", order_.size(),
                 " indices for epoch ", epoch, " but its size was ", epoch_size_,
                 " when the loader was made");
    for (size_t i : order_)
      GALLEY_CHECK(i < ds_.size(), "DataLoader: the sampler gave index ", i, " for a dataset of ",
                   ds_.size(), " examples");
    epoch_ = epoch;
    ++next_epoch_;
    start = std::min(next_start_, num_batches_);
    next_start_ = 0;
    next_claim_ = start;
    next_consume_ = first_batch_ = start;
    stats_ = LoaderStats{};
    stats_.epoch = epoch_;
    epoch_start_ = Clock::now();
    epoch_done_ = start == num_batches_;
    active_ = true;
  }
  work_cv_.notify_all();
  return iterator(this, start);
}

DataLoader::iterator& DataLoader::iterator::operator++() {
  loader_->advance(batch_);
  ++batch_;
  return *this;
}

// ---------------------------------------------------------------------------------------------
// Workers

void DataLoader::worker_loop(int worker) {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    work_cv_.wait(lock, [&] {
      return shutdown_ || (active_ && next_claim_ < num_batches_ && !free_.empty());
    });
    if (shutdown_) return;
    Slot* slot = free_.back();
    free_.pop_back();
    const size_t k = next_claim_++;
    const uint64_t generation = generation_, epoch = epoch_;
    ++busy_;
    lock.unlock();

    const auto t0 = Clock::now();
    fill_guarded(*slot, k, epoch, worker);
    const double took = std::chrono::duration<double>(Clock::now() - t0).count();

    lock.lock();
    --busy_;
    if (generation == generation_) {
      stats_.load_seconds += took;
      ready_[k % ready_.size()] = slot;
      ready_cv_.notify_one();
    } else {  // the epoch was stopped while this batch was being filled
      slot->error = nullptr;
      free_.push_back(slot);
      if (busy_ == 0) ready_cv_.notify_one();
    }
  }
}

void DataLoader::fill_guarded(Slot& slot, size_t k, uint64_t epoch, int worker) {
  try {
    fill(slot, k, epoch, worker);
  } catch (...) {  // (fill hands its errors on with the batch; this is a last resort)
    slot.error = std::current_exception();
  }
}

void DataLoader::fill(Slot& slot, size_t k, uint64_t epoch, int worker) {
  const size_t b = static_cast<size_t>(opt_.batch_size), start = k * b;
  const size_t rows = std::min(b, order_.size() - start);
  slot.indices.assign(order_.begin() + start, order_.begin() + start + rows);
  slot.rows = rows;
  slot.error = nullptr;
  const bool gpu = opt_.device.is_cuda();
  Example* target = gpu ? &slot.host : &slot.buffer;
  if (rows < b) {
    if (slot.tail_rows != int64_t(rows)) {  // once per slot: the short batch has the same size
      slot.tail = Example{first_rows(slot.buffer.data, rows), first_rows(slot.buffer.label, rows)};
      if (gpu)
        slot.host_tail =
            Example{first_rows(slot.host.data, rows), first_rows(slot.host.label, rows)};
      slot.tail_rows = static_cast<int64_t>(rows);
    }
    target = gpu ? &slot.host_tail : &slot.tail;
  }
  try {
    // The host buffer is written again only once its previous copy to the GPU has finished.
    if (gpu) slot.copied.synchronize();
  } catch (const std::exception& e) {
    slot.error = nested_error(detail::str_cat("DataLoader: batch ", k, " of epoch ", epoch,
                                              ": waiting for the previous copy: ", e.what()));
    return;
  }

  try {
    ds_.get_batch(slot.indices, target->data, target->label);
  } catch (...) {
    // Find the sample at fault by loading the batch's samples one at a time, where buffers for
    // one sample can be had (a dataset that ran out of memory may have left none: the batch is
    // then reported with its own error).
    Tensor d, l;
    try {
      d = Tensor::empty(batch_shape(data_shape_, 1));
      l = Tensor::empty(batch_shape(label_shape_, 1), label_dtype_);
    } catch (...) {
      d = l = Tensor();
    }
    std::vector<size_t> one(1);
    for (size_t i : d.defined() ? slot.indices : std::vector<size_t>()) {
      one[0] = i;
      try {
        ds_.get_batch(one, d, l);
      } catch (...) {
        slot.error = nested_error(detail::str_cat("DataLoader: loading sample ", i, " (batch ", k,
                                                  " of epoch ", epoch,
                                                  ") failed: ", detail::current_what()));
        return;
      }
    }
    // Every sample loads alone (or none could be tried): report the batch with the original
    // error.
    slot.error = nested_error(detail::str_cat(
        "DataLoader: loading batch ", k, " of epoch ", epoch, " (samples ", slot.indices.front(),
        " ... ", slot.indices.back(), ") failed: ", detail::current_what()));
    return;
  }

  try {
    // Its error names the batch, the transform and the sample, the original nested inside it.
    apply_transforms(opt_.transforms, target->data, slot.indices, opt_.seed, epoch,
                     detail::str_cat("DataLoader: batch ", k, " of epoch ", epoch, ": "));
  } catch (...) {  // handed on as it is (apply_transforms' own error, or not a std::exception)
    slot.error = std::current_exception();
    return;
  }
  // Delivery to opt_.device: nothing to copy for a CPU device, whose buffers are the batch. On
  // a GPU the copy runs on this worker's stream, after the consumer's last use of the device
  // buffer, and the consumer's compute stream will wait for `copied`.
  if (!gpu) return;
  try {
    void* stream = copy_streams_[static_cast<size_t>(worker)];
    slot.consumed.wait(stream);
    const Example& dst = rows < b ? slot.tail : slot.buffer;
    for (auto [to, from] : {std::pair{dst.data, target->data}, std::pair{dst.label, target->label}})
      detail::copy_bytes_async(to.raw_data(), opt_.device, from.raw_data(), Device::cpu(),
                               size_t(from.numel()) * dtype_size(from.dtype()), stream);
    slot.copied.record(stream);
  } catch (const std::exception& e) {
    slot.error =
        nested_error(detail::str_cat("DataLoader: batch ", k, " of epoch ", epoch,
                                     ": copying it to ", opt_.device.str(), " failed: ", e.what()));
  }
}

// ---------------------------------------------------------------------------------------------
// Consumer

Example& DataLoader::batch(size_t k) {
  if (held_ && held_batch_ == k) return held_->out;
  GALLEY_CHECK(k < num_batches_, "DataLoader: batch ", k, " is past the end of the epoch (",
               num_batches_, " batches)");
  GALLEY_CHECK(k >= next_consume_, "DataLoader: batch ", k,
               " was already handed out; iterators are single-pass");
  if (held_) {
    release(held_);
    held_ = nullptr;
  }
  for (;;) {
    const size_t want = next_consume_;
    const auto t0 = Clock::now();
    Slot* slot;
    {
      profiler::RecordScope prof("dataloader_wait", {}, profiler::EventKind::LoaderWait);
      if (workers_.empty()) {
        slot = free_.back();
        free_.pop_back();
        fill_guarded(*slot, want, epoch_, 0);
      } else {
        std::unique_lock<std::mutex> lock(mu_);
        Slot*& r = ready_[want % ready_.size()];
        ready_cv_.wait(lock, [&] { return r != nullptr; });
        slot = r;
        r = nullptr;
      }
    }
    const double waited = std::chrono::duration<double>(Clock::now() - t0).count();
    ++next_consume_;
    {
      std::lock_guard<std::mutex> lock(mu_);
      stats_.wait_seconds += waited;
      if (want == first_batch_) stats_.first_wait_seconds = waited;
      if (workers_.empty()) stats_.load_seconds += waited;
      if (!slot->error && want == k) {
        stats_.batches += 1;
        stats_.samples += slot->rows;
      }
    }
    if (slot->error) {
      std::exception_ptr e = slot->error;
      slot->error = nullptr;
      release(slot);
      if (want == k) std::rethrow_exception(e);
      continue;
    }
    if (want < k) {  // a batch skipped by advancing the iterator without dereferencing it
      release(slot);
      continue;
    }
    slot->out = slot->rows == static_cast<size_t>(opt_.batch_size) ? slot->buffer : slot->tail;
    // The step's kernels, queued from now on, run after the batch's copy.
    if (opt_.device.is_cuda()) slot->copied.wait(detail::compute_stream(opt_.device));
    held_ = slot;
    held_batch_ = k;
    return slot->out;
  }
}

void DataLoader::advance(size_t k) {
  if (held_ && held_batch_ == k) {
    release(held_);
    held_ = nullptr;
  }
  if (k + 1 == num_batches_) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!epoch_done_) {
      stats_.wall_seconds = std::chrono::duration<double>(Clock::now() - epoch_start_).count();
      epoch_done_ = true;
    }
  }
}

void DataLoader::release(Slot* slot) {
  slot->out = Example{};
  // The next copy into this slot's device buffer waits for the work queued so far, which
  // includes every use of the batch the consumer made before handing it back.
  if (opt_.device.is_cuda()) slot->consumed.record(detail::compute_stream(opt_.device));
  const bool has_tail = slot->tail.data.defined();
  const long impls = has_tail ? 2 : 1;
  bool sole = sole_owner(slot->buffer.data, impls) && sole_owner(slot->buffer.label, impls);
  if (has_tail) sole = sole && sole_owner(slot->tail.data, 2) && sole_owner(slot->tail.label, 2);
  // Pairs with the release decrement of a handle another thread dropped, so its last reads of
  // the batch happen before a worker overwrites it.
  std::atomic_thread_fence(std::memory_order_acquire);
  if (!sole) allocate(*slot);  // the consumer kept the batch: it keeps that memory
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!sole) ++stats_.reallocations;
    free_.push_back(slot);
  }
  work_cv_.notify_one();
}

}  // namespace galley::data
