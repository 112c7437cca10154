#pragma once
// Finding NaN and infinite values (the loss guard, anomaly detection, gradient clipping's
// error report).
#include <cstdint>

namespace galley::kernels::cpu {

// The index of the first element of x[0, n) that is NaN or infinite; -1 when all are finite.
int64_t first_nonfinite(const float* x, int64_t n);

}  // namespace galley::kernels::cpu
