#pragma once
// Element type conversions (the kernels of Tensor::to(DType)): float32 to and from bfloat16 and
// float16 with round to nearest even, bit for bit as galley/half.h's scalar conversions (a NaN
// may come back as the canonical NaN from a GPU's conversion instructions, which keep neither
// its sign nor its payload); the
// 16-bit types between each other through float32; int64 and uint8 to and from float32 (to an
// integer truncated toward zero and saturated, NaN to 0: galley/half.h's float_to_int64). On the
// host vectorised (F16C for float16 where the CPU has it; bfloat16 is integer arithmetic the
// compiler vectorises, or vcvtneps2bf16 where the build has AVX512-BF16) and split over the worker
// threads for large n.
#include <cstdint>

#include "galley/dtype.h"
#include "galley/half.h"
#if defined(__AVX512BF16__)
#include "kernels/cpu/bf16_avx512.h"
#endif

namespace galley::kernels {
namespace cpu {

// bfloat16 inline: integer arithmetic the compiler vectorises in place, so the short blocks of
// the staged kernels (kernels/cpu/staged.h) pay no call.
inline void to_float(const bfloat16* src, float* dst, int64_t n) {
  const uint16_t* s = reinterpret_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < n; ++i) dst[i] = detail::bf16_bits_to_float(s[i]);
}
inline void from_float(const float* src, bfloat16* dst, int64_t n) {
  uint16_t* d = reinterpret_cast<uint16_t*>(dst);
  int64_t i = 0;
#if defined(__AVX512BF16__)
  // vcvtneps2bf16 (cpu/bf16_avx512.h's bf16_halves: the same bits, subnormals included)
  for (; i + 16 <= n; i += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i), bf16_halves(_mm512_loadu_ps(src + i)));
#endif
  for (; i < n; ++i) d[i] = detail::float_to_bf16_bits(src[i]);
}
void to_float(const float16* src, float* dst, int64_t n);
void from_float(const float* src, float16* dst, int64_t n);

// n elements of `src` (dtype `from`) into `dst` (dtype `to`); the pair must satisfy
// is_convertible (galley/half.h), else galley::Error names both dtypes.
void convert(const void* src, DType from, void* dst, DType to, int64_t n);

}  // namespace cpu

namespace cuda {

// As cpu::convert, on `stream` (a cudaStream_t); the caller checks the pair.
void convert(const void* src, DType from, void* dst, DType to, int64_t n, void* stream);

}  // namespace cuda
}  // namespace galley::kernels
