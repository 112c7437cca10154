// Elementwise unary ops: the scalar forms of add and mul, neg, exp, log, pow, relu (with its
// in-place form for temporaries) and the activations gelu, silu, sigmoid, tanh and leaky_relu:
// checks, the device switch and the autograd record.
#include "src/ops/unary.h"

#include <cmath>
#include <memory>

#include "galley/autograd.h"
#include "galley/ops.h"
#include "galley/profiler.h"
#include "kernels/unary.h"
#include "src/ops/autocast.h"
#include "src/ops/binary.h"
#include "src/ops/dispatch.h"

namespace galley {

namespace cpu = kernels::cpu;
namespace gpu = kernels::cuda;
using kernels::BinaryOp;
using kernels::UnaryOp;

namespace {

// out = f(a) in a's dtype on its device; out may be a (in place).
void run_unary(UnaryOp op, const Tensor& a, Tensor& out, float p0 = 0.f, float p1 = 0.f) {
  if (a.device().is_cuda())
    gpu::unary(op, a.dtype(), a.raw_data(), out.raw_data(), a.numel(), p0, p1,
               detail::stream(a.device()));
  else
    cpu::unary(op, a.dtype(), a.raw_data(), out.raw_data(), a.numel(), p0, p1);
}

Tensor unary(UnaryOp op, const Tensor& a, float p0 = 0.f, float p1 = 0.f) {
  Tensor ca = a.contiguous();
  Tensor out = Tensor::empty(a.shape(), a.dtype(), a.device());
  run_unary(op, ca, out, p0, p1);
  return out;
}

// `grad` and `other` of one shape and dtype, as the backward kernels take them.
void check_same(const char* op, const Tensor& grad, const Tensor& other) {
  GALLEY_CHECK(grad.dtype() == other.dtype(), op, ": dtypes ", dtype_name(grad.dtype()), " and ",
               dtype_name(other.dtype()), " differ");
  GALLEY_CHECK(grad.shape() == other.shape(), op, ": shapes ", shape_str(grad.shape()), " and ",
               shape_str(other.shape()), " differ");
}

Tensor pow_backward(const Tensor& grad, const Tensor& a, float p) {
  check_same("pow_backward", grad, a);
  Tensor cg = grad.contiguous(), ca = a.contiguous();
  Tensor out = Tensor::empty(a.shape(), a.dtype(), a.device());
  if (a.device().is_cuda())
    gpu::pow_backward(a.dtype(), cg.raw_data(), ca.raw_data(), out.raw_data(), a.numel(), p,
                      detail::stream(a.device()));
  else
    cpu::pow_backward(a.dtype(), cg.raw_data(), ca.raw_data(), out.raw_data(), a.numel(), p);
  return out;
}

// r = grad where out > 0, else 0 (r may be grad, which is then contiguous).
void relu_backward(const Tensor& grad, const Tensor& out, Tensor& r) {
  check_same("relu_backward", grad, out);
  Tensor cg = grad.contiguous(), co = out.contiguous();
  if (out.device().is_cuda())
    gpu::relu_backward(out.dtype(), cg.raw_data(), co.raw_data(), r.raw_data(), out.numel(),
                       detail::stream(out.device()));
  else
    cpu::relu_backward(out.dtype(), cg.raw_data(), co.raw_data(), r.raw_data(), out.numel());
}

// grad * f'(x) of an activation from `saved`, its forward's output or input as
// kernels::backward_reads_output says; into the gradient's own buffer when nothing else holds it.
Tensor activation_backward(UnaryOp op, const Tensor& grad, const Tensor& saved, float p0) {
  check_same("unary_backward", grad, saved);
  Tensor cg = grad.contiguous(), cs = saved.contiguous();
  Tensor r =
      detail::sole_owner(grad) ? grad : Tensor::empty(saved.shape(), saved.dtype(), saved.device());
  if (saved.device().is_cuda())
    gpu::unary_backward(op, saved.dtype(), cg.raw_data(), cs.raw_data(), r.raw_data(),
                        saved.numel(), p0, detail::stream(saved.device()));
  else
    cpu::unary_backward(op, saved.dtype(), cg.raw_data(), cs.raw_data(), r.raw_data(),
                        saved.numel(), p0);
  return r;
}

// An activation and its autograd record, which keeps the output (sigmoid, tanh) or the input
// (the others) for backward, as PyTorch does.
Tensor activation(UnaryOp op, const Tensor& a, float p0 = 0.f) {
  const char* name = kernels::unary_op_name(op);
  profiler::OpScope prof(name, {&a});
  detail::check_floating(name, a);
  Tensor ca = a.contiguous();  // kept for backward as it is, when that reads the input
  Tensor out = unary(op, ca, p0);
  if (!autograd::needs_grad({&a})) return out;
  const bool reads_output = kernels::backward_reads_output(op);
  Tensor saved = reads_output ? out.detach() : ca.detach();
  return autograd::record(out, name, {a},
                          [op, saved, p0](const Tensor& g, std::vector<Tensor>& gi) {
                            gi[0] = activation_backward(op, g, saved, p0);
                          },
                          {{reads_output ? "output" : "input", saved}});
}

Tensor relu_impl(const Tensor& a, bool reuse_input) {
  profiler::OpScope prof("relu", {&a});
  detail::check_floating("relu", a);
  Tensor out;
  if (reuse_input) {
    // The input is a temporary nobody else holds: rectify it in place (one pass over memory
    // instead of a read and a write to a fresh buffer). The graph keeps the input's handle for
    // linking only; its producer's backward never reads its own output.
    auto impl = std::make_shared<detail::TensorImpl>();
    impl->storage = a.impl()->storage;
    impl->offset = a.impl()->offset;
    impl->shape = a.shape();
    impl->strides = a.strides();
    impl->dtype = a.dtype();
    out = Tensor(std::move(impl));
    out.bump_version();
    run_unary(UnaryOp::Relu, out, out);
  } else {
    out = unary(UnaryOp::Relu, a);
  }
  if (!autograd::needs_grad({&a})) return out;
  Tensor dout = out.detach();
  return autograd::record(
      out, "relu", {a},
      [dout](const Tensor& g, std::vector<Tensor>& gi) {
        // The incoming gradient is usually a temporary of the engine's: mask it in place.
        Tensor r =
            detail::sole_owner(g) ? g : Tensor::empty(dout.shape(), dout.dtype(), dout.device());
        relu_backward(g, dout, r);
        gi[0] = r;
      },
      {{"output", dout}});
}

}  // namespace

namespace detail {
Tensor affine(const Tensor& a, float scale, float shift) {
  return unary(UnaryOp::Affine, a, scale, shift);
}
Tensor scaled(const Tensor& a, float scale) {
  return affine(a, scale, -0.f);  // x + -0 is x for every x, -0 included
}
}  // namespace detail

using autograd::record;
using detail::affine;
using detail::scaled;

Tensor add(const Tensor& a, float s) {
  profiler::OpScope prof("add", {&a});
  detail::check_floating("add", a);
  Tensor out = affine(a, 1.f, s);
  if (!autograd::needs_grad({&a})) return out;
  return record(out, "add_scalar", {a},
                [](const Tensor& g, std::vector<Tensor>& gi) { gi[0] = g; });
}

Tensor mul(const Tensor& a, float s) {
  profiler::OpScope prof("mul", {&a});
  detail::check_floating("mul", a);
  Tensor out = scaled(a, s);
  if (!autograd::needs_grad({&a})) return out;
  return record(out, "mul_scalar", {a},
                [s](const Tensor& g, std::vector<Tensor>& gi) { gi[0] = scaled(g, s); });
}

Tensor div(const Tensor& a, float s) {
  profiler::OpScope prof("div", {&a});
  detail::check_floating("div", a);
  Tensor out = unary(UnaryOp::Div, a, s);
  if (!autograd::needs_grad({&a})) return out;
  return record(out, "div_scalar", {a}, [s](const Tensor& g, std::vector<Tensor>& gi) {
    gi[0] = unary(UnaryOp::Div, g, s);
  });
}

Tensor neg(const Tensor& a) {
  profiler::OpScope prof("neg", {&a});
  detail::check_floating("neg", a);
  Tensor out = scaled(a, -1.f);
  if (!autograd::needs_grad({&a})) return out;
  return record(out, "neg", {a},
                [](const Tensor& g, std::vector<Tensor>& gi) { gi[0] = scaled(g, -1.f); });
}

Tensor exp(const Tensor& a) {
  if (detail::autocast_on()) {
    detail::AutocastPause pause;
    return exp(pause.f32(a));
  }
  profiler::OpScope prof("exp", {&a});
  detail::check_floating("exp", a);
  Tensor out = unary(UnaryOp::Exp, a);
  if (!autograd::needs_grad({&a})) return out;
  Tensor dout = out.detach();
  return record(out, "exp", {a},
                [dout](const Tensor& g, std::vector<Tensor>& gi) {
                  gi[0] = detail::binary(BinaryOp::Mul, g, dout);
                },
                {{"output", dout}});
}

Tensor log(const Tensor& a) {
  if (detail::autocast_on()) {
    detail::AutocastPause pause;
    return log(pause.f32(a));
  }
  profiler::OpScope prof("log", {&a});
  detail::check_floating("log", a);
  Tensor out = unary(UnaryOp::Log, a);
  if (!autograd::needs_grad({&a})) return out;
  Tensor da = a.detach();
  return record(out, "log", {a},
                [da](const Tensor& g, std::vector<Tensor>& gi) {
                  gi[0] = detail::binary(BinaryOp::Div, g, da);
                },
                {{"input", da}});
}

Tensor pow(const Tensor& a, float p) {
  if (detail::autocast_on()) {
    detail::AutocastPause pause;
    return pow(pause.f32(a), p);
  }
  profiler::OpScope prof("pow", {&a});
  detail::check_floating("pow", a);
  Tensor out = unary(UnaryOp::Pow, a, p);
  if (!autograd::needs_grad({&a})) return out;
  Tensor da = a.detach();
  return record(
      out, "pow", {a},
      [da, p](const Tensor& g, std::vector<Tensor>& gi) { gi[0] = pow_backward(g, da, p); },
      {{"input", da}});
}

Tensor relu(const Tensor& a) {
  return relu_impl(a, false);
}

Tensor relu(Tensor&& a) {
  // A leaf that wants a gradient keeps its values (a parameter moved in by mistake), as
  // PyTorch's relu does.
  return relu_impl(a, a.defined() && detail::sole_owner(a) && !(a.is_leaf() && a.requires_grad()));
}

Tensor gelu(const Tensor& a, GeluApproximate approximate) {
  GALLEY_CHECK(approximate == GeluApproximate::None || approximate == GeluApproximate::Tanh,
               "gelu: approximate must be GeluApproximate::None or Tanh, got ",
               static_cast<int>(approximate));
  return activation(approximate == GeluApproximate::Tanh ? UnaryOp::GeluTanh : UnaryOp::Gelu, a);
}

Tensor silu(const Tensor& a) {
  return activation(UnaryOp::Silu, a);
}

Tensor sigmoid(const Tensor& a) {
  return activation(UnaryOp::Sigmoid, a);
}

Tensor tanh(const Tensor& a) {
  return activation(UnaryOp::Tanh, a);
}

Tensor leaky_relu(const Tensor& a, float negative_slope) {
  GALLEY_CHECK(std::isfinite(negative_slope), "leaky_relu: negative_slope must be finite, got ",
               negative_slope);
  return activation(UnaryOp::LeakyRelu, a, negative_slope);
}

}  // namespace galley
