// cross_entropy: softmax cross-entropy of logits [N, C] against int64 labels [N], fused, with
// label smoothing, ignore_index and the three reductions. On a GPU nothing waits for the
// device: the rows counted stay there and a bad label is reported at the next synchronisation.
// The kernels take float32: the loss of 16-bit logits is computed in float32 and rounded once.
#include "kernels/cross_entropy.h"

#include <algorithm>

#include "galley/autograd.h"
#include "galley/ops.h"
#include "galley/profiler.h"
#include "kernels/reduce.h"
#include "src/ops/autocast.h"
#include "src/ops/dispatch.h"
#include "src/ops/reduce.h"
#include "src/runtime/device_memory.h"

namespace galley {

namespace cpu = kernels::cpu;
namespace gpu = kernels::cuda;

namespace {

// n copies of g_scalar[0] * factor, on g_scalar's device (the row scales of a reduced loss),
// divided on the device by `count` (a device int64 scalar; 0 when it is 0) when it is defined.
Tensor row_scales(const Tensor& g_scalar, float factor, int64_t n, const Tensor& count) {
  const Device dev = g_scalar.device();
  Tensor out = Tensor::empty({n}, DType::Float32, dev);
  if (dev.is_cuda()) {
    gpu::fill_scaled(g_scalar.data_ptr<float>(), factor,
                     count.defined() ? count.data_ptr<int64_t>() : nullptr, out.data_ptr<float>(),
                     n, detail::stream(dev));
  } else {
    GALLEY_CHECK(!count.defined(), "row_scales: a host loss counts its rows on the host");
    std::fill_n(out.data_ptr<float>(), n, g_scalar.item() * factor);
  }
  return out;
}

}  // namespace

Tensor cross_entropy(const Tensor& logits, const Tensor& labels, const CrossEntropyOptions& o) {
  if (detail::autocast_on()) {
    detail::AutocastPause pause;
    return cross_entropy(pause.f32(logits), labels, o);
  }
  profiler::OpScope prof("cross_entropy", {&logits, &labels});
  detail::check_floating("cross_entropy", logits);
  GALLEY_CHECK(labels.defined() && labels.dtype() == DType::Int64,
               "cross_entropy: labels must be an int64 tensor of class indices",
               labels.defined() ? ", got " + dtype_name(labels.dtype()) : std::string());
  GALLEY_CHECK(logits.dim() == 2, "cross_entropy: logits must be [N, C], got ",
               shape_str(logits.shape()));
  GALLEY_CHECK(labels.dim() == 1 && labels.size(0) == logits.size(0), "cross_entropy: logits ",
               shape_str(logits.shape()), " and labels ", shape_str(labels.shape()),
               " disagree (labels must be [N] with N = ", logits.size(0), ")");
  GALLEY_CHECK(o.label_smoothing >= 0.f && o.label_smoothing <= 1.f,
               "cross_entropy: label_smoothing ", o.label_smoothing, " is outside [0, 1]");
  GALLEY_CHECK(labels.device() == logits.device(), "cross_entropy: logits on ",
               logits.device().str(), " but labels on ", labels.device().str());
  const int64_t n = logits.size(0), c = logits.size(1);
  // The loss comes in the logits' dtype (as PyTorch's); it is computed in float32, and so is the
  // gradient from the float32 probabilities kept here.
  const DType dtype = logits.dtype();
  const Device dev = logits.device();
  Tensor cx = detail::widened(logits).contiguous(), cy = labels.contiguous();
  Tensor per_row = Tensor::empty({n}, DType::Float32, dev);
  Tensor prob = Tensor::empty({n, c}, DType::Float32, dev);
  const float eps = o.label_smoothing;
  const int64_t ignore = o.ignore_index;
  int64_t count = -1;
  Tensor count_dev;  // on a GPU the rows counted stay on the device: element 0 of `counters`
  if (dev.is_cpu()) {
    int64_t bad = -1;
    count =
        cpu::cross_entropy_forward(cx.data_ptr<float>(), cy.data_ptr<int64_t>(), n, c, eps, ignore,
                                   per_row.data_ptr<float>(), prob.data_ptr<float>(), &bad);
    GALLEY_CHECK(bad < 0, "cross_entropy: label ", bad >= 0 ? cy.data_ptr<int64_t>()[bad] : 0,
                 " at row ", bad, " is outside [0, ", c, ")");
  } else {
    // Reading the count or the labels' check back would stall the host once per step (and could
    // not be captured in a CUDA graph): both stay on the device. Reports of earlier steps that
    // have arrived are raised now.
    detail::check_deferred_errors(dev);
    count_dev = Tensor::empty({2}, DType::Int64, dev);
    int64_t* d = count_dev.data_ptr<int64_t>();
    gpu::cross_entropy_forward(cx.data_ptr<float>(), cy.data_ptr<int64_t>(), n, c, eps, ignore,
                               per_row.data_ptr<float>(), prob.data_ptr<float>(), d, d + 1,
                               detail::error_slot(dev), detail::stream(dev));
  }
  const bool mean = o.reduction == Reduction::Mean;
  Tensor out;
  if (o.reduction == Reduction::None) {
    out = per_row;
  } else if (dev.is_cpu()) {
    double s = cpu::sum_all(per_row.data_ptr<float>(), n);
    // A mean over no counted rows (all ignored) is defined as 0 with zero gradient.
    if (mean) s = count > 0 ? s / double(count) : 0.0;
    out = Tensor::empty({}, DType::Float32, dev);
    out.data_ptr<float>()[0] = static_cast<float>(s);
  } else {
    out = detail::sum_all(per_row, 1.0);
    if (mean) out = row_scales(out, 1.f, 1, count_dev).view({});
  }
  Tensor result = detail::rounded(out, dtype);
  if (!autograd::needs_grad({&logits})) return result;
  const Reduction red = o.reduction;
  return autograd::record(
      result, "cross_entropy", {logits},
      detail::widened_backward(
          dtype,
          [=](const Tensor& g, std::vector<Tensor>& gi) {
            Tensor scale;
            if (red == Reduction::None) {
              scale = g.contiguous();
            } else if (dev.is_cpu()) {
              float s = g.item();
              if (red == Reduction::Mean) s = count > 0 ? s / float(count) : 0.f;
              scale = full({n}, s, DType::Float32, dev);
            } else {
              scale = row_scales(g, 1.f, n, mean ? count_dev : Tensor());
            }
            gi[0] = Tensor::empty({n, c}, DType::Float32, dev);
            if (dev.is_cuda())
              gpu::cross_entropy_backward(prob.data_ptr<float>(), cy.data_ptr<int64_t>(),
                                          scale.data_ptr<float>(), n, c, eps, ignore,
                                          gi[0].data_ptr<float>(), detail::stream(dev));
            else
              cpu::cross_entropy_backward(prob.data_ptr<float>(), cy.data_ptr<int64_t>(),
                                          scale.data_ptr<float>(), n, c, eps, ignore,
                                          gi[0].data_ptr<float>());
          }),
      {{"labels", cy}});
}

}  // namespace galley
