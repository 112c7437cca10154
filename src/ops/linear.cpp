// matmul and linear (fully connected) on the GEMM kernel (kernels/gemm.h), with the bias seeded
// into the output and its gradient summed by columns (kernels/binary.h, kernels/reduce.h). Where
// the hardware multiplies 16-bit values (a GPU's tensor cores in bfloat16 and float16, a host's
// AMX tiles or AVX512-BF16 in bfloat16) a 16-bit op multiplies its inputs as they are, sums in
// float32 and rounds once; otherwise the GEMM takes float32: a 16-bit op widens its inputs, rounds
// its output once and computes its gradients in float32.
#include "galley/autograd.h"
#include "galley/ops.h"
#include "galley/profiler.h"
#include "kernels/binary.h"
#include "kernels/gemm.h"
#include "kernels/reduce.h"
#include "src/ops/autocast.h"
#include "src/ops/dispatch.h"

namespace galley {

namespace cpu = kernels::cpu;
namespace gpu = kernels::cuda;

namespace {

// Row-major C = alpha * op(A) * op(B) + beta * C on `device` (pointers into its tensors).
void gemm(Device device, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
          const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
          int64_t ldc) {
  if (device.is_cuda())
    gpu::gemm(device.index(), trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc,
              detail::stream(device));
  else
    cpu::gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

// out[j] = the sum of column j of the float32 rows x n matrix g, on `device`.
void column_sums(Device device, const float* g, int64_t rows, int64_t n, float* out) {
  if (device.is_cuda())
    gpu::column_sums(g, rows, n, out, /*accumulate=*/false, detail::stream(device));
  else
    cpu::column_sums(g, rows, n, out, /*accumulate=*/false);
}

// Whether a product of `dtype` on `device` multiplies 16-bit values as they are: tensor cores on
// a GPU, the bfloat16 GEMM on a host that has one.
bool in_16_bits(Device device, DType dtype) {
  if (dtype != DType::BFloat16 && dtype != DType::Float16) return false;
  return device.is_cuda() || (dtype == DType::BFloat16 && cpu::gemm_bf16_available());
}

// Every row of the float32 m x n matrix `out` set to the float32 vector `bias`.
void seed_rows(Device device, const Tensor& bias, int64_t m, int64_t n, float* out) {
  Tensor cb = detail::widened(bias).contiguous();
  if (device.is_cuda())
    gpu::broadcast_rows(cb.data_ptr<float>(), m, n, out, detail::stream(device));
  else
    cpu::broadcast_rows(cb.data_ptr<float>(), m, n, out);
}

// op(A) * op(B) (m x n) of contiguous 16-bit tensors multiplied as they are (in_16_bits), as a
// tensor of their dtype and `shape` rounded once from the float32 sums; `bias`, when given, seeds
// every row.
Tensor product_16bit(const Shape& shape, bool trans_a, bool trans_b, int64_t m, int64_t n,
                     int64_t k, const Tensor& a, int64_t lda, const Tensor& b, int64_t ldb,
                     const Tensor& bias = Tensor()) {
  const Device dev = a.device();
  Tensor out = Tensor::empty(shape, DType::Float32, dev);
  float* po = out.data_ptr<float>();
  if (bias.defined()) seed_rows(dev, bias, m, n, po);
  if (dev.is_cuda())
    gpu::gemm_16bit(dev.index(), a.dtype(), trans_a, trans_b, m, n, k, a.raw_data(), lda,
                    b.raw_data(), ldb, bias.defined(), po, n, detail::stream(dev));
  else
    cpu::gemm_bf16(trans_a, trans_b, m, n, k, a.data_ptr<bfloat16>(), lda, b.data_ptr<bfloat16>(),
                   ldb, bias.defined(), po, n);
  return detail::rounded(out, a.dtype());
}

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b) {
  if (detail::autocast_on()) {
    detail::AutocastPause pause;
    return matmul(pause.low(a), pause.low(b));
  }
  profiler::OpScope prof("matmul", {&a, &b});
  detail::check_floating_pair("matmul", a, b);
  GALLEY_CHECK(a.dim() == 2 && b.dim() == 2 && a.size(1) == b.size(0), "matmul: cannot multiply ",
               shape_str(a.shape()), " by ", shape_str(b.shape()), " (need [m, k] x [k, n])");
  const DType dtype = a.dtype();
  const Device dev = a.device();
  int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  if (in_16_bits(dev, dtype)) {
    Tensor ca = a.contiguous(), cb = b.contiguous();
    Tensor result = product_16bit({m, n}, false, false, m, n, k, ca, k, cb, n);
    if (!autograd::needs_grad({&a, &b})) return result;
    Tensor da = ca.detach(), db = cb.detach();
    bool ga = a.requires_grad(), gb = b.requires_grad();
    return autograd::record(
        result, "matmul", {a, b},
        [=](const Tensor& g, std::vector<Tensor>& gi) {
          Tensor cg = g.to(dtype).contiguous();
          if (ga)  // dA = G B^T
            gi[0] = product_16bit({m, k}, false, true, m, k, n, cg, n, db, n);
          if (gb)  // dB = A^T G
            gi[1] = product_16bit({k, n}, true, false, k, n, m, da, k, cg, n);
        },
        {{"first operand", gb ? da : Tensor()}, {"second operand", ga ? db : Tensor()}});
  }
  Tensor ca = detail::widened(a).contiguous(), cb = detail::widened(b).contiguous();
  Tensor out = Tensor::empty({m, n}, DType::Float32, dev);
  gemm(dev, false, false, m, n, k, 1.f, ca.data_ptr<float>(), k, cb.data_ptr<float>(), n, 0.f,
       out.data_ptr<float>(), n);
  Tensor result = detail::rounded(out, dtype);
  if (!autograd::needs_grad({&a, &b})) return result;
  Tensor da = detail::kept_for_backward(a, ca), db = detail::kept_for_backward(b, cb);
  bool ga = a.requires_grad(), gb = b.requires_grad();
  return autograd::record(
      result, "matmul", {a, b},
      detail::widened_backward(
          dtype,
          [=](const Tensor& g, std::vector<Tensor>& gi) {
            Tensor cg = g.contiguous();
            if (ga) {  // dA = G B^T
              gi[0] = Tensor::empty({m, k}, DType::Float32, dev);
              gemm(dev, false, true, m, k, n, 1.f, cg.data_ptr<float>(), n,
                   detail::widened(db).data_ptr<float>(), n, 0.f, gi[0].data_ptr<float>(), k);
            }
            if (gb) {  // dB = A^T G
              gi[1] = Tensor::empty({k, n}, DType::Float32, dev);
              gemm(dev, true, false, k, n, m, 1.f, detail::widened(da).data_ptr<float>(), k,
                   cg.data_ptr<float>(), n, 0.f, gi[1].data_ptr<float>(), n);
            }
          }),
      {{"first operand", gb ? da : Tensor()}, {"second operand", ga ? db : Tensor()}});
}

namespace {

// linear in 16 bits (in_16_bits): x and the weight as they are, the bias seeded into the float32
// output, gradients summed in float32 and rounded once.
Tensor linear_16bit(const Tensor& x, const Tensor& weight, const Tensor& bias, int64_t rows,
                    const Shape& out_shape) {
  const DType dtype = x.dtype();
  const int64_t out_f = weight.size(0), in_f = weight.size(1);
  Tensor cx = x.contiguous(), cw = weight.contiguous();
  Tensor result =
      product_16bit(out_shape, false, true, rows, out_f, in_f, cx, in_f, cw, in_f, bias);
  if (!autograd::needs_grad({&x, &weight, &bias})) return result;
  Tensor dx = cx.detach(), dw = cw.detach();
  bool gx = x.requires_grad(), gw = weight.requires_grad(),
       gb = bias.defined() && bias.requires_grad();
  Shape x_shape = x.shape();
  const Device dev = x.device();
  return autograd::record(
      result, "linear", {x, weight, bias},
      [=](const Tensor& g, std::vector<Tensor>& gi) {
        Tensor cg = g.to(dtype).contiguous();
        if (gx)  // dX = G W
          gi[0] = product_16bit(x_shape, false, false, rows, in_f, out_f, cg, out_f, dw, in_f);
        if (gw)  // dW = G^T X
          gi[1] = product_16bit({out_f, in_f}, true, false, out_f, in_f, rows, cg, out_f, dx, in_f);
        if (gb) {  // db = the column sums of G, in float32
          Tensor w = Tensor::empty({out_f}, DType::Float32, dev);
          column_sums(dev, detail::widened(cg).data_ptr<float>(), rows, out_f, w.data_ptr<float>());
          gi[2] = detail::rounded(w, dtype);
        }
      },
      {{"input", gw ? dx : Tensor()}, {"weight", gx ? dw : Tensor()}});
}

}  // namespace

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  if (detail::autocast_on()) {
    detail::AutocastPause pause;
    return linear(pause.low(x), pause.low(weight), pause.low(bias));
  }
  profiler::OpScope prof("linear", {&x, &weight, &bias});
  detail::check_floating_pair("linear", x, weight);
  GALLEY_CHECK(weight.dim() == 2, "linear: weight must be [out, in], got ",
               shape_str(weight.shape()));
  const int64_t out_f = weight.size(0), in_f = weight.size(1);
  GALLEY_CHECK(x.dim() >= 1 && x.size(-1) == in_f, "linear: input of shape ", shape_str(x.shape()),
               " does not match weight ", shape_str(weight.shape()),
               " (the input's last dimension must be ", in_f, ")");
  if (bias.defined()) {
    detail::check_floating_pair("linear", x, bias);
    GALLEY_CHECK(bias.dim() == 1 && bias.size(0) == out_f, "linear: bias of shape ",
                 shape_str(bias.shape()), " does not match weight ", shape_str(weight.shape()));
  }
  const DType dtype = x.dtype();
  const Device dev = x.device();
  // Every dimension but the last: x.numel() / in_f, also where in_f is 0.
  const int64_t rows = shape_numel(Shape(x.shape().begin(), x.shape().end() - 1));
  Shape out_shape = x.shape();
  out_shape.back() = out_f;
  if (in_16_bits(dev, dtype)) return linear_16bit(x, weight, bias, rows, out_shape);
  Tensor cx = detail::widened(x).contiguous(), cw = detail::widened(weight).contiguous();
  Tensor out = Tensor::empty(out_shape, DType::Float32, dev);
  float* po = out.data_ptr<float>();
  // C seeded with the bias so the GEMM adds into it: one pass fewer.
  if (bias.defined()) seed_rows(dev, bias, rows, out_f, po);
  gemm(dev, false, true, rows, out_f, in_f, 1.f, cx.data_ptr<float>(), in_f, cw.data_ptr<float>(),
       in_f, bias.defined() ? 1.f : 0.f, po, out_f);
  Tensor result = detail::rounded(out, dtype);
  if (!autograd::needs_grad({&x, &weight, &bias})) return result;
  Tensor dx = detail::kept_for_backward(x, cx), dw = detail::kept_for_backward(weight, cw);
  bool gx = x.requires_grad(), gw = weight.requires_grad(),
       gb = bias.defined() && bias.requires_grad();
  Shape x_shape = x.shape();
  return autograd::record(
      result, "linear", {x, weight, bias},
      detail::widened_backward(
          dtype,
          [=](const Tensor& g, std::vector<Tensor>& gi) {
            Tensor cg = g.contiguous();
            const float* pg = cg.data_ptr<float>();
            if (gx) {  // dX = G W
              gi[0] = Tensor::empty(x_shape, DType::Float32, dev);
              gemm(dev, false, false, rows, in_f, out_f, 1.f, pg, out_f,
                   detail::widened(dw).data_ptr<float>(), in_f, 0.f, gi[0].data_ptr<float>(), in_f);
            }
            if (gw) {  // dW = G^T X
              gi[1] = Tensor::empty({out_f, in_f}, DType::Float32, dev);
              gemm(dev, true, false, out_f, in_f, rows, 1.f, pg, out_f,
                   detail::widened(dx).data_ptr<float>(), in_f, 0.f, gi[1].data_ptr<float>(), in_f);
            }
            if (gb) {  // db = the column sums of G
              gi[2] = Tensor::empty({out_f}, DType::Float32, dev);
              column_sums(dev, pg, rows, out_f, gi[2].data_ptr<float>());
            }
          }),
      {{"input", gw ? dx : Tensor()}, {"weight", gx ? dw : Tensor()}});
}

}  // namespace galley
