#include "kernels/convert.h"

#if defined(__F16C__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "galley/error.h"
#include "kernels/cpu/parallel.h"

namespace galley::kernels::cpu {

void to_float(const float16* src, float* dst, int64_t n) {
  const uint16_t* s = reinterpret_cast<const uint16_t*>(src);
  int64_t i = 0;
#if defined(__F16C__)
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i,
                     _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i))));
#endif
  for (; i < n; ++i) dst[i] = detail::half_bits_to_float(s[i]);
}

void from_float(const float* src, float16* dst, int64_t n) {
  uint16_t* d = reinterpret_cast<uint16_t*>(dst);
  int64_t i = 0;
#if defined(__F16C__)
  // vcvtps2ph rounds to nearest even like float_to_half_bits; it keeps a NaN's payload where
  // the scalar form sets the quiet bit, and both leave a NaN a NaN.
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
#endif
  for (; i < n; ++i) d[i] = detail::float_to_half_bits(src[i]);
}

namespace {

const void* at(const void* p, DType t, int64_t i) {
  return static_cast<const char*>(p) + i * int64_t(dtype_size(t));
}
void* at(void* p, DType t, int64_t i) {
  return static_cast<char*>(p) + i * int64_t(dtype_size(t));
}

// n elements from src to dst (pointers at the first element of the chunk).
void convert_n(const void* src, DType from, void* dst, DType to, int64_t n) {
  if (from == DType::Float32 && to == DType::BFloat16)
    return from_float(static_cast<const float*>(src), static_cast<bfloat16*>(dst), n);
  if (from == DType::Float32 && to == DType::Float16)
    return from_float(static_cast<const float*>(src), static_cast<float16*>(dst), n);
  if (from == DType::BFloat16 && to == DType::Float32)
    return to_float(static_cast<const bfloat16*>(src), static_cast<float*>(dst), n);
  if (from == DType::Float16 && to == DType::Float32)
    return to_float(static_cast<const float16*>(src), static_cast<float*>(dst), n);
  if (is_floating_point(from) && is_floating_point(to)) {
    // Between the 16-bit types: through float32, in blocks on the stack.
    constexpr int64_t kBlock = 1024;
    float tmp[kBlock];
    for (int64_t i = 0; i < n; i += kBlock) {
      const int64_t m = std::min(kBlock, n - i);
      convert_n(at(src, from, i), from, tmp, DType::Float32, m);
      convert_n(tmp, DType::Float32, at(dst, to, i), to, m);
    }
    return;
  }
  // float32 and the integer types: to an integer truncated and saturated (half.h), from one as
  // C++ converts.
  auto cast = [n](auto* out, const auto* in) {
    using O = std::remove_pointer_t<decltype(out)>;
    for (int64_t i = 0; i < n; ++i) out[i] = static_cast<O>(in[i]);
  };
  if (from == DType::Float32 && to == DType::Int64) {
    const float* s = static_cast<const float*>(src);
    int64_t* d = static_cast<int64_t*>(dst);
    for (int64_t i = 0; i < n; ++i) d[i] = detail::float_to_int64(s[i]);
    return;
  }
  if (from == DType::Float32 && to == DType::UInt8) {
    const float* s = static_cast<const float*>(src);
    uint8_t* d = static_cast<uint8_t*>(dst);
    for (int64_t i = 0; i < n; ++i) d[i] = detail::float_to_uint8(s[i]);
    return;
  }
  if (from == DType::Int64 && to == DType::Float32)
    return cast(static_cast<float*>(dst), static_cast<const int64_t*>(src));
  if (from == DType::UInt8 && to == DType::Float32)
    return cast(static_cast<float*>(dst), static_cast<const uint8_t*>(src));
}

}  // namespace

void convert(const void* src, DType from, void* dst, DType to, int64_t n) {
  if (from == to) {
    std::memcpy(dst, src, static_cast<size_t>(n) * dtype_size(from));
    return;
  }
  // Checked before any thread starts, so an unsupported pair is one error on the caller.
  GALLEY_CHECK(is_convertible(from, to), "convert: cannot convert ", dtype_name(from), " to ",
               dtype_name(to), " directly (go through float32)");
  parallel_balanced(n, kElementwiseGrain, [&](int64_t s, int64_t e) {
    convert_n(at(src, from, s), from, at(dst, to, s), to, e - s);
  });
}

}  // namespace galley::kernels::cpu
