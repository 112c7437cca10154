// A stand-in for libnvidia-ml.so.1 with two GPUs, so that the launcher's NVML path (inventory,
// sampling, summary) runs in tests on machines without a driver. GPU i reports 50 + 10 i percent
// utilisation, 80 GiB of memory and i + 1 GiB in use.

extern "C" {

struct nvmlDevice_st;
using nvmlDevice_t = nvmlDevice_st*;
struct nvmlUtilization_t {
  unsigned int gpu;
  unsigned int memory;
};
struct nvmlMemory_t {
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};

int nvmlInit_v2() {
  return 0;
}
int nvmlShutdown() {
  return 0;
}
int nvmlDeviceGetCount_v2(unsigned int* count) {
  *count = 2;
  return 0;
}
int nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t* device) {
  if (index >= 2) return 2;  // NVML_ERROR_INVALID_ARGUMENT
  *device = reinterpret_cast<nvmlDevice_t>(static_cast<unsigned long>(index) + 1);
  return 0;
}
int nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t* util) {
  const auto index = reinterpret_cast<unsigned long>(device) - 1;
  util->gpu = 50 + 10 * static_cast<unsigned int>(index);
  util->memory = 0;
  return 0;
}
int nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t* memory) {
  const auto index = reinterpret_cast<unsigned long>(device) - 1;
  memory->total = 80ull << 30;
  memory->used = (index + 1) << 30;
  memory->free = memory->total - memory->used;
  return 0;
}
}
