#pragma once
// Elementwise loops over float32, bfloat16 or float16 arrays computed in float32: the 16-bit
// types are widened a block at a time into a buffer on the stack, so a kernel is written once
// for float and instantiated per element type (internal to the CPU kernels).
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "galley/half.h"
#include "kernels/convert.h"
#include "kernels/cpu/bf16_avx512.h"

namespace galley::kernels::cpu {

// Elements of the 16-bit types are computed in float32 a block at a time, staged on the stack.
constexpr int64_t kStageBlock = 256;

// `n` elements of T as float32: `src` itself for float, else widened into `buf`.
template <typename T>
inline const float* as_float(const T* src, int64_t n, float* buf) {
  if constexpr (std::is_same_v<T, float>) {
    (void)n, (void)buf;
    return src;
  } else {
    to_float(src, buf, n);
    return buf;
  }
}

// The float32 sum of n floats: kSumLanes independent partial sums (not one chain of dependent
// adds), element i into sum i % kSumLanes, then the sums added pairwise (halves onto halves). The
// order is the code's, not the compiler's vectorisation's: the same bits in every build.
constexpr int64_t kSumLanes = 32;
inline float sum_floats(const float* p, int64_t n) {
  alignas(64) float acc[kSumLanes] = {};
  const int64_t whole = n / kSumLanes * kSumLanes;
  for (int64_t i = 0; i < whole; i += kSumLanes)
#pragma omp simd
    for (int64_t k = 0; k < kSumLanes; ++k) acc[k] += p[i + k];
  for (int64_t k = 0; k < n - whole; ++k) acc[k] += p[whole + k];
  for (int64_t half = kSumLanes / 2; half > 0; half /= 2)
#pragma omp simd
    for (int64_t k = 0; k < half; ++k) acc[k] += acc[k + half];
  return acc[0];
}

#if defined(__AVX512BW__)
// 16 float32 lanes as a GCC vector, on which +, -, * and / act lane by lane.
using Lanes16 = float __attribute__((vector_size(64)));
#endif

// sum_floats of n elements of T widened to float32, with its bits: bfloat16 (AVX-512) read
// straight into the 32 partial sums, two vectors of them, and added pairwise as there.
template <typename T>
inline float sum_as_floats(const T* p, int64_t n, float* buf) {
#if defined(__AVX512BW__)
  static_assert(kSumLanes == 32, "two vectors of partial sums");
  if constexpr (std::is_same_v<T, bfloat16>) {
    __m512 lo = _mm512_setzero_ps(), hi = lo;
    for (int64_t i = 0; i < n; i += kSumLanes) {
      const __mmask16 m0 = lanes(n - i), m1 = n - i > 16 ? lanes(n - i - 16) : __mmask16(0);
      lo = _mm512_mask_add_ps(lo, m0, lo, load_as_f32(p + i, m0));
      hi = _mm512_mask_add_ps(hi, m1, hi, load_as_f32(p + i + 16, m1));
    }
    const __m512 s16 = _mm512_add_ps(lo, hi);  // halves onto halves: 16, 8, 4, 2, 1
    const __m256 s8 =
        _mm256_add_ps(_mm512_castps512_ps256(s16),
                      _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(s16), 1)));
    const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
  }
#endif
  return sum_floats(as_float(p, n, buf), n);
}

// o[i] = f(a[i]) for n elements of T, computed in float32. bfloat16 goes 16 lanes at a time in
// registers where f also takes Lanes16 (with the bits f gives each lane as a float).
template <typename T, typename F>
inline void map_n(const T* a, T* o, int64_t n, F f) {
#if defined(__AVX512BW__)
  if constexpr (std::is_same_v<T, bfloat16> && std::is_invocable_r_v<Lanes16, F, Lanes16>) {
    for (int64_t i = 0; i < n; i += 16) {
      const __mmask16 m = lanes(n - i);
      store_from_f32(o + i, __m512(f(Lanes16(load_as_f32(a + i, m)))), m);
    }
    return;
  }
#endif
  if constexpr (std::is_same_v<T, float>) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) o[i] = f(a[i]);
  } else {
    float fa[kStageBlock];
    for (int64_t i = 0; i < n; i += kStageBlock) {
      const int64_t m = std::min(kStageBlock, n - i);
      to_float(a + i, fa, m);
#pragma omp simd
      for (int64_t j = 0; j < m; ++j) fa[j] = f(fa[j]);
      from_float(fa, o + i, m);
    }
  }
}

// o[i] = f(a[i * sa], b[i * sb]) for n elements of T, sa and sb 0 (one element repeated) or 1,
// computed in float32. bfloat16 goes 16 lanes at a time in registers where f also takes Lanes16
// (a generic lambda of the lane-wise operators, say: the same IEEE operation on each lane as on
// a float, and the same rounding back, so the same bits as the staged loop).
template <typename T, typename F>
inline void zip_n(const T* a, int64_t sa, const T* b, int64_t sb, T* o, int64_t n, F f) {
  if (n <= 0) return;
#if defined(__AVX512BW__)
  if constexpr (std::is_same_v<T, bfloat16> &&
                std::is_invocable_r_v<Lanes16, F, Lanes16, Lanes16>) {
    const __m512 av = _mm512_set1_ps(float(*a)), bv = _mm512_set1_ps(float(*b));
    for (int64_t i = 0; i < n; i += 16) {
      const __mmask16 m = lanes(n - i);
      const Lanes16 fa = Lanes16(sa ? load_as_f32(a + i, m) : av);
      const Lanes16 fb = Lanes16(sb ? load_as_f32(b + i, m) : bv);
      store_from_f32(o + i, __m512(f(fa, fb)), m);
    }
    return;
  }
#endif
  if constexpr (std::is_same_v<T, float>) {
    if (sa && sb) {
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) o[i] = f(a[i], b[i]);
    } else if (sa) {
      const float bv = *b;
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) o[i] = f(a[i], bv);
    } else if (sb) {
      const float av = *a;
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) o[i] = f(av, b[i]);
    } else {
      const float v = f(*a, *b);
      for (int64_t i = 0; i < n; ++i) o[i] = v;
    }
  } else {
    float fa[kStageBlock], fb[kStageBlock];
    const float av = float(*a), bv = float(*b);
    for (int64_t i = 0; i < n; i += kStageBlock) {
      const int64_t m = std::min(kStageBlock, n - i);
      if (sa) to_float(a + i, fa, m);
      if (sb) to_float(b + i, fb, m);
#pragma omp simd
      for (int64_t j = 0; j < m; ++j) fa[j] = f(sa ? fa[j] : av, sb ? fb[j] : bv);
      from_float(fa, o + i, m);
    }
  }
}

}  // namespace galley::kernels::cpu
