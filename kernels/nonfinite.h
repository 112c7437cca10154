#pragma once
// Finding NaN and infinite values (the loss guard, anomaly detection, gradient clipping's error
// report). The CUDA launchers take device pointers and the cudaStream_t to run on.
#include <cstdint>

#include "galley/dtype.h"

namespace galley::kernels {
namespace cpu {

// The index of the first element of x[0, n) that is NaN or infinite; -1 when all are finite.
// x holds `dtype` elements: float32, bfloat16 or float16 (any other dtype throws).
int64_t first_nonfinite(const void* x, DType dtype, int64_t n);

}  // namespace cpu

namespace cuda {

// *first (a device int64) = as cpu::first_nonfinite.
void first_nonfinite(const void* x, DType dtype, int64_t n, int64_t* first, void* stream);
// When *x (one device float) is NaN or infinite and word 0 of `error_slot` (a device's deferred
// error slot, {code, a, b, c}) is clear, writes {code, the bits of *x, 0, 0}, code last. Nothing
// waits: the host finds the report at its next synchronisation.
void report_nonfinite_scalar(const float* x, int64_t code, int64_t* error_slot, void* stream);

}  // namespace cuda
}  // namespace galley::kernels
