#pragma once
// The register block shared by the convolution kernels that run on float32 vectors (the direct
// path's correlations, cpu/conv2d_direct.cpp, and the Winograd path's transformed products,
// cpu/conv2d_winograd.cpp): OB output channels x NV vectors, summed over a run of inputs, each
// input one vector load and each weight one broadcast.
#include <cstdint>
#include <cstring>

#if defined(__AVX__)
#include <immintrin.h>
#endif

namespace galley::kernels::cpu::conv_block {

// L floats: one vector register (the compiler splits it on hosts with neither AVX-512 nor AVX2).
// OB output channels x up to 3 vectors of outputs in the accumulators: with AVX-512's 32
// registers 8 x 3, with AVX2's 16 4 x 3, which leaves room for the loads and the broadcast.
#if defined(__AVX512F__)
constexpr int64_t L = 16;
constexpr int64_t OB = 8;
#else
constexpr int64_t L = 8;
constexpr int64_t OB = 4;
#endif
using V = float __attribute__((vector_size(L * sizeof(float))));

inline V load(const float* p) {
  V v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store(float* p, V v) {
  std::memcpy(p, &v, sizeof v);
}
inline V splat(float s) {
  return V{} + s;
}
// splat(*p), as one broadcast load (no scalar register on the way).
inline V broadcast(const float* p) {
#if defined(__AVX512F__)
  return reinterpret_cast<V>(_mm512_set1_ps(*p));
#elif defined(__AVX__)
  return reinterpret_cast<V>(_mm256_broadcast_ss(p));
#else
  return splat(*p);
#endif
}

// y[o][v * L + i] = sum over c < cin, t < taps of wb[(c * taps + t) * OB + o] *
// x[c * plane + shift[t] + v * L + i], for OB output channels o and NV vectors v: the weights
// packed [cin][taps][OB], consecutive outputs at consecutive inputs.
template <int NV>
void correlate_block(const float* x, int64_t plane, int64_t cin, const int64_t* shift, int64_t taps,
                     const float* wb, float* y, int64_t ldy) {
  V acc[OB][NV];
#pragma GCC unroll 8
  for (int o = 0; o < OB; ++o)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[o][v] = V{};
  for (int64_t c = 0; c < cin; ++c, x += plane) {
    for (int64_t t = 0; t < taps; ++t, wb += OB) {
      const float* xs = x + shift[t];
      V xv[NV];
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) xv[v] = load(xs + v * L);
#pragma GCC unroll 8
      for (int o = 0; o < OB; ++o) {
        const V wv = broadcast(wb + o);
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) acc[o][v] += wv * xv[v];
      }
    }
  }
#pragma GCC unroll 8
  for (int o = 0; o < OB; ++o)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) store(y + o * ldy + v * L, acc[o][v]);
}

// correlate_block over `nvec` consecutive vectors of outputs (OB channels, rows ldy apart), in
// blocks of three vectors and the rest in one block of two or one.
inline void correlate_vectors(const float* x, int64_t plane, int64_t cin, const int64_t* shift,
                              int64_t taps, const float* wb, float* y, int64_t ldy, int64_t nvec) {
  int64_t v = 0;
  for (; v + 3 <= nvec; v += 3)
    correlate_block<3>(x + v * L, plane, cin, shift, taps, wb, y + v * L, ldy);
  if (nvec - v == 2)
    correlate_block<2>(x + v * L, plane, cin, shift, taps, wb, y + v * L, ldy);
  else if (nvec - v == 1)
    correlate_block<1>(x + v * L, plane, cin, shift, taps, wb, y + v * L, ldy);
}

}  // namespace galley::kernels::cpu::conv_block
