// Elementwise unary ops and their backward on the host.
#include "kernels/unary.h"

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "galley/half.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/simd_math.h"
#include "kernels/cpu/staged.h"
#include "kernels/unary_math.h"

namespace galley::kernels::cpu {
namespace {

namespace um = unary_math;
using M = SimdMath;

// ---------------------------------------------------------------------------------------------
// Fixed-size blocks for the ops that call SimdMath: every element, the last block's included,
// goes through the same vector code (a loop of constant trip count over an aligned stack block
// has no scalar prologue or epilogue), so its result does not depend on where it lies, in which
// dtype it is stored or how the threads split the array.

template <typename T>
void load_block(const T* src, float* dst, int64_t m) {
  if constexpr (std::is_same_v<T, float>)
    std::copy(src, src + m, dst);
  else
    to_float(src, dst, m);
  std::fill(dst + m, dst + kStageBlock, 0.f);  // the lanes past the end compute on zeros
}

template <typename T>
void store_block(const float* src, T* dst, int64_t m) {
  if constexpr (std::is_same_v<T, float>)
    std::copy(src, src + m, dst);
  else
    from_float(src, dst, m);
}

template <typename T, typename F>
void map_blocks(const T* a, T* o, int64_t n, F f) {
  alignas(64) float x[kStageBlock];
  for (int64_t i = 0; i < n; i += kStageBlock) {
    const int64_t m = std::min(kStageBlock, n - i);
    load_block(a + i, x, m);
#pragma omp simd
    for (int64_t j = 0; j < kStageBlock; ++j) x[j] = f(x[j]);
    store_block(x, o + i, m);
  }
}

template <typename T, typename F>
void zip_blocks(const T* a, const T* b, T* o, int64_t n, F f) {
  alignas(64) float x[kStageBlock], y[kStageBlock];
  for (int64_t i = 0; i < n; i += kStageBlock) {
    const int64_t m = std::min(kStageBlock, n - i);
    load_block(a + i, x, m);
    load_block(b + i, y, m);
#pragma omp simd
    for (int64_t j = 0; j < kStageBlock; ++j) x[j] = f(x[j], y[j]);
    store_block(x, o + i, m);
  }
}

// um::relu and um::relu_backward on floats and (AVX-512) on 16 lanes at a time, with the same
// bits: map_n and zip_n take the lanes for bfloat16.
struct Relu {
  float operator()(float x) const { return um::relu(x); }
#if defined(__AVX512BW__)
  Lanes16 operator()(Lanes16 x) const {  // !(x <= 0) ? x : 0
    const __m512 v = __m512(x);
    return Lanes16(_mm512_maskz_mov_ps(_mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_NLE_UQ), v));
  }
#endif
};
struct ReluBackward {
  float operator()(float g, float y) const { return um::relu_backward(g, y); }
#if defined(__AVX512BW__)
  Lanes16 operator()(Lanes16 g, Lanes16 y) const {  // !(y <= 0) ? g : 0
    return Lanes16(_mm512_maskz_mov_ps(
        _mm512_cmp_ps_mask(__m512(y), _mm512_setzero_ps(), _CMP_NLE_UQ), __m512(g)));
  }
#endif
};

// How map and zip loop: map_n / zip_n (kernels/cpu/staged.h), or over fixed-size blocks for the
// ops that call SimdMath.
enum class Loop { Plain, Blocks };

// o = f(a) over n elements of `dtype`, computed in float32; o may be a.
template <Loop kLoop = Loop::Plain, typename F>
void map(const char* op, DType dtype, const void* a, void* out, int64_t n, F f) {
  dispatch_floating(dtype, op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* p = static_cast<const T*>(a);
    T* o = static_cast<T*>(out);
    parallel_balanced(n, kElementwiseGrain, [&](int64_t s, int64_t e) {
      if constexpr (kLoop == Loop::Blocks)
        map_blocks(p + s, o + s, e - s, f);
      else
        map_n(p + s, o + s, e - s, f);
    });
  });
}

// o = f(a, b) over n elements of `dtype`; o may be a.
template <Loop kLoop = Loop::Plain, typename F>
void zip(const char* op, DType dtype, const void* a, const void* b, void* out, int64_t n, F f) {
  dispatch_floating(dtype, op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* pa = static_cast<const T*>(a);
    const T* pb = static_cast<const T*>(b);
    T* o = static_cast<T*>(out);
    parallel_balanced(n, kElementwiseGrain, [&](int64_t s, int64_t e) {
      if constexpr (kLoop == Loop::Blocks)
        zip_blocks(pa + s, pb + s, o + s, e - s, f);
      else
        zip_n(pa + s, 1, pb + s, 1, o + s, e - s, f);
    });
  });
}

}  // namespace

void unary(UnaryOp op, DType dtype, const void* a, void* out, int64_t n, float p0, float p1) {
  switch (op) {
    case UnaryOp::Affine:
      return map("affine", dtype, a, out, n, [=](float x) { return x * p0 + p1; });
    case UnaryOp::Exp:
      return map("exp", dtype, a, out, n, [](float x) { return std::exp(x); });
    case UnaryOp::Log:
      return map("log", dtype, a, out, n, [](float x) { return std::log(x); });
    case UnaryOp::Pow:
      return map("pow", dtype, a, out, n, [=](float x) { return um::pow_scalar<M>(x, p0); });
    case UnaryOp::Relu:
      return map("relu", dtype, a, out, n, Relu{});
    case UnaryOp::Sigmoid:
      return map<Loop::Blocks>("sigmoid", dtype, a, out, n,
                               [](float x) { return um::sigmoid<M>(x); });
    case UnaryOp::Tanh:
      return map<Loop::Blocks>("tanh", dtype, a, out, n, [](float x) { return um::tanh<M>(x); });
    case UnaryOp::Silu:
      return map<Loop::Blocks>("silu", dtype, a, out, n, [](float x) { return um::silu<M>(x); });
    case UnaryOp::Gelu:
      return map<Loop::Blocks>("gelu", dtype, a, out, n, [](float x) { return um::gelu<M>(x); });
    case UnaryOp::GeluTanh:
      return map<Loop::Blocks>("gelu", dtype, a, out, n,
                               [](float x) { return um::gelu_tanh<M>(x); });
    case UnaryOp::LeakyRelu:
      return map("leaky_relu", dtype, a, out, n, [=](float x) { return um::leaky_relu(x, p0); });
    case UnaryOp::Div:
      return map("div", dtype, a, out, n, [=](float x) { return x / p0; });
  }
}

void unary_backward(UnaryOp op, DType dtype, const void* grad, const void* saved, void* out,
                    int64_t n, float p0) {
  switch (op) {
    case UnaryOp::Sigmoid:
      return zip("sigmoid_backward", dtype, grad, saved, out, n,
                 [](float g, float y) { return um::sigmoid_backward(g, y); });
    case UnaryOp::Tanh:
      return zip("tanh_backward", dtype, grad, saved, out, n,
                 [](float g, float y) { return um::tanh_backward(g, y); });
    case UnaryOp::Silu:
      return zip<Loop::Blocks>("silu_backward", dtype, grad, saved, out, n,
                               [](float g, float x) { return um::silu_backward<M>(g, x); });
    case UnaryOp::Gelu:
      return zip<Loop::Blocks>("gelu_backward", dtype, grad, saved, out, n,
                               [](float g, float x) { return um::gelu_backward<M>(g, x); });
    case UnaryOp::GeluTanh:
      return zip<Loop::Blocks>("gelu_backward", dtype, grad, saved, out, n,
                               [](float g, float x) { return um::gelu_tanh_backward<M>(g, x); });
    case UnaryOp::LeakyRelu:
      return zip("leaky_relu_backward", dtype, grad, saved, out, n,
                 [=](float g, float x) { return um::leaky_relu_backward(g, x, p0); });
    default:
      throw Error(detail::str_cat("unary_backward: ", unary_op_name(op),
                                  " is not an activation (it has a backward kernel of its own)"));
  }
}

void pow_backward(DType dtype, const void* grad, const void* a, void* out, int64_t n, float p) {
  zip("pow_backward", dtype, grad, a, out, n,
      [=](float g, float x) { return um::pow_backward<M>(g, x, p); });
}

void relu_backward(DType dtype, const void* grad, const void* out_fwd, void* out, int64_t n) {
  zip("relu_backward", dtype, grad, out_fwd, out, n, ReluBackward{});
}

}  // namespace galley::kernels::cpu
