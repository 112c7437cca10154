#pragma once
// Rows copied, read or added at a stride (internal to the CPU kernels): the short rows the
// convolutions copy into their buffers, the strided rows of im2col and col2im (cpu/conv2d.cpp)
// and the column phases of a strided direct convolution's bordered input (cpu/conv2d_direct.cpp).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/cpu/bf16_avx512.h"
#include "kernels/cpu/vector_lanes.h"

namespace galley::kernels::cpu {

// dst[j] = src[j] for j < n, elements of 4 or 2 bytes. Rows are short (28 elements in resnet):
// masked vectors (16 or 32 elements) rather than a call to memcpy.
template <typename T>
inline void copy_row(const T* src, T* dst, int64_t n) {
#if defined(__AVX512BW__)
  if constexpr (sizeof(T) == 4) {
    for (int64_t j = 0; j < n; j += 16) {
      const __mmask16 m = lanes(n - j);
      _mm512_mask_storeu_epi32(dst + j, m, _mm512_maskz_loadu_epi32(m, src + j));
    }
    return;
  } else if constexpr (sizeof(T) == 2) {
    for (int64_t j = 0; j < n; j += 32) {
      const __mmask32 m = lanes32(n - j);
      _mm512_mask_storeu_epi16(dst + j, m, _mm512_maskz_loadu_epi16(m, src + j));
    }
    return;
  }
#endif
  std::memcpy(dst, src, size_t(n) * sizeof(T));
}

// dst[j] = src[j * stride] for j < n: a strided row (of im2col, or a column phase of the direct
// path's bordered input). A float32 row of stride 2 goes 16 outputs a vector (the even lanes of two
// masked loads, so nothing past src[2 * (n - 1)] is read); the rest one element at a time.
template <typename T, typename D>
inline __attribute__((always_inline)) void gather_strided(const T* src, D* dst, int64_t n,
                                                          int64_t stride) {
  int64_t j = 0;
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<T, float> && std::is_same_v<D, float>) {
    if (stride == 2) {
      const __m512i even =
          _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
      for (; j < n; j += 16) {
        const int64_t reach = 2 * (n - j) - 1;  // source elements up to the last one needed
        const __m512 a = _mm512_maskz_loadu_ps(lanes(reach), src + 2 * j);
        const __m512 b =
            _mm512_maskz_loadu_ps(lanes(std::max<int64_t>(0, reach - 16)), src + 2 * j + 16);
        _mm512_mask_storeu_ps(dst + j, lanes(n - j), _mm512_permutex2var_ps(a, even, b));
      }
    }
  }
#endif
  for (; j < n; ++j) dst[j] = static_cast<D>(src[j * stride]);
}

// even[k] = src[2k] and odd[k] = src[2k + 1] for the n elements of src: a row split into its two
// column phases at stride 2 in one pass, two vectors of src at a time (the last ones partial, so
// nothing past src[n - 1] is read, nor past either phase's last element written; interleave_row's
// inverse).
template <typename T, typename D>
inline void deinterleave_row(const T* src, int64_t n, D* even, D* odd) {
  int64_t j = 0;
#if defined(GALLEY_VECTOR_LANES)
  if constexpr (std::is_same_v<T, float> && std::is_same_v<D, float>) {
    using namespace conv_block;
    V e, o;
    for (; j + 2 * L <= n; j += 2 * L) {
      deinterleave(load(src + j), load(src + j + L), e, o);
      store(even + j / 2, e);
      store(odd + j / 2, o);
    }
    if (const int64_t left = n - j; left > 0) {  // a partial pair of vectors
      deinterleave(load_lanes(src + j, lane_range(0, left)),
                   load_lanes(src + j + L, lane_range(0, left - L)), e, o);
      store_first(even + j / 2, e, (left + 1) / 2);
      store_first(odd + j / 2, o, left / 2);
      j = n;
    }
  }
#endif
#if defined(__AVX512BW__)
  if constexpr (sizeof(T) == 2 && std::is_same_v<T, D>) {
    // 32 elements a vector: each 32-bit word holds an even element in its low half and the odd
    // one after it in its high half, narrowed apart.
    for (; j < n; j += 32) {
      const int64_t left = std::min<int64_t>(n - j, 32);
      const __m512i v = _mm512_maskz_loadu_epi16(lanes32(left), src + j);
      _mm256_mask_storeu_epi16(even + j / 2, lanes((left + 1) / 2), _mm512_cvtepi32_epi16(v));
      _mm256_mask_storeu_epi16(odd + j / 2, lanes(left / 2),
                               _mm512_cvtepi32_epi16(_mm512_srli_epi32(v, 16)));
    }
  }
#endif
  for (; j < n; ++j) {
    D* dst = j % 2 ? odd : even;  // (subscripting the conditional itself trips GCC 12's ASan)
    dst[j / 2] = static_cast<D>(src[j]);
  }
}

// dst[j * stride] += src[j] (kAdd: col2im's strided row) or = src[j] (the phases of a strided
// direct convolution's input gradient) for j < n. Stride 2 goes 16 elements a vector, the odd
// positions between left as they are (not even an added zero); the rest one at a time.
template <bool kAdd>
inline void scatter_strided(const float* src, float* dst, int64_t n, int64_t stride) {
  int64_t j = 0;
#if defined(__AVX512F__)
  if (stride == 2) {
    // Lane 2i of the low (high) spread takes src lane i (8 + i).
    const __m512i lo = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    const __m512i hi = _mm512_add_epi32(lo, _mm512_set1_epi32(8));
    const __mmask16 even = 0x5555;
    for (; j < n; j += 16) {
      const __m512 v = _mm512_maskz_loadu_ps(lanes(n - j), src + j);
      const int64_t reach = 2 * (n - j) - 1;
      const __mmask16 m0 = lanes(reach) & even, m1 = lanes(std::max<int64_t>(0, reach - 16)) & even;
      float* d = dst + 2 * j;
      __m512 v0 = _mm512_permutexvar_ps(lo, v), v1 = _mm512_permutexvar_ps(hi, v);
      if constexpr (kAdd) {
        v0 = _mm512_add_ps(_mm512_maskz_loadu_ps(m0, d), v0);
        v1 = _mm512_add_ps(_mm512_maskz_loadu_ps(m1, d + 16), v1);
      }
      _mm512_mask_storeu_ps(d, m0, v0);
      _mm512_mask_storeu_ps(d + 16, m1, v1);
    }
  }
#endif
  for (; j < n; ++j) {
    if constexpr (kAdd)
      dst[j * stride] += src[j];
    else
      dst[j * stride] = src[j];
  }
}

// dst[2k] = even[k] and dst[2k + 1] = odd[k], for the n elements of dst: the two column phases of
// a stride-2 row put back together, two vectors of dst at a time (the last ones partial).
inline void interleave_row(const float* even, const float* odd, float* dst, int64_t n) {
  int64_t j = 0;
#if defined(GALLEY_VECTOR_LANES)
  using namespace conv_block;
  V first, second;
  for (; j + 2 * L <= n; j += 2 * L) {
    interleave(load(even + j / 2), load(odd + j / 2), first, second);
    store(dst + j, first);
    store(dst + j + L, second);
  }
  if (const int64_t left = n - j; left > 0) {  // a partial pair of vectors
    interleave(load_lanes(even + j / 2, lane_range(0, (left + 1) / 2)),
               load_lanes(odd + j / 2, lane_range(0, left / 2)), first, second);
    store_first(dst + j, first, left);
    if (left > L) store_first(dst + j + L, second, left - L);
    j = n;
  }
#endif
  for (; j < n; ++j) dst[j] = j % 2 ? odd[j / 2] : even[j / 2];
}

}  // namespace galley::kernels::cpu
