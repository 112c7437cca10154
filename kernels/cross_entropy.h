#pragma once
// Softmax cross-entropy over float32 logits [n, c] and int64 labels [n], fused: one pass computes
// the loss of every row and keeps the probabilities that backward needs. The CUDA launchers take
// device pointers and the cudaStream_t to run on; they only enqueue.
#include <cstdint>

namespace galley::kernels {
namespace cpu {

// loss[i] = (1 - eps) * -log p[i, y_i] + eps * mean_c(-log p[i, c]); 0 for ignored rows.
// prob receives the softmax. Returns the number of rows not ignored. A label outside [0, c)
// that is not ignore_index is reported through *bad_row (else -1).
int64_t cross_entropy_forward(const float* logits, const int64_t* labels, int64_t n, int64_t c,
                              float eps, int64_t ignore_index, float* loss, float* prob,
                              int64_t* bad_row);
// gx[i, :] = row_scale[i] * (prob[i, :] - target_i), target_i = (1 - eps) onehot + eps / c.
void cross_entropy_backward(const float* prob, const int64_t* labels, const float* row_scale,
                            int64_t n, int64_t c, float eps, int64_t ignore_index, float* gx);

}  // namespace cpu

namespace cuda {

// As the CPU kernel, with the row count and the first bad row written to device scalars
// (count: int64, bad_row: int64, -1 when none). A bad row is also reported in `error_slot` (may
// be null) as {1, row, label, c} when its word 0 is clear: the host checks it at its next
// synchronisation, so no step waits for the labels' check.
void cross_entropy_forward(const float* logits, const int64_t* labels, int64_t n, int64_t c,
                           float eps, int64_t ignore_index, float* loss, float* prob,
                           int64_t* count, int64_t* bad_row, int64_t* error_slot, void* stream);
// row_scale is a device array of n floats.
void cross_entropy_backward(const float* prob, const int64_t* labels, const float* row_scale,
                            int64_t n, int64_t c, float eps, int64_t ignore_index, float* gx,
                            void* stream);
// out[i] = *scalar * factor for all i (the row scales of a reduced loss's backward), divided by
// *count when `count` is not null (0 when *count is 0: the mean over no rows), all read on the
// device.
void fill_scaled(const float* scalar, float factor, const int64_t* count, float* out, int64_t n,
                 void* stream);

}  // namespace cuda
}  // namespace galley::kernels
