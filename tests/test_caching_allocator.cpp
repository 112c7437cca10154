// The device allocator's bookkeeping, over a fake device: reuse, splitting and merging, streams,
// statistics, the cap and its error message, and the environment variables.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <future>
#include <map>

#include "galley/galley.h"
#include "src/runtime/caching_allocator.h"
#include "test_util.h"

using galley::detail::CachingAllocator;

namespace {

constexpr size_t MiB = size_t(1) << 20;

// A device of `total` bytes that hands out distinct fake addresses and counts its calls.
class FakeDevice : public galley::detail::DeviceMemory {
 public:
  explicit FakeDevice(size_t total, std::map<uintptr_t, size_t>* live)
      : total_(total), live_(live) {}
  void* allocate(size_t bytes) override {
    if (used_ + bytes > total_) return nullptr;
    used_ += bytes;
    uintptr_t p = next_;
    next_ += bytes + 4096;
    (*live_)[p] = bytes;
    return reinterpret_cast<void*>(p);
  }
  void release(void* p) override {
    auto it = live_->find(reinterpret_cast<uintptr_t>(p));
    ASSERT_NE(it, live_->end()) << "release of an address never allocated";
    used_ -= it->second;
    live_->erase(it);
  }
  size_t total_bytes() const override { return total_; }
  std::string name() const override { return "fake:0"; }

 private:
  size_t total_, used_ = 0;
  uintptr_t next_ = 0x10000000;
  std::map<uintptr_t, size_t>* live_;
};

struct Fixture {
  std::map<uintptr_t, size_t> device;  // live segments
  CachingAllocator alloc;
  explicit Fixture(size_t total = 64 * MiB, size_t limit = 0)
      : alloc(std::make_unique<FakeDevice>(total, &device), limit) {}
};

}  // namespace

TEST(CachingAllocator, FreedBlocksAreReusedWithoutNewDeviceAllocations) {
  Fixture f;
  void* a = f.alloc.allocate(3 * MiB);
  f.alloc.free(a);
  void* b = f.alloc.allocate(3 * MiB);
  EXPECT_EQ(a, b);
  auto s = f.alloc.stats();
  EXPECT_EQ(s.device_allocs, 1u);
  EXPECT_EQ(s.reuses, 1u);
  EXPECT_EQ(s.allocated, 3 * MiB);
  EXPECT_EQ(s.reserved, 4 * MiB);  // large segments are rounded to 2 MiB
}

TEST(CachingAllocator, SmallRequestsShareOneSegmentAndMergeBack) {
  Fixture f;
  std::vector<void*> ps;
  for (int i = 0; i < 8; ++i) ps.push_back(f.alloc.allocate(1000));  // rounded to 1024
  auto s = f.alloc.stats();
  EXPECT_EQ(s.device_allocs, 1u);
  EXPECT_EQ(s.reserved, CachingAllocator::kSmallSegment);
  EXPECT_EQ(s.allocated, 8 * 1024u);
  for (int i = 1; i < 8; ++i)
    EXPECT_EQ(static_cast<char*>(ps[i]) - static_cast<char*>(ps[i - 1]), 1024);
  for (int i : {1, 3, 0, 2, 7, 5, 4, 6}) f.alloc.free(ps[i]);
  EXPECT_EQ(f.alloc.stats().allocated, 0u);
  // Everything merged back into one free segment, which empty_cache returns.
  f.alloc.empty_cache();
  EXPECT_EQ(f.alloc.stats().reserved, 0u);
  EXPECT_TRUE(f.device.empty());
}

TEST(CachingAllocator, LargeBlocksSplitAndTheRestIsUsable) {
  Fixture f;
  void* big = f.alloc.allocate(8 * MiB);
  f.alloc.free(big);
  void* part = f.alloc.allocate(3 * MiB);  // takes the front of the cached 8 MiB block
  void* rest = f.alloc.allocate(4 * MiB);  // and the rest comes from the remainder
  EXPECT_EQ(part, big);
  EXPECT_EQ(static_cast<char*>(rest) - static_cast<char*>(part), static_cast<ptrdiff_t>(3 * MiB));
  EXPECT_EQ(f.alloc.stats().device_allocs, 1u);
  f.alloc.free(part);
  f.alloc.free(rest);
  void* again = f.alloc.allocate(8 * MiB);  // merged again
  EXPECT_EQ(again, big);
}

TEST(CachingAllocator, BlocksAreReusedOnlyOnTheirStream) {
  Fixture f;
  void* a = f.alloc.allocate(2 * MiB, /*stream=*/1);
  f.alloc.free(a);
  void* b = f.alloc.allocate(2 * MiB, /*stream=*/2);
  EXPECT_NE(a, b);
  void* c = f.alloc.allocate(2 * MiB, /*stream=*/1);
  EXPECT_EQ(a, c);
  EXPECT_EQ(f.alloc.stats().device_allocs, 2u);
}

TEST(CachingAllocator, APrivatePoolKeepsItsBlocksAndIsReleasedAlone) {
  // A CUDA graph's capture allocates under its own key: its blocks must never go to eager
  // requests (the graph writes into them at every replay), and releasing the pool when the
  // graph goes leaves the eager cache alone.
  Fixture f;
  constexpr uintptr_t graph = 0x3;
  f.alloc.open_pool(graph);
  void* eager = f.alloc.allocate(2 * MiB);
  f.alloc.free(eager);
  void* g1 = f.alloc.allocate(2 * MiB, graph, /*may_release=*/false);
  EXPECT_NE(g1, eager);
  f.alloc.free(g1);
  void* g2 = f.alloc.allocate(2 * MiB, graph, false);  // reuse inside the capture is fine
  EXPECT_EQ(g2, g1);
  f.alloc.free(g2);
  void* e2 = f.alloc.allocate(2 * MiB);
  EXPECT_EQ(e2, eager);
  EXPECT_EQ(f.alloc.stats().device_allocs, 2u);
  // While the graph lives, emptying the cache leaves its memory alone (replays write there).
  f.alloc.empty_cache();
  EXPECT_EQ(f.alloc.stats().device_frees, 0u);
  EXPECT_EQ(f.device.size(), 2u);
  f.alloc.release_pool(graph);
  EXPECT_EQ(f.alloc.stats().device_frees, 1u);
  EXPECT_EQ(f.device.size(), 1u);  // the eager segment stays
  f.alloc.free(e2);
}

TEST(CachingAllocator, AnEndedPoolGivesBackItsLastSegmentsWhenTheirBlocksAreFreed) {
  // A tensor made during a capture (the step's loss) may outlive its graph.
  Fixture f;
  constexpr uintptr_t graph = 0x5;
  f.alloc.open_pool(graph);
  void* kept = f.alloc.allocate(3 * MiB, graph, false);
  f.alloc.release_pool(graph);
  EXPECT_EQ(f.alloc.stats().device_frees, 0u);
  f.alloc.free(kept);
  EXPECT_EQ(f.alloc.stats().device_frees, 1u);
  EXPECT_TRUE(f.device.empty());
  EXPECT_EQ(f.alloc.stats().reserved, 0u);
}

TEST(CachingAllocator, DuringACaptureTheCacheIsNotEmptiedToMakeRoom) {
  Fixture f(64 * MiB, 10 * MiB);
  f.alloc.free(f.alloc.allocate(8 * MiB));  // cached
  std::string msg;
  try {
    f.alloc.allocate(9 * MiB, 0x3, /*may_release=*/false);
    ADD_FAILURE() << "no error";
  } catch (const galley::OutOfMemoryError& e) {
    msg = e.what();
  }
  testutil::expect_contains(msg, {"requested 9.00 MiB", "while a CUDA graph capture is underway"});
  EXPECT_EQ(f.alloc.stats().device_frees, 0u);
}

TEST(CachingAllocator, TheCapIsAnOutOfMemoryErrorNamingRequestUseAndCap) {
  Fixture f(64 * MiB, 10 * MiB);
  void* a = f.alloc.allocate(6 * MiB);
  std::string msg;
  try {
    f.alloc.allocate(6 * MiB);
    ADD_FAILURE() << "no error over the cap";
  } catch (const galley::OutOfMemoryError& e) {
    msg = e.what();
  }
  testutil::expect_contains(msg, {"fake:0", "requested 6.00 MiB", "6.00 MiB in use",
                                  "cap 10.00 MiB", "over the cap", "GALLEY_GPU_MEMORY_FRACTION"});
  // Memory under the cap still works, and the failed request changed nothing.
  EXPECT_EQ(f.alloc.stats().allocated, 6 * MiB);
  void* b = f.alloc.allocate(2 * MiB);
  f.alloc.free(a);
  f.alloc.free(b);
  EXPECT_EQ(f.alloc.stats().peak_allocated, 8 * MiB);
}

TEST(CachingAllocator, CachedSegmentsAreReturnedBeforeGivingUp) {
  Fixture f(64 * MiB, 10 * MiB);
  void* a = f.alloc.allocate(8 * MiB);
  f.alloc.free(a);                      // cached: 8 MiB reserved, nothing in use
  void* b = f.alloc.allocate(9 * MiB);  // needs 10 MiB: the cache is given back first
  EXPECT_NE(b, nullptr);
  auto s = f.alloc.stats();
  EXPECT_EQ(s.reserved, 10 * MiB);
  EXPECT_EQ(s.device_frees, 1u);
}

TEST(CachingAllocator, AFullDeviceIsAnOutOfMemoryErrorToo) {
  Fixture f(8 * MiB, 0);
  void* a = f.alloc.allocate(6 * MiB);
  EXPECT_THROW(f.alloc.allocate(4 * MiB), galley::OutOfMemoryError);
  f.alloc.free(a);
  EXPECT_NO_THROW(f.alloc.free(f.alloc.allocate(4 * MiB)));
}

TEST(CachingAllocator, LoweringTheCapReturnsFreeMemory) {
  Fixture f;
  f.alloc.free(f.alloc.allocate(20 * MiB));
  EXPECT_EQ(f.alloc.stats().reserved, 20 * MiB);
  f.alloc.set_limit(4 * MiB);
  EXPECT_EQ(f.alloc.stats().reserved, 0u);
  EXPECT_EQ(f.alloc.stats().limit, 4 * MiB);
}

TEST(CachingAllocator, FreeingAForeignPointerIsAnError) {
  Fixture f;
  int x = 0;
  testutil::expect_contains(testutil::error_of([&] { f.alloc.free(&x); }), {"did not hand out"});
}

TEST(CachingAllocator, EveryDeviceSegmentIsReturnedAtDestruction) {
  std::map<uintptr_t, size_t> device;
  {
    CachingAllocator alloc(std::make_unique<FakeDevice>(64 * MiB, &device), 0);
    alloc.allocate(3 * MiB);  // still in use at destruction
    alloc.free(alloc.allocate(100));
  }
  EXPECT_TRUE(device.empty());
}

TEST(MemoryLimitFromEnv, LimitThenFractionThenNone) {
  unsetenv("GALLEY_GPU_MEMORY_LIMIT_MB");
  unsetenv("GALLEY_GPU_MEMORY_FRACTION");
  EXPECT_EQ(galley::detail::memory_limit_from_env(100 * MiB), 0u);
  setenv("GALLEY_GPU_MEMORY_FRACTION", "0.4", 1);
  EXPECT_EQ(galley::detail::memory_limit_from_env(100 * MiB), 40 * MiB);
  setenv("GALLEY_GPU_MEMORY_LIMIT_MB", "512", 1);
  EXPECT_EQ(galley::detail::memory_limit_from_env(100 * MiB), 512 * MiB);
  setenv("GALLEY_GPU_MEMORY_LIMIT_MB", "lots", 1);
  testutil::expect_contains(
      testutil::error_of([] { galley::detail::memory_limit_from_env(100 * MiB); }),
      {"GALLEY_GPU_MEMORY_LIMIT_MB='lots'"});
  unsetenv("GALLEY_GPU_MEMORY_LIMIT_MB");
  setenv("GALLEY_GPU_MEMORY_FRACTION", "1.5", 1);
  testutil::expect_contains(
      testutil::error_of([] { galley::detail::memory_limit_from_env(100 * MiB); }),
      {"GALLEY_GPU_MEMORY_FRACTION='1.5'", "(0, 1]"});
  unsetenv("GALLEY_GPU_MEMORY_FRACTION");
}

TEST(DeviceMemory, WithoutAGpuTheMemoryApiSaysSo) {
  if (galley::cuda_device_count() > 0) GTEST_SKIP() << "a GPU is present";
  testutil::expect_contains(
      testutil::error_of([] { galley::memory_stats(galley::Device::cuda(0)); }),
      {"cuda:0 does not exist", "0 CUDA device"});
  testutil::expect_contains(testutil::error_of([] { galley::empty_cache(galley::Device::cpu()); }),
                            {"not a GPU"});
}

// While a CUDA graph capture is underway on the device (any thread), no segment goes back to
// it: cudaFree synchronises the device and would invalidate the capture. What was freed
// meanwhile goes back when the last capture ends.
TEST(CachingAllocator, NothingReturnsToTheDeviceWhileACaptureIsUnderway) {
  Fixture f;
  void* a = f.alloc.allocate(3 * MiB);
  void* b = f.alloc.allocate(3 * MiB);
  f.alloc.free(a);
  f.alloc.begin_capture();
  f.alloc.begin_capture();  // two threads capturing
  f.alloc.empty_cache();
  f.alloc.set_limit(1 * MiB);
  EXPECT_EQ(f.device.size(), 2u) << "a segment went back to the device during a capture";
  f.alloc.end_capture();
  EXPECT_EQ(f.device.size(), 2u) << "one capture is still underway";
  f.alloc.end_capture();
  EXPECT_EQ(f.device.size(), 1u) << "the segment freed during the capture was kept";
  EXPECT_EQ(f.alloc.stats().reserved, 4 * MiB);  // b's 3 MiB, rounded to 2 MiB segments
  f.alloc.free(b);
  f.alloc.empty_cache();
  EXPECT_TRUE(f.device.empty());
  EXPECT_EQ(f.alloc.stats().reserved, 0u);
  EXPECT_THROW(f.alloc.end_capture(), galley::Error);
}

TEST(CachingAllocator, AnEndedGraphPoolKeepsItsLastBlockUntilNoCaptureIsUnderway) {
  Fixture f;
  const uintptr_t pool = 7;
  f.alloc.open_pool(pool);
  void* a = f.alloc.allocate(3 * MiB, pool, /*may_release=*/false);
  f.alloc.release_pool(pool);  // the graph is gone; its block is still in use
  f.alloc.begin_capture();     // another graph is being captured
  f.alloc.free(a);
  EXPECT_EQ(f.device.size(), 1u);
  f.alloc.end_capture();
  EXPECT_TRUE(f.device.empty());
}

// A device whose release() checks, from another thread, that the allocator's mutex is free:
// segments must go back to the device outside it, so that other threads keep allocating while
// a (slow, device-synchronising) cudaFree runs.
class ProbingDevice : public galley::detail::DeviceMemory {
 public:
  CachingAllocator* alloc = nullptr;
  int released = 0, released_under_lock = 0;
  void* allocate(size_t bytes) override {
    next_ += bytes + 4096;
    return reinterpret_cast<void*>(next_);
  }
  void release(void*) override {
    ++released;
    auto probe = std::async(std::launch::async, [this] { (void)alloc->stats(); });
    // Generous: a loaded machine may leave the probe's thread unscheduled for seconds.
    if (probe.wait_for(std::chrono::seconds(30)) != std::future_status::ready)
      ++released_under_lock;
  }
  size_t total_bytes() const override { return 1 << 30; }
  std::string name() const override { return "probe:0"; }

 private:
  uintptr_t next_ = 0x10000000;
};

TEST(CachingAllocator, SegmentsGoBackToTheDeviceOutsideTheMutex) {
  auto dev = std::make_unique<ProbingDevice>();
  ProbingDevice* d = dev.get();
  CachingAllocator alloc(std::move(dev), 0);
  d->alloc = &alloc;
  void* a = alloc.allocate(3 * MiB);
  void* b = alloc.allocate(3 * MiB);
  alloc.free(a);
  alloc.empty_cache();
  const uintptr_t pool = 9;
  alloc.open_pool(pool);
  void* c = alloc.allocate(3 * MiB, pool, false);
  alloc.release_pool(pool);
  alloc.free(c);  // the last block of an ended pool
  alloc.free(b);
  alloc.set_limit(1 * MiB);
  EXPECT_EQ(d->released, 3);
  EXPECT_EQ(d->released_under_lock, 0);
}

// A block made before a capture and freed by the step being captured may be used by the
// graph's kernels at every replay: nothing else gets it until the graph's pool is released.
TEST(CachingAllocator, ABlockFreedDuringACaptureWaitsForTheGraph) {
  Fixture f;
  const uintptr_t pool = 11;
  void* eager = f.alloc.allocate(3 * MiB);
  f.alloc.open_pool(pool);
  f.alloc.free(eager, /*capture_pool=*/pool);
  EXPECT_NE(f.alloc.allocate(3 * MiB), eager) << "the graph's block went to an eager tensor";
  EXPECT_EQ(f.alloc.stats().allocated, 6 * MiB);
  f.alloc.release_pool(pool);
  EXPECT_EQ(f.alloc.stats().allocated, 3 * MiB);
  EXPECT_EQ(f.alloc.allocate(3 * MiB), eager);
}
