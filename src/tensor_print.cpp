// Printing: Tensor::to_string and operator<<.
#include <functional>
#include <iomanip>
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
  auto value = [&](int64_t i) {
    std::ostringstream v;
    if (dtype() == DType::Float32) {
      v << std::setprecision(4) << std::fixed << c.data<float>()[i];
    } else if (dtype() == DType::BFloat16) {
      v << std::setprecision(4) << std::fixed << float(c.data<bfloat16>()[i]);
    } else if (dtype() == DType::Float16) {
      v << std::setprecision(4) << std::fixed << float(c.data<float16>()[i]);
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
