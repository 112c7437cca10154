#pragma once
// Gradient clipping over many tensors of one GPU: the CUDA side of kernels/cpu/clip.h (the same
// chunks of cpu::kClipChunk elements, norms accumulated in double; spans of any floating dtype,
// each dtype's spans launched together). Declared without CUDA types
// so that C++ files can call the launchers; `stream` is a cudaStream_t. Launchers only enqueue.
#include <cstdint>

#include "kernels/cpu/clip.h"

namespace galley::kernels::cuda {

// ----------------------------------------------------------------------------------------------
// launchers

// The doubles of device scratch grad_norm needs for these spans (one per chunk).
int64_t grad_norm_scratch(const cpu::GradSpan* spans, int count);
// *total (a device float) = the norm of all the spans' elements taken together, as
// cpu::grad_norm. One launch per 64 spans writes one partial per chunk into `scratch`, a last
// one adds them by a fixed tree: the bits depend on the sizes alone (replicas on different GPUs
// agree), never on atomics.
void grad_norm(const cpu::GradSpan* spans, int count, double norm_type, double* scratch,
               float* total, void* stream);
// x *= scale for every element (one launch per 64 spans).
void scale_grads(const cpu::GradSpan* spans, int count, float scale, void* stream);
// x = min(max(x, -clip), clip) for every element; NaN stays NaN.
void clamp_grads(const cpu::GradSpan* spans, int count, float clip, void* stream);

}  // namespace galley::kernels::cuda
