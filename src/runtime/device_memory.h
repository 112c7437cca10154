#pragma once
// Memory and copies on non-host devices, for Storage and Tensor (internal). Implemented in
// memory.cpp over the CUDA runtime; without the CUDA backend every call is an error that says
// so, and cuda_device_count() is 0 so none is reached through all_devices().
#include <cstddef>

#include "galley/device.h"

namespace galley::detail {

// `bytes` on `device` from its caching allocator (ordered on the device's compute stream).
void* device_alloc(Device device, size_t bytes);
// Returns a block from device_alloc. Never throws (runs in destructors).
void device_free(Device device, void* p) noexcept;
// Copies `bytes` between any two devices (host included); returns when the copy is complete.
void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes);
// The device's compute stream (a cudaStream_t), created on first use. It is a blocking stream,
// so copies on the legacy default stream stay ordered with the kernels queued on it.
void* compute_stream(Device device);
// Sets `count` 4-byte words at `dst` on `device` to `pattern`'s bits.
void fill_words(Device device, void* dst, size_t count, uint32_t pattern);

}  // namespace galley::detail
