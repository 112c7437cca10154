#pragma once
// Softmax cross-entropy over logits [n, c] and int64 labels [n], fused: one pass computes the
// loss of every row and keeps the probabilities that backward needs.
#include <cstdint>

namespace galley::kernels::cpu {

// loss[i] = (1 - eps) * -log p[i, y_i] + eps * mean_c(-log p[i, c]); 0 for ignored rows.
// prob receives the softmax. Returns the number of rows not ignored. A label outside [0, c)
// that is not ignore_index is reported through *bad_row (else -1).
int64_t cross_entropy_forward(const float* logits, const int64_t* labels, int64_t n, int64_t c,
                              float eps, int64_t ignore_index, float* loss, float* prob,
                              int64_t* bad_row);
// gx[i, :] = row_scale[i] * (prob[i, :] - target_i), target_i = (1 - eps) onehot + eps / c.
void cross_entropy_backward(const float* prob, const int64_t* labels, const float* row_scale,
                            int64_t n, int64_t c, float eps, int64_t ignore_index, float* gx);

}  // namespace galley::kernels::cpu
