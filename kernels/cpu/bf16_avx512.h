#pragma once
// bfloat16 pairs and AVX-512 vectors (internal to the CPU kernels): the 32-bit pair words that
// vdpbf16ps and the tiles multiply, 16 elements widened to float32 or rounded from it, and the
// tail of a short row masked rather than left to a scalar loop. The rounding is galley/half.h's
// float_to_bf16_bits, bit for bit: round to nearest even, a NaN kept quiet with its sign.
#include <cstdint>
#include <cstring>
#include <vector>

#include "galley/half.h"
#include "kernels/cpu/aligned.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace galley::kernels::cpu {

// Two bfloat16 bits, the even-indexed value in the low half.
using Pair = uint32_t;

// The pair of bfloat16 values at p and p + 1 (p need not be 4-byte aligned).
inline Pair pair_at(const uint16_t* p) {
  Pair v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// The pair of lo and hi rounded to bfloat16 (detail::float_to_bf16_bits).
inline Pair pair_of(float lo, float hi) {
  return Pair(detail::float_to_bf16_bits(lo)) | Pair(detail::float_to_bf16_bits(hi)) << 16;
}

// Rows u[g][r][w] (`rows` rows of `width` floats in each of `groups`) as pairs
// [g][(rows + 1) / 2][w] into out: rows 2j and 2j + 1 paired (input channels: the transformed
// kernels of the Winograd path, the weights of the channels-across-lanes path), a zero partner
// past the last.
inline void pair_rows(const float* u, int64_t groups, int64_t rows, int64_t width, Pair* out) {
  const int64_t rp = (rows + 1) / 2;
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t j = 0; j < rp; ++j) {
      const float* lo = u + (g * rows + 2 * j) * width;
      Pair* dst = out + (g * rp + j) * width;
      for (int64_t o = 0; o < width; ++o)
        dst[o] = pair_of(lo[o], 2 * j + 1 < rows ? lo[width + o] : 0.f);
    }
}
inline aligned_vector<Pair> pair_rows(const float* u, int64_t groups, int64_t rows, int64_t width) {
  aligned_vector<Pair> out(size_t(groups * ((rows + 1) / 2) * width));
  pair_rows(u, groups, rows, width, out.data());
  return out;
}

#if defined(__AVX512F__)
// The first n lanes of 16 (all of them for n >= 16).
inline __mmask16 lanes(int64_t n) {
  return n >= 16 ? __mmask16(0xffff) : __mmask16((1u << n) - 1);
}
#endif

#if defined(__AVX512BW__)
// The first n lanes of 32 (all of them for n >= 32): 16-bit elements, a 512-bit vector of them.
inline __mmask32 lanes32(int64_t n) {
  return n >= 32 ? ~__mmask32(0) : (__mmask32(1) << n) - 1;
}

// The lanes of m from p widened to float32; the others zero.
inline __m512 load_bf16(const bfloat16* p, __mmask16 m) {
  const __m256i h = _mm256_maskz_loadu_epi16(m, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// v rounded to bfloat16 bits, as 16 32-bit lanes.
inline __m512i bf16_bits(__m512 v) {
  const __m512i x = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(1));
  const __m512i r =
      _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(x, _mm512_set1_epi32(0x7fff)), lsb), 16);
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(x, _mm512_set1_epi32(0x7fffffff)),
                                                _mm512_set1_epi32(0x7f800000));
  return _mm512_mask_mov_epi32(r, nan,
                               _mm512_or_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(0x40)));
}

#if defined(__AVX512BF16__)
// The lanes of v that hold a float32 subnormal (vfpclassps, class 0x20).
inline __mmask16 subnormal_lanes(__m512 v) {
  return _mm512_fpclass_ps_mask(v, 0x20);
}
#endif

// v rounded to bfloat16, 16 bits a lane. vcvtneps2bf16 rounds as bf16_bits does, NaNs included,
// but reads a subnormal as zero: a vector holding one (rare) takes bf16_bits.
inline __m256i bf16_halves(__m512 v) {
#if defined(__AVX512BF16__)
  if (!subnormal_lanes(v)) return (__m256i)_mm512_cvtneps_pbh(v);
#endif
  return _mm512_cvtepi32_epi16(bf16_bits(v));
}

#if defined(__AVX512BF16__)
// The pairs (lo[i], hi[i]) of two vectors rounded to bfloat16 by vcvtne2ps2bf16, lo in the low
// halves: as bf16_bits rounds, except that subnormals become zeros of their sign. For operands of
// float32 sums, whose subnormal terms vanish beside any normal one.
inline __m512i bf16_pairs_flushed(__m512 lo, __m512 hi) {
  // lo's 16 values then hi's, interleaved: word 2i from i, word 2i + 1 from 16 + i.
  const __m512i both = (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
  const __m512i order = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24,
                                         8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  return _mm512_permutexvar_epi16(order, both);
}
#endif

// The lanes of m of v rounded to bfloat16 into p.
inline void store_bf16(bfloat16* p, __m512 v, __mmask16 m) {
  _mm256_mask_storeu_epi16(p, m, bf16_halves(v));
}

// The lanes of m from p as float32 (bfloat16 and float16 widened), the others zero; and the lanes
// of m of v into p (rounded to nearest even): one vector loop for float32 and 16-bit data.
inline __m512 load_as_f32(const float* p, __mmask16 m) {
  return _mm512_maskz_loadu_ps(m, p);
}
inline __m512 load_as_f32(const bfloat16* p, __mmask16 m) {
  return load_bf16(p, m);
}
inline void store_from_f32(float* p, __m512 v, __mmask16 m) {
  _mm512_mask_storeu_ps(p, m, v);
}
inline void store_from_f32(bfloat16* p, __m512 v, __mmask16 m) {
  store_bf16(p, v, m);
}
inline __m512 load_as_f32(const float* p) {
  return _mm512_loadu_ps(p);
}
inline __m512 load_as_f32(const bfloat16* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// 32 lanes, lo's then hi's, into p: for bfloat16 one vcvtne2ps2bf16 when neither holds a
// subnormal, else store_bf16 twice (the same bits either way).
inline void store_from_f32_x2(float* p, __m512 lo, __m512 hi) {
  _mm512_storeu_ps(p, lo);
  _mm512_storeu_ps(p + 16, hi);
}
inline void store_from_f32_x2(bfloat16* p, __m512 lo, __m512 hi) {
#if defined(__AVX512BF16__)
  if (!(subnormal_lanes(lo) | subnormal_lanes(hi))) {
    _mm512_storeu_si512(p, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
    return;
  }
#endif
  store_bf16(p, lo, 0xffff);
  store_bf16(p + 16, hi, 0xffff);
}
inline __m512 load_as_f32(const float16* p, __mmask16 m) {
  return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
}
inline void store_from_f32(float16* p, __m512 v, __mmask16 m) {
  _mm256_mask_storeu_epi16(p, m, _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
}

// The pairs (lo[j], hi[j]) for the lanes of m, zero elsewhere (hi null: zero partners).
inline __m512i pairs_of(const uint16_t* lo, const uint16_t* hi, __mmask16 m) {
  const __m512i v = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, lo));
  if (!hi) return v;
  return _mm512_or_si512(
      v, _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, hi)), 16));
}
#endif

}  // namespace galley::kernels::cpu
