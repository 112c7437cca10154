#pragma once
/// \file The 16-bit floating element types, their conversions to and from float, and the
/// dispatch helper that picks a kernel's instantiation from a tensor's dtype.
///
/// Conversions round to nearest even, as PyTorch's do: a float32 value converts to the same
/// bits here as with `torch.Tensor.to(torch.bfloat16)` / `torch.float16`. NaN stays NaN (quiet,
/// sign kept), infinities stay infinities, a float32 too large for float16 becomes infinity.
/// Usable in CUDA device code as well (the same storage as `__nv_bfloat16` / `__half`).
#include <cstdint>
#include <cstring>

#include "galley/dtype.h"
#include "galley/error.h"

#if defined(__CUDACC__)
#define GALLEY_HOST_DEVICE __host__ __device__
#else
#define GALLEY_HOST_DEVICE
#endif

namespace galley {

namespace detail {

// float32 to an integer type, truncated toward zero and saturated: NaN gives 0, a value past the
// type's range its nearest end (the conversion C++ leaves undefined there; CUDA's cvt.rzi gives
// the same). Tensor::to(Int64 / UInt8) on the host and on a GPU alike.
GALLEY_HOST_DEVICE inline int64_t float_to_int64(float v) {
  if (!(v == v)) return 0;
  if (v >= 0x1p63f) return INT64_MAX;
  if (v < -0x1p63f) return INT64_MIN;
  return static_cast<int64_t>(v);
}
GALLEY_HOST_DEVICE inline uint8_t float_to_uint8(float v) {
  if (!(v > 0.f)) return 0;  // NaN, and values in (-1, 0] that truncate to 0
  if (v >= 255.f) return 255;
  return static_cast<uint8_t>(v);
}

GALLEY_HOST_DEVICE inline uint32_t float_bits(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  return x;
}
GALLEY_HOST_DEVICE inline float bits_float(uint32_t x) {
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

/// float32 to bfloat16 bits, round to nearest even; a NaN keeps its sign and top payload, quiet.
GALLEY_HOST_DEVICE inline uint16_t float_to_bf16_bits(float f) {
  const uint32_t x = float_bits(f);
  const uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  const uint32_t nan = (x >> 16) | 0x40u;
  return static_cast<uint16_t>((x & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}
GALLEY_HOST_DEVICE inline float bf16_bits_to_float(uint16_t b) {
  return bits_float(uint32_t(b) << 16);
}

/// float32 to IEEE binary16 bits, round to nearest even (subnormals included); overflow gives
/// infinity, a NaN stays a quiet NaN with its sign.
GALLEY_HOST_DEVICE inline uint16_t float_to_half_bits(float f) {
  const uint32_t x = float_bits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t abs = x & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds past 65504
  if (abs < 0x38800000u) {  // below the smallest normal half: a subnormal or zero
    if (abs < 0x33000000u) return static_cast<uint16_t>(sign);  // at most half the smallest
    const uint32_t shift = 126u - (abs >> 23);                  // 14 .. 24
    const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    uint32_t h = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1u))) ++h;
    return static_cast<uint16_t>(sign | h);
  }
  uint32_t h = (abs - 0x38000000u) >> 13;
  const uint32_t rem = abs & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}
GALLEY_HOST_DEVICE inline float half_bits_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  if (exp == 0x1f) return bits_float(sign | 0x7f800000u | (mant << 13));
  if (exp != 0) return bits_float(sign | ((exp + 112) << 23) | (mant << 13));
  // Zero or subnormal: mant * 2^-24, exact in float32.
  const float magnitude = float(mant) * 5.9604644775390625e-8f;
  return sign ? -magnitude : magnitude;
}

}  // namespace detail

/// A 16-bit floating element of the encoding `Format` (its to_bits / from_bits conversions):
/// stored as its bits, converted to float for arithmetic.
template <typename Format>
struct float16_storage {
  uint16_t bits = 0;
  float16_storage() = default;
  GALLEY_HOST_DEVICE float16_storage(float f) : bits(Format::to_bits(f)) {}
  GALLEY_HOST_DEVICE operator float() const { return Format::to_float(bits); }
  static GALLEY_HOST_DEVICE float16_storage from_bits(uint16_t b) {
    float16_storage v;
    v.bits = b;
    return v;
  }
};

namespace detail {
struct BFloat16Format {
  static GALLEY_HOST_DEVICE uint16_t to_bits(float f) { return float_to_bf16_bits(f); }
  static GALLEY_HOST_DEVICE float to_float(uint16_t b) { return bf16_bits_to_float(b); }
};
struct Float16Format {
  static GALLEY_HOST_DEVICE uint16_t to_bits(float f) { return float_to_half_bits(f); }
  static GALLEY_HOST_DEVICE float to_float(uint16_t b) { return half_bits_to_float(b); }
};
}  // namespace detail

/// bfloat16: float32's sign and exponent with 7 mantissa bits.
using bfloat16 = float16_storage<detail::BFloat16Format>;
/// IEEE binary16: 5 exponent and 10 mantissa bits (largest finite 65504).
using float16 = float16_storage<detail::Float16Format>;

template <>
struct dtype_of<bfloat16> {
  static constexpr DType value = DType::BFloat16;
};
template <>
struct dtype_of<float16> {
  static constexpr DType value = DType::Float16;
};

/// True for the floating dtypes an op computes in: float32, bfloat16 and float16.
inline bool is_floating_point(DType t) {
  return t == DType::Float32 || t == DType::BFloat16 || t == DType::Float16;
}

/// True when Tensor::to converts `from` to `to` in one step: the same dtype, two floating
/// dtypes, or float32 and int64 / uint8 either way.
inline bool is_convertible(DType from, DType to) {
  return from == to || (is_floating_point(from) && is_floating_point(to)) ||
         from == DType::Float32 || to == DType::Float32;
}

/// Names a C++ element type for a dispatched lambda: `typename decltype(tag)::type`.
template <typename T>
struct type_tag {
  using type = T;
};

/// Calls `f(type_tag<T>{})` with T the element type of floating dtype `t` (float, bfloat16 or
/// float16): the one place where a kernel's instantiation is chosen. Any other dtype is an
/// error naming `op`.
///
///     dispatch_floating(x.dtype(), "relu", [&](auto tag) {
///       using T = typename decltype(tag)::type;
///       relu_kernel<T>(x.data<T>(), y.data<T>(), n);
///     });
template <typename F>
decltype(auto) dispatch_floating(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::Float32:
      return f(type_tag<float>{});
    case DType::BFloat16:
      return f(type_tag<bfloat16>{});
    case DType::Float16:
      return f(type_tag<float16>{});
    default:
      break;
  }
  GALLEY_CHECK(false, op, ": expected a float32, bfloat16 or float16 tensor, got ", dtype_name(t));
  return f(type_tag<float>{});  // not reached
}

}  // namespace galley
