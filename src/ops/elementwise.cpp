// Elementwise ops: arithmetic with broadcasting, scalar forms, exp/log/pow and relu.
#include "galley/autograd.h"
#include "galley/ops.h"
#include "galley/profiler.h"
#include "src/device_scope.h"
#include "src/ops/backend.h"
#include "src/ops/dispatch.h"

namespace galley {

using autograd::record;

Tensor add(const Tensor& a, const Tensor& b) {
  profiler::OpScope prof("add", {&a, &b});
  detail::check_floating_pair("add", a, b);
  detail::DeviceScope scope(a.device());
  Tensor out = backend::binary(backend::BinaryOp::Add, a, b);
  if (!autograd::needs_grad({&a, &b})) return out;
  return record(out, "add", {a, b},
                [sa = a.shape(), sb = b.shape()](const Tensor& g, std::vector<Tensor>& gi) {
                  gi[0] = backend::sum_to(g, sa);
                  gi[1] = backend::sum_to(g, sb);
                });
}

Tensor sub(const Tensor& a, const Tensor& b) {
  profiler::OpScope prof("sub", {&a, &b});
  detail::check_floating_pair("sub", a, b);
  detail::DeviceScope scope(a.device());
  Tensor out = backend::binary(backend::BinaryOp::Sub, a, b);
  if (!autograd::needs_grad({&a, &b})) return out;
  return record(out, "sub", {a, b},
                [sa = a.shape(), sb = b.shape()](const Tensor& g, std::vector<Tensor>& gi) {
                  gi[0] = backend::sum_to(g, sa);
                  gi[1] = backend::sum_to(backend::affine(g, -1.f, 0.f), sb);
                });
}

Tensor mul(const Tensor& a, const Tensor& b) {
  profiler::OpScope prof("mul", {&a, &b});
  detail::check_floating_pair("mul", a, b);
  detail::DeviceScope scope(a.device());
  Tensor out = backend::binary(backend::BinaryOp::Mul, a, b);
  if (!autograd::needs_grad({&a, &b})) return out;
  Tensor da = a.detach(), db = b.detach();
  return record(out, "mul", {a, b}, [da, db](const Tensor& g, std::vector<Tensor>& gi) {
    gi[0] = backend::sum_to(backend::binary(backend::BinaryOp::Mul, g, db), da.shape());
    gi[1] = backend::sum_to(backend::binary(backend::BinaryOp::Mul, g, da), db.shape());
  });
}

Tensor div(const Tensor& a, const Tensor& b) {
  profiler::OpScope prof("div", {&a, &b});
  detail::check_floating_pair("div", a, b);
  detail::DeviceScope scope(a.device());
  Tensor out = backend::binary(backend::BinaryOp::Div, a, b);
  if (!autograd::needs_grad({&a, &b})) return out;
  Tensor db = b.detach(), dout = out.detach();
  Shape sa = a.shape();
  return record(out, "div", {a, b}, [sa, db, dout](const Tensor& g, std::vector<Tensor>& gi) {
    Tensor g_over_b = backend::binary(backend::BinaryOp::Div, g, db);
    gi[0] = backend::sum_to(g_over_b, sa);
    // d(a/b)/db = -(a/b)/b = -out/b
    gi[1] = backend::sum_to(
        backend::affine(backend::binary(backend::BinaryOp::Mul, g_over_b, dout), -1.f, 0.f),
        db.shape());
  });
}

Tensor add(const Tensor& a, float s) {
  profiler::OpScope prof("add", {&a});
  detail::check_floating("add", a);
  detail::DeviceScope scope(a.device());
  Tensor out = backend::affine(a, 1.f, s);
  if (!autograd::needs_grad({&a})) return out;
  return record(out, "add_scalar", {a},
                [](const Tensor& g, std::vector<Tensor>& gi) { gi[0] = g; });
}

Tensor mul(const Tensor& a, float s) {
  profiler::OpScope prof("mul", {&a});
  detail::check_floating("mul", a);
  detail::DeviceScope scope(a.device());
  Tensor out = backend::affine(a, s, 0.f);
  if (!autograd::needs_grad({&a})) return out;
  return record(out, "mul_scalar", {a}, [s](const Tensor& g, std::vector<Tensor>& gi) {
    gi[0] = backend::affine(g, s, 0.f);
  });
}

Tensor neg(const Tensor& a) {
  profiler::OpScope prof("neg", {&a});
  detail::check_floating("neg", a);
  detail::DeviceScope scope(a.device());
  Tensor out = backend::affine(a, -1.f, 0.f);
  if (!autograd::needs_grad({&a})) return out;
  return record(out, "neg", {a}, [](const Tensor& g, std::vector<Tensor>& gi) {
    gi[0] = backend::affine(g, -1.f, 0.f);
  });
}

Tensor exp(const Tensor& a) {
  profiler::OpScope prof("exp", {&a});
  detail::check_floating("exp", a);
  detail::DeviceScope scope(a.device());
  Tensor out = backend::exp(a);
  if (!autograd::needs_grad({&a})) return out;
  Tensor dout = out.detach();
  return record(out, "exp", {a}, [dout](const Tensor& g, std::vector<Tensor>& gi) {
    gi[0] = backend::binary(backend::BinaryOp::Mul, g, dout);
  });
}

Tensor log(const Tensor& a) {
  profiler::OpScope prof("log", {&a});
  detail::check_floating("log", a);
  detail::DeviceScope scope(a.device());
  Tensor out = backend::log(a);
  if (!autograd::needs_grad({&a})) return out;
  Tensor da = a.detach();
  return record(out, "log", {a}, [da](const Tensor& g, std::vector<Tensor>& gi) {
    gi[0] = backend::binary(backend::BinaryOp::Div, g, da);
  });
}

Tensor pow(const Tensor& a, float p) {
  profiler::OpScope prof("pow", {&a});
  detail::check_floating("pow", a);
  detail::DeviceScope scope(a.device());
  Tensor out = backend::pow(a, p);
  if (!autograd::needs_grad({&a})) return out;
  Tensor da = a.detach();
  return record(out, "pow", {a}, [da, p](const Tensor& g, std::vector<Tensor>& gi) {
    gi[0] = backend::pow_backward(g, da, p);
  });
}

namespace {
// True when `t` is the only handle to its data (no views, no saved copies), so an op may write
// its result into t's buffer without anyone observing it.
bool sole_owner(const Tensor& t) {
  return t.impl_ptr().use_count() == 1 && t.impl()->storage.use_count() == 1 && t.is_contiguous();
}

Tensor relu_impl(const Tensor& a, bool reuse_input) {
  profiler::OpScope prof("relu", {&a});
  detail::check_floating("relu", a);
  detail::DeviceScope scope(a.device());
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
    backend::relu_(out);
  } else {
    out = backend::relu(a);
  }
  if (!autograd::needs_grad({&a})) return out;
  Tensor dout = out.detach();
  return record(out, "relu", {a}, [dout](const Tensor& g, std::vector<Tensor>& gi) {
    // The incoming gradient is usually a temporary of the engine's: mask it in place.
    if (sole_owner(g)) {
      Tensor gm = g;
      backend::relu_backward_(gm, dout);
      gi[0] = gm;
    } else {
      gi[0] = backend::relu_backward(g, dout);
    }
  });
}
}  // namespace

Tensor relu(const Tensor& a) {
  return relu_impl(a, false);
}

Tensor relu(Tensor&& a) {
  return relu_impl(a, a.defined() && sole_owner(a));
}

Tensor bias_relu(const Tensor& x, const Tensor& bias, int64_t dim) {
  profiler::OpScope prof("bias_relu", {&x, &bias});
  detail::check_floating_pair("bias_relu", x, bias);
  detail::DeviceScope scope(x.device());
  const int64_t d = dim < 0 ? dim + x.dim() : dim;
  GALLEY_CHECK(x.dim() >= 1 && d >= 0 && d < x.dim(), "bias_relu: dimension ", dim,
               " is out of range for ", shape_str(x.shape()));
  GALLEY_CHECK(bias.dim() == 1 && bias.size(0) == x.size(d), "bias_relu: bias ",
               shape_str(bias.shape()), " does not match dimension ", dim, " of ",
               shape_str(x.shape()));
  int64_t outer = 1, inner = 1;
  for (int64_t k = 0; k < d; ++k) outer *= x.size(k);
  for (int64_t k = d + 1; k < x.dim(); ++k) inner *= x.size(k);
  const int64_t channels = x.size(d);
  // The kernels take float32: a 16-bit input is widened, the output rounded once, and the
  // gradients computed in float32 (masked by the rounded output, as a 16-bit relu is).
  const DType dtype = x.dtype();
  Tensor cx = detail::widened(x).contiguous(), cb = detail::widened(bias).contiguous();
  Tensor out = Tensor::empty(x.shape());
  const Device dev = x.device();
  backend::bias_relu_forward(dev, cx.data_ptr<float>(), cb.data_ptr<float>(), outer, channels,
                             inner, out.data_ptr<float>());
  Tensor result = detail::rounded(out, dtype);
  if (!autograd::needs_grad({&x, &bias})) return result;
  Tensor dout = result.detach();
  const bool gx = x.requires_grad(), gb = bias.requires_grad();
  return record(result, "bias_relu", {x, bias},
                detail::widened_backward(dtype, [=](const Tensor& g, std::vector<Tensor>& gi) {
                  // The masked gradient goes into the incoming one when nothing else holds it.
                  const bool reuse = gx && sole_owner(g);
                  Tensor cg = g.contiguous();
                  Tensor wout = detail::widened(dout);
                  Tensor gxt = reuse ? cg : Tensor::empty(wout.shape());
                  if (gb) gi[1] = Tensor::empty({channels});
                  backend::bias_relu_backward(dev, cg.data_ptr<float>(), wout.data_ptr<float>(),
                                              outer, channels, inner, gxt.data_ptr<float>(),
                                              gb ? gi[1].data_ptr<float>() : nullptr);
                  if (gx) gi[0] = gxt;
                }));
}

}  // namespace galley
