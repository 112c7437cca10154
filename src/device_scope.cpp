// Which device new default tensors go to while an op runs (see device_scope.h).
#include "device_scope.h"

#include "runtime/device_memory.h"

namespace galley::detail {

namespace {
thread_local Device tls_device = Device::cpu();
}
DeviceScope::DeviceScope(Device device) : prev_(tls_device) {
  tls_device = device;
  // Kernels go to the device's streams, which CUDA accepts only from its current device.
  if (device.is_cuda()) make_current(device);
}
DeviceScope::~DeviceScope() {
  tls_device = prev_;
}
Device current_device() {
  return tls_device;
}

}  // namespace galley::detail
