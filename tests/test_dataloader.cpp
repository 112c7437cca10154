// The prefetching DataLoader and the samplers: order, exactly-once, distributed shares, errors,
// early exit, buffer recycling and the starvation figures.
#include <gtest/gtest.h>

#include "test_util.h"

#include "src/allocator.h"

#include <galley/data/dataloader.h>
#include <galley/data/sampler.h>
#include <galley/data/synthetic.h>
#include <galley/data/transforms.h>

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <memory>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

namespace {

using galley::Shape;
using galley::Tensor;
using galley::data::DataLoader;
using galley::data::DataLoaderOptions;
using galley::data::DistributedSampler;
using galley::data::Example;
using galley::data::TensorDataset;
using testutil::error_of;
using testutil::expect_contains;
using testutil::expect_nested;

// n examples whose data [2] is (index, index + 0.5) and whose label is index.
TensorDataset indexed_dataset(int64_t n) {
  std::vector<float> d;
  std::vector<int64_t> l;
  for (int64_t i = 0; i < n; ++i) {
    d.push_back(float(i));
    d.push_back(float(i) + 0.5f);
    l.push_back(i);
  }
  return TensorDataset(Tensor::from_vector(d, {n, 2}), Tensor::from_vector(l, {n}));
}

// The example indices of a batch, checking that data and labels agree.
std::vector<int64_t> indices_of(const Example& b) {
  std::vector<int64_t> out;
  const float* d = b.data.data<float>();
  const int64_t* l = b.label.data<int64_t>();
  for (int64_t i = 0; i < b.label.numel(); ++i) {
    EXPECT_EQ(int64_t(d[2 * i]), l[i]);
    EXPECT_EQ(d[2 * i + 1], float(l[i]) + 0.5f);
    out.push_back(l[i]);
  }
  return out;
}

// One epoch's batches as lists of example indices.
std::vector<std::vector<int64_t>> epoch_batches(DataLoader& loader) {
  std::vector<std::vector<int64_t>> out;
  for (auto& [data, label] : loader) out.push_back(indices_of({data, label}));
  return out;
}

// Runs f on another thread and ends the test program if it has not finished in `seconds`: a
// hang must fail the suite, not stall it.
template <typename F>
void within(double seconds, F&& f) {
  auto done = std::async(std::launch::async, std::forward<F>(f));
  if (done.wait_for(std::chrono::duration<double>(seconds)) != std::future_status::ready) {
    std::fprintf(stderr, "test still running after %.0f s: the loader hangs\n", seconds);
    std::fflush(stderr);
    std::_Exit(3);
  }
  done.get();
}

// Wraps a dataset: sleeps in every get_batch, counts calls, throws for one index.
class SlowDataset : public galley::data::Dataset {
 public:
  SlowDataset(const TensorDataset& inner, double batch_ms, int64_t bad_index = -1)
      : inner_(inner), batch_ms_(batch_ms), bad_(bad_index) {}
  size_t size() const override { return inner_.size(); }
  Example get(size_t i) const override { return inner_.get(i); }
  Shape data_shape() const override { return inner_.data_shape(); }
  void get_batch(const std::vector<size_t>& idx, Tensor& d, Tensor& l) const override {
    calls.fetch_add(1);
    const auto t0 = std::chrono::steady_clock::now();
    struct Busy {  // the time spent here, however the call ends
      std::atomic<int64_t>& ns;
      std::chrono::steady_clock::time_point t0;
      ~Busy() {
        ns.fetch_add(std::chrono::duration_cast<std::chrono::nanoseconds>(
                         std::chrono::steady_clock::now() - t0)
                         .count());
      }
    } busy{busy_ns, t0};
    if (batch_ms_ > 0)
      std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(batch_ms_));
    for (size_t i : idx)
      if (int64_t(i) == bad_) throw std::runtime_error("cannot decode this example");
    inner_.get_batch(idx, d, l);
    done.fetch_add(1);
  }
  mutable std::atomic<int> calls{0};
  mutable std::atomic<int> done{0};         // batches filled
  mutable std::atomic<int64_t> busy_ns{0};  // time inside get_batch, summed over calls

 private:
  const TensorDataset& inner_;
  double batch_ms_;
  int64_t bad_;
};

const int kWorkerCounts[] = {0, 1, 2, 4};

TEST(DataLoader, DesignCallShape) {
  TensorDataset ds = indexed_dataset(10);
  galley::data::DataLoader train_loader(ds, {.batch_size = 4, .shuffle = true, .num_workers = 2});
  size_t rows = 0;
  for (int epoch = 0; epoch < 2; ++epoch)
    for (auto& [data, label] : train_loader) {
      EXPECT_EQ(data.dim(), 2);
      rows += label.numel();
    }
  EXPECT_EQ(rows, 20u);
  EXPECT_EQ(train_loader.size(), 3u);
}

TEST(DataLoader, OrderDependsOnlyOnSeedAndEpoch) {
  TensorDataset ds = indexed_dataset(103);
  std::vector<std::vector<std::vector<int64_t>>> reference;
  for (int workers : kWorkerCounts) {
    DataLoader loader(ds, {.batch_size = 10, .shuffle = true, .seed = 7, .num_workers = workers});
    std::vector<std::vector<std::vector<int64_t>>> epochs;
    for (int e = 0; e < 3; ++e) epochs.push_back(epoch_batches(loader));
    if (reference.empty())
      reference = epochs;
    else
      EXPECT_EQ(epochs, reference) << workers << " workers";
  }
  EXPECT_NE(reference[0], reference[1]) << "each epoch is shuffled afresh";
  // The same order as the synchronous BatchIterator with the same seed.
  galley::data::BatchIterator it(ds, {.batch_size = 10, .shuffle = true, .seed = 7});
  for (int e = 0; e < 3; ++e) {
    std::vector<std::vector<int64_t>> batches;
    for (auto& b : it) batches.push_back(indices_of(b));
    EXPECT_EQ(batches, reference[e]) << "epoch " << e;
  }
  DataLoader other_seed(ds, {.batch_size = 10, .shuffle = true, .seed = 8, .num_workers = 2});
  EXPECT_NE(epoch_batches(other_seed), reference[0]);
}

TEST(DataLoader, SetEpochSelectsTheOrder) {
  TensorDataset ds = indexed_dataset(50);
  DataLoader a(ds, {.batch_size = 8, .shuffle = true, .seed = 3, .num_workers = 2});
  std::vector<std::vector<int64_t>> third;
  for (int e = 0; e < 3; ++e) third = epoch_batches(a);
  DataLoader b(ds, {.batch_size = 8, .shuffle = true, .seed = 3});
  b.set_epoch(2);
  EXPECT_EQ(b.epoch(), 2u);
  EXPECT_EQ(epoch_batches(b), third);
  EXPECT_EQ(b.epoch(), 3u);
}

TEST(DataLoader, EverySampleExactlyOncePerEpoch) {
  TensorDataset ds = indexed_dataset(103);
  for (int workers : kWorkerCounts)
    for (bool drop_last : {false, true}) {
      DataLoader loader(ds, {.batch_size = 10,
                             .shuffle = true,
                             .drop_last = drop_last,
                             .num_workers = workers,
                             .prefetch = 3});
      EXPECT_EQ(loader.size(), drop_last ? 10u : 11u);
      for (int e = 0; e < 2; ++e) {
        std::multiset<int64_t> seen;
        size_t batches = 0;
        for (auto& batch : loader) {
          ++batches;
          EXPECT_EQ(batch.data.size(0), batch.label.size(0));
          EXPECT_EQ(batch.data.size(1), 2);
          for (int64_t i : indices_of(batch)) seen.insert(i);
        }
        EXPECT_EQ(batches, loader.size());
        EXPECT_EQ(seen.size(), drop_last ? 100u : 103u);
        EXPECT_EQ(std::set<int64_t>(seen.begin(), seen.end()).size(), seen.size())
            << "a sample came twice with " << workers << " workers";
      }
    }
}

TEST(DataLoader, ShortLastBatchAndSequentialOrder) {
  TensorDataset ds = indexed_dataset(23);
  DataLoader loader(ds, {.batch_size = 10, .num_workers = 2});
  auto batches = epoch_batches(loader);
  ASSERT_EQ(batches.size(), 3u);
  EXPECT_EQ(batches[2], (std::vector<int64_t>{20, 21, 22}));
  for (int64_t i = 0; i < 10; ++i) EXPECT_EQ(batches[1][i], 10 + i);
  // The short batch keeps its shape in the next epoch too.
  auto again = epoch_batches(loader);
  EXPECT_EQ(again, batches);
}

TEST(DataLoader, EmptyDatasetHasNoBatches) {
  TensorDataset ds = indexed_dataset(3);
  DataLoader loader(ds, {.batch_size = 10, .drop_last = true, .num_workers = 2});
  EXPECT_EQ(loader.size(), 0u);
  EXPECT_TRUE(epoch_batches(loader).empty());
}

TEST(DistributedSampler, RanksPartitionTheData) {
  for (size_t n : {100u, 103u, 3u}) {
    for (bool drop_last : {false, true}) {
      const int world = 4;
      for (uint64_t epoch : {0u, 1u}) {
        std::vector<std::vector<size_t>> shares;
        for (int r = 0; r < world; ++r) {
          DistributedSampler s(
              n, {.rank = r, .world_size = world, .seed = 11, .drop_last = drop_last});
          std::vector<size_t> idx;
          s.indices(epoch, idx);
          EXPECT_EQ(idx.size(), s.size());
          shares.push_back(idx);
        }
        const size_t share = drop_last ? n / world : (n + world - 1) / world;
        std::multiset<size_t> all;
        for (auto& s : shares) {
          EXPECT_EQ(s.size(), share) << "ranks must have equal shares";
          all.insert(s.begin(), s.end());
        }
        std::set<size_t> distinct(all.begin(), all.end());
        for (size_t i : distinct) EXPECT_LT(i, n);
        if (drop_last) {
          EXPECT_EQ(distinct.size(), all.size()) << "shares overlap, n=" << n;
          EXPECT_EQ(all.size(), n / world * world);
        } else {
          EXPECT_EQ(distinct.size(), n) << "the union must be the whole dataset, n=" << n;
          EXPECT_EQ(all.size() - distinct.size(), share * world - n) << "only padding repeats";
        }
      }
    }
  }
  // A new epoch reshuffles, the same on every rank.
  DistributedSampler s0(100, {.rank = 0, .world_size = 2, .seed = 1});
  std::vector<size_t> e0, e1;
  s0.indices(0, e0);
  s0.indices(1, e1);
  EXPECT_NE(e0, e1);
  EXPECT_THROW(DistributedSampler(10, {.rank = 2, .world_size = 2}), galley::Error);
  EXPECT_THROW(DistributedSampler(10, {.rank = 0, .world_size = 0}), galley::Error);
}

TEST(DataLoader, DistributedSamplerThroughTheLoader) {
  TensorDataset ds = indexed_dataset(100);
  std::set<int64_t> all;
  size_t total = 0;
  for (int r = 0; r < 3; ++r) {
    auto sampler = std::make_shared<DistributedSampler>(
        ds.size(), galley::data::DistributedSamplerOptions{.rank = r, .world_size = 3, .seed = 5});
    DataLoader loader(ds, {.batch_size = 8, .num_workers = 2, .sampler = sampler});
    EXPECT_EQ(loader.size(), 5u);  // 34 indices per rank
    for (auto& b : epoch_batches(loader)) {
      total += b.size();
      all.insert(b.begin(), b.end());
    }
  }
  EXPECT_EQ(total, 102u);
  EXPECT_EQ(all.size(), 100u);
}

TEST(DataLoader, WorkerExceptionNamesTheSample) {
  TensorDataset inner = indexed_dataset(100);
  SlowDataset ds(inner, 0, /*bad_index=*/37);
  for (int workers : kWorkerCounts) {
    DataLoader loader(ds, {.batch_size = 10, .num_workers = workers});
    size_t delivered = 0;
    const std::string msg = error_of([&] {
      for (auto& b : loader) {
        (void)b;
        ++delivered;
      }
    });
    expect_contains(msg, {"sample 37", "batch 3", "cannot decode this example"});
    EXPECT_EQ(delivered, 3u) << "batches before the bad one arrive, in order";
    // The original exception is nested inside.
    try {
      for (auto& b : loader) (void)b;
      ADD_FAILURE() << "the second epoch must fail too";
    } catch (const galley::Error& e) {
      expect_nested<std::runtime_error>(e, "cannot decode this example");
    }
  }
}

namespace {
// A dataset whose batches cannot be allocated (every sample alone can).
class OutOfMemoryDataset : public galley::data::Dataset {
 public:
  explicit OutOfMemoryDataset(const TensorDataset& inner) : inner_(inner) {}
  size_t size() const override { return inner_.size(); }
  Example get(size_t i) const override { return inner_.get(i); }
  Shape data_shape() const override { return inner_.data_shape(); }
  void get_batch(const std::vector<size_t>& idx, Tensor& d, Tensor& l) const override {
    if (idx.size() > 1) throw galley::OutOfMemoryError("batch buffer: out of memory");
    inner_.get_batch(idx, d, l);
  }

 private:
  const TensorDataset& inner_;
};
}  // namespace

TEST(DataLoader, OutOfMemoryInAWorkerReachesTheLoopAsOutOfMemory) {
  TensorDataset inner = indexed_dataset(20);
  OutOfMemoryDataset ds(inner);
  for (int workers : kWorkerCounts) {
    DataLoader loader(ds, {.batch_size = 5, .num_workers = workers});
    try {
      for (auto& b : loader) (void)b;
      ADD_FAILURE() << "the worker's error was lost (" << workers << " workers)";
    } catch (const galley::OutOfMemoryError& e) {
      expect_contains(e.what(), {"DataLoader", "batch 0", "out of memory"});
      expect_nested<galley::OutOfMemoryError>(e, "batch buffer: out of memory");
    }
  }
}

TEST(DataLoader, TransformErrorsKeepTheirTypeWithTheOriginalNestedInside) {
  TensorDataset ds = indexed_dataset(20);
  const galley::data::Transform oom = [](float*, const Shape&, galley::Generator&) {
    throw galley::OutOfMemoryError("transform: out of memory");
  };
  const galley::data::Transform plain = [](float*, const Shape&, galley::Generator&) {
    throw std::runtime_error("transform: plain failure");
  };
  for (int workers : kWorkerCounts) {
    DataLoader loader(ds, {.batch_size = 5, .num_workers = workers, .transforms = {oom}});
    try {
      for (auto& b : loader) (void)b;
      ADD_FAILURE() << "the transform's error was lost (" << workers << " workers)";
    } catch (const galley::OutOfMemoryError& e) {
      expect_contains(e.what(), {"DataLoader: batch 0", "transform 0 failed on sample",
                                 "transform: out of memory"});
      expect_nested<galley::OutOfMemoryError>(e, "transform: out of memory");
    }
    DataLoader other(ds, {.batch_size = 5, .num_workers = workers, .transforms = {plain}});
    try {
      for (auto& b : other) (void)b;
      ADD_FAILURE() << "the transform's error was lost (" << workers << " workers)";
    } catch (const galley::Error& e) {
      expect_contains(e.what(), {"DataLoader: batch 0", "transform 0", "plain failure"});
      expect_nested<std::runtime_error>(e, "transform: plain failure", /*plain=*/true);
    }
  }
}

namespace {
// A dataset that takes the address space it is left before it fails, as one that ran out of
// memory does: the loader's retry of the batch a sample at a time then finds no memory either.
// Samples of 4 MiB, so that a sample's buffer needs address space of its own (the host
// allocator's cache emptied first).
class MemoryHogDataset : public galley::data::Dataset {
 public:
  static constexpr int64_t kFloats = int64_t(1) << 20;
  size_t size() const override { return 8; }
  Example get(size_t i) const override {
    return {galley::full({kFloats}, float(i)), galley::full({}, float(i), galley::DType::Int64)};
  }
  Shape data_shape() const override { return {kFloats}; }
  void get_batch(const std::vector<size_t>& idx, Tensor& d, Tensor& l) const override {
    std::unique_lock<std::mutex> lock(mu_);  // (before `hog` is read: release() takes it too)
    if (hog) {
      try {  // at most 1 GiB, should the limit be gone
        for (int k = 0; k < 1024; ++k) held_.emplace_back(new char[size_t(1) << 20]);
      } catch (const std::bad_alloc&) {
      }
      // A little back, for the messages the loader builds; not the 4 MiB of a sample.
      for (int k = 0; k < 2 && !held_.empty(); ++k) held_.pop_back();
      throw galley::OutOfMemoryError("dataset: out of memory");
    }
    // Straight into the batch: no sample's tensor made and freed, whose memory a later
    // allocation of a sample's size could reuse.
    check_batch(idx.size(), d, l);
    for (size_t k = 0; k < idx.size(); ++k) {
      std::fill_n(d.data<float>() + int64_t(k) * kFloats, kFloats, float(idx[k]));
      l.data<int64_t>()[k] = int64_t(idx[k]);
    }
  }
  void release() {
    std::lock_guard<std::mutex> lock(mu_);
    held_.clear();
  }
  std::atomic<bool> hog{false};

 private:
  mutable std::mutex mu_;
  mutable std::vector<std::unique_ptr<char[]>> held_;
};
}  // namespace

TEST(DataLoader, ADatasetOutOfMemoryLeavesTheLoaderWhole) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "the sanitizers map more address space than a limit on it leaves";
#endif
  rlimit saved{};
  ASSERT_EQ(getrlimit(RLIMIT_AS, &saved), 0);
  for (int workers : {0, 2}) {
    MemoryHogDataset ds;
    DataLoader loader(ds, {.batch_size = 2, .num_workers = workers});
    for (auto& b : loader) (void)b;      // the threads and the buffers exist before the limit
    galley::detail::host_empty_cache();  // no freed block of a sample's size to reuse
    rlimit tight = saved;
    tight.rlim_cur = testutil::mapped_bytes() + (size_t(64) << 20);
    ASSERT_EQ(setrlimit(RLIMIT_AS, &tight), 0);
    ds.hog = true;
    bool out_of_memory = false;
    try {
      for (auto& b : loader) (void)b;
    } catch (const galley::OutOfMemoryError& e) {
      out_of_memory = true;
      expect_contains(e.what(), {"DataLoader", "batch 0", "dataset: out of memory"});
    } catch (const std::exception& e) {
      ADD_FAILURE() << "not an OutOfMemoryError (" << workers << " workers): " << e.what();
    }
    ds.hog = false;
    ds.release();
    ASSERT_EQ(setrlimit(RLIMIT_AS, &saved), 0);
    EXPECT_TRUE(out_of_memory) << workers << " workers";
    // Every buffer went back: the next epoch has all its batches.
    size_t batches = 0;
    for (auto& b : loader) {
      EXPECT_EQ(b.data.size(0), 2);
      ++batches;
    }
    EXPECT_EQ(batches, 4u) << workers << " workers";
  }
}

TEST(DataLoader, TransformExceptionNamesTheSample) {
  TensorDataset ds = indexed_dataset(20);  // samples of shape [2]: 2 "channels"
  DataLoader loader(ds, {.batch_size = 5,
                         .shuffle = true,
                         .num_workers = 2,
                         .transforms = {galley::data::normalize({0, 0, 0}, {1, 1, 1})}});
  const std::string msg = error_of([&] {
    for (auto& b : loader) (void)b;
  });
  expect_contains(msg, {"DataLoader: batch 0", "sample", "normalize: 3 channel statistics"});
}

TEST(DataLoader, EarlyBreakNeitherHangsNorLeaks) {
  TensorDataset inner = indexed_dataset(200);
  within(60, [&] {
    SlowDataset ds(inner, 2);
    for (int workers : {0, 1, 4}) {
      {
        DataLoader loader(ds, {.batch_size = 5, .shuffle = true, .num_workers = workers});
        for (int e = 0; e < 3; ++e) {
          int taken = 0;
          for (auto& b : loader) {
            (void)b;
            if (++taken == 3) break;
          }
        }
        // A full epoch after the broken ones still has every sample exactly once.
        std::set<int64_t> seen;
        size_t count = 0;
        for (auto& b : epoch_batches(loader)) {
          count += b.size();
          seen.insert(b.begin(), b.end());
        }
        EXPECT_EQ(seen.size(), 200u);
        EXPECT_EQ(count, 200u);
        // Break again and destroy the loader with workers mid-epoch.
        for (auto& b : loader) {
          (void)b;
          break;
        }
      }
      // Never touched: the destructor stops idle workers.
      DataLoader idle(ds, {.batch_size = 5, .num_workers = workers});
    }
  });
}

TEST(DataLoader, BuffersAreRecycled) {
  TensorDataset ds = indexed_dataset(1000);
  for (int workers : {0, 2}) {
    DataLoader loader(ds,
                      {.batch_size = 16, .shuffle = true, .num_workers = workers, .prefetch = 2});
    std::set<const void*> buffers;
    for (int e = 0; e < 3; ++e) {
      for (auto& [data, label] : loader) {
        buffers.insert(data.raw_data());
        buffers.insert(label.raw_data());
      }
      EXPECT_EQ(loader.stats().reallocations, 0u);
    }
    const size_t pool = workers == 0 ? 1 : size_t(workers) * 2 + 1;
    EXPECT_LE(buffers.size(), 2 * pool) << "63 batches x 3 epochs came from a fixed pool";
  }
}

TEST(DataLoader, KeptBatchStaysValid) {
  TensorDataset ds = indexed_dataset(64);
  DataLoader loader(ds, {.batch_size = 8, .num_workers = 2, .prefetch = 1});
  std::vector<Tensor> kept;
  std::vector<std::vector<int64_t>> expected;
  for (auto& [data, label] : loader) {
    if (kept.size() < 2) {
      kept.push_back(label);  // kept past ++: the loader must not write into it again
      expected.push_back(label.to_vector<int64_t>());
    }
  }
  EXPECT_EQ(loader.stats().reallocations, 2u);
  for (int e = 0; e < 2; ++e) epoch_batches(loader);
  for (size_t i = 0; i < kept.size(); ++i) EXPECT_EQ(kept[i].to_vector<int64_t>(), expected[i]);
}

TEST(DataLoader, StarvationStatistics) {
  TensorDataset inner = indexed_dataset(80);
  SlowDataset ds(inner, 4);  // 4 ms per batch of 8: 10 batches
  {
    // In the caller's thread, a step that costs nothing: the consumer waits all the time, every
    // load inside its wait (a bound that holds however the machine schedules the thread).
    DataLoader loader(ds, {.batch_size = 8});
    const int64_t busy0 = ds.busy_ns.load();
    for (auto& b : loader) (void)b;
    const auto s = loader.stats();
    const double loading = 1e-9 * double(ds.busy_ns.load() - busy0);
    EXPECT_EQ(s.batches, 10u);
    EXPECT_EQ(s.samples, 80u);
    EXPECT_GE(s.wait_seconds, 0.035);
    EXPECT_GE(s.wait_seconds, loading);
    EXPECT_LE(s.wait_seconds, s.wall_seconds);
    EXPECT_GE(s.starvation(), loading / s.wall_seconds);
    EXPECT_LE(s.starvation(), 1.0);
  }
  {
    // Two workers ahead of a 15 ms step: once warm the consumer hardly waits. The step also
    // waits until the workers have filled the next three batches (the pool holds four beside the
    // consumer's), so that a worker thread the machine leaves unscheduled for a while lengthens
    // the step, not the loader's wait: the figure checked is the loader's own hand-off.
    DataLoader loader(ds, {.batch_size = 8, .num_workers = 2});
    const int filled = ds.done.load();
    int taken = 0;
    for (auto& b : loader) {
      (void)b;
      taken += 1;
      std::this_thread::sleep_for(std::chrono::milliseconds(15));
      const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(30);
      while (ds.done.load() - filled < std::min(taken + 3, 10) &&
             std::chrono::steady_clock::now() < end)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    const auto s = loader.stats();
    EXPECT_EQ(s.epoch, 0u);
    EXPECT_EQ(s.batches, 10u);
    EXPECT_GE(s.wall_seconds, 0.15);
    EXPECT_GE(s.first_wait_seconds, 0.0);
    EXPECT_LE(s.first_wait_seconds, s.wait_seconds);
    EXPECT_LT(s.steady_starvation(), 0.2)
        << "waited " << s.wait_seconds << " s of " << s.wall_seconds;
    EXPECT_GE(s.load_seconds, 0.035);
  }
}

TEST(DataLoader, TransformsDoNotDependOnWorkersOrBatchSize) {
  galley::data::SyntheticDataset ds({.size = 40, .data_shape = {3, 8, 8}, .seed = 1});
  auto run = [&](int workers, int64_t batch, uint64_t epoch) {
    DataLoader loader(
        ds, {.batch_size = batch,
             .seed = 9,
             .num_workers = workers,
             .transforms = {galley::data::random_crop(2), galley::data::random_horizontal_flip(),
                            galley::data::normalize({0.5f}, {0.25f})}});
    loader.set_epoch(epoch);
    std::vector<float> all;
    for (auto& [data, label] : loader) {
      auto v = data.to_vector();
      all.insert(all.end(), v.begin(), v.end());
    }
    return all;
  };
  const auto ref = run(0, 8, 0);
  EXPECT_EQ(run(3, 8, 0), ref);
  EXPECT_EQ(run(2, 5, 0), ref);
  EXPECT_NE(run(2, 8, 1), ref) << "augmentations change with the epoch";
}

TEST(DataLoader, OptionsAreValidated) {
  TensorDataset ds = indexed_dataset(10);
  expect_contains(error_of([&] { DataLoader l(ds, {.batch_size = 0}); }), {"batch_size 0"});
  expect_contains(error_of([&] { DataLoader l(ds, {.num_workers = -1}); }), {"num_workers -1"});
  expect_contains(error_of([&] { DataLoader l(ds, {.num_workers = 2, .prefetch = 0}); }),
                  {"prefetch 0"});
  const int gpus = galley::cuda_device_count();
  expect_contains(error_of([&] { DataLoader l(ds, {.device = galley::Device::cuda(gpus)}); }),
                  {"cuda:" + std::to_string(gpus), "does not exist"});
  auto sampler = std::make_shared<galley::data::SequentialSampler>(11);
  expect_contains(error_of([&] { DataLoader l(ds, {.sampler = sampler}); }),
                  {"11 examples", "has 10"});
  auto right = std::make_shared<galley::data::SequentialSampler>(10);
  expect_contains(error_of([&] { DataLoader l(ds, {.shuffle = true, .sampler = right}); }),
                  {"either shuffle"});
  // A CPU device by index is a tag on the batches.
  DataLoader tagged(ds, {.batch_size = 4, .num_workers = 1, .device = galley::Device::cpu(1)});
  for (auto& [data, label] : tagged) EXPECT_EQ(data.device(), galley::Device::cpu(1));
}

}  // namespace

TEST(DataLoaderPosition, ResumingMidEpochYieldsTheRestOfThatEpochsOrder) {
  std::vector<float> v(50);
  for (int i = 0; i < 50; ++i) v[i] = float(i);
  galley::data::TensorDataset ds(galley::Tensor::from_vector(v, {50, 1}),
                                 galley::Tensor::from_vector(std::vector<int64_t>(50, 0), {50}));
  for (int workers : {0, 2}) {
    galley::data::DataLoader full(
        ds, {.batch_size = 8, .shuffle = true, .seed = 3, .num_workers = workers});
    full.set_epoch(4);
    std::vector<std::vector<float>> expected;
    for (auto& [data, label] : full) expected.push_back(data.to_vector());
    galley::data::DataLoader resumed(
        ds, {.batch_size = 8, .shuffle = true, .seed = 3, .num_workers = workers});
    resumed.set_position(4, 3);
    std::vector<std::vector<float>> rest;
    for (auto& [data, label] : resumed) rest.push_back(data.to_vector());
    ASSERT_EQ(rest.size(), expected.size() - 3) << workers << " workers";
    for (size_t i = 0; i < rest.size(); ++i) EXPECT_EQ(rest[i], expected[i + 3]);
    // The epoch after it starts at its first batch again.
    size_t n = 0;
    for (auto& b : resumed) n += (void(b), 1);
    EXPECT_EQ(n, expected.size());
  }
}

TEST(DataLoaderPosition, AResumedEpochsFirstWaitIsItsFirstBatchs) {
  // The first batch a resumed epoch takes is where its pipeline fills: its wait (here the whole
  // 20 ms load, in the caller's thread) is the epoch's first_wait_seconds, not a steady one.
  TensorDataset inner = indexed_dataset(40);
  SlowDataset ds(inner, 20);
  DataLoader loader(ds, {.batch_size = 8});
  loader.set_position(0, 3);
  size_t n = 0;
  for (auto& b : loader) n += (void(b), 1);
  EXPECT_EQ(n, 2u);
  const auto s = loader.stats();
  EXPECT_GE(s.first_wait_seconds, 0.015);
  EXPECT_LE(s.first_wait_seconds, s.wait_seconds);
}

namespace {
// Examples of the right shapes but another dtype than the batch's slots hold.
class WrongDtypeDataset : public galley::data::Dataset {
 public:
  size_t size() const override { return 4; }
  Example get(size_t) const override {
    return {galley::full({4}, 1.f, galley::DType::Float32).to(galley::DType::Int64),
            Tensor::from_vector(std::vector<int64_t>{1}, {})};
  }
  Shape data_shape() const override { return {4}; }
};

// A sampler whose indices fall short of its size, or point past the dataset.
class ShortSampler : public galley::data::Sampler {
 public:
  explicit ShortSampler(bool past) : past_(past) {}
  size_t size() const override { return 8; }
  size_t dataset_size() const override { return 8; }
  void indices(uint64_t, std::vector<size_t>& out) const override {
    out.assign(past_ ? 8 : 5, past_ ? 9 : 0);
  }

 private:
  bool past_;
};
}  // namespace

// What a dataset, a sampler or a transform hands the loader wrongly is an error naming it (or
// the very exception, whatever its type), never bytes misread or written past a buffer; a
// prefetch deeper than the epoch allocates no more buffers than it has batches.
TEST(DataLoader, WrongInputsFromTheUserAreErrors) {
  WrongDtypeDataset wrong;
  for (int workers : {0, 1}) {
    DataLoader loader(wrong, {.batch_size = 2, .num_workers = workers});
    expect_contains(error_of([&] {
                      for (auto& b : loader) (void)b;
                    }),
                    {"example 0", "int64 data", "expected float32"});
  }
  TensorDataset ds = indexed_dataset(8);
  for (bool past : {false, true}) {
    DataLoader loader(ds, {.batch_size = 2, .sampler = std::make_shared<ShortSampler>(past)});
    expect_contains(error_of([&] { loader.begin(); }),
                    {"DataLoader", past ? "index 9" : "gave 5 indices"});
  }
  galley::data::Transform throws_int = [](float*, const Shape&, galley::Generator&) { throw 7; };
  DataLoader loader(ds, {.batch_size = 2, .num_workers = 1, .transforms = {throws_int}});
  bool caught = false;  // a galley::Error, the thrown value nested inside it
  try {
    for (auto& b : loader) (void)b;
  } catch (const galley::Error& e) {
    try {
      std::rethrow_if_nested(e);
    } catch (int v) {
      caught = v == 7;
    }
  }
  EXPECT_TRUE(caught);
  DataLoader deep(ds, {.batch_size = 1, .num_workers = 1, .prefetch = 1 << 26});
  EXPECT_EQ(epoch_batches(deep).size(), 8u);
}

namespace {

// A sampler that fails in its first call, then gives 0, 1, ..., n-1.
class FailingOnceSampler : public galley::data::Sampler {
 public:
  explicit FailingOnceSampler(size_t n) : n_(n) {}
  size_t size() const override { return n_; }
  size_t dataset_size() const override { return n_; }
  void indices(uint64_t epoch, std::vector<size_t>& out) const override {
    if (!failed_) {
      failed_ = true;
      throw std::runtime_error("no indices today");
    }
    EXPECT_EQ(epoch, 0u) << "the failed begin() used up an epoch";
    out.resize(n_);
    for (size_t i = 0; i < n_; ++i) out[i] = i;
  }

 private:
  size_t n_;
  mutable bool failed_ = false;
};

}  // namespace

// Whatever a transform, a dataset or a sampler throws reaches the loop as a galley::Error naming
// what failed, with the original nested inside: an exception that is not a std::exception
// included, and a std::bad_alloc as an OutOfMemoryError.
TEST(DataLoader, EveryExceptionOfTheUsersCodeArrivesAsAGalleyError) {
  TensorDataset ds = indexed_dataset(8);
  for (int workers : {0, 2}) {
    DataLoader odd(ds,
                   {.batch_size = 4,
                    .num_workers = workers,
                    .transforms = {[](float*, const Shape&, galley::Generator&) { throw 42; }}});
    expect_contains(error_of([&] {
                      for (auto& b : odd) (void)b;
                    }),
                    {"transform 0 failed on sample 0", "not a std::exception"});
    DataLoader oom(
        ds,
        {.batch_size = 4,
         .num_workers = workers,
         .transforms = {[](float*, const Shape&, galley::Generator&) { throw std::bad_alloc(); }}});
    EXPECT_THROW(
        {
          for (auto& b : oom) (void)b;
        },
        galley::OutOfMemoryError)
        << workers << " workers";
  }
  DataLoader loader(ds, {.batch_size = 4, .sampler = std::make_shared<FailingOnceSampler>(8)});
  expect_contains(error_of([&] { loader.begin(); }),
                  {"the sampler failed to give the indices of epoch 0", "no indices today"});
  size_t batches = 0;
  for (auto& b : loader) batches += b.data.size(0) > 0;  // epoch 0, not 1
  EXPECT_EQ(batches, 2u);
}

// A batch_size beyond the dataset gives one short batch and reserves no more rows than it has
// (a full-batch run asks for no terabytes).
TEST(DataLoader, ABatchLargerThanTheDatasetReservesOnlyItsRows) {
  TensorDataset ds = indexed_dataset(10);
  for (int workers : {0, 2}) {
    DataLoader loader(ds, {.batch_size = int64_t(1) << 40, .num_workers = workers});
    size_t batches = 0;
    for (auto& b : loader) {
      EXPECT_EQ(b.data.shape(), (Shape{10, 2}));
      EXPECT_EQ(indices_of(b).size(), 10u);
      ++batches;
    }
    EXPECT_EQ(batches, 1u);
  }
}

// SyntheticDataset's get_batch checks its tensors as every dataset's does: a strided view (whose
// rows it would write in the wrong places) is refused.
TEST(DataLoader, SyntheticBatchesRefuseAStridedTensor) {
  galley::data::SyntheticDataset syn({.size = 4, .data_shape = {3, 2}, .num_classes = 2});
  Tensor d = Tensor::empty({1, 2, 3}).transpose(1, 2);
  Tensor l = Tensor::empty({1}, galley::DType::Int64);
  expect_contains(error_of([&] { syn.get_batch({0}, d, l); }), {"SyntheticDataset", "contiguous"});
}

namespace {
// A sampler whose size grows after the loader has asked it once.
class GrowingSampler : public galley::data::Sampler {
 public:
  size_t size() const override { return calls_++ == 0 ? 4 : 6; }
  size_t dataset_size() const override { return 8; }
  void indices(uint64_t, std::vector<size_t>& out) const override {
    out.resize(6);
    for (size_t i = 0; i < 6; ++i) out[i] = i;
  }

 private:
  mutable int calls_ = 0;
};
}  // namespace

// The loader's buffers and batch count are sized by the sampler's size when it is made: a
// sampler giving more indices later is an error, not rows written past the buffers.
TEST(DataLoader, ASamplerThatGrowsIsAnError) {
  TensorDataset ds = indexed_dataset(8);
  DataLoader loader(ds, {.batch_size = 10, .sampler = std::make_shared<GrowingSampler>()});
  expect_contains(error_of([&] { loader.begin(); }),
                  {"gave 6 indices", "its size was 4 when the loader was made"});
}
