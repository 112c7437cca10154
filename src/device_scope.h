#pragma once
// Which device new tensors belong to while an op runs (internal).
//
// An op opens a DeviceScope for its inputs' device, and every tensor Tensor::empty makes for
// the default device (cpu:0) inside it goes to that device instead, so outputs, gradients and
// optimizer state stay on the device of the inputs without every kernel passing a device
// around. (Several CPU devices share host memory; the index keeps a replica's tensors apart.)
#include "galley/device.h"

namespace galley::detail {

class DeviceScope {
 public:
  explicit DeviceScope(Device device);
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  Device prev_;
};

// The device new default tensors get inside the innermost scope (cpu:0 outside any).
Device current_device();

}  // namespace galley::detail
