#pragma once
/// \file GPU memory: statistics, cache control and the per-job cap.
///
/// Tensors on a GPU get their memory from a caching allocator per device. Its cap comes from
/// GALLEY_GPU_MEMORY_LIMIT_MB (MiB) or GALLEY_GPU_MEMORY_FRACTION (of the device's memory), or
/// from set_memory_limit / set_memory_fraction; going over it raises galley::OutOfMemoryError
/// naming the request, the bytes in use and the cap, so several jobs can share one GPU.
#include <cstddef>
#include <cstdint>

#include "galley/device.h"

namespace galley {

/// What the allocator of one device holds.
struct MemoryStats {
  size_t allocated = 0;        ///< bytes in use by tensors
  size_t reserved = 0;         ///< bytes taken from the device (in use + cached)
  size_t peak_allocated = 0;   ///< highest `allocated` so far
  size_t peak_reserved = 0;    ///< highest `reserved` so far
  uint64_t device_allocs = 0;  ///< segments taken from the device (cudaMalloc calls)
  uint64_t reuses = 0;         ///< requests served from the cache
  size_t limit = 0;            ///< the cap on `reserved` (0: none)
};

/// Statistics of `device`'s allocator (a CUDA device that exists).
MemoryStats memory_stats(Device device);
/// Returns cached, unused memory of `device` to the driver (for other processes).
void empty_cache(Device device);
/// Caps what `device`'s allocator may reserve (0 removes the cap).
void set_memory_limit(Device device, size_t bytes);
/// Caps it at `fraction` (0, 1] of the device's total memory.
void set_memory_fraction(Device device, double fraction);

}  // namespace galley
