#pragma once
// 1x1 convolutions at a stride (the projection shortcuts of residual networks) without im2col or
// a GEMM's packing. Such a layer is a product of few terms (its input channels) per output, so a
// general GEMM spends more on packing its operands and on the bias pass than on the multiply-adds.
//
// Each image's strided samples are copied once into a buffer of rows, one an input channel, each
// rounded up to whole vectors (at stride 2 two vector loads and a shuffle give a vector of
// samples), with a row of ones after them that the bias multiplies. The forward pass is then the
// register block of cpu/conv2d_block.h (a block of output channels x three vectors of outputs,
// one broadcast a weight) with a single tap, written straight into the output; the input gradient
// the same block over the output gradient with the transposed weights, spread back onto every
// stride-th position of the input gradient (zero between); and the weight gradient a block of
// output channels x input channels across the lanes, one broadcast an output gradient element,
// over the samples transposed to one row a position. Every output is summed in float32 in one
// order whatever the thread count; 16-bit activations are widened as they are read and rounded
// once as they are written.
#include "kernels/conv2d.h"

namespace galley::kernels::cpu {

// True where conv2d_forward / conv2d_backward take this path: a 1x1 kernel, stride 2 or more, no
// padding, one group, on a host with AVX2 and FMA or AVX-512 (cpu/vector_lanes.h), for float32
// and float16 activations, and bfloat16 ones but where the host has AMX's tiles (whose GEMM
// multiplies bfloat16 values as they are).
bool conv2d_pointwise_applies(const Conv2dGeometry& g, DType dtype = DType::Float32);

// Same contracts as conv2d_forward / conv2d_backward (without the bias gradient), for any
// ungrouped, unpadded 1x1 geometry of any stride, whatever conv2d_pointwise_applies says, so that
// tests can compare the paths; other geometries, and a build without the vector lanes, are an
// error.
void conv2d_pointwise_forward(const Conv2dGeometry& g, const void* x, const float* w,
                              const float* b, void* y, DType dtype = DType::Float32);
void conv2d_pointwise_backward(const Conv2dGeometry& g, const void* x, const float* w,
                               const void* gy, void* gx, float* gw, DType dtype = DType::Float32);

}  // namespace galley::kernels::cpu
