// Host memory for tensors: 64-byte aligned blocks recycled through per-size free lists, so a
// training loop that allocates the same shapes every step stops calling malloc after warm-up.
#include "allocator.h"

#include <cstdlib>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "galley/error.h"

namespace galley::detail {
namespace {

constexpr size_t kAlign = 64;
// Blocks above this size go straight back to the system; the cache keeps at most kCacheCap.
constexpr size_t kCacheCap = size_t(1) << 30;

size_t round_up(size_t bytes) {
  if (bytes <= 4096) return (bytes + kAlign - 1) / kAlign * kAlign;
  // Coarser classes for large blocks so that nearby sizes share a free list: the smallest power
  // of two from 4 KiB with step * 16 >= bytes (compared without computing step * 16).
  size_t step = size_t(1) << 12;
  while (step < bytes / 16 + (bytes % 16 != 0)) step <<= 1;
  return (bytes + step - 1) / step * step;
}

struct HostCache {
  std::mutex mu;
  std::unordered_map<size_t, std::vector<void*>> free;
  size_t cached = 0;
  HostAllocatorStats stats;
};

HostCache& cache() {
  static HostCache* c = new HostCache();  // never destroyed: tensors may outlive static teardown
  return *c;
}

}  // namespace

void* host_alloc(size_t bytes, size_t* actual) {
  // No machine has half the address space to give; nor would a size class fit past it.
  if (bytes > SIZE_MAX / 2)
    throw OutOfMemoryError(
        str_cat("host allocation of ", bytes, " bytes: more than half the address space"));
  size_t size = round_up(bytes == 0 ? kAlign : bytes);
  *actual = size;
  HostCache& c = cache();
  {
    std::lock_guard<std::mutex> lock(c.mu);
    auto it = c.free.find(size);
    if (it != c.free.end() && !it->second.empty()) {
      void* p = it->second.back();
      it->second.pop_back();
      c.cached -= size;
      c.stats.in_use += size;
      c.stats.reused++;
      return p;
    }
  }
  void* p = std::aligned_alloc(kAlign, size);
  if (!p) {
    host_empty_cache();
    p = std::aligned_alloc(kAlign, size);
  }
  if (!p) throw OutOfMemoryError(str_cat("host allocation of ", bytes, " bytes failed"));
  std::lock_guard<std::mutex> lock(c.mu);
  c.stats.in_use += size;
  c.stats.system_allocs++;
  return p;
}

void host_free(void* p, size_t size) {
  if (!p) return;
  HostCache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  c.stats.in_use -= size;
  if (c.cached + size > kCacheCap) {
    std::free(p);
    return;
  }
  c.free[size].push_back(p);
  c.cached += size;
}

void host_empty_cache() {
  HostCache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  for (auto& [size, blocks] : c.free)
    for (void* p : blocks) std::free(p);
  c.free.clear();
  c.cached = 0;
}

HostAllocatorStats host_allocator_stats() {
  HostCache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  HostAllocatorStats s = c.stats;
  s.cached = c.cached;
  return s;
}

}  // namespace galley::detail
