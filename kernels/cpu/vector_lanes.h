#pragma once
// Lane operations on the register block's float vector (cpu/conv2d_block.h's V, 16 lanes with
// AVX-512, 8 with AVX2) for kernels written once for both widths (the Winograd path,
// cpu/conv2d_winograd.cpp): a mask of lanes, loads and stores of those lanes (bfloat16 and float16
// widened as they are read, rounded to nearest even as they are written), the even and odd lanes
// of a pair of vectors, the lanes of a pair interleaved, an L x L transpose, and planes copied
// channel-last through it. AVX-512 builds take the instructions' own masks and two-source
// permutes; AVX2 ones a vector of all-ones lanes, shuffles within 128-bit halves followed by a
// cross-half permute, and a scalar loop for the 16-bit types' partial vectors.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "galley/half.h"
#include "kernels/cpu/bf16_avx512.h"
#include "kernels/cpu/conv2d_block.h"

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#define GALLEY_VECTOR_LANES 1
#include <immintrin.h>
#endif

namespace galley::kernels::cpu::conv_block {

#if defined(__AVX512F__)
using Mask = __mmask16;
using M = __m512;  // V as the intrinsics' type

// Lanes [lo, hi) of L (clamped; none where lo >= hi).
inline Mask lane_range(int64_t lo, int64_t hi) {
  lo = lo < 0 ? 0 : lo;
  return lo >= hi ? Mask(0) : Mask(lanes(hi) & ~lanes(lo));
}
inline Mask first_lanes(int64_t n) {
  return lanes(n);
}
#elif defined(GALLEY_VECTOR_LANES)
using Mask = __m256i;  // a lane is chosen where all its bits are set
using M = __m256;

inline Mask lane_range(int64_t lo, int64_t hi) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  lo = lo < 0 ? 0 : (lo > L ? L : lo);
  hi = hi < 0 ? 0 : (hi > L ? L : hi);
  // lane >= lo and lane < hi
  return _mm256_andnot_si256(_mm256_cmpgt_epi32(_mm256_set1_epi32(int32_t(lo)), lane),
                             _mm256_cmpgt_epi32(_mm256_set1_epi32(int32_t(hi)), lane));
}
inline Mask first_lanes(int64_t n) {
  return lane_range(0, n);
}
inline int mask_bits(Mask m) {
  return _mm256_movemask_ps(_mm256_castsi256_ps(m));
}
#endif

#if defined(GALLEY_VECTOR_LANES)
inline V as_v(M v) {
  return reinterpret_cast<V>(v);
}
inline M as_m(V v) {
  return reinterpret_cast<M>(v);
}

// The lanes of m from p as float32 (16-bit values widened), the others zero. Lanes outside m are
// not read.
template <typename T>
inline V load_lanes(const T* p, Mask m) {
#if defined(__AVX512F__)
  return as_v(load_as_f32(p, m));
#else
  const int bits = mask_bits(m);
  if constexpr (std::is_same_v<T, float>) {
    // (a masked load of a whole vector costs more than a load on AMD Zen 3)
    return bits == 0xff ? load(p) : as_v(_mm256_maskload_ps(p, m));
  } else {
    if (bits == 0xff) {
      const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
      if constexpr (std::is_same_v<T, bfloat16>)
        return as_v(_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)));
#if defined(__F16C__)
      else
        return as_v(_mm256_cvtph_ps(h));
#endif
    }
    alignas(32) float f[L] = {};
    for (int i = 0; i < L; ++i)
      if (bits >> i & 1) f[i] = static_cast<float>(p[i]);
    return load(f);
  }
#endif
}

// The first n lanes of v into p (all L for n >= L; rounded to T); nothing past them is written.
// AVX2 stores a partial vector in pieces of 4, 2 and 1 floats: its masked store (vmaskmovps) takes
// several times a store's cycles on AMD Zen 3.
template <typename T>
inline void store_first(T* p, V v, int64_t n) {
#if defined(__AVX512F__)
  store_from_f32(p, as_m(v), lanes(n));
#else
  if constexpr (std::is_same_v<T, float>) {
    if (n >= L) return _mm256_storeu_ps(p, as_m(v));
    __m128 h = _mm256_castps256_ps128(as_m(v));
    if (n >= 4) {
      _mm_storeu_ps(p, h);
      h = _mm256_extractf128_ps(as_m(v), 1);
      p += 4, n -= 4;
    }
    if (n >= 2) {
      _mm_storel_pi(reinterpret_cast<__m64*>(p), h);
      h = _mm_movehl_ps(h, h);
      p += 2, n -= 2;
    }
    if (n >= 1) _mm_store_ss(p, h);
  } else {
    alignas(32) float f[L];
    store(f, v);
    for (int64_t i = 0; i < n && i < L; ++i) p[i] = T(f[i]);
  }
#endif
}

// The first L / 2 lanes of v to lo and the last L / 2 to hi: two stores of half a vector, where
// copying the lanes out through memory kept the vector on the stack.
inline void store_halves(float* lo, float* hi, V v) {
#if defined(__AVX512F__)
  // (the upper half through the 64-bit extract, which AVX512F has; the 32-bit one needs AVX512DQ)
  _mm256_storeu_ps(lo, _mm512_castps512_ps256(as_m(v)));
  _mm256_storeu_pd(reinterpret_cast<double*>(hi),
                   _mm512_extractf64x4_pd(_mm512_castps_pd(as_m(v)), 1));
#else
  _mm_storeu_ps(lo, _mm256_castps256_ps128(as_m(v)));
  _mm_storeu_ps(hi, _mm256_extractf128_ps(as_m(v), 1));
#endif
}

// even = lanes 0, 2, .., 2L - 2 and odd = lanes 1, 3, .., 2L - 1 of the 2L lanes a then b (a
// caller that uses one of them leaves the other's instructions to the compiler to drop).
inline void deinterleave(V a, V b, V& even, V& odd) {
#if defined(__AVX512F__)
  const __m512i e = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i o = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  even = as_v(_mm512_permutex2var_ps(as_m(a), e, as_m(b)));
  odd = as_v(_mm512_permutex2var_ps(as_m(a), o, as_m(b)));
#else
  // a0 a2 b0 b2 | a4 a6 b4 b6 (and the odd alike), then the 64-bit quarters in the order 0, 2, 1, 3
  auto quarters = [](__m256 t) {
    return as_v(_mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(t), 0xd8)));
  };
  even = quarters(_mm256_shuffle_ps(as_m(a), as_m(b), 0x88));
  odd = quarters(_mm256_shuffle_ps(as_m(a), as_m(b), 0xdd));
#endif
}

// first = a0 b0 a1 b1 .. (the first L lanes of a and b interleaved), second = the last L.
inline void interleave(V a, V b, V& first, V& second) {
#if defined(__AVX512F__)
  const __m512i f = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
  const __m512i s = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
  first = as_v(_mm512_permutex2var_ps(as_m(a), f, as_m(b)));
  second = as_v(_mm512_permutex2var_ps(as_m(a), s, as_m(b)));
#else
  const __m256 lo = _mm256_unpacklo_ps(as_m(a), as_m(b)), hi = _mm256_unpackhi_ps(as_m(a), as_m(b));
  first = as_v(_mm256_permute2f128_ps(lo, hi, 0x20));
  second = as_v(_mm256_permute2f128_ps(lo, hi, 0x31));
#endif
}

// r[j] = column j of the L x L matrix whose row k is r[k].
inline void transpose(V r[L]) {
#if defined(__AVX512F__)
  transpose16(reinterpret_cast<__m512*>(r));  // __m512 may alias any vector
#else
  // Pairs of rows interleaved, then quads, then the 128-bit halves exchanged.
  __m256 t[8], u[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(as_m(r[i]), as_m(r[i + 1]));
    t[i + 1] = _mm256_unpackhi_ps(as_m(r[i]), as_m(r[i + 1]));
  }
  for (int i = 0; i < 8; i += 4) {
    u[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int c = 0; c < 4; ++c) {
    r[c] = as_v(_mm256_permute2f128_ps(u[c], u[4 + c], 0x20));
    r[4 + c] = as_v(_mm256_permute2f128_ps(u[c], u[4 + c], 0x31));
  }
#endif
}

// The L lanes of v into d: as floats, or as bfloat16 bits (store_first's rounding; without
// AVX-512 a scalar loop, which no kernel takes there, the pairs needing AVX512-BF16).
inline void store_lanes_as(float* d, V v) {
  store(d, v);
}
inline void store_lanes_as(uint16_t* d, V v) {
  store_first(reinterpret_cast<bfloat16*>(d), v, L);
}

// dst[r * ld + j * cp + c] = src[c][r][j] for `channels` planes of h x w (cp >= channels rounded
// up to whole vectors; the channels past `channels` to the next whole vector zero, any elements
// past that left as they were), in L x L transposes: the Winograd and channels-across-lanes
// paths' channel-last copies and the direct path's transposed output gradient. D is float, or
// (AVX-512) uint16_t for bfloat16 bits. A transpose takes L positions of the plane in memory
// order, across the ends of rows: a row at a time, 7x7 planes took 7 transposes (7 of 16 lanes
// used), 14x14 ones 14, against 4 and 13 so.
template <typename T, typename D = float>
void to_channels_last(const T* src, int64_t channels, int64_t h, int64_t w, int64_t cp, D* dst,
                      int64_t ld) {
  const int64_t P = h * w;
  for (int64_t c0 = 0; c0 < channels; c0 += L)
    for (int64_t q0 = 0, r = 0, j = 0; q0 < P; q0 += L) {  // (r, j): position q0's row and column
      if (c0 + L <= channels && q0 + L <= P) {
        // A whole tile in loops of fixed counts, which keep it in registers: through the partial
        // tiles' loops GCC kept it on the stack (from_channels_last took 46 ns a 16 x 16 tile on
        // an Intel Xeon, its transpose alone 22).
        V t[L];
#pragma GCC unroll 16
        for (int k = 0; k < L; ++k) t[k] = load_lanes(src + (c0 + k) * P + q0, first_lanes(L));
        transpose(t);
#pragma GCC unroll 16
        for (int q = 0; q < L; ++q) {
          store_lanes_as(dst + r * ld + j * cp + c0, t[q]);
          if (++j == w) j = 0, ++r;
        }
        continue;
      }
      const Mask m = first_lanes(P - q0);
      V v[L];
      for (int64_t k = 0; k < L; ++k)
        v[k] = c0 + k < channels ? load_lanes(src + (c0 + k) * P + q0, m) : V{};
      transpose(v);
      for (int64_t q = 0; q < L && q0 + q < P; ++q) {
        store_lanes_as(dst + r * ld + j * cp + c0, v[q]);
        if (++j == w) j = 0, ++r;
      }
    }
}

// dst[c][q] = src[q * ld + c] (+ bias[c]) for `channels` planes of P positions: a channel-last
// block of rows back into planes, L x L at a time (rounded to T as stored).
template <typename T>
void from_channels_last(const float* src, int64_t ld, int64_t channels, int64_t P,
                        const float* bias, T* dst) {
  for (int64_t c0 = 0; c0 < channels; c0 += L)
    for (int64_t q0 = 0; q0 < P; q0 += L) {
      if (c0 + L <= channels && q0 + L <= P) {  // a whole tile, as to_channels_last takes it
        V t[L];
#pragma GCC unroll 16
        for (int k = 0; k < L; ++k) t[k] = load(src + (q0 + k) * ld + c0);
        transpose(t);
        T* d = dst + c0 * P + q0;
        if (bias) {
#pragma GCC unroll 16
          for (int c = 0; c < L; ++c) store_first(d + c * P, t[c] + splat(bias[c0 + c]), L);
        } else {
#pragma GCC unroll 16
          for (int c = 0; c < L; ++c) store_first(d + c * P, t[c], L);
        }
        continue;
      }
      V v[L];
      const int64_t rows = std::min(L, P - q0);
      for (int64_t k = 0; k < rows; ++k) v[k] = load(src + (q0 + k) * ld + c0);
      for (int64_t k = rows; k < L; ++k) v[k] = V{};
      transpose(v);
      const int64_t cs = std::min(L, channels - c0);
      for (int64_t c = 0; c < cs; ++c)
        store_first(dst + (c0 + c) * P + q0, bias ? v[c] + splat(bias[c0 + c]) : v[c], P - q0);
    }
}
#endif

}  // namespace galley::kernels::cpu::conv_block
