#pragma once
/// \file Devices a tensor can live on.
#include <cstdint>
#include <string>
#include <vector>

namespace galley {

/// Kind of device.
enum class DeviceType : uint8_t { CPU, CUDA };

/// A device: the host CPU or one CUDA GPU by index (after CUDA_VISIBLE_DEVICES).
class Device {
 public:
  /// The host CPU. Several CPU "devices" may be named by index for data-parallel testing.
  static Device cpu(int index = 0) { return Device(DeviceType::CPU, index); }
  /// CUDA device `index`.
  static Device cuda(int index = 0) { return Device(DeviceType::CUDA, index); }

  Device() = default;
  Device(DeviceType type, int index) : type_(type), index_(index) {}

  /// Kind of device.
  DeviceType type() const { return type_; }
  /// Index among devices of its kind.
  int index() const { return index_; }
  /// True for the host.
  bool is_cpu() const { return type_ == DeviceType::CPU; }
  /// True for a GPU.
  bool is_cuda() const { return type_ == DeviceType::CUDA; }
  /// "cpu", "cpu:1", "cuda:0".
  std::string str() const;

  /// True when both name the same memory: the same device, or any two CPU devices (the host's
  /// memory is one; a CPU index only places a data-parallel replica).
  bool same_memory(const Device& o) const { return *this == o || (is_cpu() && o.is_cpu()); }

  bool operator==(const Device& o) const { return type_ == o.type_ && index_ == o.index_; }
  bool operator!=(const Device& o) const { return !(*this == o); }

 private:
  DeviceType type_ = DeviceType::CPU;
  int index_ = 0;
};

/// Number of usable CUDA devices; 0 when the CUDA backend is absent, no driver or no GPU.
int cuda_device_count();
/// Every CUDA device if there is one, else the CPU.
std::vector<Device> all_devices();

}  // namespace galley
