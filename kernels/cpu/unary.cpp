// Elementwise unary ops and their backward on the host.
#include "kernels/unary.h"

#include <cmath>

#include "galley/half.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/staged.h"

namespace galley::kernels::cpu {
namespace {

// o = f(a) over n elements of `dtype`, computed in float32.
template <typename F>
void map(const char* op, DType dtype, const void* a, void* out, int64_t n, F f) {
  dispatch_floating(dtype, op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* p = static_cast<const T*>(a);
    T* o = static_cast<T*>(out);
    parallel_for(n, kElementwiseGrain,
                 [&](int64_t s, int64_t e) { map_n(p + s, o + s, e - s, f); });
  });
}

// o = f(a, b) over n elements of `dtype`; o may be a.
template <typename F>
void zip(const char* op, DType dtype, const void* a, const void* b, void* out, int64_t n, F f) {
  dispatch_floating(dtype, op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* pa = static_cast<const T*>(a);
    const T* pb = static_cast<const T*>(b);
    T* o = static_cast<T*>(out);
    parallel_for(n, kElementwiseGrain,
                 [&](int64_t s, int64_t e) { zip_n(pa + s, 1, pb + s, 1, o + s, e - s, f); });
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
      return map("pow", dtype, a, out, n, [=](float x) { return std::pow(x, p0); });
    case UnaryOp::Relu:
      // `!(x <= 0)` keeps a NaN as NaN, as PyTorch does, instead of hiding it behind a zero.
      return map("relu", dtype, a, out, n, [](float x) { return !(x <= 0.f) ? x : 0.f; });
  }
}

void pow_backward(DType dtype, const void* grad, const void* a, void* out, int64_t n, float p) {
  zip("pow_backward", dtype, grad, a, out, n,
      [=](float g, float x) { return g * p * std::pow(x, p - 1.f); });
}

void relu_backward(DType dtype, const void* grad, const void* out_fwd, void* out, int64_t n) {
  zip("relu_backward", dtype, grad, out_fwd, out, n,
      [](float g, float y) { return y > 0.f ? g : 0.f; });
}

}  // namespace galley::kernels::cpu
