#include "src/runtime/caching_allocator.h"

#include <cstdlib>
#include <vector>

#include "galley/error.h"

namespace galley::detail {

namespace {
size_t round_up(size_t x, size_t m) {
  return (x + m - 1) / m * m;
}

std::string mib(size_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f MiB", double(bytes) / double(1 << 20));
  return buf;
}

// Large segments are rounded to this, and a large block is split only when at least this much
// would be left over (smaller leftovers would fragment the pool for little gain).
constexpr size_t kLargeRound = size_t(2) << 20;
constexpr size_t kLargeSplit = size_t(1) << 20;
}  // namespace

size_t memory_limit_from_env(size_t total) {
  if (const char* mb = std::getenv("GALLEY_GPU_MEMORY_LIMIT_MB"); mb && *mb) {
    char* end = nullptr;
    const double v = std::strtod(mb, &end);
    // At least a byte (0 would mean no cap) and within size_t (a larger double does not convert).
    const double bytes = v * double(1 << 20);
    GALLEY_CHECK(end && *end == '\0' && bytes >= 1 && bytes < 1.8e19,
                 "GALLEY_GPU_MEMORY_LIMIT_MB='", mb,
                 "' must be a positive number of MiB, from one byte to 1.7e13 MiB");
    return static_cast<size_t>(bytes);
  }
  if (const char* f = std::getenv("GALLEY_GPU_MEMORY_FRACTION"); f && *f) {
    char* end = nullptr;
    const double v = std::strtod(f, &end);
    GALLEY_CHECK(end && *end == '\0' && v > 0 && v <= 1, "GALLEY_GPU_MEMORY_FRACTION='", f,
                 "' must be a number in (0, 1]");
    return static_cast<size_t>(v * double(total));
  }
  return 0;
}

bool CachingAllocator::Order::operator()(const Block* a, const Block* b) const {
  if (a->stream != b->stream) return a->stream < b->stream;
  if (a->size != b->size) return a->size < b->size;
  return a->ptr < b->ptr;
}

CachingAllocator::CachingAllocator(std::unique_ptr<DeviceMemory> memory, size_t limit)
    : mem_(std::move(memory)) {
  stats_.limit = limit;
}

CachingAllocator::~CachingAllocator() {
  // Blocks still handed out at exit belong to tensors being torn down with the process; their
  // segments are returned with the rest.
  std::vector<Block*> heads;
  for (auto* pool : {&small_, &large_})
    for (Block* b : *pool)
      if (!b->prev) heads.push_back(b);
  for (auto& [p, b] : live_)
    if (!b->prev) heads.push_back(b);
  for (const Segment& s : deferred_) mem_->release(s.ptr);
  for (Block* h : heads) {
    mem_->release(h->ptr);
    for (Block* b = h; b;) {
      Block* n = b->next;
      delete b;
      b = n;
    }
  }
}

CachingAllocator::Block* CachingAllocator::take_from_pool(Pool& pool, size_t size,
                                                          uintptr_t stream) {
  Block key{nullptr, size, stream, false};
  auto it = pool.lower_bound(&key);
  if (it == pool.end() || (*it)->stream != stream) return nullptr;
  Block* b = *it;
  pool.erase(it);
  return b;
}

void CachingAllocator::split(Block* b, size_t size, Pool& pool) {
  const size_t rest = b->size - size;
  if (rest < (b->small ? kRound : kLargeSplit)) return;
  Block* r = new Block{static_cast<char*>(b->ptr) + size, rest, b->stream, b->small};
  r->prev = b;
  r->next = b->next;
  if (b->next) b->next->prev = r;
  b->next = r;
  b->size = size;
  pool.insert(r);
}

void CachingAllocator::retire(Block* b, std::vector<Segment>& out) {
  if (captures_ > 0) {
    deferred_.push_back({b->ptr, b->size});
  } else {
    // Counted as gone now, so that a request racing with the release sees the room it makes.
    out.push_back({b->ptr, b->size});
    stats_.reserved -= b->size;
    ++stats_.device_frees;
    ++releasing_;
  }
  delete b;
}

void CachingAllocator::take_free_segments(std::vector<Segment>& out, bool any, uintptr_t stream) {
  for (auto* pool : {&small_, &large_}) {
    for (auto it = pool->begin(); it != pool->end();) {
      Block* b = *it;
      const bool match = any ? open_pools_.count(b->stream) == 0 : b->stream == stream;
      if (!b->prev && !b->next && match) {  // a whole segment, free
        it = pool->erase(it);
        retire(b, out);
      } else {
        ++it;
      }
    }
  }
}

void CachingAllocator::give_back(std::vector<Segment>& segs, bool locked) {
  if (segs.empty()) return;
  for (const Segment& s : segs) mem_->release(s.ptr);
  std::unique_lock<std::mutex> lock(mu_, std::defer_lock);
  if (!locked) lock.lock();
  releasing_ -= static_cast<int>(segs.size());
  segs.clear();
  released_.notify_all();
}

void CachingAllocator::out_of_memory(size_t requested, size_t segment, const char* why) const {
  throw OutOfMemoryError(str_cat(
      "out of memory on ", mem_->name(), ": requested ", mib(requested), " (a ", mib(segment),
      " segment); ", mib(stats_.allocated), " in use by tensors, ", mib(stats_.reserved),
      " reserved by galley, cap ", stats_.limit ? mib(stats_.limit) : std::string("none"), " of ",
      mib(mem_->total_bytes()), " on the device: ", why,
      " (GALLEY_GPU_MEMORY_FRACTION / GALLEY_GPU_MEMORY_LIMIT_MB set the cap)"));
}

CachingAllocator::Block* CachingAllocator::new_segment(size_t size, bool small, uintptr_t stream,
                                                       size_t requested, bool may_release) {
  const size_t seg = small ? kSmallSegment : round_up(size, kLargeRound);
  // Making room gives memory back while this thread holds the mutex: the request needs it now.
  std::vector<Segment> freed;
  if (stats_.limit && stats_.reserved + seg > stats_.limit) {
    if (may_release) take_free_segments(freed);
    give_back(freed, /*locked=*/true);
    if (stats_.reserved + seg > stats_.limit)
      out_of_memory(requested, seg,
                    may_release
                        ? "over the cap"
                        : "over the cap while a CUDA graph capture is underway on this device");
  }
  void* p = mem_->allocate(seg);
  if (!p && !may_release)
    out_of_memory(requested, seg,
                  "the device has no more free memory (while a CUDA graph capture is underway on "
                  "this device)");
  if (!p) {  // the device is full: give back what the cache holds and try once more
    take_free_segments(freed);
    give_back(freed, /*locked=*/true);
    p = mem_->allocate(seg);
    if (!p) out_of_memory(requested, seg, "the device has no more free memory");
  }
  ++stats_.device_allocs;
  stats_.reserved += seg;
  stats_.peak_reserved = std::max(stats_.peak_reserved, stats_.reserved);
  return new Block{p, seg, stream, small};
}

void* CachingAllocator::allocate(size_t bytes, uintptr_t stream, bool may_release) {
  const size_t size = round_up(std::max<size_t>(bytes, 1), kRound);
  const bool small = size <= kSmallRequest;
  std::lock_guard<std::mutex> lock(mu_);
  Pool& pool = small ? small_ : large_;
  Block* b = take_from_pool(pool, size, stream);
  if (b)
    ++stats_.reuses;
  else
    b = new_segment(size, small, stream, bytes, may_release && captures_ == 0);
  split(b, size, pool);
  b->allocated = true;
  live_[b->ptr] = b;
  stats_.allocated += b->size;
  stats_.peak_allocated = std::max(stats_.peak_allocated, stats_.allocated);
  return b->ptr;
}

void CachingAllocator::free(void* p, uintptr_t capture_pool) {
  if (!p) return;
  std::vector<Segment> freed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = live_.find(p);
    GALLEY_CHECK(it != live_.end(), "device allocator on ", mem_->name(), ": free of ", p,
                 " which it did not hand out (or freed twice)");
    Block* b = it->second;
    if (capture_pool && b->stream != capture_pool) {
      // Freed by a step being captured, but made outside it: the graph's kernels may use it at
      // every replay, so it must not serve anyone else until the graph is gone.
      held_[capture_pool].push_back(p);
      return;
    }
    live_.erase(it);
    b->allocated = false;
    stats_.allocated -= b->size;
    Pool& pool = b->small ? small_ : large_;
    // Merge with free neighbours of the same segment, so large requests find room again.
    for (Block* n : {b->prev, b->next}) {
      if (!n || n->allocated) continue;
      pool.erase(n);
      Block* lo = n == b->prev ? n : b;
      Block* hi = n == b->prev ? b : n;
      lo->size += hi->size;
      lo->next = hi->next;
      if (hi->next) hi->next->prev = lo;
      delete hi;
      b = lo;
    }
    if (!b->prev && !b->next && dead_pools_.count(b->stream))  // the last block of an ended pool
      retire(b, freed);
    else
      pool.insert(b);
  }
  give_back(freed, /*locked=*/false);
}

void CachingAllocator::empty_cache() {
  std::vector<Segment> freed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    take_free_segments(freed);
  }
  give_back(freed, /*locked=*/false);
}

void CachingAllocator::open_pool(uintptr_t stream) {
  std::lock_guard<std::mutex> lock(mu_);
  open_pools_.insert(stream);
  dead_pools_.erase(stream);
}

void CachingAllocator::release_pool(uintptr_t stream) {
  std::vector<void*> held;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto h = held_.find(stream);
    if (h != held_.end()) {
      held.swap(h->second);
      held_.erase(h);
    }
  }
  for (void* p : held) free(p);
  std::vector<Segment> freed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    open_pools_.erase(stream);
    take_free_segments(freed, false, stream);
    for (auto& [p, b] : live_)
      if (b->stream == stream) {
        dead_pools_.insert(stream);
        break;
      }
  }
  give_back(freed, /*locked=*/false);
}

void CachingAllocator::begin_capture() {
  std::unique_lock<std::mutex> lock(mu_);
  // A release decided before the capture but still running outside the mutex would land inside
  // it: wait for those to finish first.
  released_.wait(lock, [&] { return releasing_ == 0; });
  ++captures_;
}

void CachingAllocator::end_capture() {
  std::vector<Segment> freed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    GALLEY_CHECK(captures_ > 0, "device allocator on ", mem_->name(),
                 ": end_capture without begin_capture");
    if (--captures_ == 0) {
      for (const Segment& seg : deferred_) {
        stats_.reserved -= seg.size;
        ++stats_.device_frees;
        ++releasing_;
      }
      freed.swap(deferred_);
    }
  }
  give_back(freed, /*locked=*/false);
}

void CachingAllocator::set_limit(size_t bytes) {
  std::vector<Segment> freed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.limit = bytes;
    if (bytes && stats_.reserved > bytes) take_free_segments(freed);
  }
  give_back(freed, /*locked=*/false);
}

AllocatorStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace galley::detail
