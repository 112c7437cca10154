#pragma once
// Direct convolution with the output channels across the vector lanes, for strided convolutions
// (resnet's 3x3/2 downsampling layers).
//
// The direct path (cpu/conv2d_direct.h) puts consecutive outputs of a plane across the lanes, so
// a stride first splits each bordered plane into its phases, and a plane narrower than a vector
// (7 wide at resnet's last stage: 7 of 8 lanes) leaves lanes idle. Here each image is copied
// channel-last into a zero-bordered buffer, xb[row][column][channel], once (L x L transposes). An
// output position p at (i, j) reads tap (a, b) of input channel c at xb[i s + a d][j s + b d][c]:
// a scalar, whatever the stride. The register block holds NP positions x OV vectors of output
// channels; each (channel, tap) step loads OV vectors of weights ([channel][tap][output], output
// channels in whole vectors) and broadcasts each position's input against them. The sums run over
// the channels, and within each over the taps, in the direct path's order, so each output has the
// direct path's bits. The positions' sums go to a channel-last scratch, [position][output], which
// L x L transposes (adding the bias) write into the output planes.
//
// bfloat16 data where the direct path takes the dot products (AVX512-BF16 without AMX): the
// forward pass and the input gradient copy the image as bfloat16 bits, and each step takes a pair
// of channels at a tap, its two values one 32-bit broadcast against OV vectors of weight pairs
// (vdpbf16ps: both exact products added to a float32 lane), twice the multiply-adds an
// instruction on half the bytes; the sums in another order than float32's, each result rounded
// once. On resnet's 3x3/2 layers at batch 64 (AMD Zen 4, two threads) against the same path on
// the widened values: forward 1.6x (16->32 at 28x28) and 1.8x (32->64 at 14x14), the
// backward 1.3x and 1.2x. The weight gradient, a sum over positions, stays on the widened values.
#include "kernels/conv2d.h"

namespace galley::kernels::cpu {

// Which parts of a convolution conv2d_forward / conv2d_backward run on this path. None unless: one
// group, a stride of 2 or more, dilation 1, a kernel of more than one tap (a 1x1 one is
// cpu/conv2d_pointwise.h's), computed in float32 (float32 or float16 data, or bfloat16 where
// cpu/conv2d_direct.h's bf16_kernels() is not Tiles: on the dot products (AMD Zen 4, two
// threads) resnet's 3x3/2 layers in bfloat16 ran 1.77x and 1.2x forward and 1.32x and 1.27x
// backward here, the values widened, against im2col on the bfloat16 GEMM; AMX's tiles take their
// phases, cpu/conv2d.cpp), at least 16 output channels and one image a
// thread, in a build for AVX2 hosts with FMA or for AVX-512. Then each part where it beat the
// direct path's phases (one thread, batch 64, alternated in one process; AMD Zen 3 with AVX2,
// AMD Zen 4 with AVX-512):
//   forward      from 8 input channels: Zen 3 1.2x at 8->16 28x28, 1.1x at resnet's 16->32
//                3x3/2, 1.27x at its 32->64; Zen 4 1.0x, 1.11x and 1.31x;
//   input_grad   from 16 input channels: 1.19x and 1.37x on resnet's two on Zen 3, 1.18x and
//                1.38x on Zen 4 (with 8 or 12 input channels 0.86-0.9x on Zen 3: too few steps
//                for the block's sums; 0.67x and 1.13x on Zen 4); on cores that issue two
//                16-lane FMAs a cycle (intel_avx512_cores()) from 32, whose
//                register block then holds twice the accumulators (resnet's 16->32 layer 0.7x
//                here on a Xeon, its 32->64 one 1.25x);
//   weight_grad  from 16 input channels; on AVX2 only where the output rows are at most a vector
//                wide (resnet's 7x7 outputs: 1.11x on 32->64 on Zen 3, 1.06x on 16->32 at 14x14),
//                which leave the direct path's lanes idle: on 14-wide rows the two tied. On
//                AVX-512 every row width: 1.19x and 1.14x on resnet's two, 1.08x on 16->32 at
//                56x56 (28-wide outputs).
struct ConvChannelsUse {
  bool forward = false, input_grad = false, weight_grad = false;
};
ConvChannelsUse conv2d_channels_use(const Conv2dGeometry& g, DType dtype = DType::Float32);

// y = conv(x, w) (+ b) for any geometry of one group (whatever conv2d_channels_use says, so
// tests can compare it with the other paths); an error in builds with neither AVX-512 nor AVX2
// and FMA, or for more than one group. x and y hold `dtype` elements, widened to float32 as they
// are read and rounded once as the result is written; w and b are float32.
void conv2d_channels_forward(const Conv2dGeometry& g, const void* x, const float* w, const float* b,
                             void* y, DType dtype = DType::Float32);
// gx = the input gradient from gy, for any geometry of one group and dilation 1: by the phases of
// the direct path's strided input gradient (cpu/conv2d_direct.h), each a correlation of the
// channel-last output gradient with its share of the taps, every input position that some tap
// reaches one of the block's positions (the others zero); its sums in the direct path's order.
void conv2d_channels_input_grad(const Conv2dGeometry& g, const float* w, const void* gy, void* gx,
                                DType dtype = DType::Float32);
// gw = the weight gradient from x and gy (overwritten; float32), for any geometry of one group:
// channel-last inputs and output gradients, a register block of input channels at one tap x
// vectors of output channels summing over the positions of a batch of images.
void conv2d_channels_weight_grad(const Conv2dGeometry& g, const void* x, const void* gy, float* gw,
                                 DType dtype = DType::Float32);

}  // namespace galley::kernels::cpu
