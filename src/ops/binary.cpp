// add, sub, mul and div of two tensors, with NumPy broadcasting: checks, the device switch and
// the autograd record (a broadcast input's gradient is summed back to its shape).
#include "src/ops/binary.h"

#include <algorithm>

#include "galley/autograd.h"
#include "galley/ops.h"
#include "galley/profiler.h"
#include "src/ops/autocast.h"
#include "src/ops/dispatch.h"
#include "src/ops/unary.h"

namespace galley {

namespace cpu = kernels::cpu;
namespace gpu = kernels::cuda;
using kernels::BinaryOp;

namespace detail {

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  const size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    GALLEY_CHECK(da == db || da == 1 || db == 1, op, ": shapes ", shape_str(a), " and ",
                 shape_str(b), " cannot be broadcast together (dimension ", i, ": ", da, " vs ", db,
                 ")");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b) {
  static const char* names[] = {"add", "sub", "mul", "div"};
  GALLEY_CHECK(a.dtype() == b.dtype(), names[int(op)], ": dtypes ", dtype_name(a.dtype()), " and ",
               dtype_name(b.dtype()), " differ (convert one with .to(dtype))");
  const Shape out_shape = broadcast_shapes(a.shape(), b.shape(), names[int(op)]);
  const size_t rank = std::max<size_t>(out_shape.size(), 1);
  const Device dev = a.device();
  Tensor ca = a.contiguous(), cb = b.contiguous();
  Tensor out = Tensor::empty(out_shape, a.dtype(), dev);
  auto sa = aligned(a.shape(), rank), sb = aligned(b.shape(), rank), so = aligned(out_shape, rank);
  if (dev.is_cuda())
    gpu::binary(op, a.dtype(), ca.raw_data(), sa.data(), cb.raw_data(), sb.data(), out.raw_data(),
                so.data(), int(rank), stream(dev));
  else
    cpu::binary(op, a.dtype(), ca.raw_data(), sa.data(), cb.raw_data(), sb.data(), out.raw_data(),
                so.data(), int(rank));
  return out;
}

Tensor sum_to(const Tensor& g, const Shape& shape) {
  if (g.shape() == shape) return g;
  const size_t rank = std::max<size_t>(g.dim(), 1);
  const Device dev = g.device();
  Tensor cg = g.contiguous();
  Tensor out = Tensor::empty(shape, g.dtype(), dev);
  auto sg = aligned(g.shape(), rank), so = aligned(shape, rank);
  if (dev.is_cuda())
    gpu::sum_to(g.dtype(), cg.raw_data(), sg.data(), out.raw_data(), so.data(), int(rank),
                stream(dev));
  else
    cpu::sum_to(g.dtype(), cg.raw_data(), sg.data(), out.raw_data(), so.data(), int(rank));
  return out;
}

void add_inplace(Tensor& acc, const Tensor& g) {
  GALLEY_CHECK(acc.dtype() == g.dtype(), "add_inplace: dtypes ", dtype_name(acc.dtype()), " and ",
               dtype_name(g.dtype()), " differ");
  GALLEY_CHECK(acc.shape() == g.shape(), "add_inplace: ", shape_str(acc.shape()), " vs ",
               shape_str(g.shape()));
  GALLEY_CHECK(acc.is_contiguous(), "add_inplace: the accumulator must be contiguous");
  Tensor cg = g.contiguous();
  if (acc.device().is_cuda())
    gpu::add_inplace(acc.dtype(), acc.raw_data(), cg.raw_data(), acc.numel(), stream(acc.device()));
  else
    cpu::add_inplace(acc.dtype(), acc.raw_data(), cg.raw_data(), acc.numel());
}

}  // namespace detail

using autograd::record;
using detail::binary;
using detail::sum_to;

Tensor add(const Tensor& a, const Tensor& b) {
  if (detail::autocast_on()) {
    detail::AutocastPause pause;
    const DType d = pause.widest({&a, &b});
    return add(pause.to(a, d), pause.to(b, d));
  }
  profiler::OpScope prof("add", {&a, &b});
  detail::check_floating_pair("add", a, b);
  Tensor out = binary(BinaryOp::Add, a, b);
  if (!autograd::needs_grad({&a, &b})) return out;
  return record(out, "add", {a, b},
                [sa = a.shape(), sb = b.shape()](const Tensor& g, std::vector<Tensor>& gi) {
                  gi[0] = sum_to(g, sa);
                  gi[1] = sum_to(g, sb);
                });
}

Tensor sub(const Tensor& a, const Tensor& b) {
  if (detail::autocast_on()) {
    detail::AutocastPause pause;
    const DType d = pause.widest({&a, &b});
    return sub(pause.to(a, d), pause.to(b, d));
  }
  profiler::OpScope prof("sub", {&a, &b});
  detail::check_floating_pair("sub", a, b);
  Tensor out = binary(BinaryOp::Sub, a, b);
  if (!autograd::needs_grad({&a, &b})) return out;
  return record(out, "sub", {a, b},
                [sa = a.shape(), sb = b.shape()](const Tensor& g, std::vector<Tensor>& gi) {
                  gi[0] = sum_to(g, sa);
                  gi[1] = sum_to(detail::scaled(g, -1.f), sb);
                });
}

Tensor mul(const Tensor& a, const Tensor& b) {
  if (detail::autocast_on()) {
    detail::AutocastPause pause;
    const DType d = pause.widest({&a, &b});
    return mul(pause.to(a, d), pause.to(b, d));
  }
  profiler::OpScope prof("mul", {&a, &b});
  detail::check_floating_pair("mul", a, b);
  Tensor out = binary(BinaryOp::Mul, a, b);
  if (!autograd::needs_grad({&a, &b})) return out;
  // Each operand is kept for the other's gradient only, as PyTorch keeps them.
  const bool ga = a.requires_grad(), gb = b.requires_grad();
  Tensor da = gb ? a.detach() : Tensor(), db = ga ? b.detach() : Tensor();
  return record(out, "mul", {a, b},
                [da, db, sa = a.shape(), sb = b.shape()](const Tensor& g, std::vector<Tensor>& gi) {
                  if (db.defined()) gi[0] = sum_to(binary(BinaryOp::Mul, g, db), sa);
                  if (da.defined()) gi[1] = sum_to(binary(BinaryOp::Mul, g, da), sb);
                },
                {{"first operand", da}, {"second operand", db}});
}

Tensor div(const Tensor& a, const Tensor& b) {
  if (detail::autocast_on()) {
    detail::AutocastPause pause;
    const DType d = pause.widest({&a, &b});
    return div(pause.to(a, d), pause.to(b, d));
  }
  profiler::OpScope prof("div", {&a, &b});
  detail::check_floating_pair("div", a, b);
  Tensor out = binary(BinaryOp::Div, a, b);
  if (!autograd::needs_grad({&a, &b})) return out;
  // The numerator is kept for the divisor's gradient only (as PyTorch keeps it, not the
  // quotient, which the caller may then write), and the quotient computed again from it.
  Tensor db = b.detach(), da = b.requires_grad() ? a.detach() : Tensor();
  Shape sa = a.shape();
  return record(
      out, "div", {a, b},
      [sa, da, db](const Tensor& g, std::vector<Tensor>& gi) {
        Tensor g_over_b = binary(BinaryOp::Div, g, db);
        gi[0] = sum_to(g_over_b, sa);
        // d(a/b)/db = -(a/b)/b
        if (da.defined())
          gi[1] = sum_to(
              detail::scaled(binary(BinaryOp::Mul, g_over_b, binary(BinaryOp::Div, da, db)), -1.f),
              db.shape());
      },
      {{"numerator", da}, {"divisor", db}});
}

}  // namespace galley
