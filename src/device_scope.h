#pragma once
// Which CPU "device" new tensors belong to while an op runs (internal).
//
// Several CPU devices share host memory; the index is what keeps a replica's tensors apart.
// An op opens a DeviceScope for its inputs' device, and every tensor Tensor::empty makes for
// cpu:0 inside it is tagged with that device instead, so outputs and gradients stay on the
// device of the inputs without every kernel passing a device around.
#include "galley/device.h"

namespace galley::detail {

class DeviceScope {
 public:
  explicit DeviceScope(Device device);
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int prev_;
};

// The CPU index new tensors get inside the innermost scope (0 outside any).
int current_cpu_index();

}  // namespace galley::detail
