// One caching allocator per CUDA device, created on first use (never during static
// initialisation), over the CUDA runtime.
#include "galley/runtime/memory.h"

#include <memory>
#include <mutex>
#include <vector>

#include "galley/error.h"
#include "src/runtime/caching_allocator.h"

#ifdef GALLEY_HAVE_CUDA
#include <cuda_runtime_api.h>
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

}  // namespace galley
