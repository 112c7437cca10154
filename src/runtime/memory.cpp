// One caching allocator per CUDA device, created on first use (never during static
// initialisation), over the CUDA runtime.
#include "galley/runtime/memory.h"

#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "galley/error.h"
#include "galley/runtime/cuda.h"
#include "src/runtime/caching_allocator.h"
#include "src/runtime/device_memory.h"

#ifdef GALLEY_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "kernels/cuda/fill.cuh"
#endif

namespace galley {

namespace detail {
namespace {

#ifdef GALLEY_HAVE_CUDA
class CudaMemory : public DeviceMemory {
 public:
  explicit CudaMemory(int device) : device_(device) {
    int prev = 0;
    cudaGetDevice(&prev);
    cudaSetDevice(device_);
    size_t free_bytes = 0;
    if (cudaMemGetInfo(&free_bytes, &total_) != cudaSuccess) {
      (void)cudaGetLastError();
      total_ = 0;
    }
    cudaSetDevice(prev);
  }
  void* allocate(size_t bytes) override {
    int prev = 0;
    cudaGetDevice(&prev);
    cudaSetDevice(device_);
    void* p = nullptr;
    if (cudaMalloc(&p, bytes) != cudaSuccess) {
      (void)cudaGetLastError();  // an out-of-memory is reported by the allocator, with context
      p = nullptr;
    }
    cudaSetDevice(prev);
    return p;
  }
  void release(void* p) override {
    // Never throws: this runs from destructors. A failure here leaves memory to the driver.
    int prev = 0;
    cudaGetDevice(&prev);
    cudaSetDevice(device_);
    if (cudaFree(p) != cudaSuccess) (void)cudaGetLastError();
    cudaSetDevice(prev);
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

#ifdef GALLEY_HAVE_CUDA
namespace {
// Throws with the failed call and CUDA's own words.
void cuda_check(cudaError_t rc, const char* what, Device device) {
  if (rc == cudaSuccess) return;
  (void)cudaGetLastError();
  GALLEY_CHECK(false, what, " on ", device.str(), " failed: ", cudaGetErrorString(rc));
}

// Makes `device` current for the scope, restoring the caller's device after.
class CurrentDevice {
 public:
  explicit CurrentDevice(int index) {
    cudaGetDevice(&prev_);
    if (index != prev_) cudaSetDevice(index);
  }
  ~CurrentDevice() { cudaSetDevice(prev_); }

 private:
  int prev_ = 0;
};
}  // namespace

void* device_alloc(Device device, size_t bytes) {
  return cuda_allocator(device.index()).allocate(bytes);
}

void device_free(Device device, void* p) noexcept {
  try {
    cuda_allocator(device.index()).free(p);
  } catch (...) {
    // A free that fails at exit is left to the driver rather than aborting the process.
  }
}

void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) {
  if (bytes == 0) return;
  if (dst_device.is_cpu() && src_device.is_cpu()) {
    std::memcpy(dst, src, bytes);
    return;
  }
  const Device gpu = dst_device.is_cuda() ? dst_device : src_device;
  CurrentDevice current(gpu.index());
  cudaError_t rc;
  if (dst_device.is_cuda() && src_device.is_cuda() && dst_device != src_device)
    rc = cudaMemcpyPeer(dst, dst_device.index(), src, src_device.index(), bytes);
  else
    rc = cudaMemcpy(dst, src, bytes, cudaMemcpyDefault);
  cuda_check(rc, "copy", gpu);
}

void* compute_stream(Device device) {
  static std::mutex mu;
  static auto* streams = new std::vector<cudaStream_t>();
  std::lock_guard<std::mutex> lock(mu);
  if (streams->size() <= size_t(device.index())) streams->resize(device.index() + 1, nullptr);
  cudaStream_t& s = (*streams)[device.index()];
  if (!s) {
    CurrentDevice current(device.index());
    cuda_check(cudaStreamCreate(&s), "creating the compute stream", device);
  }
  return s;
}

void fill_words(Device device, void* dst, size_t count, uint32_t pattern) {
  CurrentDevice current(device.index());
  kernels::cuda::fill_u32(static_cast<uint32_t*>(dst), count, pattern, compute_stream(device));
  cuda_check(cudaGetLastError(), "fill", device);
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
void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) {
  if (!dst_device.is_cpu()) no_backend(dst_device);
  if (!src_device.is_cpu()) no_backend(src_device);
  std::memcpy(dst, src, bytes);
}
void* compute_stream(Device device) {
  no_backend(device);
}
void fill_words(Device device, void*, size_t, uint32_t) {
  no_backend(device);
}
#endif

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
  detail::CurrentDevice current(device.index());
  detail::cuda_check(cudaDeviceSynchronize(), "synchronize", device);
#endif
}

}  // namespace cuda

}  // namespace galley
