#pragma once
// Memory, copies, streams and events on non-host devices, for Storage, Tensor, the loader and
// the communicators (internal). Implemented in memory.cpp over the CUDA runtime; without the
// CUDA backend every call that needs a GPU is an error that says so, and cuda_device_count() is
// 0 so none is reached through all_devices(). Streams and events are passed as void* so that
// code compiled without CUDA headers can hold them.
#include <cstddef>
#include <cstdint>

#include "galley/device.h"
#include "galley/dtype.h"

namespace galley::detail {

// `bytes` on `device` from its caching allocator (ordered on the device's compute stream).
// Inside a CUDA graph capture on this thread the block comes from the graph's private pool.
void* device_alloc(Device device, size_t bytes);
// Returns a block from device_alloc. Never throws (runs in destructors).
void device_free(Device device, void* p) noexcept;
// Copies `bytes` between any two devices (host included), returning as soon as the caller may
// reuse or free both buffers, never waiting for a whole device:
// - within one GPU: queued on its compute stream;
// - host to GPU: queued on the destination's compute stream once the data is staged (by CUDA
//   for pageable memory, by galley's staging ring for page-locked memory);
// - GPU to GPU: queued on the destination's compute stream after the source's queued work; the
//   source's stream runs its later work only after the copy (so freed source memory is safe);
// - GPU to host: returns when the copy is complete (the caller reads the data next).
void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes);
// Queues the copy on `stream` (of the GPU involved) and returns at once: host memory on either
// side must stay untouched until the copy is done (page-locked buffers, waited for with an
// Event). Between two host pointers it is a plain memcpy.
void copy_bytes_async(void* dst, Device dst_device, const void* src, Device src_device,
                      size_t bytes, void* stream);
// The device's compute stream (a cudaStream_t), created on first use: a non-blocking stream,
// ordered against other streams by events only (never implicitly by the legacy stream).
void* compute_stream(Device device);
// A new non-blocking stream on `device` for work that overlaps compute (host-to-device copies,
// communication); destroy it with destroy_stream.
void* create_stream(Device device, bool high_priority = false);
void destroy_stream(Device device, void* stream) noexcept;
// Makes `device` this thread's current CUDA device (kernels may only be launched into the
// streams of the current device); the previous one is not restored.
void make_current(Device device);
// Sets `count` elements of `width` bytes (1, 2, 4 or 8) at `dst` on `device` to `pattern`'s low
// bytes.
void fill_elements(Device device, void* dst, size_t count, uint64_t pattern, int width);
// Converts `count` elements at `src` (dtype `from`) into `dst` (dtype `to`), both on `device`,
// queued on its compute stream.
void convert_elements(Device device, const void* src, DType from, void* dst, DType to,
                      size_t count);

// Page-locked host memory (fast, asynchronous copies to and from GPUs); nullptr when this
// process has no CUDA device.
void* pinned_alloc(size_t bytes);
void pinned_free(void* p) noexcept;

// A CUDA event without timing, move-only. record() marks the work queued on a stream so far;
// wait() makes another stream wait for that work on the device, without blocking the host;
// synchronize() blocks the host until it is done. A default-constructed event is empty: waiting
// on it or synchronising it does nothing.
class Event {
 public:
  Event() = default;
  explicit Event(Device device);
  ~Event();
  Event(Event&& o) noexcept;
  Event& operator=(Event&& o) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  bool valid() const { return event_ != nullptr; }
  void record(void* stream);
  void wait(void* stream) const;
  void synchronize() const;
  // True when the recorded work has finished (or nothing was recorded).
  bool done() const;
  // The cudaEvent_t (null when empty).
  void* handle() const { return event_; }

 private:
  Device device_;
  void* event_ = nullptr;
  bool recorded_ = false;
};

// Makes `device` this thread's current CUDA device for the scope and gives the caller's back
// after, touching the device only when it differs: setting a device creates its context, and a
// thread that never used cuda:0 must not get one there just from a restore. Never throws (a
// failure to set the device is reported by the CUDA call that follows).
class CurrentDevice {
 public:
  explicit CurrentDevice(Device device) noexcept;
  ~CurrentDevice();
  CurrentDevice(const CurrentDevice&) = delete;
  CurrentDevice& operator=(const CurrentDevice&) = delete;

 private:
  int prev_ = -1;
  bool changed_ = false;
};

// While alive, this thread's device allocations on `device` come from the private pool `pool`
// and never empty the cache (a CUDA graph being captured: its memory must stay its own, and
// giving memory back would synchronise the device). It also tells the device's allocator that a
// capture is underway, so that no thread returns memory to the device until it ends.
class CaptureAllocations {
 public:
  CaptureAllocations(Device device, uintptr_t pool);
  ~CaptureAllocations();
  CaptureAllocations(const CaptureAllocations&) = delete;
  CaptureAllocations& operator=(const CaptureAllocations&) = delete;

 private:
  Device device_;
  int prev_device_;
  uintptr_t prev_pool_;
};
// Opens a private pool on `device` (a CUDA graph's): its memory stays reserved until
// release_pool, which returns it to the device (blocks still in use go back when freed).
void open_pool(Device device, uintptr_t pool);
// Never throws.
void release_pool(Device device, uintptr_t pool) noexcept;
// True while this thread captures a CUDA graph on `device`.
bool capturing(Device device);

// Errors found by kernels, reported on the host later. A kernel that meets bad input (a label
// out of range) cannot throw; it writes a report into its device's slot, which lives in
// page-locked host memory mapped into the device. The next synchronising call on the device
// (a copy to the host, item(), galley::cuda::synchronize, the next loss) checks the slot and
// throws the report as a galley::Error. Slot layout (int64): {code, a, b, c}; code 0 is clear.
// LabelOutOfRange: {1, row, label, classes} (cross_entropy). NonFiniteLoss: {2, the loss's float
// bits, 0, 0} (the loss guard of backward(), queued instead of reading the loss back).
enum class DeferredError : int64_t { None = 0, LabelOutOfRange = 1, NonFiniteLoss = 2 };
// The device's slot (a pointer usable by kernels).
int64_t* error_slot(Device device);
// Throws (and clears) the report in the device's slot, if any, and a failed kernel launch of
// this thread.
void check_deferred_errors(Device device);
// Throws when a kernel launch this thread made since the last check was refused (launches return
// nothing, and CUDA keeps the refusal per thread, where another thread's synchronisation never
// sees it): DataParallel's replica threads check after each task, so that a refused launch (a GPU
// the build has no kernels for, a bad configuration) fails the step instead of leaving its output
// unwritten.
void check_launch_errors();

}  // namespace galley::detail
