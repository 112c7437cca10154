#pragma once
// Direct convolution for ungrouped convolutions with a kernel larger than 1x1 (the 3x3
// convolutions of most CNNs): no im2col copy and no GEMM packing per image.
//
// Each image is copied into a zero-bordered buffer. With rows of the bordered width Wp, the input
// under kernel tap (i, j) for output (oh, ow) sits at flat offset q + (i * Wp + j) * dilation,
// where q = oh * Wp + ow. A vector of consecutive outputs q (16 with AVX-512, 8 with AVX2) is thus
// a sum over (channel, tap) of as many consecutive inputs times one weight: one vector load, one
// broadcast and one FMA per output channel, with a block of output channels and vectors held in
// registers. The flat output
// carries Wp - OW junk columns per row, dropped when the result is written out (or, in float32
// where that pays, the block takes each output row's vectors and stores them into the planes
// directly, the last one of a row partly). The input
// gradient is the same correlation of the bordered output gradient with the flipped, transposed
// kernel; the weight gradient runs over q with output channels across the vector lanes, or, for
// few (input channel, tap) pairs (the stems), over each output row's vectors with the outputs
// across the lanes, the output gradient read in place.
//
// A strided convolution (stride s up to 4, dilation 1) holds each bordered plane as its phases:
// padded row r is row r / s of row phase r % s, columns alike, so tap (i, j) of output
// (oh, ow) reads phase (i % s, j % s) at row oh + i / s, column ow + j / s, again a constant
// shift of q = oh * Wq + ow (Wq the phase width) with no zero taps. That covers the forward pass
// and the weight gradient. The input gradient is split the other way: the input positions of
// phase (r, c) take only the taps a = r + s u, b = c + s v, so each phase is a stride-1 correlation
// of the output gradient with its share of the taps (2x2, 2x1, 1x2 and 1x1 of a 3x3/2 kernel),
// whose rows are interleaved back into the input gradient's.
#include "kernels/conv2d.h"

namespace galley::kernels::cpu {

// The kernels that run a bfloat16 convolution on the direct path:
//   Tiles        AMX (tdpbf16ps), in builds for hosts with AMX-BF16 whose kernel grants the tile
//                state; float32 sums;
//   DotProducts  vdpbf16ps, in builds for hosts with AVX512-BF16; float32 sums;
//   Widened      the float32 kernels on the widened values (every host), with the float32
//                kernels' bits.
// The weights are rounded to bfloat16 by the first two (exact for the weights of a bfloat16
// convolution, which the op widens from bfloat16). bf16_kernels() is the one the direct path
// uses: Tiles where available; else DotProducts in a build with AVX512-BF16 that does not target
// AMX, on AMD's cores (Zen 4 and 5 issue vdpbf16ps at their float32 FMA rate, so it does twice
// the multiply-adds an instruction); else Widened. Intel's cores run vdpbf16ps at one every two
// cycles against two FMAs a cycle, so where AMX exists but the kernel refuses its tiles, or the
// tiles are hidden (a virtual machine's Xeon), Widened. GALLEY_BF16_KERNELS=tiles|dot|widened
// overrides the choice where this host and build have those kernels (read once).
enum class Bf16Kernels { Tiles, DotProducts, Widened };
bool bf16_kernels_available(Bf16Kernels k);
Bf16Kernels bf16_kernels();
// Whether a convolution of `dtype` runs on the bfloat16 kernels `bf16` (a bfloat16 one on Tiles
// or DotProducts) rather than on the float32 kernels.
inline bool on_bf16_kernels(DType dtype, Bf16Kernels bf16) {
  return dtype == DType::BFloat16 && bf16 != Bf16Kernels::Widened;
}
// Whether a convolution of `dtype` multiplies bfloat16 pairs with vdpbf16ps: a bfloat16 one where
// bf16_kernels() is DotProducts (only in builds with AVX512-BF16).
inline bool on_dot_products(DType dtype) {
  return dtype == DType::BFloat16 && bf16_kernels() == Bf16Kernels::DotProducts;
}

// The float32 lanes of the vectors the direct and Winograd paths run on in this build: 16 with
// AVX-512, 8 with AVX2 and FMA, 0 without either (neither path is taken then).
int conv2d_vector_lanes();

// Whether this is an AVX-512 build on one of Intel's cores: the choices the host kernels make from
// measurements on an Intel Xeon (two 16-lane FMAs a cycle, vdpbf16ps at one every two cycles, a
// 64-byte access straddling two cache lines split in two) follow it. The vendor stands in for
// those traits: AMD Zen 4, which the other choices were measured on, issues one 16-lane FMA a
// cycle as two halves; Intel's client and low-end parts with one FMA unit, and AMD Zen 5 with
// two, were not measured.
bool intel_avx512_cores();

// Which parts of a convolution conv2d_forward / conv2d_backward run on the direct path. None
// unless: stride 1 (or up to 4 with dilation 1), one group, a kernel of more than
// one tap, padding at most (kernel - 1) * dilation, at least one image per thread, and a host with
// AVX-512, or AVX2 with FMA (elsewhere the registers would not hold a block). A strided one
// takes the bfloat16 kernels for its weight gradient alone, on the dot products (its other parts,
// from 16 channels, take the channels path or the tiles' phases). Then each part where it is faster
// than im2col + GEMM (measured on the layers of the benchmark models): the forward pass and the
// weight gradient need enough (input channel, tap) pairs to amortise writing each output block
// and summing each image's products (the 9 of a single channel's 3x3 kernel; the weight
// gradient 64 for bfloat16 on the dot products, but for the stems' of at most 27, which run with
// the outputs across the lanes on those kernels); the input gradient needs enough input
// channels to fill its blocks of output channels (16). A bfloat16 convolution of 16 or more input
// channels, where bf16_kernels() is Tiles or DotProducts, takes the direct path for every part on
// those kernels; any other runs the widened kernels.
struct ConvDirectUse {
  bool forward = false, input_grad = false, weight_grad = false;
  // The kernels a bfloat16 convolution's forward pass runs on the direct path, and those of its
  // backward: the same, but for a stem's weight gradient on the dot products (its forward pass
  // widened).
  Bf16Kernels bf16 = Bf16Kernels::Widened, bf16_backward = Bf16Kernels::Widened;
};
ConvDirectUse conv2d_direct_use(const Conv2dGeometry& g, DType dtype = DType::Float32);

// The ways the direct path runs g's parts, so that tests see every way taken. forward_rows and
// input_grad_rows: the float32 forward pass (and stride-1 input gradient) stores its outputs
// straight into the planes by rows rather than through the flat output. weight_grad_lanes: the
// weight gradient sums over the outputs across the vector lanes (few (input channel, tap) pairs:
// the stems) rather than over the output channels. All false in builds without the vector lanes.
struct ConvDirectWays {
  bool forward_rows = false, input_grad_rows = false, weight_grad_lanes = false;
};
ConvDirectWays conv2d_direct_ways(const Conv2dGeometry& g);

// Same contracts as conv2d_forward / conv2d_backward (the bias gradient only as below); callable
// for any geometry of one group with stride 1, or a stride up to 4 with dilation 1 (the bfloat16
// kernels at stride 1 only), whatever conv2d_direct_use says, so tests can
// compare the two paths on every machine; other geometries are an error. `bf16` picks the
// bfloat16 kernels (an unavailable one is an error).
void conv2d_direct_forward(const Conv2dGeometry& g, const void* x, const float* w, const float* b,
                           void* y, DType dtype = DType::Float32,
                           Bf16Kernels bf16 = bf16_kernels());
// gb, where given, takes the bias gradient, each image's plane sums taken as the weight gradient
// reads its output gradient (a pass of its own would read it again from memory), added in image
// order after the images, as conv2d_backward's own bias gradient does: the same bits at any thread
// count. It needs gw and the float32 kernels (not Tiles or DotProducts).
void conv2d_direct_backward(const Conv2dGeometry& g, const void* x, const float* w, const void* gy,
                            void* gx, float* gw, DType dtype = DType::Float32,
                            Bf16Kernels bf16 = bf16_kernels(), float* gb = nullptr);

}  // namespace galley::kernels::cpu
