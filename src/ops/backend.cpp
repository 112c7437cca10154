// The device switch: CPU kernels for host tensors, CUDA launchers for GPU tensors.
#include "src/ops/backend.h"

#include <algorithm>

#include "galley/half.h"
#include "galley/runtime/memory.h"
#include "kernels/cpu/bias_relu.h"
#include "kernels/cpu/clip.h"
#include "kernels/cpu/cross_entropy.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/nonfinite.h"
#include "kernels/cpu/reduce.h"
#include "kernels/cpu/softmax.h"
#include "kernels/cpu/unary.h"
#include "kernels/cuda/blas.cuh"
#include "kernels/cuda/clip.cuh"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/nonfinite.cuh"
#include "src/runtime/device_memory.h"

namespace galley::backend {

namespace cpu = kernels::cpu;
namespace gpu = kernels::cuda;

void* stream(Device device) {
  return device.is_cuda() ? detail::compute_stream(device) : nullptr;
}

namespace {
bool on_gpu(const Tensor& t) {
  return t.device().is_cuda();
}

// `s` with leading 1s up to `rank` dimensions.
std::vector<int64_t> aligned(const Shape& s, size_t rank) {
  std::vector<int64_t> out(rank - s.size(), 1);
  out.insert(out.end(), s.begin(), s.end());
  return out;
}

gpu::Binary to_gpu(BinaryOp op) {
  switch (op) {
    case BinaryOp::Add:
      return gpu::Binary::Add;
    case BinaryOp::Sub:
      return gpu::Binary::Sub;
    case BinaryOp::Mul:
      return gpu::Binary::Mul;
    case BinaryOp::Div:
      return gpu::Binary::Div;
  }
  return gpu::Binary::Add;
}

// The kernels take one dtype for all their arrays: two inputs must agree (on either device).
void check_same_dtype(const char* op, const Tensor& a, const Tensor& b) {
  GALLEY_CHECK(a.dtype() == b.dtype(), op, ": dtypes ", dtype_name(a.dtype()), " and ",
               dtype_name(b.dtype()), " differ (convert one with .to(dtype))");
}

Tensor gpu_unary(gpu::Unary op, const Tensor& a, float p0 = 0.f, float p1 = 0.f) {
  Tensor ca = a.contiguous();
  Tensor out = Tensor::empty(a.shape(), a.dtype(), a.device());
  gpu::unary(op, a.dtype(), ca.raw_data(), out.raw_data(), a.numel(), p0, p1, stream(a.device()));
  return out;
}

// The most workspace one convolution call may take, cap or no cap. cuDNN's hungriest algorithms
// (FFT) can ask for gigabytes to be a little faster; memory that large is better left to the
// tensors, to other jobs on the GPU, and to the allocator's pool, which one huge block fragments.
constexpr size_t kConvWorkspaceLimit = size_t(1) << 30;

// What a convolution's workspace may take on `device`: the per-call limit, lowered under a cap
// to what the cap leaves beside the tensors in use. Cached free blocks count as room, as the
// allocator returns them to make space; where that is not enough, the allocation raises
// OutOfMemoryError and the kernel layer falls back to a smaller workspace.
size_t conv_workspace_limit(Device device) {
  const MemoryStats s = memory_stats(device);
  if (s.limit == 0) return kConvWorkspaceLimit;
  return std::min(kConvWorkspaceLimit, s.limit > s.allocated ? s.limit - s.allocated : size_t(0));
}

// cuDNN's scratch, from the caching allocator. One block at a time: taking the next releases
// the previous (the calls that use them are ordered on the device's compute stream, so the
// block may be reused at once), which keeps backward's data and filter workspaces from adding
// up under a cap; the last goes when the op returns.
struct Scratch {
  Device device;
  Tensor block;
  gpu::Workspace workspace() {
    gpu::Workspace ws;
    ws.limit = conv_workspace_limit(device);
    ws.allocate = [this](size_t bytes) {
      block = Tensor();
      block = Tensor::empty({int64_t((bytes + 3) / 4)}, DType::Float32, device);
      return block.raw_data();
    };
    return ws;
  }
};
}  // namespace

Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b) {
  static const char* names[] = {"add", "sub", "mul", "div"};
  check_same_dtype(names[int(op)], a, b);
  if (!on_gpu(a)) return cpu::binary(op, a, b);
  const Shape out_shape = cpu::broadcast_shapes(a.shape(), b.shape(), names[int(op)]);
  const size_t rank = std::max<size_t>(out_shape.size(), 1);
  Tensor ca = a.contiguous(), cb = b.contiguous();
  Tensor out = Tensor::empty(out_shape, a.dtype(), a.device());
  auto sa = aligned(a.shape(), rank), sb = aligned(b.shape(), rank), so = aligned(out_shape, rank);
  gpu::binary(to_gpu(op), a.dtype(), ca.raw_data(), sa.data(), cb.raw_data(), sb.data(),
              out.raw_data(), so.data(), int(rank), stream(a.device()));
  return out;
}

Tensor sum_to(const Tensor& g, const Shape& shape) {
  if (!on_gpu(g)) return cpu::sum_to(g, shape);
  if (g.shape() == shape) return g;
  const size_t rank = std::max<size_t>(g.dim(), 1);
  Tensor cg = g.contiguous();
  Tensor out = Tensor::empty(shape, g.dtype(), g.device());
  auto sg = aligned(g.shape(), rank), so = aligned(shape, rank);
  gpu::sum_to(g.dtype(), cg.raw_data(), sg.data(), out.raw_data(), so.data(), int(rank),
              stream(g.device()));
  return out;
}

void add_inplace(Tensor& acc, const Tensor& g) {
  check_same_dtype("add_inplace", acc, g);
  if (!on_gpu(acc)) return cpu::add_inplace(acc, g);
  GALLEY_CHECK(acc.shape() == g.shape(), "add_inplace: ", shape_str(acc.shape()), " vs ",
               shape_str(g.shape()));
  Tensor cg = g.contiguous();
  gpu::add_inplace(acc.dtype(), acc.raw_data(), cg.raw_data(), acc.numel(), stream(acc.device()));
}

Tensor affine(const Tensor& a, float scale, float shift) {
  return on_gpu(a) ? gpu_unary(gpu::Unary::Affine, a, scale, shift) : cpu::affine(a, scale, shift);
}
Tensor exp(const Tensor& a) {
  return on_gpu(a) ? gpu_unary(gpu::Unary::Exp, a) : cpu::exp(a);
}
Tensor log(const Tensor& a) {
  return on_gpu(a) ? gpu_unary(gpu::Unary::Log, a) : cpu::log(a);
}
Tensor pow(const Tensor& a, float p) {
  return on_gpu(a) ? gpu_unary(gpu::Unary::Pow, a, p) : cpu::pow(a, p);
}
Tensor pow_backward(const Tensor& grad, const Tensor& a, float p) {
  check_same_dtype("pow_backward", grad, a);
  if (!on_gpu(a)) return cpu::pow_backward(grad, a, p);
  Tensor cg = grad.contiguous(), ca = a.contiguous();
  Tensor out = Tensor::empty(a.shape(), a.dtype(), a.device());
  gpu::pow_backward(a.dtype(), cg.raw_data(), ca.raw_data(), out.raw_data(), a.numel(), p,
                    stream(a.device()));
  return out;
}
Tensor relu(const Tensor& a) {
  return on_gpu(a) ? gpu_unary(gpu::Unary::Relu, a) : cpu::relu(a);
}
void relu_(Tensor& a) {
  if (!on_gpu(a)) return cpu::relu_(a);
  gpu::unary(gpu::Unary::Relu, a.dtype(), a.raw_data(), a.raw_data(), a.numel(), 0.f, 0.f,
             stream(a.device()));
}
Tensor relu_backward(const Tensor& grad, const Tensor& out) {
  check_same_dtype("relu_backward", grad, out);
  if (!on_gpu(out)) return cpu::relu_backward(grad, out);
  Tensor cg = grad.contiguous();
  Tensor r = Tensor::empty(out.shape(), out.dtype(), out.device());
  gpu::relu_backward(out.dtype(), cg.raw_data(), out.raw_data(), r.raw_data(), out.numel(),
                     stream(out.device()));
  return r;
}
void relu_backward_(Tensor& grad, const Tensor& out) {
  check_same_dtype("relu_backward_", grad, out);
  if (!on_gpu(out)) return cpu::relu_backward_(grad, out);
  gpu::relu_backward(out.dtype(), grad.raw_data(), out.raw_data(), grad.raw_data(), out.numel(),
                     stream(out.device()));
}

void gemm(Device device, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
          const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
          int64_t ldc) {
  if (device.is_cpu())
    return cpu::gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  gpu::gemm(device.index(), trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc,
            stream(device));
}

void broadcast_rows(Device device, const float* bias, int64_t rows, int64_t n, float* out) {
  if (device.is_cuda()) return gpu::broadcast_rows(bias, rows, n, out, stream(device));
  for (int64_t r = 0; r < rows; ++r) std::copy_n(bias, n, out + r * n);
}

void column_sums(Device device, const float* g, int64_t rows, int64_t n, float* out) {
  if (device.is_cuda()) return gpu::column_sums(g, rows, n, out, false, stream(device));
  cpu::column_sums(g, rows, n, out, false);
}

void conv2d_forward(Device device, const cpu::Conv2dGeometry& g, const float* x, const float* w,
                    const float* b, float* y) {
  if (device.is_cpu()) return cpu::conv2d_forward(g, x, w, b, y);
  Scratch scratch{device, Tensor()};
  gpu::conv2d_forward(device.index(), g, x, w, b, y, scratch.workspace(), stream(device));
}

void conv2d_backward(Device device, const cpu::Conv2dGeometry& g, const float* x, const float* w,
                     const float* gy, float* gx, float* gw, float* gb) {
  if (device.is_cpu()) return cpu::conv2d_backward(g, x, w, gy, gx, gw, gb);
  Scratch scratch{device, Tensor()};
  gpu::conv2d_backward(device.index(), g, x, w, gy, gx, gw, gb, scratch.workspace(),
                       stream(device));
}

void max_pool2d_forward(Device device, const cpu::Pool2dGeometry& g, const float* x, float* y,
                        int32_t* idx) {
  if (device.is_cpu()) return cpu::max_pool2d_forward(g, x, y, idx);
  gpu::max_pool2d_forward(g, x, y, idx, stream(device));
}

void max_pool2d_backward(Device device, const cpu::Pool2dGeometry& g, const float* gy,
                         const int32_t* idx, float* gx) {
  if (device.is_cpu()) return cpu::max_pool2d_backward(g, gy, idx, gx);
  gpu::max_pool2d_backward(g, gy, idx, gx, stream(device));
}

Tensor sum_all(const Tensor& x, float scale) {
  Tensor cx = x.contiguous();
  Tensor out = Tensor::empty({}, DType::Float32, x.device());
  if (on_gpu(x)) {
    gpu::sum_all(cx.data_ptr<float>(), cx.numel(), scale, out.data_ptr<float>(),
                 stream(x.device()));
  } else {
    out.data_ptr<float>()[0] =
        static_cast<float>(cpu::sum_all(cx.data_ptr<float>(), cx.numel()) * scale);
  }
  return out;
}

void sum_dim(Device device, const float* x, int64_t outer, int64_t len, int64_t inner, float scale,
             float* out) {
  if (device.is_cuda()) return gpu::sum_dim(x, outer, len, inner, scale, out, stream(device));
  cpu::sum_dim(x, outer, len, inner, out);
  if (scale != 1.f)
    for (int64_t i = 0; i < outer * inner; ++i) out[i] *= scale;
}

void expand_dim(Device device, const float* g, int64_t outer, int64_t len, int64_t inner,
                float scale, float* out) {
  if (device.is_cuda()) return gpu::expand_dim(g, outer, len, inner, scale, out, stream(device));
  cpu::expand_dim(g, outer, len, inner, scale, out);
}

void argmax_dim(Device device, const float* x, int64_t outer, int64_t len, int64_t inner,
                int64_t* out) {
  if (device.is_cuda()) return gpu::argmax_dim(x, outer, len, inner, out, stream(device));
  cpu::argmax_dim(x, outer, len, inner, out);
}

void softmax_forward(Device device, const float* x, int64_t outer, int64_t len, int64_t inner,
                     bool log, float* y) {
  if (device.is_cuda()) return gpu::softmax_forward(x, outer, len, inner, log, y, stream(device));
  cpu::softmax_forward(x, outer, len, inner, log, y);
}

void softmax_backward(Device device, const float* y, const float* gy, int64_t outer, int64_t len,
                      int64_t inner, bool log, float* gx) {
  if (device.is_cuda())
    return gpu::softmax_backward(y, gy, outer, len, inner, log, gx, stream(device));
  cpu::softmax_backward(y, gy, outer, len, inner, log, gx);
}

int64_t cross_entropy_forward(Device device, const float* logits, const int64_t* labels, int64_t n,
                              int64_t c, float eps, int64_t ignore_index, float* loss, float* prob,
                              int64_t* bad_row, Tensor* count) {
  if (device.is_cpu())
    return cpu::cross_entropy_forward(logits, labels, n, c, eps, ignore_index, loss, prob, bad_row);
  // Reading the count or the labels' check back would stall the host once per step (and could
  // not be captured in a CUDA graph): both stay on the device. Reports of earlier steps that
  // have arrived are raised now.
  detail::check_deferred_errors(device);
  Tensor counters = Tensor::empty({2}, DType::Int64, device);
  int64_t* d = counters.data_ptr<int64_t>();
  gpu::cross_entropy_forward(logits, labels, n, c, eps, ignore_index, loss, prob, d, d + 1,
                             detail::error_slot(device), stream(device));
  *count = counters;  // element 0 is the count
  *bad_row = -1;
  return -1;
}

Tensor row_scales(const Tensor& g_scalar, float factor, int64_t n, const Tensor& count) {
  Tensor out = Tensor::empty({n}, DType::Float32, g_scalar.device());
  if (on_gpu(g_scalar)) {
    gpu::fill_scaled(g_scalar.data_ptr<float>(), factor,
                     count.defined() ? count.data_ptr<int64_t>() : nullptr, out.data_ptr<float>(),
                     n, stream(g_scalar.device()));
  } else {
    GALLEY_CHECK(!count.defined(), "row_scales: a host loss counts its rows on the host");
    std::fill_n(out.data_ptr<float>(), n, g_scalar.item() * factor);
  }
  return out;
}

void cross_entropy_backward(Device device, const float* prob, const int64_t* labels,
                            const Tensor& row_scale, int64_t n, int64_t c, float eps,
                            int64_t ignore_index, float* gx) {
  Tensor s = row_scale.contiguous();
  if (device.is_cpu())
    return cpu::cross_entropy_backward(prob, labels, s.data_ptr<float>(), n, c, eps, ignore_index,
                                       gx);
  gpu::cross_entropy_backward(prob, labels, s.data_ptr<float>(), n, c, eps, ignore_index, gx,
                              stream(device));
}

void bias_relu_forward(Device device, const float* x, const float* b, int64_t outer,
                       int64_t channels, int64_t inner, float* y) {
  if (device.is_cuda())
    return gpu::bias_relu_forward(x, b, outer, channels, inner, y, stream(device));
  cpu::bias_relu_forward(x, b, outer, channels, inner, y);
}

void bias_relu_backward(Device device, const float* gy, const float* y, int64_t outer,
                        int64_t channels, int64_t inner, float* gx, float* gb) {
  if (device.is_cuda())
    return gpu::bias_relu_backward(gy, y, outer, channels, inner, gx, gb, stream(device));
  cpu::bias_relu_backward(gy, y, outer, channels, inner, gx, gb);
}

void adam_update_multi(Device device, const cpu::AdamStep& s, double lr, double beta1, double beta2,
                       const std::vector<OptimizerTensor>& tensors) {
  GALLEY_CHECK(device.is_cuda(), "adam_update_multi: ", device.str(), " is not a GPU");
  if (tensors.empty()) return;
  gpu::adam_update_multi(s, lr, beta1, beta2, tensors.data(), static_cast<int>(tensors.size()),
                         stream(device));
}

void sgd_update_multi(Device device, const cpu::SGDStep& s,
                      const std::vector<OptimizerTensor>& tensors) {
  GALLEY_CHECK(device.is_cuda(), "sgd_update_multi: ", device.str(), " is not a GPU");
  if (tensors.empty()) return;
  gpu::sgd_update_multi(s, tensors.data(), static_cast<int>(tensors.size()), stream(device));
}

void adam_update(Device device, const cpu::AdamStep& s, DType dtype, int64_t n, void* p,
                 const void* g, float* m, float* v, float* vmax) {
  GALLEY_CHECK(device.is_cpu(), "adam_update: ", device.str(), " takes adam_update_multi");
  cpu::adam_update(s, dtype, n, p, g, m, v, vmax);
}

void sgd_update(Device device, const cpu::SGDStep& s, DType dtype, int64_t n, void* p,
                const void* g, float* buf) {
  GALLEY_CHECK(device.is_cpu(), "sgd_update: ", device.str(), " takes sgd_update_multi");
  cpu::sgd_update(s, dtype, n, p, g, buf);
}

int64_t first_nonfinite(const Tensor& t) {
  Tensor c = t.contiguous();
  GALLEY_CHECK(is_floating_point(c.dtype()),
               "first_nonfinite: expected a float32, bfloat16 or float16 tensor, got ",
               dtype_name(c.dtype()));
  if (!on_gpu(c)) return cpu::first_nonfinite(c.raw_data(), c.dtype(), c.numel());
  Tensor first = Tensor::empty({}, DType::Int64, c.device());
  gpu::first_nonfinite(c.raw_data(), c.dtype(), c.numel(), first.data_ptr<int64_t>(),
                       stream(c.device()));
  return first.to(Device::cpu()).data_ptr<int64_t>()[0];
}

void report_nonfinite_loss(const Tensor& loss) {
  const Device dev = loss.device();
  GALLEY_CHECK(dev.is_cuda() && loss.numel() == 1 && loss.dtype() == DType::Float32,
               "report_nonfinite_loss: expects one float32 element on a GPU");
  gpu::report_nonfinite_scalar(loss.data_ptr<float>(),
                               static_cast<int64_t>(detail::DeferredError::NonFiniteLoss),
                               detail::error_slot(dev), stream(dev));
}

Tensor grad_norm(Device device, const std::vector<GradSpan>& spans, double norm_type) {
  Tensor out = Tensor::empty({}, DType::Float32, device);
  const int count = static_cast<int>(spans.size());
  if (device.is_cpu()) {
    out.data_ptr<float>()[0] = static_cast<float>(cpu::grad_norm(spans.data(), count, norm_type));
    return out;
  }
  // One double per chunk (int64 storage: tensors have no float64 dtype), from the caching
  // allocator, so a step allocates nothing new.
  const int64_t parts = gpu::grad_norm_scratch(spans.data(), count);
  Tensor scratch = Tensor::empty({std::max<int64_t>(parts, 1)}, DType::Int64, device);
  gpu::grad_norm(spans.data(), count, norm_type, reinterpret_cast<double*>(scratch.raw_data()),
                 out.data_ptr<float>(), stream(device));
  return out;
}

void scale_grads(Device device, const std::vector<GradSpan>& spans, float scale) {
  if (device.is_cpu()) return cpu::scale_grads(spans.data(), int(spans.size()), scale);
  gpu::scale_grads(spans.data(), int(spans.size()), scale, stream(device));
}

void clamp_grads(Device device, const std::vector<GradSpan>& spans, float clip) {
  if (device.is_cpu()) return cpu::clamp_grads(spans.data(), int(spans.size()), clip);
  gpu::clamp_grads(spans.data(), int(spans.size()), clip, stream(device));
}

}  // namespace galley::backend
