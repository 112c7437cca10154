#pragma once
// Element type conversions on the GPU (the CUDA side of Tensor::to(DType)): float32 to and from
// bfloat16 and float16 with round to nearest even, the 16-bit types between each other through
// float32, and int64 / uint8 to and from float32. Declared without CUDA types.
#include <cstdint>

#include "galley/dtype.h"

namespace galley::kernels::cuda {

// ----------------------------------------------------------------------------------------------
// launchers

// n elements of src (dtype `from`) into dst (dtype `to`) on `stream`; the pair is one that
// kernels/cpu/convert.h's convert accepts (checked by the caller).
void convert(const void* src, DType from, void* dst, DType to, int64_t n, void* stream);

}  // namespace galley::kernels::cuda
