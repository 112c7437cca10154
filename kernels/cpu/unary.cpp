#include "kernels/cpu/unary.h"

#include <cmath>

#include "kernels/cpu/parallel.h"

namespace galley::kernels::cpu {
namespace {

template <typename F>
Tensor map(const Tensor& a, F f) {
  Tensor ca = a.contiguous();
  Tensor out = Tensor::empty(a.shape());
  const float* p = ca.data<float>();
  float* o = out.data<float>();
  parallel_for(out.numel(), kElementwiseGrain, [&](int64_t s, int64_t e) {
#pragma omp simd
    for (int64_t i = s; i < e; ++i) o[i] = f(p[i]);
  });
  return out;
}

template <typename F>
Tensor zip(const Tensor& a, const Tensor& b, F f) {
  GALLEY_CHECK(a.shape() == b.shape(), "elementwise: shapes ", shape_str(a.shape()), " and ",
               shape_str(b.shape()), " differ");
  Tensor ca = a.contiguous(), cb = b.contiguous();
  Tensor out = Tensor::empty(a.shape());
  const float* pa = ca.data<float>();
  const float* pb = cb.data<float>();
  float* o = out.data<float>();
  parallel_for(out.numel(), kElementwiseGrain, [&](int64_t s, int64_t e) {
#pragma omp simd
    for (int64_t i = s; i < e; ++i) o[i] = f(pa[i], pb[i]);
  });
  return out;
}

}  // namespace

Tensor affine(const Tensor& a, float scale, float shift) {
  return map(a, [=](float x) { return x * scale + shift; });
}
Tensor exp(const Tensor& a) {
  return map(a, [](float x) { return std::exp(x); });
}
Tensor log(const Tensor& a) {
  return map(a, [](float x) { return std::log(x); });
}
Tensor pow(const Tensor& a, float p) {
  return map(a, [=](float x) { return std::pow(x, p); });
}
Tensor pow_backward(const Tensor& grad, const Tensor& a, float p) {
  return zip(grad, a, [=](float g, float x) { return g * p * std::pow(x, p - 1.f); });
}
// `!(x <= 0)` keeps a NaN as NaN, as PyTorch does, instead of hiding it behind a zero.
Tensor relu(const Tensor& a) {
  return map(a, [](float x) { return !(x <= 0.f) ? x : 0.f; });
}
void relu_(Tensor& a) {
  float* p = a.data<float>();
  parallel_for(a.numel(), kElementwiseGrain, [&](int64_t s, int64_t e) {
#pragma omp simd
    for (int64_t i = s; i < e; ++i) p[i] = !(p[i] <= 0.f) ? p[i] : 0.f;
  });
}
void relu_backward_(Tensor& grad, const Tensor& out) {
  GALLEY_CHECK(grad.shape() == out.shape(), "relu_backward: shapes ", shape_str(grad.shape()),
               " and ", shape_str(out.shape()), " differ");
  float* g = grad.data<float>();
  const float* y = out.data<float>();
  parallel_for(grad.numel(), kElementwiseGrain, [&](int64_t s, int64_t e) {
#pragma omp simd
    for (int64_t i = s; i < e; ++i) g[i] = y[i] > 0.f ? g[i] : 0.f;
  });
}
Tensor relu_backward(const Tensor& grad, const Tensor& out) {
  return zip(grad, out, [](float g, float y) { return y > 0.f ? g : 0.f; });
}

}  // namespace galley::kernels::cpu
