#pragma once
// The device switch of the non-finite checks (internal), for the loss guard, anomaly mode and
// gradient clipping's error report.
#include "galley/tensor.h"

namespace galley::detail {

// The index of the first NaN or infinite element of `t` (float32, bfloat16 or float16, any
// layout) in row-major order, -1 when every element is finite. On a GPU it waits for the
// answer: for anomaly detection and error reports, never the default path.
int64_t first_nonfinite(const Tensor& t);
// Queues the loss guard's check of a one-element float32 GPU tensor: a NaN or infinite value is
// reported at the device's next synchronisation (detail::DeferredError::NonFiniteLoss).
void report_nonfinite_loss(const Tensor& loss);

}  // namespace galley::detail
