#include "kernels/cpu/unary.h"

#include <cmath>

#include "kernels/cpu/convert.h"
#include "kernels/cpu/parallel.h"

namespace galley::kernels::cpu {
namespace {

// f over every element, in the input's dtype (float32, bfloat16 or float16; computed in float32).
template <typename F>
Tensor map(const char* op, const Tensor& a, F f) {
  Tensor ca = a.contiguous();
  Tensor out = Tensor::empty(a.shape(), a.dtype(), a.device());
  dispatch_floating(a.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* p = ca.data<T>();
    T* o = out.data<T>();
    parallel_for(out.numel(), kElementwiseGrain,
                 [&](int64_t s, int64_t e) { map_n(p + s, o + s, e - s, f); });
  });
  return out;
}

// f over the elements of two tensors of one shape and dtype (the op layer checks the dtypes);
// in place when `out` is `a`.
template <typename F>
void zip_into(const char* op, const Tensor& a, const Tensor& b, Tensor& out, F f) {
  GALLEY_CHECK(a.shape() == b.shape(), op, ": shapes ", shape_str(a.shape()), " and ",
               shape_str(b.shape()), " differ");
  Tensor cb = b.contiguous();
  dispatch_floating(a.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* pa = a.data<T>();
    const T* pb = cb.data<T>();
    T* o = out.data<T>();
    parallel_for(out.numel(), kElementwiseGrain,
                 [&](int64_t s, int64_t e) { zip_n(pa + s, 1, pb + s, 1, o + s, e - s, f); });
  });
}

template <typename F>
Tensor zip(const char* op, const Tensor& a, const Tensor& b, F f) {
  Tensor ca = a.contiguous();
  Tensor out = Tensor::empty(a.shape(), a.dtype(), a.device());
  zip_into(op, ca, b, out, f);
  return out;
}

}  // namespace

Tensor affine(const Tensor& a, float scale, float shift) {
  return map("affine", a, [=](float x) { return x * scale + shift; });
}
Tensor exp(const Tensor& a) {
  return map("exp", a, [](float x) { return std::exp(x); });
}
Tensor log(const Tensor& a) {
  return map("log", a, [](float x) { return std::log(x); });
}
Tensor pow(const Tensor& a, float p) {
  return map("pow", a, [=](float x) { return std::pow(x, p); });
}
Tensor pow_backward(const Tensor& grad, const Tensor& a, float p) {
  return zip("pow_backward", grad, a,
             [=](float g, float x) { return g * p * std::pow(x, p - 1.f); });
}
// `!(x <= 0)` keeps a NaN as NaN, as PyTorch does, instead of hiding it behind a zero.
Tensor relu(const Tensor& a) {
  return map("relu", a, [](float x) { return !(x <= 0.f) ? x : 0.f; });
}
void relu_(Tensor& a) {
  GALLEY_CHECK(a.is_contiguous(), "relu_: the tensor must be contiguous");
  zip_into("relu_", a, a, a, [](float x, float) { return !(x <= 0.f) ? x : 0.f; });
}
void relu_backward_(Tensor& grad, const Tensor& out) {
  GALLEY_CHECK(grad.is_contiguous(), "relu_backward_: the gradient must be contiguous");
  zip_into("relu_backward", grad, out, grad, [](float g, float y) { return y > 0.f ? g : 0.f; });
}
Tensor relu_backward(const Tensor& grad, const Tensor& out) {
  return zip("relu_backward", grad, out, [](float g, float y) { return y > 0.f ? g : 0.f; });
}

}  // namespace galley::kernels::cpu
