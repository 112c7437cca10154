#pragma once
// The float32 formulas of the activations of kernels/unary.h and of their derivatives, shared by
// the CPU kernels and the CUDA kernels so that both evaluate one expression: PyTorch's, in its
// operation order (aten/src/ATen/native/cpu/Activation.cpp and UnaryOpsKernel.cpp). Each is
// templated over `M`, the side's exp, erf and tanh of a float (M::exp, M::erf, M::tanh): libm
// or its vector forms on the host, CUDA's on the device. Plain C++ (no CUDA types).
//
// No branches and no arithmetic under a condition (select_bits() below), so the host loops
// vectorise.
#include <cstdint>

#include "galley/half.h"

namespace galley::kernels::unary_math {

// float(M_SQRT1_2), float(M_2_SQRTPI * M_SQRT1_2 * 0.5) = 1/sqrt(2 pi), and the tanh form's
// float(M_SQRT2 * M_2_SQRTPI * 0.5) = sqrt(2/pi) and 0.044715, rounded to float as PyTorch does.
constexpr float kSqrtHalf = float(0.70710678118654752440);
constexpr float kInvSqrt2Pi = float(0.39894228040143267794);
constexpr float kSqrt2OverPi = float(0.79788456080286535588);
constexpr float kKappa = float(0.044715);
constexpr float kFloatMax = 3.40282347e38f;

// c ? a : b, by bit masks. Written as `?:`, GCC either keeps a branch in a loop that calls a
// vector function (it does not if-convert such loops) or sinks the arithmetic feeding one side
// under the condition, which it then may not speculate (it might raise an FP exception): either
// way the loop stays scalar. Integer masks do neither.
GALLEY_HOST_DEVICE inline float select_bits(bool c, float a, float b) {
  const uint32_t m = 0u - uint32_t(c);
  return detail::bits_float((detail::float_bits(a) & m) | (detail::float_bits(b) & ~m));
}

// v, or FLT_MAX where v is +inf (a NaN stays NaN).
GALLEY_HOST_DEVICE inline float capped(float v) {
  return select_bits(v > kFloatMax, kFloatMax, v);
}

// 1 / (1 + e^-x): e^-x overflows to inf for x < -88.7 and the quotient is then 0, never NaN.
template <typename M>
GALLEY_HOST_DEVICE inline float sigmoid(float x) {
  return 1.f / (1.f + M::exp(-x));
}
// From the output y: grad * (1 - y) * y.
GALLEY_HOST_DEVICE inline float sigmoid_backward(float g, float y) {
  return g * (1.f - y) * y;
}

template <typename M>
GALLEY_HOST_DEVICE inline float tanh(float x) {
  return M::tanh(x);
}
// From the output y: grad * (1 - y^2).
GALLEY_HOST_DEVICE inline float tanh_backward(float g, float y) {
  return g * (1.f - y * y);
}

// x / (1 + e^-x): -0 below x = -88.7 (x / inf).
template <typename M>
GALLEY_HOST_DEVICE inline float silu(float x) {
  return x / (1.f + M::exp(-x));
}
// grad * s * (1 + x (1 - s)), s = sigmoid(x): at x -> -inf s is 0 first, so the product is 0.
template <typename M>
GALLEY_HOST_DEVICE inline float silu_backward(float g, float x) {
  const float s = 1.f / (1.f + M::exp(-x));
  return g * s * (1.f + x * (1.f - s));
}

// x * 0.5 * (1 + erf(x / sqrt 2)).
template <typename M>
GALLEY_HOST_DEVICE inline float gelu(float x) {
  return x * 0.5f * (1.f + M::erf(x * kSqrtHalf));
}
// grad * (cdf + x * pdf): pdf = e^(-x^2 / 2) / sqrt(2 pi) underflows to 0 long before x^2
// overflows, so x * pdf is 0 for every finite large x.
template <typename M>
GALLEY_HOST_DEVICE inline float gelu_backward(float g, float x) {
  const float cdf = 0.5f * (1.f + M::erf(x * kSqrtHalf));
  const float pdf = kInvSqrt2Pi * M::exp(x * x * -0.5f);
  return g * (cdf + x * pdf);
}

// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))): x^3 overflowing makes tanh +-1, fine.
template <typename M>
GALLEY_HOST_DEVICE inline float gelu_tanh(float x) {
  const float inner = kSqrt2OverPi * (x + kKappa * (x * x * x));
  return 0.5f * x * (1.f + M::tanh(inner));
}
// grad * (0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2)), t the tanh above.
// Two departures from PyTorch. 1 + t and 1 - t^2 come from e = exp(-2 |inner|), as 2 / (1 + e)
// (2 e / (1 + e) for inner < 0) and 4 e / (1 + e)^2, not from t: near saturation both are
// differences of nearly equal numbers, where the tanh's last-bit error (libm's vector tanh, or
// PyTorch's, is off by an ulp at some inputs, differently on different CPUs) becomes the whole
// result, amplified by x^3 (at x = -5.35, 8x the true gradient). And the inner derivative is
// capped at FLT_MAX: for |x| > 1.8e19 it is inf, the tanh has long saturated (1 - t^2 == 0), and
// PyTorch's 0 * inf gives NaN; here the term is 0. Below that the cap changes nothing.
template <typename M>
GALLEY_HOST_DEVICE inline float gelu_tanh_backward(float g, float x) {
  const float x_sq = x * x;
  const float inner = kSqrt2OverPi * (x + kKappa * (x_sq * x));
  const float e = M::exp(-2.f * detail::bits_float(detail::float_bits(inner) & 0x7fffffffu));
  const float d = 1.f / (1.f + e);
  const float one_plus_t = select_bits(inner >= 0.f, 2.f * d, 2.f * e * d);
  const float left = 0.5f * x;
  const float left_derivative = 0.5f * one_plus_t;
  const float tanh_derivative = 4.f * e * d * d;
  const float inner_derivative = capped(kSqrt2OverPi * (1.f + 3.f * kKappa * x_sq));
  const float right_derivative = left * tanh_derivative * inner_derivative;
  return g * (left_derivative + right_derivative);
}

// max(x, 0) as PyTorch's relu: `!(x <= 0)` keeps a NaN as NaN (fmaxf would drop it), and -0
// becomes 0. No arithmetic under the condition, so loops over it vectorise.
GALLEY_HOST_DEVICE inline float relu(float x) {
  return !(x <= 0.f) ? x : 0.f;
}
// From the output: 0 where y <= 0, else grad, as PyTorch's threshold_backward: a NaN output
// (from a NaN input) passes its gradient on.
GALLEY_HOST_DEVICE inline float relu_backward(float g, float y) {
  return !(y <= 0.f) ? g : 0.f;
}

// x^p as PyTorch's pow(tensor, scalar) takes it: its special exponents by their own operations
// (0.5 a square root, -0.5 its reciprocal, 2 and 3 products, -1 and -2 reciprocals), which round
// differently from a general pow and differ from it at -0 and -inf (sqrt(-inf) is NaN, sqrt(-0)
// -0, where pow gives +inf and +0); any other exponent by M::pow. p is the same for every element,
// so the branches are the loop's, not the element's.
template <typename M>
GALLEY_HOST_DEVICE inline float pow_scalar(float x, float p) {
  if (p == 0.5f) return M::sqrt(x);
  if (p == -0.5f) return 1.f / M::sqrt(x);
  if (p == 2.f) return x * x;
  if (p == 3.f) return x * x * x;
  if (p == -1.f) return 1.f / x;
  if (p == -2.f) return 1.f / (x * x);
  return M::pow(x, p);
}
// d(x^p)/dx times g, as PyTorch's pow_backward: g * (p * x^(p - 1)), x^(p - 1) by pow_scalar; x^0
// is constant, so its gradient is zero, also at 0 and NaN (where x^-1 is not finite).
template <typename M>
GALLEY_HOST_DEVICE inline float pow_backward(float g, float x, float p) {
  return p == 0.f ? 0.f : g * (p * pow_scalar<M>(x, p - 1.f));
}

// x * (x > 0 ? 1 : slope), PyTorch's vectorised form: a NaN stays NaN (NaN * slope), -0 stays -0.
GALLEY_HOST_DEVICE inline float leaky_relu(float x, float slope) {
  return x * select_bits(x > 0.f, 1.f, slope);
}
// From the input: grad * (x > 0 ? 1 : slope), so x == 0 takes the slope, as in PyTorch.
GALLEY_HOST_DEVICE inline float leaky_relu_backward(float g, float x, float slope) {
  return g * select_bits(x > 0.f, 1.f, slope);
}

}  // namespace galley::kernels::unary_math
