#pragma once
// exp, erf and tanh of a float for loops under `#pragma omp simd` (internal to the CPU kernels):
// struct SimdMath, the `M` of kernels/unary_math.h.
//
// A loop calling libm's scalar expf / erff / tanhf does not vectorise, and glibc's erff and
// tanhf take 30-50 ns an element. glibc (2.35 and later, x86-64) also ships vector forms of all
// three in libmvec (_ZGVdN8v_erff: eight lanes of AVX2, ...), which its <math.h> declares to GCC
// only under -ffast-math. We declare them here without fast-math, under names of our own bound
// to the libm symbols (asm labels), so that only the calls through SimdMath vectorise and every
// other std::exp in a file including this one stays the scalar call it was. libmvec's errors,
// measured over float32 inputs against double: expf 2.6 ulp, erff 1.9, tanhf 1.1 (scalar libm:
// 0.5, 0.9, 2.2). Elsewhere (clang, other C libraries or CPUs) SimdMath is the scalar std::
// functions: the same results within those ulps, unvectorised.
//
// A vector call and a scalar call round differently, so a loop that vectorises must not leave
// elements to a scalar prologue or epilogue, or an element's result would depend on its position;
// the CPU kernels run these functions over fixed-size blocks only (kernels/cpu/unary.cpp).
#include <cmath>

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__GLIBC__) && \
    (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 35))
#define GALLEY_LIBMVEC 1
extern "C" {
float galley_simd_expf(float) noexcept __asm__("expf") __attribute__((__simd__("notinbranch")));
float galley_simd_erff(float) noexcept __asm__("erff") __attribute__((__simd__("notinbranch")));
float galley_simd_tanhf(float) noexcept __asm__("tanhf") __attribute__((__simd__("notinbranch")));
}
#else
#define GALLEY_LIBMVEC 0
inline float galley_simd_expf(float x) {
  return std::exp(x);
}
inline float galley_simd_erff(float x) {
  return std::erf(x);
}
inline float galley_simd_tanhf(float x) {
  return std::tanh(x);
}
#endif

namespace galley::kernels::cpu {

struct SimdMath {
  static float exp(float x) { return galley_simd_expf(x); }
  static float erf(float x) { return galley_simd_erff(x); }
  static float tanh(float x) { return galley_simd_tanhf(x); }
  static float sqrt(float x) { return std::sqrt(x); }
  static float pow(float x, float p) { return std::pow(x, p); }
};

}  // namespace galley::kernels::cpu
