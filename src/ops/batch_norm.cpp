// batch_norm: checks, the statistics (batch or running), the normalisation with the affine
// transform (and ReLU), the in-place update of the running statistics and the autograd record.
// The kernels take x and its gradients in x's dtype and compute in float32; the per-channel
// arrays are float32 (weight and bias given in a 16-bit dtype are widened, and their gradients
// rounded back once).
#include "kernels/batch_norm.h"

#include "galley/autograd.h"
#include "galley/ops.h"
#include "galley/profiler.h"
#include "src/ops/autocast.h"
#include "src/ops/batch_norm.h"
#include "src/ops/dispatch.h"

namespace galley {

namespace cpu = kernels::cpu;
namespace gpu = kernels::cuda;

namespace {

// A per-channel argument: undefined, or [C] on x's device in float32 (or x's dtype when
// `x_dtype_too`).
void check_channel_arg(const Tensor& x, const Tensor& t, const char* role, bool x_dtype_too) {
  if (!t.defined()) return;
  const int64_t C = x.size(1);
  GALLEY_CHECK(t.dim() == 1 && t.size(0) == C, "batch_norm: ", role, " of shape ",
               shape_str(t.shape()), " does not match the ", C, " channels of input ",
               shape_str(x.shape()));
  GALLEY_CHECK(t.dtype() == DType::Float32 || (x_dtype_too && t.dtype() == x.dtype()),
               "batch_norm: ", role, " is ", dtype_name(t.dtype()), " for a ",
               dtype_name(x.dtype()), " input ", shape_str(x.shape()), "; it must be float32",
               x_dtype_too ? " or the input's dtype" : "");
  GALLEY_CHECK(t.device() == x.device(), "batch_norm: ", role, " is on ", t.device().str(),
               ", the input on ", x.device().str());
}

float* ptr_or_null(const Tensor& t) {
  return t.defined() ? t.data_ptr<float>() : nullptr;
}

// batch_norm(_add) of an input without elements (the residual of its shape): an empty output
// and gradients, the weight's and the bias's zero.
Tensor normalize_nothing(const Tensor& x, const Tensor& residual, const Tensor& weight,
                         const Tensor& bias) {
  const Device dev = x.device();
  const DType dtype = x.dtype();
  const Shape shape = x.shape();
  Tensor result = Tensor::empty(shape, dtype, dev);
  if (!autograd::needs_grad({&x, &weight, &bias, &residual})) return result;
  const bool gx = x.requires_grad(), gr = residual.defined() && residual.requires_grad();
  const bool gw = weight.defined() && weight.requires_grad(),
             gb = bias.defined() && bias.requires_grad();
  const int64_t C = shape[1];
  const DType wdtype = weight.defined() ? weight.dtype() : dtype;
  const DType bdtype = bias.defined() ? bias.dtype() : dtype;
  return autograd::record(result, residual.defined() ? "batch_norm_add" : "batch_norm",
                          {x, weight, bias, residual}, [=](const Tensor&, std::vector<Tensor>& gi) {
                            if (gx) gi[0] = zeros(shape, dtype, dev);
                            if (gw) gi[1] = zeros({C}, wdtype, dev);
                            if (gb) gi[2] = zeros({C}, bdtype, dev);
                            if (gr) gi[3] = zeros(shape, dtype, dev);
                          });
}

// batch_norm, and batch_norm_add when `residual` is defined.
Tensor normalize(const Tensor& x, const Tensor& residual, const Tensor& running_mean,
                 const Tensor& running_var, const Tensor& weight, const Tensor& bias,
                 const BatchNormOptions& o) {
  profiler::OpScope prof(residual.defined() ? "batch_norm_add" : "batch_norm",
                         {&x, &weight, &bias});
  detail::check_floating("batch_norm", x);
  GALLEY_CHECK(x.dim() >= 2, "batch_norm: input must be [N, C] or [N, C, *], got ",
               shape_str(x.shape()));
  GALLEY_CHECK(running_mean.defined() == running_var.defined(),
               "batch_norm: running_mean and running_var must both be given or both undefined");
  check_channel_arg(x, running_mean, "running_mean", false);
  check_channel_arg(x, running_var, "running_var", false);
  check_channel_arg(x, weight, "weight", true);
  check_channel_arg(x, bias, "bias", true);
  GALLEY_CHECK(o.eps >= 0 && o.momentum >= 0 && o.momentum <= 1, "batch_norm: eps ", o.eps,
               " and momentum ", o.momentum, " must be >= 0, momentum at most 1");
  kernels::BatchNormGeometry g;
  g.outer = x.size(0), g.channels = x.size(1);
  for (int64_t k = 2; k < x.dim(); ++k) g.inner *= x.size(k);
  GALLEY_CHECK(o.training || running_mean.defined(),
               "batch_norm: running_mean and running_var must be given in evaluation mode "
               "(training false), as PyTorch's; without them pass training true to normalise by "
               "the batch's statistics");
  const bool batch_stats = o.training;
  GALLEY_CHECK(!batch_stats || x.numel() == 0 || g.outer * g.inner > 1,
               "batch_norm: expected more than 1 value per channel when training, got input ",
               shape_str(x.shape()));
  if (o.training && running_mean.defined())
    GALLEY_CHECK(running_mean.is_contiguous() && running_var.is_contiguous(),
                 "batch_norm: running_mean and running_var are updated in place and must be "
                 "contiguous");
  if (residual.defined())
    GALLEY_CHECK(residual.shape() == x.shape() && residual.dtype() == x.dtype() &&
                     residual.device() == x.device(),
                 "batch_norm_add: residual ", shape_str(residual.shape()), " ",
                 dtype_name(residual.dtype()), " on ", residual.device().str(),
                 " does not match input ", shape_str(x.shape()), " ", dtype_name(x.dtype()), " on ",
                 x.device().str());
  // No values at all (an empty batch, or planes of size 0): an empty output and running
  // statistics left as they are, as PyTorch's.
  if (x.numel() == 0) return normalize_nothing(x, residual, weight, bias);
  const DType dtype = x.dtype();
  const Device dev = x.device();
  const int64_t C = g.channels;
  Tensor cx = x.contiguous();
  Tensor cr = residual.defined() ? residual.contiguous() : Tensor();
  Tensor cw = weight.defined() ? detail::widened(weight).contiguous() : Tensor();
  Tensor cb = bias.defined() ? detail::widened(bias).contiguous() : Tensor();
  const bool grad = autograd::needs_grad({&x, &weight, &bias, &residual});

  Tensor mean, var;
  kernels::BatchNormRunning run;
  if (batch_stats) {
    mean = Tensor::empty({C}, DType::Float32, dev);
    var = Tensor::empty({C}, DType::Float32, dev);
    if (o.training && running_mean.defined()) {
      run.mean = running_mean.data_ptr<float>();
      run.var = running_var.data_ptr<float>();
      run.momentum = static_cast<float>(o.momentum);
      running_mean.bump_version();  // updated in place below
      running_var.bump_version();
    }
  } else {
    // The backward reads the statistics of this forward, whatever updates them meanwhile.
    mean = grad ? running_mean.detach().clone() : running_mean.detach().contiguous();
    var = grad ? running_var.detach().clone() : running_var.detach().contiguous();
  }
  kernels::BatchNormParams p;
  p.mean = mean.data_ptr<float>(), p.var = var.data_ptr<float>();
  p.eps = static_cast<float>(o.eps);
  p.weight = ptr_or_null(cw), p.bias = ptr_or_null(cb);
  Tensor result = Tensor::empty(x.shape(), dtype, dev);
  const void* pr = cr.defined() ? cr.raw_data() : nullptr;
  if (dev.is_cuda()) {
    void* st = detail::stream(dev);
    if (batch_stats)
      gpu::batch_norm_stats(dtype, cx.raw_data(), g, run, mean.data_ptr<float>(),
                            var.data_ptr<float>(), st);
    gpu::batch_norm_forward(dtype, cx.raw_data(), g, p, o.relu, result.raw_data(), pr, st);
  } else if (batch_stats) {
    // The statistics and the normalisation in one call (a channel at a time on long planes).
    cpu::batch_norm_train_forward(dtype, cx.raw_data(), g, run, mean.data_ptr<float>(),
                                  var.data_ptr<float>(), p, o.relu, result.raw_data(), pr);
  } else {
    cpu::batch_norm_forward(dtype, cx.raw_data(), g, p, o.relu, result.raw_data(), pr);
  }
  if (!grad) return result;

  Tensor out = o.relu ? result.detach() : Tensor();
  const bool added = residual.defined();
  const bool mask_from_x = dev.is_cpu() && cpu::batch_norm_relu_mask_from_x(dtype, g, added);
  // The bias is read back only for that mask: its C values are copied (PyTorch keeps no bias for
  // its backward, so writing it before the backward must not matter).
  const Tensor kept_bias = o.relu && mask_from_x && cb.defined() ? cb.detach().clone() : cb;
  const bool gr = added && residual.requires_grad();
  const bool gx = x.requires_grad();
  const bool gw = weight.defined() && weight.requires_grad();
  const bool gb = bias.defined() && bias.requires_grad();
  const DType wdtype = weight.defined() ? weight.dtype() : dtype;
  const DType bdtype = bias.defined() ? bias.dtype() : dtype;
  const Shape shape = x.shape();
  return autograd::record(
      result, added ? "batch_norm_add" : "batch_norm", {x, weight, bias, residual},
      [=](const Tensor& gy, std::vector<Tensor>& gi) {
        Tensor cg = (gy.dtype() == dtype ? gy : gy.detach().to(dtype)).contiguous();
        if (gx) gi[0] = Tensor::empty(shape, dtype, dev);
        // The residual's gradient: gy itself, or gy masked by the ReLU (written by the kernel).
        if (gr) gi[3] = o.relu ? Tensor::empty(shape, dtype, dev) : cg;
        void* pgr = gr && o.relu ? gi[3].raw_data() : nullptr;
        // The input gradient through batch statistics needs both per-channel sums.
        const bool sums = batch_stats && gx;
        Tensor dw = gw || sums ? Tensor::empty({C}, DType::Float32, dev) : Tensor();
        Tensor db = gb || sums ? Tensor::empty({C}, DType::Float32, dev) : Tensor();
        kernels::BatchNormParams q = p;
        q.mean = mean.data_ptr<float>(), q.var = var.data_ptr<float>();
        q.weight = ptr_or_null(cw), q.bias = ptr_or_null(kept_bias);  // the forward's affine
        const void* py = out.defined() ? out.raw_data() : nullptr;
        void* pgx = gx ? gi[0].raw_data() : nullptr;
        if (dev.is_cuda())
          gpu::batch_norm_backward(dtype, cg.raw_data(), cx.raw_data(), py, g, q, batch_stats, pgx,
                                   ptr_or_null(dw), ptr_or_null(db), pgr, detail::stream(dev));
        else
          cpu::batch_norm_backward(dtype, cg.raw_data(), cx.raw_data(), py, g, q, batch_stats, pgx,
                                   ptr_or_null(dw), ptr_or_null(db), added, pgr);
        if (gw) gi[1] = wdtype == DType::Float32 ? dw : detail::rounded(dw, wdtype);
        if (gb) gi[2] = bdtype == DType::Float32 ? db : detail::rounded(db, bdtype);
      },
      // A fused ReLU's mask: from the output, or on the host from x and the forward's affine.
      {{"input", cx}, {"weight", cw}, {"output", mask_from_x ? Tensor() : out}});
}

}  // namespace

Tensor batch_norm(const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                  const Tensor& weight, const Tensor& bias, const BatchNormOptions& options) {
  return normalize(x, Tensor(), running_mean, running_var, weight, bias, options);
}

Tensor batch_norm_add(const Tensor& x, const Tensor& residual, const Tensor& running_mean,
                      const Tensor& running_var, const Tensor& weight, const Tensor& bias,
                      const BatchNormOptions& options) {
  GALLEY_CHECK(residual.defined(), "batch_norm_add: the residual is undefined");
  if (detail::autocast_on()) {  // the residual follows x's dtype, as add_'s second operand
    detail::AutocastPause pause;
    return normalize(x, pause.to(residual, x.dtype()), running_mean, running_var, weight, bias,
                     options);
  }
  return normalize(x, residual, running_mean, running_var, weight, bias, options);
}

namespace detail {

void count_batch(const Tensor& counter) {
  GALLEY_CHECK(counter.defined() && counter.dtype() == DType::Int64 && counter.numel() == 1,
               "batch_norm: num_batches_tracked must be one int64, got ",
               counter.defined() ? dtype_name(counter.dtype()) : "undefined");
  if (counter.device().is_cuda())
    gpu::batch_norm_count(counter.data_ptr<int64_t>(), stream(counter.device()));
  else
    ++*counter.data_ptr<int64_t>();
}

}  // namespace detail
}  // namespace galley
