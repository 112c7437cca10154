#pragma once
// Fused optimizer updates: one pass over parameter, gradient and state per parameter tensor.
#include <cstdint>

namespace galley::kernels::cpu {

struct AdamStep {
  float lr, beta1, beta2, eps, weight_decay;
  float step_size;   // lr / (1 - beta1^t)
  float bias2_sqrt;  // sqrt(1 - beta2^t)
  bool decoupled;    // AdamW: p *= 1 - lr * wd before the update
  bool amsgrad;
};
// Updates p, m, v (and vmax when amsgrad) from g in place, as torch.optim.Adam / AdamW.
void adam_update(const AdamStep& s, int64_t n, float* p, const float* g, float* m, float* v,
                 float* vmax);

struct SGDStep {
  float lr, momentum, dampening, weight_decay;
  bool nesterov;
  bool first;  // the momentum buffer starts as the first gradient
};
// Updates p (and the momentum buffer buf when momentum != 0) from g, as torch.optim.SGD.
void sgd_update(const SGDStep& s, int64_t n, float* p, const float* g, float* buf);

}  // namespace galley::kernels::cpu
