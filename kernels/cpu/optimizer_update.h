#pragma once
// Fused optimizer updates: one pass over parameter, gradient and state per parameter tensor.
// Parameters and gradients are float32, bfloat16 or float16 (one dtype for both); the state
// (moments, momentum buffers) is always float32. The update is computed in float32 and the
// parameter rounded to its dtype once per step, as torch.optim does for 16-bit parameters.
#include <cstdint>

#include "galley/dtype.h"

namespace galley::kernels::cpu {

struct AdamStep {
  float lr, beta1, beta2, eps, weight_decay;
  float step_size;   // lr / (1 - beta1^t)
  float bias2_sqrt;  // sqrt(1 - beta2^t)
  bool decoupled;    // AdamW: p *= 1 - lr * wd before the update
  bool amsgrad;
};
// Updates p, m, v (and vmax when amsgrad) from g in place, as torch.optim.Adam / AdamW. p and g
// are `dtype` (float32, bfloat16 or float16); m, v and vmax float32. Any other dtype throws.
void adam_update(const AdamStep& s, DType dtype, int64_t n, void* p, const void* g, float* m,
                 float* v, float* vmax);
// The float32 case of the above.
void adam_update(const AdamStep& s, int64_t n, float* p, const float* g, float* m, float* v,
                 float* vmax);

struct SGDStep {
  float lr, momentum, dampening, weight_decay;
  bool nesterov;
  bool first;  // the momentum buffer starts as the first gradient
};
// Updates p (and the float32 momentum buffer buf when momentum != 0) from g, as
// torch.optim.SGD. p and g are `dtype` (float32, bfloat16 or float16).
void sgd_update(const SGDStep& s, DType dtype, int64_t n, void* p, const void* g, float* buf);
// The float32 case of the above.
void sgd_update(const SGDStep& s, int64_t n, float* p, const float* g, float* buf);

}  // namespace galley::kernels::cpu
