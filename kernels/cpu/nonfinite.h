#pragma once
// Finding NaN and infinite values (the loss guard, anomaly detection, gradient clipping's
// error report).
#include <cstdint>

#include "galley/dtype.h"

namespace galley::kernels::cpu {

// The index of the first element of x[0, n) that is NaN or infinite; -1 when all are finite.
// x holds `dtype` elements: float32, bfloat16 or float16 (any other dtype throws).
int64_t first_nonfinite(const void* x, DType dtype, int64_t n);
// The float32 case of the above.
inline int64_t first_nonfinite(const float* x, int64_t n) {
  return first_nonfinite(x, DType::Float32, n);
}

}  // namespace galley::kernels::cpu
