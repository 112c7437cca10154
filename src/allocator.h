#pragma once
// Host block cache behind Storage (internal).
#include <cstddef>
#include <cstdint>

namespace galley::detail {

struct HostAllocatorStats {
  size_t in_use = 0;  // bytes held by live storages
  size_t cached = 0;  // bytes in free lists
  uint64_t system_allocs = 0;
  uint64_t reused = 0;
};

// Returns at least `bytes` (64-byte aligned); *actual receives the block's real size.
void* host_alloc(size_t bytes, size_t* actual);
// Returns a block obtained from host_alloc with its actual size.
void host_free(void* p, size_t actual);
// Gives every cached block back to the system.
void host_empty_cache();
HostAllocatorStats host_allocator_stats();

}  // namespace galley::detail
