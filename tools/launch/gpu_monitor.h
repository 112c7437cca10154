#pragma once
/// \file
/// GPU inventory and utilisation through NVML, loaded at run time with dlopen so that the
/// launcher runs (and links) on machines without a GPU driver.

#include <string>
#include <vector>

#include "scheduler.h"

namespace galley::launch {

/// One utilisation sample of one GPU.
struct GpuSample {
  /// GPU index.
  int id = 0;
  /// Percent of the last sample period a kernel was running.
  unsigned utilization_percent = 0;
  /// Device memory in use, MiB (all processes).
  long memory_used_mb = 0;
};

/// Loads libnvidia-ml.so.1 if present; otherwise every query reports nothing.
class GpuMonitor {
 public:
  /// Tries to load and initialise NVML; never throws.
  GpuMonitor();
  ~GpuMonitor();
  GpuMonitor(const GpuMonitor&) = delete;
  GpuMonitor& operator=(const GpuMonitor&) = delete;

  /// Whether NVML was loaded and initialised.
  bool available() const { return handle_ != nullptr; }
  /// Why NVML is not available (empty when it is).
  const std::string& unavailable_reason() const { return reason_; }
  /// The GPUs NVML sees, with their memory.
  std::vector<GpuInfo> devices() const;
  /// One sample of each of `ids` that NVML knows; ids it does not know are left out.
  std::vector<GpuSample> sample(const std::vector<int>& ids) const;

 private:
  struct Api;
  void* handle_ = nullptr;
  Api* api_ = nullptr;
  std::string reason_;
};

}  // namespace galley::launch
