#pragma once
// Winograd convolution F(2x2, 3x3) for float32 3x3 convolutions with stride 1 and padding 1 (the
// "same" convolutions of ResNets and VGGs): each 2x2 block of outputs comes from a 4x4 block of
// inputs in 16 products instead of 36.
//
// The input's 4x4 tiles (overlapping by two) are transformed, B^T d B, into 16 values each; the
// kernel's 3x3 taps, G g G^T, into 16 each. Position k of every tile's transform then multiplies
// with position k of every kernel's: 16 independent products [out channels x in channels] x
// [in channels x tiles], run on the direct path's register block (cpu/conv2d_block.h) with tiles
// across the vector lanes (16 with AVX-512, 8 with AVX2: the code is written once for both, on
// cpu/vector_lanes.h). The output transform, A^T m A, turns each tile's 16 sums into its 2x2
// outputs. With AVX-512, where a row has at most 8 tiles (planes 15 or 16 wide, vgg's 16x16), the
// transforms hold two tile rows a vector. Planes 14 wide or less (12 with AVX2: at most 7 or 6
// tiles a row, which would leave most lanes of the transforms idle) run with channels across the
// lanes instead: each image copied channel-last into a bordered buffer, the transforms on vectors
// of L channels of one tile, the products a tile's input channel broadcast against vectors of L
// output channels, and the outputs transposed back into planes; the same transforms in the same
// order, so the same bits. The transforms' coefficients are 0, +-1 and +-1/2, so on inputs whose
// products and sums are exact in float (small integers, weights in quarters) the result has the
// im2col path's bits; on others it differs from a direct sum by a few units in the last place of
// the largest terms. The input gradient of such a convolution is another one (the output gradient
// against the flipped, transposed kernel) and runs here too. So does the weight gradient, as the
// forward transposed: G^T [sum over tiles of (A gy A^T) . (B^T d B)] G, whose 16 products per pair
// of channels run over every tile of the batch (both operands transformed channel-last, the inputs
// as the narrow forward's); 16 products a tile and channel pair against the direct path's 36.
//
// A bfloat16 convolution on the dot products (cpu/conv2d_direct.h's Bf16Kernels::DotProducts:
// AVX512-BF16 without AMX) takes the tiled form with its products on bfloat16 pairs: each
// position's transformed inputs and kernels rounded to bfloat16, input channels 2j and 2j + 1
// paired, summed in float32 by vdpbf16ps (two multiply-adds a lane an instruction); the
// transforms stay float32. Those roundings make its outputs differ from the float32 path's on the
// same values by about twice the output's own bfloat16 rounding (exact values give im2col's bits).
#include "kernels/conv2d.h"

namespace galley::kernels::cpu {

// Whether conv2d_forward / conv2d_backward take this path for `g` (the input gradient only): a
// 3x3 convolution computed in float32 (float32 or float16 data, or bfloat16 where
// cpu/conv2d_direct.h's bf16_kernels() is Widened) with stride 1, padding 1, no dilation and one
// group, in a build for AVX-512 hosts or AVX2 ones with FMA, with at least 16 input and output
// channels (fewer leave the transforms' cost unpaid); or such a bfloat16 one on the dot products
// (the products on pairs), from the same 16 channels.
bool conv2d_winograd_applies(const Conv2dGeometry& g, DType dtype = DType::Float32);
// Whether conv2d_backward takes it for the weight gradient as well: where it applies, with at
// least 32 input and output channels in AVX-512 builds, 16 in AVX2 ones, computed in float32 (a
// bfloat16 one on the dot products keeps to the direct path's). Its transforms (both
// operands, about as costly a tile as the AVX-512 direct path's sums of 16 x 16 channels) cost
// in proportion to the channels, its products to their product.
bool conv2d_winograd_weight_grad_applies(const Conv2dGeometry& g, DType dtype = DType::Float32);

// y = conv(x, w) (+ b) and gx = the input gradient from gy, for any geometry of a 3x3
// convolution with stride 1, padding 1, no dilation and one group (whatever
// conv2d_winograd_applies says, so tests can compare it with the other paths); an error in builds
// with neither AVX-512 nor AVX2 and FMA. x, y, gy and gx hold `dtype` elements, widened to float32
// as they are read and rounded once as the result is written (bfloat16 on the dot products: the
// tiled form's products on pairs, narrow planes widened); w and b are float32.
void conv2d_winograd_forward(const Conv2dGeometry& g, const void* x, const float* w, const float* b,
                             void* y, DType dtype = DType::Float32);
void conv2d_winograd_input_grad(const Conv2dGeometry& g, const float* w, const void* gy, void* gx,
                                DType dtype = DType::Float32);
// gw = the weight gradient from x and gy (overwritten; float32), for the same geometries.
void conv2d_winograd_weight_grad(const Conv2dGeometry& g, const void* x, const void* gy, float* gw,
                                 DType dtype = DType::Float32);
// Tests: the tiled form's tile rows laid out in whole vectors (1) or dense (0) on any AVX-512
// host, or as the host chooses (-1, the default: whole vectors on Intel's cores).
void conv2d_winograd_whole_vector_rows_for_tests(int setting);

}  // namespace galley::kernels::cpu
