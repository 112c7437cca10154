#include "gpu_monitor.h"

#include <dlfcn.h>

#include <type_traits>

namespace galley::launch {
namespace {

// The few NVML declarations used, from its stable C ABI (nvml.h is not needed to build).
using nvmlReturn_t = int;
using nvmlDevice_t = struct nvmlDevice_st*;
struct nvmlUtilization_t {
  unsigned int gpu;
  unsigned int memory;
};
struct nvmlMemory_t {
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};
constexpr nvmlReturn_t NVML_SUCCESS = 0;

}  // namespace

struct GpuMonitor::Api {
  nvmlReturn_t (*init)() = nullptr;
  nvmlReturn_t (*shutdown)() = nullptr;
  nvmlReturn_t (*count)(unsigned int*) = nullptr;
  nvmlReturn_t (*handle_by_index)(unsigned int, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*utilization)(nvmlDevice_t, nvmlUtilization_t*) = nullptr;
  nvmlReturn_t (*memory)(nvmlDevice_t, nvmlMemory_t*) = nullptr;
};

GpuMonitor::GpuMonitor() {
  void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    reason_ = "NVML (libnvidia-ml.so.1) not found: no NVIDIA driver on this machine";
    return;
  }
  auto* api = new Api;
  auto load = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
    return fn != nullptr;
  };
  bool ok = load(api->init, "nvmlInit_v2") && load(api->shutdown, "nvmlShutdown") &&
            load(api->count, "nvmlDeviceGetCount_v2") &&
            load(api->handle_by_index, "nvmlDeviceGetHandleByIndex_v2") &&
            load(api->utilization, "nvmlDeviceGetUtilizationRates") &&
            load(api->memory, "nvmlDeviceGetMemoryInfo");
  if (!ok) {
    reason_ = "NVML found but lacks the functions used (driver too old?)";
  } else if (api->init() != NVML_SUCCESS) {
    reason_ = "NVML found but could not be initialised (driver not loaded?)";
    ok = false;
  }
  if (!ok) {
    delete api;
    dlclose(lib);
    return;
  }
  handle_ = lib;
  api_ = api;
}

GpuMonitor::~GpuMonitor() {
  if (!handle_) return;
  api_->shutdown();
  delete api_;
  dlclose(handle_);
}

std::vector<GpuInfo> GpuMonitor::devices() const {
  std::vector<GpuInfo> gpus;
  if (!handle_) return gpus;
  unsigned int count = 0;
  if (api_->count(&count) != NVML_SUCCESS) return gpus;
  for (unsigned int i = 0; i < count; ++i) {
    nvmlDevice_t device = nullptr;
    nvmlMemory_t memory{};
    long mb = 0;
    if (api_->handle_by_index(i, &device) == NVML_SUCCESS &&
        api_->memory(device, &memory) == NVML_SUCCESS)
      mb = long(memory.total >> 20);
    gpus.push_back(GpuInfo{int(i), mb});
  }
  return gpus;
}

std::vector<GpuSample> GpuMonitor::sample(const std::vector<int>& ids) const {
  std::vector<GpuSample> samples;
  if (!handle_) return samples;
  for (int id : ids) {
    nvmlDevice_t device = nullptr;
    nvmlUtilization_t util{};
    nvmlMemory_t memory{};
    if (id < 0 || api_->handle_by_index(unsigned(id), &device) != NVML_SUCCESS) continue;
    if (api_->utilization(device, &util) != NVML_SUCCESS) continue;
    if (api_->memory(device, &memory) != NVML_SUCCESS) continue;
    samples.push_back(GpuSample{id, util.gpu, long(memory.used >> 20)});
  }
  return samples;
}

}  // namespace galley::launch
