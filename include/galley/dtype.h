#pragma once
/// \file Element types.
#include <cstddef>
#include <cstdint>
#include <string>

namespace galley {

/// Element type of a tensor. Float32 is the compute type today; Int64 carries class labels.
enum class DType : uint8_t { Float32, Float16, BFloat16, Int64, UInt8 };

/// Bytes per element of `t`.
size_t dtype_size(DType t);
/// Lower-case name of `t` ("float32", "int64", ...).
std::string dtype_name(DType t);

/// Maps a C++ element type to its DType.
template <typename T>
struct dtype_of;
template <>
struct dtype_of<float> {
  static constexpr DType value = DType::Float32;
};
template <>
struct dtype_of<int64_t> {
  static constexpr DType value = DType::Int64;
};
template <>
struct dtype_of<uint8_t> {
  static constexpr DType value = DType::UInt8;
};

}  // namespace galley
