#pragma once
// Fused optimizer updates (torch.optim.Adam / AdamW / SGD): one pass over parameter, gradient
// and state per parameter tensor on the host; many tensors per launch on a GPU (the launchers
// take device pointers and the cudaStream_t to run on; they only enqueue). Parameters and
// gradients are float32, bfloat16 or float16 (one dtype for both); the state (moments, momentum
// buffers) is always float32. The update is computed in float32 and the parameter rounded to its
// dtype once per step, as torch.optim does for 16-bit parameters. A weight decay of zero adds
// nothing (not 0 * p, which is NaN for an infinite parameter), as in torch.optim.
#include <cstdint>

#include "galley/dtype.h"

namespace galley::kernels {

struct AdamStep {
  float lr, beta1, beta2, eps, weight_decay;
  // 1 - beta1 and 1 - beta2 computed in double and then rounded, as PyTorch's Python scalars are
  // (1 - float(0.99999) is 1.00136e-5, not 1e-5: a bias in every early step).
  float one_minus_beta1, one_minus_beta2;
  float shrink;      // AdamW: 1 - lr * weight_decay in double, the factor the parameter first takes
  float step_size;   // lr / (1 - beta1^t)
  float bias2_sqrt;  // sqrt(1 - beta2^t)
  bool decoupled;    // AdamW: p *= 1 - lr * wd before the update
  bool amsgrad;
  bool maximize;  // the update takes -g (before the weight decay)
};

struct SGDStep {
  float lr, momentum, dampening, weight_decay;
  float one_minus_dampening;  // computed in double, as AdamStep's one_minus_beta
  bool nesterov;
  bool maximize;  // the update takes -g (before the weight decay)
  bool first;     // the momentum buffer starts as the first gradient
};

// One tensor of a multi-tensor update. `step` (Adam) is a device int64 holding the steps this
// tensor has taken; `buf` (SGD) its momentum buffer, `first` whether that buffer starts now.
struct OptimizerTensor {
  void* p;        // `dtype`
  const void* g;  // `dtype`
  float* m;       // Adam: exp_avg
  float* v;       // Adam: exp_avg_sq
  float* vmax;    // Adam with amsgrad: max_exp_avg_sq, else null
  int64_t* step;  // Adam: device step counter
  float* buf;     // SGD: momentum buffer (null without momentum)
  int64_t n;
  bool first;                    // SGD: the momentum buffer starts as the gradient
  DType dtype = DType::Float32;  // of p and g
};

namespace cpu {

// Updates p, m, v (and vmax when amsgrad) from g in place. p and g are `dtype`; any dtype other
// than the floating ones throws.
void adam_update(const AdamStep& s, DType dtype, int64_t n, void* p, const void* g, float* m,
                 float* v, float* vmax);
// The float32 case of the above.
void adam_update(const AdamStep& s, int64_t n, float* p, const float* g, float* m, float* v,
                 float* vmax);
// Updates p (and the momentum buffer buf when momentum != 0) from g.
void sgd_update(const SGDStep& s, DType dtype, int64_t n, void* p, const void* g, float* buf);
// The float32 case of the above.
void sgd_update(const SGDStep& s, int64_t n, float* p, const float* g, float* buf);

}  // namespace cpu

namespace cuda {

// Adam / AdamW over `count` tensors in a few launches (one per 32 tensors of a dtype, plus one
// that advances the step counters). lr, beta1 and beta2 come in double: each block computes its
// tensor's lr / (1 - beta1^t) and sqrt(1 - beta2^t) from t = *step + 1 by the host's formula
// (CUDA's pow, and which products the compilers fuse into FMAs, may move the last bit), so
// nothing is read back and the launches can be captured in a CUDA graph (whose replays
// then keep counting steps). s's other fields (eps, weight_decay, decoupled, amsgrad) apply to
// every tensor.
void adam_update_multi(const AdamStep& s, double lr, double beta1, double beta2,
                       const OptimizerTensor* tensors, int count, void* stream);
// SGD over `count` tensors, one launch per 32 of a dtype (s.first is ignored; each tensor has
// its own).
void sgd_update_multi(const SGDStep& s, const OptimizerTensor* tensors, int count, void* stream);

}  // namespace cuda
}  // namespace galley::kernels
