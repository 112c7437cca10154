// Printing: Tensor::to_string and operator<<.
#include <algorithm>
#include <cmath>
#include <functional>
#include <iomanip>
#include <limits>
#include <ostream>
#include <sstream>

#include "galley/autograd.h"
#include "galley/half.h"
#include "galley/tensor.h"

namespace galley {

std::string Tensor::to_string() const {
  if (!impl_) return "Tensor(undefined)";
  std::ostringstream os;
  os << "Tensor(";
  if (!device().is_cpu()) {
    os << "shape=" << shape_str(shape()) << ", dtype=" << dtype_name(dtype())
       << ", device=" << device().str() << ")";
    return os.str();
  }
  Tensor c = contiguous();
  const int64_t n = numel();
  const int64_t edge = 3;  // elements shown at each end of a long row
  const bool floating = is_floating_point(dtype());
  auto real = [&](int64_t i) {
    if (dtype() == DType::Float32) return c.data<float>()[i];
    if (dtype() == DType::BFloat16) return float(c.data<bfloat16>()[i]);
    return float(c.data<float16>()[i]);
  };
  // PyTorch's choice, from the elements shown: scientific notation when their finite non-zero
  // magnitudes span more than 1000x, pass 1e8, or fall below 1e-4 (fixed point would print 1e-6
  // as 0.0000).
  bool scientific = false;
  float lo = std::numeric_limits<float>::infinity(), hi = 0.f;
  auto measure = [&](int64_t i) {
    const float a = std::fabs(real(i));
    if (a == 0.f || !std::isfinite(a)) return;
    lo = std::min(lo, a);
    hi = std::max(hi, a);
  };
  bool measuring = false;
  auto value = [&](int64_t i) {
    std::ostringstream v;
    if (floating) {
      v << std::setprecision(4) << (scientific ? std::scientific : std::fixed) << real(i);
    } else if (dtype() == DType::Int64) {
      v << c.data<int64_t>()[i];
    } else if (dtype() == DType::UInt8) {
      v << int(c.data<uint8_t>()[i]);
    } else {
      v << "?";
    }
    return v.str();
  };
  std::function<void(int64_t, int64_t, int)> rec = [&](int64_t d, int64_t base, int indent) {
    if (d == dim()) {
      if (measuring)
        measure(base);
      else
        os << value(base);
      return;
    }
    int64_t len = shape()[d], stride = shape_numel(Shape(shape().begin() + d + 1, shape().end()));
    os << "[";
    for (int64_t i = 0; i < len; ++i) {
      if (len > 2 * edge && i == edge) {
        os << (d + 1 == dim() ? "..., " : "...,\n" + std::string(indent + 1, ' '));
        i = len - edge;
      }
      rec(d + 1, base + i * stride, indent + 1);
      if (i + 1 < len) os << (d + 1 == dim() ? ", " : ",\n" + std::string(indent + 1, ' '));
    }
    os << "]";
  };
  if (n > 0 && floating) {  // the shown elements' magnitudes first
    std::ostringstream shown;
    std::swap(os, shown);
    measuring = true;
    rec(0, 0, 7);
    measuring = false;
    std::swap(os, shown);
    scientific = hi > 0.f && (hi / lo > 1000.f || hi > 1e8f || lo < 1e-4f);
  }
  if (n > 0)
    rec(0, 0, 7);
  else
    os << "[]";
  os << ", shape=" << shape_str(shape()) << ", dtype=" << dtype_name(dtype());
  if (!device().is_cpu() || device().index() != 0) os << ", device=" << device().str();
  if (impl_->grad_fn)
    os << ", grad_fn=" << impl_->grad_fn->name;
  else if (impl_->requires_grad)
    os << ", requires_grad=true";
  os << ")";
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) {
  return os << t.to_string();
}

}  // namespace galley
