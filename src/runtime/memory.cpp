// One caching allocator per CUDA device, created on first use (never during static
// initialisation), over the CUDA runtime.
#include "galley/runtime/memory.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "galley/error.h"
#include "galley/runtime/cuda.h"
#include "src/runtime/caching_allocator.h"
#include "src/runtime/device_memory.h"

#ifdef GALLEY_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "kernels/convert.h"
#include "kernels/fill.h"
#endif

namespace galley {

namespace detail {
namespace {

#ifdef GALLEY_HAVE_CUDA
class CudaMemory : public DeviceMemory {
 public:
  explicit CudaMemory(int device) : device_(device) {
    CurrentDevice current(Device::cuda(device_));
    size_t free_bytes = 0;
    if (cudaMemGetInfo(&free_bytes, &total_) != cudaSuccess) {
      (void)cudaGetLastError();
      total_ = 0;
    }
  }
  void* allocate(size_t bytes) override {
    CurrentDevice current(Device::cuda(device_));
    void* p = nullptr;
    // cudaMalloc counts as unsafe while this thread captures a CUDA graph (a graph's private
    // pool starts empty): allow it for this one call, as it does not touch any stream.
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    cudaThreadExchangeStreamCaptureMode(&mode);
    const cudaError_t rc = cudaMalloc(&p, bytes);
    cudaThreadExchangeStreamCaptureMode(&mode);
    if (rc != cudaSuccess) {
      (void)cudaGetLastError();  // an out-of-memory is reported by the allocator, with context
      p = nullptr;
    }
    return p;
  }
  void release(void* p) override {
    // Never throws: this runs from destructors. A failure here leaves memory to the driver.
    CurrentDevice current(Device::cuda(device_));
    if (cudaFree(p) != cudaSuccess) (void)cudaGetLastError();
  }
  size_t total_bytes() const override { return total_; }
  std::string name() const override { return "cuda:" + std::to_string(device_); }

 private:
  int device_;
  size_t total_ = 0;
};
#endif

std::mutex allocators_mu;
std::vector<std::unique_ptr<CachingAllocator>>& allocators() {
  static auto* a = new std::vector<std::unique_ptr<CachingAllocator>>();  // lives to exit
  return *a;
}

}  // namespace

// The allocator of CUDA device `index`, created on first use with the cap from the environment.
CachingAllocator& cuda_allocator(int index) {
  GALLEY_CHECK(index >= 0 && index < cuda_device_count(), "cuda:", index,
               " does not exist: this machine has ", cuda_device_count(), " CUDA device(s)");
  std::lock_guard<std::mutex> lock(allocators_mu);
  auto& all = allocators();
  if (all.size() <= size_t(index)) all.resize(index + 1);
  if (!all[index]) {
#ifdef GALLEY_HAVE_CUDA
    auto mem = std::make_unique<CudaMemory>(index);
    const size_t limit = memory_limit_from_env(mem->total_bytes());
    all[index] = std::make_unique<CachingAllocator>(std::move(mem), limit);
#endif
  }
  return *all[index];
}

}  // namespace detail

namespace {
detail::CachingAllocator& allocator_of(Device device, const char* what) {
  GALLEY_CHECK(device.is_cuda(), what, ": ", device.str(),
               " is not a GPU; host memory is not capped or cached per device");
  return detail::cuda_allocator(device.index());
}
}  // namespace

MemoryStats memory_stats(Device device) {
  auto s = allocator_of(device, "memory_stats").stats();
  return {s.allocated,     s.reserved, s.peak_allocated, s.peak_reserved,
          s.device_allocs, s.reuses,   s.limit};
}

void empty_cache(Device device) {
  allocator_of(device, "empty_cache").empty_cache();
}

void set_memory_limit(Device device, size_t bytes) {
  allocator_of(device, "set_memory_limit").set_limit(bytes);
}

void set_memory_fraction(Device device, double fraction) {
  GALLEY_CHECK(fraction > 0 && fraction <= 1, "set_memory_fraction: ", fraction,
               " is not in (0, 1]");
  auto& a = allocator_of(device, "set_memory_fraction");
  a.set_limit(static_cast<size_t>(fraction * double(a.memory().total_bytes())));
}

// ---------------------------------------------------------------------------------------------
// Device memory and copies

namespace detail {

namespace {
// The private pool of the graph this thread is capturing, and its device (-1: none).
thread_local int capture_device = -1;
thread_local uintptr_t capture_pool = 0;
}  // namespace

CaptureAllocations::CaptureAllocations(Device device, uintptr_t pool)
    : device_(device), prev_device_(capture_device), prev_pool_(capture_pool) {
#ifdef GALLEY_HAVE_CUDA
  cuda_allocator(device.index()).begin_capture();
#endif
  capture_device = device.index();
  capture_pool = pool;
}
CaptureAllocations::~CaptureAllocations() {
  capture_device = prev_device_;
  capture_pool = prev_pool_;
#ifdef GALLEY_HAVE_CUDA
  try {
    cuda_allocator(device_.index()).end_capture();
  } catch (...) {
    // Only a mismatched pair throws; the destructor must not.
  }
#endif
}

#ifdef GALLEY_HAVE_CUDA
CurrentDevice::CurrentDevice(Device device) noexcept {
  if (cudaGetDevice(&prev_) != cudaSuccess) {
    (void)cudaGetLastError();
    prev_ = -1;
  }
  if (device.index() == prev_) return;
  changed_ = cudaSetDevice(device.index()) == cudaSuccess;
  if (!changed_) (void)cudaGetLastError();  // the call that follows reports the failure
}
CurrentDevice::~CurrentDevice() {
  if (changed_ && prev_ >= 0 && cudaSetDevice(prev_) != cudaSuccess) (void)cudaGetLastError();
}
#else
CurrentDevice::CurrentDevice(Device) noexcept {}
CurrentDevice::~CurrentDevice() = default;
#endif
bool capturing(Device device) {
  return device.is_cuda() && capture_device == device.index();
}

#ifdef GALLEY_HAVE_CUDA
namespace {
// Throws with the failed call and CUDA's own words.
void cuda_check(cudaError_t rc, const char* what, Device device) {
  if (rc == cudaSuccess) return;
  (void)cudaGetLastError();
  GALLEY_CHECK(false, what, " on ", device.str(), " failed: ", cudaGetErrorString(rc));
}

cudaStream_t as_stream(void* s) {
  return static_cast<cudaStream_t>(s);
}

// True for ordinary host memory (neither page-locked nor device memory).
bool is_pageable(const void* p) {
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
    (void)cudaGetLastError();
    return true;
  }
  return attr.type == cudaMemoryTypeUnregistered;
}

void check_not_capturing(Device gpu, const char* what) {
  GALLEY_CHECK(!capturing(gpu), what, " ", gpu.str(),
               " inside a CUDA graph capture: a captured step may not copy between the host "
               "and the GPU or read values back (item(), to_vector()); copy inputs into the "
               "graph's static tensors before replay() and read results after it");
}
}  // namespace

void* device_alloc(Device device, size_t bytes) {
  if (capturing(device))
    return cuda_allocator(device.index()).allocate(bytes, capture_pool, /*may_release=*/false);
  return cuda_allocator(device.index()).allocate(bytes);
}

void open_pool(Device device, uintptr_t pool) {
  cuda_allocator(device.index()).open_pool(pool);
}

void release_pool(Device device, uintptr_t pool) noexcept {
  try {
    cuda_allocator(device.index()).release_pool(pool);
  } catch (...) {
    // Memory left cached goes back with empty_cache() or at exit.
  }
}

void device_free(Device device, void* p) noexcept {
  try {
    cuda_allocator(device.index()).free(p, capturing(device) ? capture_pool : 0);
  } catch (...) {
    // A free that fails at exit is left to the driver rather than aborting the process.
  }
}

namespace {
// Page-locked staging for copies from page-locked host memory to a GPU. CUDA copies such memory
// by DMA straight from the caller's buffer, so a synchronous copy would have to wait until the
// GPU's queue reaches it, that is for everything queued on the compute stream before. Copying the
// data into a staging chunk first (what CUDA itself does for pageable memory) lets the caller
// reuse its buffer at once while the GPU copy runs in stream order. A chunk is reused once the
// copy out of it has finished; the ring only waits when every chunk is still in flight.
class Staging {
 public:
  static constexpr size_t kChunk = size_t(2) << 20;
  static constexpr size_t kChunks = 32;

  explicit Staging(Device device) : device_(device) {}
  ~Staging() = delete;  // lives to exit, like the allocators: CUDA may be gone by then

  void copy_in(void* dst, const void* src, size_t bytes, void* stream) {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t done = 0; done < bytes;) {
      Chunk& c = next_chunk();
      const size_t n = std::min(kChunk, bytes - done);
      std::memcpy(c.host, static_cast<const char*>(src) + done, n);
      cuda_check(cudaMemcpyAsync(static_cast<char*>(dst) + done, c.host, n, cudaMemcpyHostToDevice,
                                 as_stream(stream)),
                 "copy to", device_);
      c.copied.record(stream);
      done += n;
    }
  }

 private:
  struct Chunk {
    void* host = nullptr;
    Event copied;
  };
  Chunk& next_chunk() {
    if (chunks_.size() < kChunks && (chunks_.empty() || !chunks_[next_].copied.done())) {
      Chunk c;
      c.host = pinned_alloc(kChunk);
      c.copied = Event(device_);
      chunks_.push_back(std::move(c));
      next_ = chunks_.size() - 1;
    }
    Chunk& c = chunks_[next_];
    c.copied.synchronize();
    next_ = (next_ + 1) % chunks_.size();
    return c;
  }

  Device device_;
  std::mutex mu_;
  std::vector<Chunk> chunks_;
  size_t next_ = 0;
};

Staging& staging(Device device) {
  static std::mutex mu;
  static auto* all = new std::vector<Staging*>();
  std::lock_guard<std::mutex> lock(mu);
  if (all->size() <= size_t(device.index())) all->resize(device.index() + 1, nullptr);
  Staging*& s = (*all)[device.index()];
  if (!s) s = new Staging(device);
  return *s;
}

// Makes `waiter`'s compute stream wait for the work queued so far on `signaller`'s.
void order_after(Device waiter, Device signaller) {
  Event e(signaller);
  e.record(compute_stream(signaller));
  e.wait(compute_stream(waiter));
  // Destroying a recorded event is allowed; CUDA releases it once the event completes.
}
}  // namespace

void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) {
  if (bytes == 0) return;
  if (dst_device.is_cpu() && src_device.is_cpu()) {
    std::memcpy(dst, src, bytes);
    return;
  }
  // Within one GPU: ordered on the compute stream like a kernel, so nothing waits (and it can be
  // captured into a CUDA graph).
  if (dst_device == src_device)
    return copy_bytes_async(dst, dst_device, src, src_device, bytes, compute_stream(dst_device));
  if (dst_device.is_cuda() && src_device.is_cuda()) {
    check_not_capturing(src_device, "copy from");
    check_not_capturing(dst_device, "copy to");
    // Between GPUs, neither host nor stream waits for more than the copy needs: the destination's
    // stream takes the copy after the source's queued work (which produces the data), and the
    // source's stream runs its later work after the copy, so memory the caller frees right after
    // (reused by the source's stream) is not overwritten before the copy has read it.
    order_after(dst_device, src_device);
    copy_bytes_async(dst, dst_device, src, src_device, bytes, compute_stream(dst_device));
    order_after(src_device, dst_device);
    return;
  }
  if (dst_device.is_cuda()) {  // from the host
    check_not_capturing(dst_device, "copy to");
    // From pageable memory cudaMemcpyAsync returns once CUDA has staged the data, so the caller
    // may reuse its buffer at once; from page-locked memory galley stages it the same way.
    if (is_pageable(src))
      return copy_bytes_async(dst, dst_device, src, src_device, bytes, compute_stream(dst_device));
    CurrentDevice current(dst_device);
    staging(dst_device).copy_in(dst, src, bytes, compute_stream(dst_device));
    return;
  }
  // To the host: the caller reads the data next, so the copy (and the work producing it) must
  // be complete, and errors kernels found on the way are reported now.
  check_not_capturing(src_device, "copy from");
  void* stream = compute_stream(src_device);
  copy_bytes_async(dst, dst_device, src, src_device, bytes, stream);
  Event done(src_device);
  done.record(stream);
  done.synchronize();
  check_deferred_errors(src_device);
}

void copy_bytes_async(void* dst, Device dst_device, const void* src, Device src_device,
                      size_t bytes, void* stream) {
  if (bytes == 0) return;
  if (dst_device.is_cpu() && src_device.is_cpu()) {
    std::memcpy(dst, src, bytes);
    return;
  }
  const Device gpu = dst_device.is_cuda() ? dst_device : src_device;
  CurrentDevice current(gpu);
  if (dst_device.is_cuda() && src_device.is_cuda() && dst_device != src_device)
    cuda_check(cudaMemcpyPeerAsync(dst, dst_device.index(), src, src_device.index(), bytes,
                                   as_stream(stream)),
               "copy", gpu);
  else
    cuda_check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, as_stream(stream)), "copy", gpu);
}

void* compute_stream(Device device) {
  static std::mutex mu;
  static auto* streams = new std::vector<cudaStream_t>();
  std::lock_guard<std::mutex> lock(mu);
  if (streams->size() <= size_t(device.index())) streams->resize(device.index() + 1, nullptr);
  cudaStream_t& s = (*streams)[device.index()];
  if (!s) {
    CurrentDevice current(device);
    // Non-blocking: nothing on the legacy default stream (a library's stray call) joins the
    // compute stream's order implicitly, which would also break a CUDA graph capture on it.
    // Everything galley orders against it goes through events.
    cuda_check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "creating the compute stream",
               device);
  }
  return s;
}

void* create_stream(Device device, bool high_priority) {
  CurrentDevice current(device);
  int least = 0, greatest = 0;
  cuda_check(cudaDeviceGetStreamPriorityRange(&least, &greatest), "stream priorities", device);
  cudaStream_t s = nullptr;
  cuda_check(
      cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, high_priority ? greatest : least),
      "creating a stream", device);
  return s;
}

void destroy_stream(Device device, void* stream) noexcept {
  if (!stream) return;
  CurrentDevice current(device);
  if (cudaStreamDestroy(as_stream(stream)) != cudaSuccess) (void)cudaGetLastError();
}

void make_current(Device device) {
  int now = -1;
  if (cudaGetDevice(&now) == cudaSuccess && now == device.index()) return;
  cuda_check(cudaSetDevice(device.index()), "making the device current", device);
}

void fill_elements(Device device, void* dst, size_t count, uint64_t pattern, int width) {
  CurrentDevice current(device);
  if (width == 4)
    kernels::cuda::fill_u32(static_cast<uint32_t*>(dst), count, uint32_t(pattern),
                            compute_stream(device));
  else
    kernels::cuda::fill_bytes(dst, count * size_t(width), pattern, width, compute_stream(device));
  const cudaError_t launch = cudaGetLastError();
  if (launch != cudaErrorNotReady) cuda_check(launch, "fill", device);
}

void convert_elements(Device device, const void* src, DType from, void* dst, DType to,
                      size_t count) {
  CurrentDevice current(device);
  kernels::cuda::convert(src, from, dst, to, static_cast<int64_t>(count), compute_stream(device));
  const cudaError_t launch = cudaGetLastError();
  if (launch != cudaErrorNotReady) cuda_check(launch, "convert", device);
}

void* pinned_alloc(size_t bytes) {
  if (cuda_device_count() == 0) return nullptr;
  void* p = nullptr;
  // Portable: usable with every GPU of the process; mapped: kernels may write into it.
  if (cudaHostAlloc(&p, std::max<size_t>(bytes, 1), cudaHostAllocPortable | cudaHostAllocMapped) !=
      cudaSuccess) {
    (void)cudaGetLastError();
    throw OutOfMemoryError(str_cat("page-locked host memory: cannot allocate ", bytes,
                                   " bytes (the system limits locked memory; use ordinary "
                                   "host memory or a smaller pool)"));
  }
  return p;
}

void pinned_free(void* p) noexcept {
  if (p && cudaFreeHost(p) != cudaSuccess) (void)cudaGetLastError();
}

Event::Event(Device device) : device_(device) {
  CurrentDevice current(device);
  cudaEvent_t e = nullptr;
  cuda_check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "creating an event", device);
  event_ = e;
}
Event::~Event() {
  if (!event_) return;
  CurrentDevice current(device_);
  if (cudaEventDestroy(static_cast<cudaEvent_t>(event_)) != cudaSuccess) (void)cudaGetLastError();
}
void Event::record(void* stream) {
  CurrentDevice current(device_);
  cuda_check(cudaEventRecord(static_cast<cudaEvent_t>(event_), as_stream(stream)), "event record",
             device_);
  recorded_ = true;
}
void Event::wait(void* stream) const {
  if (!event_ || !recorded_) return;
  CurrentDevice current(device_);
  cuda_check(cudaStreamWaitEvent(as_stream(stream), static_cast<cudaEvent_t>(event_), 0),
             "stream wait", device_);
}
void Event::synchronize() const {
  if (!event_ || !recorded_) return;
  cuda_check(cudaEventSynchronize(static_cast<cudaEvent_t>(event_)), "event synchronize", device_);
}
bool Event::done() const {
  if (!event_ || !recorded_) return true;
  const cudaError_t rc = cudaEventQuery(static_cast<cudaEvent_t>(event_));
  if (rc == cudaErrorNotReady) {
    // A status, not a failure: keep it from reaching the next cudaGetLastError on this thread.
    if (cudaPeekAtLastError() == cudaErrorNotReady) (void)cudaGetLastError();
    return false;
  }
  cuda_check(rc, "event query", device_);
  return true;
}

int64_t* error_slot(Device device) {
  static std::mutex mu;
  static auto* slots = new std::vector<int64_t*>();
  std::lock_guard<std::mutex> lock(mu);
  if (slots->size() <= size_t(device.index())) slots->resize(device.index() + 1, nullptr);
  int64_t*& slot = (*slots)[device.index()];
  if (!slot) {
    CurrentDevice current(device);
    void* p = nullptr;
    cuda_check(cudaHostAlloc(&p, 4 * sizeof(int64_t), cudaHostAllocPortable | cudaHostAllocMapped),
               "allocating the error slot", device);
    slot = static_cast<int64_t*>(p);
    std::fill_n(slot, 4, int64_t(0));
  }
  return slot;  // with unified addressing the host pointer is the device pointer
}

void check_launch_errors() {
  if (cuda_device_count() == 0) return;  // no launches (and no runtime to ask)
  const cudaError_t launch = cudaGetLastError();
  if (launch == cudaSuccess || launch == cudaErrorNotReady) return;
  int device = -1;
  if (cudaGetDevice(&device) != cudaSuccess) (void)cudaGetLastError();
  throw Error(str_cat("a kernel launch on cuda:", device, " failed: ", cudaGetErrorString(launch),
                      " (", cudaGetErrorName(launch), ")"));
}

void check_deferred_errors(Device device) {
  if (!device.is_cuda()) return;
  // Kernel launches return nothing; a launch this thread made that CUDA refused (a bad
  // configuration, too many resources) is reported here rather than left as unwritten output.
  const cudaError_t launch = cudaGetLastError();
  GALLEY_CHECK(launch == cudaSuccess || launch == cudaErrorNotReady, "a kernel launch on ",
               device.str(), " failed earlier: ", cudaGetErrorString(launch));
  volatile int64_t* slot = error_slot(device);
  const int64_t code = slot[0];
  if (code == 0) return;
  const int64_t a = slot[1], b = slot[2], c = slot[3];
  slot[0] = 0;
  if (code == static_cast<int64_t>(DeferredError::LabelOutOfRange))
    throw Error(str_cat("cross_entropy on ", device.str(), ": label ", b, " at row ", a,
                        " is outside [0, ", c,
                        ") (found by the GPU in an earlier step, which left that row out of its "
                        "loss)"));
  if (code == static_cast<int64_t>(DeferredError::NonFiniteLoss)) {
    float loss;
    const uint32_t bits = static_cast<uint32_t>(a);
    std::memcpy(&loss, &bits, sizeof loss);
    throw Error(str_cat(
        "backward: the loss is ", loss != loss ? "nan" : str_cat(loss), " (on ", device.str(),
        ", found by the GPU after that backward() was queued: its gradients, and any optimizer "
        "step queued after it, are not finite). galley::set_detect_anomaly(true) names the op "
        "that first produced a non-finite value; galley::set_check_loss_finite(false) turns "
        "this check off"));
  }
  throw Error(str_cat(device.str(), ": a kernel reported error code ", code));
}
#else
namespace {
[[noreturn]] void no_backend(Device device) {
  throw Error(
      str_cat(device.str(),
              ": this build of galley has no CUDA backend (configure "
              "with the CUDA toolkit, cuDNN and NCCL present, GALLEY_WITH_CUDA=AUTO or ON)"));
}
}  // namespace
void* device_alloc(Device device, size_t) {
  no_backend(device);
}
void device_free(Device, void*) noexcept {}
void open_pool(Device device, uintptr_t) {
  no_backend(device);
}
void release_pool(Device, uintptr_t) noexcept {}
void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) {
  if (!dst_device.is_cpu()) no_backend(dst_device);
  if (!src_device.is_cpu()) no_backend(src_device);
  if (bytes != 0) std::memcpy(dst, src, bytes);  // an empty tensor's pointer may be null
}
void copy_bytes_async(void* dst, Device dst_device, const void* src, Device src_device,
                      size_t bytes, void*) {
  copy_bytes(dst, dst_device, src, src_device, bytes);
}
void* compute_stream(Device device) {
  no_backend(device);
}
void* create_stream(Device device, bool) {
  no_backend(device);
}
void destroy_stream(Device, void*) noexcept {}
void make_current(Device device) {
  no_backend(device);
}
void fill_elements(Device device, void*, size_t, uint64_t, int) {
  no_backend(device);
}
void convert_elements(Device device, const void*, DType, void*, DType, size_t) {
  no_backend(device);
}
void* pinned_alloc(size_t) {
  return nullptr;
}
void pinned_free(void*) noexcept {}
Event::Event(Device device) : device_(device) {
  no_backend(device);
}
Event::~Event() = default;
void Event::record(void*) {}
void Event::wait(void*) const {}
void Event::synchronize() const {}
bool Event::done() const {
  return true;
}
int64_t* error_slot(Device device) {
  no_backend(device);
}
void check_deferred_errors(Device) {}
void check_launch_errors() {}
#endif

Event::Event(Event&& o) noexcept
    : device_(o.device_), event_(std::exchange(o.event_, nullptr)), recorded_(o.recorded_) {}
Event& Event::operator=(Event&& o) noexcept {
  if (this != &o) {
    Event tmp(std::move(*this));
    device_ = o.device_;
    event_ = std::exchange(o.event_, nullptr);
    recorded_ = o.recorded_;
  }
  return *this;
}

}  // namespace detail

// ---------------------------------------------------------------------------------------------
// galley::cuda

namespace cuda {

bool available() {
  return cuda_device_count() > 0;
}

std::string device_name(int index) {
  GALLEY_CHECK(index >= 0 && index < cuda_device_count(), "cuda:", index,
               " does not exist: this machine has ", cuda_device_count(), " CUDA device(s)");
#ifdef GALLEY_HAVE_CUDA
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, index) != cudaSuccess) {
    (void)cudaGetLastError();
    return "cuda:" + std::to_string(index);
  }
  return prop.name;
#else
  return "";
#endif
}

size_t total_memory(int index) {
  return detail::cuda_allocator(index).memory().total_bytes();
}

void synchronize(Device device) {
  if (!device.is_cuda()) return;
  GALLEY_CHECK(device.index() < cuda_device_count(), device.str(), " does not exist");
#ifdef GALLEY_HAVE_CUDA
  detail::CurrentDevice current(device);
  detail::cuda_check(cudaDeviceSynchronize(), "synchronize", device);
  detail::check_deferred_errors(device);
#endif
}

}  // namespace cuda

}  // namespace galley
