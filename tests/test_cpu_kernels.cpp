// CPU kernels against simpler forms of themselves: the GEMM spread over threads against one
// thread and a naive product, and the direct convolution kernels (kernels/cpu/conv2d_direct.h)
// against the im2col + GEMM path,
// forward and backward, over geometries that exercise every tail: channel counts that are not
// multiples of the register blocks, rectangular and dilated kernels, every padding the direct
// path accepts, outputs of a single pixel and rows wider than a vector.
// The bfloat16 kernels (AMX tiles, vdpbf16ps, widened), strided bfloat16 convolutions over their
// phases, and 16-bit max pooling, each against the float32 kernels.
//
// Inputs are small integers and weights multiples of 1/4, so every product and partial sum is
// exact in float: two paths that add in different orders must agree to the bit.
#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "galley/galley.h"
#include "kernels/batch_norm.h"
#include "kernels/binary.h"
#include "kernels/conv2d.h"
#include "kernels/convert.h"
#include "kernels/cpu/conv2d_channels.h"
#include "kernels/cpu/conv2d_direct.h"
#include "kernels/cpu/conv2d_pointwise.h"
#include "kernels/cpu/conv2d_winograd.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/staged.h"
#include "kernels/gemm.h"
#include "kernels/max_pool2d.h"
#include "kernels/unary.h"
#include "kernels/unary_math.h"

using galley::kernels::Conv2dGeometry;

namespace {

struct Case {
  int64_t n, c, h, w, o, kh, kw, pad, dilation, stride = 1;
};

Conv2dGeometry geometry(const Case& k) {
  Conv2dGeometry g{k.n, k.c, k.h, k.w, k.o, k.kh, k.kw, k.stride, k.pad, k.dilation, 1, 0, 0};
  g.oh = (k.h + 2 * k.pad - (k.kh - 1) * k.dilation - 1) / k.stride + 1;
  g.ow = (k.w + 2 * k.pad - (k.kw - 1) * k.dilation - 1) / k.stride + 1;
  return g;
}

std::vector<float> exact_values(size_t n, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> d(-3, 3);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng) * scale;
  return v;
}

// n draws of a standard normal distribution from rng: values whose sums round.
std::vector<float> normal_values(std::mt19937& rng, size_t n) {
  std::normal_distribution<float> normal;
  std::vector<float> v(n);
  for (auto& x : v) x = normal(rng);
  return v;
}

// float32 values as 16-bit bits of dt (rounded to nearest even), and such bits widened back.
std::vector<uint16_t> narrow_to(const std::vector<float>& v, galley::DType dt) {
  std::vector<uint16_t> bits(v.size());
  galley::kernels::cpu::convert(v.data(), galley::DType::Float32, bits.data(), dt,
                                int64_t(v.size()));
  return bits;
}
std::vector<float> widen_from(const std::vector<uint16_t>& bits, galley::DType dt) {
  std::vector<float> v(bits.size());
  galley::kernels::cpu::convert(bits.data(), dt, v.data(), galley::DType::Float32,
                                int64_t(v.size()));
  return v;
}

// The largest |got - ref| and the root mean square of ref.
std::pair<double, double> worst_and_rms(const std::vector<float>& got,
                                        const std::vector<float>& ref) {
  double e = 0, r = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    e = std::max(e, double(std::fabs(got[i] - ref[i])));
    r += double(ref[i]) * ref[i];
  }
  return {e, std::sqrt(r / double(ref.size()))};
}

// A bfloat16 Winograd convolution with its products on pairs rounds each transformed input and
// kernel to bfloat16, in sums that reach about 4 x the largest output: its worst error, observed
// within 0.025 x the outputs' root mean square, is held to 0.04 x (the output's own rounding is up
// to 0.01 of it; a pair in the wrong place is off by about the whole of it).
constexpr double kPairProductsError = 0.04;

// x, w, b and gy of a geometry (ungrouped), exact values from seeds seed to seed + 3.
struct Operands {
  std::vector<float> x, w, b, gy;
};
Operands exact_operands(const Conv2dGeometry& g, uint32_t seed) {
  return {exact_values(size_t(g.n * g.c * g.h * g.w), seed, 1.f),
          exact_values(size_t(g.o * g.c * g.kh * g.kw), seed + 1, 0.25f),
          exact_values(size_t(g.o), seed + 2, 0.5f),
          exact_values(size_t(g.n * g.o * g.oh * g.ow), seed + 3, 0.5f)};
}

// x, w, b and gy of a geometry (ungrouped), normal draws from seed: sums that round.
Operands random_operands(const Conv2dGeometry& g, uint32_t seed) {
  std::mt19937 rng(seed);
  Operands r;
  r.x = normal_values(rng, size_t(g.n * g.c * g.h * g.w));
  r.w = normal_values(rng, size_t(g.o * g.c * g.kh * g.kw));
  r.b = normal_values(rng, size_t(g.o));
  r.gy = normal_values(rng, size_t(g.n * g.o * g.oh * g.ow));
  return r;
}

std::string name(const Case& k) {
  return "n" + std::to_string(k.n) + " c" + std::to_string(k.c) + " " + std::to_string(k.h) + "x" +
         std::to_string(k.w) + " o" + std::to_string(k.o) + " k" + std::to_string(k.kh) + "x" +
         std::to_string(k.kw) + " pad" + std::to_string(k.pad) + " d" + std::to_string(k.dilation) +
         " s" + std::to_string(k.stride);
}

const std::vector<Case>& cases() {
  static const std::vector<Case> all = {
      {2, 1, 28, 28, 32, 3, 3, 1, 1},   // the Fashion-MNIST model's first conv
      {3, 32, 14, 14, 64, 3, 3, 1, 1},  // ... and its second
      {2, 3, 32, 32, 64, 3, 3, 0, 1},   // SimpleCNN's, unpadded
      {2, 64, 8, 8, 128, 3, 3, 1, 1},   // VGG's last block
      {2, 5, 9, 7, 17, 3, 3, 1, 1},     // channels off every block size
      {1, 2, 6, 40, 3, 3, 3, 1, 1},     // rows wider than two vectors
      {2, 4, 11, 10, 70, 3, 3, 1, 1},   // more than four vectors of output channels
      {2, 3, 9, 9, 5, 3, 3, 2, 2},      // dilation 2
      {2, 2, 8, 9, 6, 5, 5, 2, 1},      // 5x5
      {2, 3, 7, 8, 4, 2, 3, 1, 1},      // rectangular kernel, padding below one side's reach
      {2, 3, 7, 8, 4, 3, 1, 0, 1},      // a column kernel
      {1, 6, 3, 3, 9, 3, 3, 0, 1},      // a single output pixel
      {2, 1, 9, 9, 6, 5, 5, 2, 1},      // one channel's 5x5 (lane columns across kernel rows)
      {4, 33, 5, 6, 16, 3, 3, 1, 1},    // 33 input channels
  };
  return all;
}

// Strided geometries for the direct path: every phase count (a kernel wider than, as wide as and
// narrower than the stride, where the input gradient has positions no tap reaches), both
// paddings' parities, padding as wide as the stride, odd sizes, and the tails of cases().
const std::vector<Case>& strided_cases() {
  static const std::vector<Case> all = {
      {2, 16, 28, 28, 32, 3, 3, 1, 1, 2},  // resnet's 3x3/2 layers
      {3, 32, 14, 14, 64, 3, 3, 1, 1, 2},  // ... at 7x7 out
      {2, 5, 9, 7, 17, 3, 3, 1, 1, 2},     // odd sizes, channels off every block
      {2, 3, 9, 8, 6, 3, 3, 0, 1, 2},      // unpadded
      {1, 2, 6, 70, 3, 3, 3, 1, 1, 2},     // rows of more than two vectors out
      {2, 4, 11, 10, 70, 3, 3, 1, 1, 3},   // stride 3: three phases a side
      {2, 1, 13, 11, 5, 3, 3, 1, 1, 3},    // one channel at stride 3 (lane columns on phases)
      {2, 3, 10, 9, 5, 2, 2, 0, 1, 2},     // a 2x2 kernel: as wide as the stride
      {2, 2, 12, 11, 6, 5, 5, 2, 1, 2},    // 5x5
      {2, 3, 9, 8, 4, 3, 1, 1, 1, 2},      // a column kernel: one column phase
      {2, 16, 8, 8, 24, 1, 1, 0, 1, 2},    // a strided 1x1: one phase
      {1, 6, 3, 3, 9, 3, 3, 0, 1, 2},      // a single output pixel
  };
  return all;
}

}  // namespace

// A path's forward(g, x, w, b, y) and backward(g, x, w, gy, gx, gw) against im2col's, bit for
// bit on exact values: with the bias and without, and both gradients, then each alone (the other
// pointer null, and its buffer left as it was).
template <typename Forward, typename Backward>
void expect_matches_im2col(const Case& k, uint32_t seed, Forward forward, Backward backward) {
  namespace cpu = galley::kernels::cpu;
  const Conv2dGeometry g = geometry(k);
  const auto [x, w, b, gy] = exact_operands(g, seed);
  const size_t ny = gy.size();
  for (const float* bias : {b.data(), static_cast<const float*>(nullptr)}) {
    std::vector<float> want(ny, -1.f), got(ny, -2.f);
    cpu::conv2d_forward_im2col(g, x.data(), w.data(), bias, want.data());
    forward(g, x.data(), w.data(), bias, got.data(), galley::DType::Float32);
    ASSERT_EQ(got, want) << name(k) << (bias ? " with bias" : " without bias");
  }
  std::vector<float> gw_want(w.size(), -1.f), gx_want(x.size(), -1.f);
  cpu::conv2d_backward_im2col(g, x.data(), w.data(), gy.data(), gx_want.data(), gw_want.data());
  for (int which = 0; which < 3; ++which) {
    std::vector<float> gx(x.size(), -2.f), gw(w.size(), -2.f);
    float* pgx = which != 2 ? gx.data() : nullptr;
    float* pgw = which != 1 ? gw.data() : nullptr;
    backward(g, x.data(), w.data(), gy.data(), pgx, pgw, galley::DType::Float32);
    if (pgx) EXPECT_EQ(gx, gx_want) << name(k) << " input gradient, case " << which;
    if (pgw) EXPECT_EQ(gw, gw_want) << name(k) << " weight gradient, case " << which;
    if (!pgx) EXPECT_EQ(gx, std::vector<float>(x.size(), -2.f)) << name(k) << " wrote gx";
    if (!pgw) EXPECT_EQ(gw, std::vector<float>(w.size(), -2.f)) << name(k) << " wrote gw";
  }
}

// The conv2d_*_forward / conv2d_*_backward of a path, as the expect_* helpers take them.
#define GALLEY_CONV_PATH(prefix)                                                           \
  [](const Conv2dGeometry& g, const void* x, const float* w, const float* b, void* y,      \
     galley::DType dt) { galley::kernels::cpu::prefix##_forward(g, x, w, b, y, dt); },     \
      [](const Conv2dGeometry& g, const void* x, const float* w, const void* gy, void* gx, \
         float* gw,                                                                        \
         galley::DType dt) { galley::kernels::cpu::prefix##_backward(g, x, w, gy, gx, gw, dt); }

// A path on 16-bit x and gy (`dt`) against the same path in float32 on the widened values: the
// float32 bits, each output rounded once. On exact values the sums need no rounding; on random
// ones (`exact` false, for a path that widens and sums as its float32 form does) the outputs'
// rounding to 16 bits is tested too.
template <typename Forward, typename Backward>
void expect_16bit_rounds_once(const Case& k, uint32_t seed, galley::DType dt, Forward forward,
                              Backward backward, bool exact = true) {
  namespace cpu = galley::kernels::cpu;
  const galley::DType f32 = galley::DType::Float32;
  const Conv2dGeometry g = geometry(k);
  const auto [x_in, w, b, gy] = exact ? exact_operands(g, seed) : random_operands(g, seed);
  // x as the 16-bit values widened: the float32 run's input
  const std::vector<float> x = widen_from(narrow_to(x_in, dt), dt);
  const size_t ny = gy.size();
  const std::string what = name(k) + " " + galley::dtype_name(dt);
  std::vector<uint16_t> x16(x.size()), y16(ny), want16(ny);
  cpu::convert(x.data(), f32, x16.data(), dt, int64_t(x.size()));
  std::vector<float> y(ny);
  forward(g, x.data(), w.data(), b.data(), y.data(), f32);
  cpu::convert(y.data(), f32, want16.data(), dt, int64_t(ny));
  forward(g, x16.data(), w.data(), b.data(), y16.data(), dt);
  EXPECT_EQ(y16, want16) << what << " output";
  std::vector<uint16_t> gy16(ny), gx16(x.size()), gx_want16(x.size());
  cpu::convert(gy.data(), f32, gy16.data(), dt, int64_t(ny));
  std::vector<float> gy_rounded(ny), gx(x.size()), gw(w.size()), gw16(w.size());
  cpu::convert(gy16.data(), dt, gy_rounded.data(), f32, int64_t(ny));
  backward(g, x.data(), w.data(), gy_rounded.data(), gx.data(), gw.data(), f32);
  cpu::convert(gx.data(), f32, gx_want16.data(), dt, int64_t(x.size()));
  backward(g, x16.data(), w.data(), gy16.data(), gx16.data(), gw16.data(), dt);
  EXPECT_EQ(gx16, gx_want16) << what << " input gradient";
  EXPECT_EQ(gw16, gw) << what << " weight gradient";
}

TEST(ConvDirect, MatchesIm2colBitForBit) {
  for (const Case& k : cases()) expect_matches_im2col(k, 1, GALLEY_CONV_PATH(conv2d_direct));
}

// The cases above take every way of the direct path: both ways of writing its outputs (by rows
// straight into the planes, and through the flat output), forward and input gradient, and both
// weight gradients (the outputs across the lanes, and the output channels), at stride 1 and 2;
// the stems and resnet's 3x3/2 layers each the way it was measured faster.
TEST(ConvDirect, CasesCoverEveryWay) {
  namespace cpu = galley::kernels::cpu;
  if (cpu::conv2d_vector_lanes() == 0) GTEST_SKIP() << "no AVX2 or AVX-512: one way only";
  int fwd[2] = {0, 0}, ig[2] = {0, 0}, wg[2][2] = {{0, 0}, {0, 0}};
  for (const std::vector<Case>* set : {&cases(), &strided_cases()})
    for (const Case& k : *set) {
      const cpu::ConvDirectWays w = cpu::conv2d_direct_ways(geometry(k));
      ++fwd[w.forward_rows];
      if (k.stride == 1) ++ig[w.input_grad_rows];
      ++wg[k.stride > 1][w.weight_grad_lanes];
    }
  for (int way = 0; way < 2; ++way) {
    EXPECT_GT(fwd[way], 0) << "forward rows " << way;
    EXPECT_GT(ig[way], 0) << "input gradient rows " << way;
    EXPECT_GT(wg[0][way], 0) << "stride 1, weight gradient lanes " << way;
    EXPECT_GT(wg[1][way], 0) << "strided, weight gradient lanes " << way;
  }
  const Conv2dGeometry stem = geometry(Case{64, 1, 28, 28, 16, 3, 3, 1, 1});
  const Conv2dGeometry vgg_stem = geometry(Case{64, 3, 32, 32, 32, 3, 3, 1, 1});
  const Conv2dGeometry strided = geometry(Case{64, 16, 28, 28, 32, 3, 3, 1, 1, 2});
  for (const Conv2dGeometry& g : {stem, vgg_stem}) {
    EXPECT_TRUE(cpu::conv2d_direct_ways(g).forward_rows);
    EXPECT_TRUE(cpu::conv2d_direct_ways(g).weight_grad_lanes);
  }
  // (on AVX2 its flat output measured faster than rows; with 16 lanes the flat output's 14 rows
  // of 15, junk column included, take 14 vectors, as many as the rows, so rows_pay takes them)
  if (cpu::conv2d_vector_lanes() == 8) EXPECT_FALSE(cpu::conv2d_direct_ways(strided).forward_rows);
  EXPECT_FALSE(cpu::conv2d_direct_ways(strided).weight_grad_lanes);
}

// The bias gradient that the direct path sums image by image with the weight gradient: the sums
// of the output gradient's planes (exact values, so any order gives these bits), in float32 and on
// 16-bit output gradients; the weight gradient the same with it or without. Without the weight
// gradient, or on the bfloat16 kernels, asking for it is an error.
TEST(ConvDirect, SumsTheBiasGradientWithTheWeightGradient) {
  namespace cpu = galley::kernels::cpu;
  for (const std::vector<Case>* set : {&cases(), &strided_cases()})
    for (const Case& k : *set) {
      const Conv2dGeometry g = geometry(k);
      const auto [x, w, b, gy] = exact_operands(g, 11);
      const int64_t P = g.oh * g.ow;
      std::vector<float> gb_want(size_t(g.o), 0.f);
      for (int64_t n = 0; n < g.n; ++n)
        for (int64_t o = 0; o < g.o; ++o)
          for (int64_t p = 0; p < P; ++p) gb_want[size_t(o)] += gy[size_t((n * g.o + o) * P + p)];
      std::vector<float> gw_alone(w.size()), gw(w.size()), gb(size_t(g.o), -2.f);
      cpu::conv2d_direct_backward(g, x.data(), w.data(), gy.data(), nullptr, gw_alone.data());
      cpu::conv2d_direct_backward(g, x.data(), w.data(), gy.data(), nullptr, gw.data(),
                                  galley::DType::Float32, cpu::bf16_kernels(), gb.data());
      EXPECT_EQ(gb, gb_want) << name(k);
      EXPECT_EQ(gw, gw_alone) << name(k);
      // float16 activations: the output gradient's values are exact in float16 too.
      std::vector<uint16_t> x16(x.size()), gy16(gy.size());
      cpu::convert(x.data(), galley::DType::Float32, x16.data(), galley::DType::Float16,
                   int64_t(x.size()));
      cpu::convert(gy.data(), galley::DType::Float32, gy16.data(), galley::DType::Float16,
                   int64_t(gy.size()));
      std::fill(gb.begin(), gb.end(), -2.f);
      cpu::conv2d_direct_backward(g, x16.data(), w.data(), gy16.data(), nullptr, gw.data(),
                                  galley::DType::Float16, cpu::bf16_kernels(), gb.data());
      EXPECT_EQ(gb, gb_want) << name(k) << " float16";
      EXPECT_THROW(
          cpu::conv2d_direct_backward(g, x.data(), w.data(), gy.data(), nullptr, nullptr,
                                      galley::DType::Float32, cpu::bf16_kernels(), gb.data()),
          galley::Error)
          << name(k);
    }
  const Conv2dGeometry g = geometry(cases()[0]);
  std::vector<uint16_t> x16(size_t(g.n * g.c * g.h * g.w)), gy16(size_t(g.n * g.o * g.oh * g.ow));
  std::vector<float> w(size_t(g.o * g.c * 9)), gw(w.size()), gb(size_t(g.o));
  for (cpu::Bf16Kernels kernels : {cpu::Bf16Kernels::Tiles, cpu::Bf16Kernels::DotProducts})
    if (cpu::bf16_kernels_available(kernels)) {
      EXPECT_THROW(
          cpu::conv2d_direct_backward(g, x16.data(), w.data(), gy16.data(), nullptr, gw.data(),
                                      galley::DType::BFloat16, kernels, gb.data()),
          galley::Error);
    }
}

// On values whose sums round, the direct path's bias gradient has the bits of conv2d_backward's
// own bias pass (each image's plane sums, added in image order) at every thread count, through
// either weight gradient (the outputs across the lanes, and the broadcast block).
TEST(ConvDirect, BiasGradientHasOneOrderAtEveryThreadCount) {
  namespace cpu = galley::kernels::cpu;
  const int saved = galley::num_threads();
  for (const Case& k : {Case{24, 3, 12, 12, 8, 3, 3, 1, 1}, Case{24, 8, 10, 10, 12, 3, 3, 1, 1}}) {
    const Conv2dGeometry g = geometry(k);
    std::mt19937 rng(9);
    const auto x = normal_values(rng, size_t(g.n * g.c * g.h * g.w)),
               w = normal_values(rng, size_t(g.o * g.c * 9)),
               gy = normal_values(rng, size_t(g.n * g.o * g.oh * g.ow));
    const int64_t P = g.oh * g.ow;
    std::vector<float> want(size_t(g.o));
    for (int64_t o = 0; o < g.o; ++o) {
      float sum = 0.f;
      for (int64_t n = 0; n < g.n; ++n) sum += cpu::sum_floats(gy.data() + (n * g.o + o) * P, P);
      want[size_t(o)] = sum;
    }
    for (int threads : {1, 2, 3}) {
      galley::set_num_threads(threads);
      std::vector<float> gw(w.size()), gb(size_t(g.o), -2.f), gb_op(size_t(g.o), -2.f);
      cpu::conv2d_direct_backward(g, x.data(), w.data(), gy.data(), nullptr, gw.data(),
                                  galley::DType::Float32, cpu::bf16_kernels(), gb.data());
      cpu::conv2d_backward(g, x.data(), w.data(), gy.data(), nullptr, gw.data(), gb_op.data());
      EXPECT_EQ(gb, want) << name(k) << ", " << threads << " threads";
      EXPECT_EQ(gb_op, want) << name(k) << ", " << threads << " threads, through conv2d_backward";
    }
  }
  galley::set_num_threads(saved);
}

TEST(ConvDirect, StridedMatchesIm2colBitForBit) {
  namespace cpu = galley::kernels::cpu;
  for (const Case& k : strided_cases()) {
    expect_matches_im2col(k, 7, GALLEY_CONV_PATH(conv2d_direct));
    // The 16-bit types on the widened kernels.
    expect_16bit_rounds_once(k, 7, galley::DType::Float16, GALLEY_CONV_PATH(conv2d_direct));
  }
  // What the strided direct path does not take: a dilation, the bfloat16 kernels.
  const Conv2dGeometry g = geometry(strided_cases()[0]);
  std::vector<float> x(size_t(g.n * g.c * g.h * g.w)), w(size_t(g.o * g.c * 9)),
      gy(size_t(g.n * g.o * g.oh * g.ow));
  Conv2dGeometry dilated = g;
  dilated.dilation = 2;
  EXPECT_THROW(cpu::conv2d_direct_forward(dilated, x.data(), w.data(), nullptr, gy.data()),
               galley::Error);
  std::vector<float> gw(w.size());
  for (cpu::Bf16Kernels kernels : {cpu::Bf16Kernels::Tiles, cpu::Bf16Kernels::DotProducts})
    if (cpu::bf16_kernels_available(kernels)) {
      EXPECT_THROW(cpu::conv2d_direct_forward(g, x.data(), w.data(), nullptr, gy.data(),
                                              galley::DType::BFloat16, kernels),
                   galley::Error);
      EXPECT_THROW(cpu::conv2d_direct_backward(g, x.data(), w.data(), gy.data(), x.data(),
                                               gw.data(), galley::DType::BFloat16, kernels),
                   galley::Error)
          << "the input gradient";
      // The weight gradient alone: on the dot products (over the phases), not on the tiles.
      if (kernels == cpu::Bf16Kernels::Tiles)
        EXPECT_THROW(cpu::conv2d_direct_backward(g, x.data(), w.data(), gy.data(), nullptr,
                                                 gw.data(), galley::DType::BFloat16, kernels),
                     galley::Error);
      else
        EXPECT_NO_THROW(cpu::conv2d_direct_backward(g, x.data(), w.data(), gy.data(), nullptr,
                                                    gw.data(), galley::DType::BFloat16, kernels));
    }
}

// bfloat16 on the widened direct kernels, on values whose sums round: the float32 kernels' bits on
// the widened values, each output rounded once, whichever way the outputs are stored (by rows:
// the stems; through the flat output) and at a stride.
TEST(ConvDirect, WidenedBf16RoundsTheFloat32SumsOnce) {
  namespace cpu = galley::kernels::cpu;
  using galley::DType;
  auto forward = [](const Conv2dGeometry& g, const void* x, const float* w, const float* b, void* y,
                    DType dt) {
    cpu::conv2d_direct_forward(g, x, w, b, y, dt, cpu::Bf16Kernels::Widened);
  };
  auto backward = [](const Conv2dGeometry& g, const void* x, const float* w, const void* gy,
                     void* gx, float* gw, DType dt) {
    cpu::conv2d_direct_backward(g, x, w, gy, gx, gw, dt, cpu::Bf16Kernels::Widened);
  };
  for (const Case& k : std::vector<Case>{{2, 1, 28, 28, 16, 3, 3, 1, 1},
                                         {2, 3, 32, 32, 32, 3, 3, 1, 1},
                                         {2, 16, 13, 11, 20, 3, 3, 1, 1},
                                         {2, 5, 12, 9, 18, 3, 3, 1, 1, 2}})
    expect_16bit_rounds_once(k, 23, DType::BFloat16, forward, backward, /*exact=*/false);
}

// Unpadded 1x1 geometries for the pointwise path: resnet's projections, strides 1 to 4, sizes
// the stride does not divide, channel counts off the register blocks on both sides (output
// channels that the weight gradient's block rows divide, that only 4 divides, and neither), rows
// of several vectors, outputs of fewer positions than a vector and of one.
const std::vector<Case>& pointwise_cases() {
  static const std::vector<Case> all = {
      {2, 16, 28, 28, 32, 1, 1, 0, 1, 2},  // resnet's first projection
      {3, 32, 14, 14, 64, 1, 1, 0, 1, 2},  // ... and its second, 7x7 out
      {2, 5, 9, 7, 17, 1, 1, 0, 1, 2},     // odd sizes, channels off every block
      {2, 3, 10, 9, 6, 1, 1, 0, 1, 3},     // stride 3
      {2, 4, 11, 13, 70, 1, 1, 0, 1, 4},   // stride 4, many output channels
      {1, 33, 6, 70, 9, 1, 1, 0, 1, 2},    // 33 input channels, rows of several vectors
      {3, 17, 5, 4, 12, 1, 1, 0, 1, 2},    // 12 outputs: blocks of 6 rows
      {2, 16, 8, 8, 20, 1, 1, 0, 1, 2},    // 20 outputs: blocks of 4 rows
      {2, 7, 3, 3, 5, 1, 1, 0, 1, 2},      // 2x2 out
      {1, 6, 1, 1, 9, 1, 1, 0, 1, 2},      // a single input and output pixel
      {2, 8, 6, 5, 24, 1, 1, 0, 1, 1},     // stride 1
  };
  return all;
}

TEST(ConvPointwise, MatchesIm2colBitForBit) {
  if (galley::kernels::cpu::conv2d_vector_lanes() == 0)
    GTEST_SKIP() << "the pointwise path needs AVX2 with FMA, or AVX-512, in the build";
  for (const Case& k : pointwise_cases()) {
    expect_matches_im2col(k, 21, GALLEY_CONV_PATH(conv2d_pointwise));
    for (const galley::DType dt : {galley::DType::Float16, galley::DType::BFloat16}) {
      expect_16bit_rounds_once(k, 21, dt, GALLEY_CONV_PATH(conv2d_pointwise));
      expect_16bit_rounds_once(k, 22, dt, GALLEY_CONV_PATH(conv2d_pointwise), /*exact=*/false);
    }
  }
}

// Random values, whose sums round: the output and the input gradient have the same bits on one
// thread and two (each image's sums run in one order), the weight gradient the same bits on every
// run at a thread count (chunks added in order), and all are within float32's error of the im2col
// path.
TEST(ConvPointwise, RepeatsItsBitsAndStaysCloseToIm2col) {
  if (galley::kernels::cpu::conv2d_vector_lanes() == 0)
    GTEST_SKIP() << "the pointwise path needs AVX2 with FMA, or AVX-512, in the build";
  namespace cpu = galley::kernels::cpu;
  const int saved = galley::num_threads();
  const Conv2dGeometry g = geometry({9, 16, 28, 28, 32, 1, 1, 0, 1, 2});
  std::mt19937 rng(5);
  auto randoms = [&](size_t n) { return normal_values(rng, n); };
  const auto x = randoms(size_t(g.n * g.c * g.h * g.w)), w = randoms(size_t(g.o * g.c)),
             b = randoms(size_t(g.o)), gy = randoms(size_t(g.n * g.o * g.oh * g.ow));
  struct Result {
    std::vector<float> y, gx, gw;
  };
  auto run = [&](int threads) {
    galley::set_num_threads(threads);
    Result r{std::vector<float>(gy.size()), std::vector<float>(x.size()),
             std::vector<float>(w.size())};
    cpu::conv2d_pointwise_forward(g, x.data(), w.data(), b.data(), r.y.data());
    cpu::conv2d_pointwise_backward(g, x.data(), w.data(), gy.data(), r.gx.data(), r.gw.data());
    return r;
  };
  const Result one = run(1), two = run(2), again = run(2);
  galley::set_num_threads(saved);
  EXPECT_EQ(one.y, two.y);
  EXPECT_EQ(one.gx, two.gx);
  EXPECT_EQ(two.gw, again.gw);
  Result want{std::vector<float>(gy.size()), std::vector<float>(x.size()),
              std::vector<float>(w.size())};
  cpu::conv2d_forward_im2col(g, x.data(), w.data(), b.data(), want.y.data());
  cpu::conv2d_backward_im2col(g, x.data(), w.data(), gy.data(), want.gx.data(), want.gw.data());
  auto near = [](const std::vector<float>& got, const std::vector<float>& ref, const char* what) {
    for (size_t i = 0; i < ref.size(); ++i)
      ASSERT_NEAR(got[i], ref[i], 1e-4f * (1.f + std::abs(ref[i]))) << what << " [" << i << "]";
  };
  near(one.y, want.y, "output");
  near(one.gx, want.gx, "input gradient");
  near(one.gw, want.gw, "weight gradient (one thread)");
  near(two.gw, want.gw, "weight gradient (two threads)");
}

// Where the dispatcher takes the pointwise path, and what the path refuses.
TEST(ConvPointwise, TakenForStridedOneByOnesAndRefusesOtherGeometries) {
  namespace cpu = galley::kernels::cpu;
  const Conv2dGeometry projection = geometry({8, 16, 28, 28, 32, 1, 1, 0, 1, 2});
  const bool lanes = cpu::conv2d_vector_lanes() > 0;
  EXPECT_EQ(cpu::conv2d_pointwise_applies(projection), lanes);
  EXPECT_EQ(cpu::conv2d_pointwise_applies(projection, galley::DType::Float16), lanes);
  EXPECT_EQ(cpu::conv2d_pointwise_applies(projection, galley::DType::BFloat16),
            lanes && cpu::bf16_kernels() != cpu::Bf16Kernels::Tiles)
      << "bfloat16 widened, but where AMX's tiles multiply it";
  EXPECT_FALSE(cpu::conv2d_pointwise_applies(geometry({8, 16, 28, 28, 32, 1, 1, 0, 1, 1})))
      << "stride 1 stays on the GEMM";
  EXPECT_FALSE(cpu::conv2d_pointwise_applies(geometry({8, 16, 28, 28, 32, 3, 3, 1, 1, 2})));
  EXPECT_FALSE(cpu::conv2d_pointwise_applies(geometry({8, 16, 28, 28, 32, 1, 1, 1, 1, 2})))
      << "padded";
  Conv2dGeometry grouped = projection;
  grouped.groups = 2;
  EXPECT_FALSE(cpu::conv2d_pointwise_applies(grouped));
  if (!lanes) return;
  std::vector<float> x(size_t(2 * 16 * 8 * 8)), w(size_t(32 * 16 * 9)), y(size_t(2 * 32 * 64));
  const Conv2dGeometry three = geometry({2, 16, 8, 8, 32, 3, 3, 1, 1, 1});
  EXPECT_THROW(cpu::conv2d_pointwise_forward(three, x.data(), w.data(), nullptr, y.data()),
               galley::Error);
  Conv2dGeometry two_groups = geometry({2, 16, 8, 8, 32, 1, 1, 0, 1, 1});
  two_groups.groups = 2;
  EXPECT_THROW(
      cpu::conv2d_pointwise_backward(two_groups, x.data(), w.data(), y.data(), x.data(), nullptr),
      galley::Error);
}

// The channels-across-lanes path (kernels/cpu/conv2d_channels.h) on every geometry of cases()
// and strided_cases(): its forward pass, its weight gradient, and its input gradient where the
// dilation is 1, give im2col's bits on exact values; the forward pass and the input gradient also
// the direct path's bits on values whose sums round (they sum in the direct path's order; the
// input gradient against the direct path's phases, at a stride); 16-bit data gives the float32
// bits (rounded once, where the result is 16-bit).
TEST(ConvChannels, MatchesIm2colAndTheDirectPathBitForBit) {
  namespace cpu = galley::kernels::cpu;
  if (cpu::conv2d_vector_lanes() == 0) GTEST_SKIP() << "a build without AVX2 or AVX-512";
  std::vector<Case> all = cases();
  all.insert(all.end(), strided_cases().begin(), strided_cases().end());
  // And: stride 4 with a 3x3 kernel (phases no tap reaches, in both axes), padding 2 at stride
  // 3 with output channels in three vectors (AVX2), and resnet's 32->64 3x3/2 at batch 5.
  all.insert(all.end(), {{2, 4, 13, 11, 20, 3, 3, 1, 1, 4},
                         {3, 16, 9, 10, 40, 3, 3, 2, 1, 3},
                         {5, 32, 14, 14, 64, 3, 3, 1, 1, 2}});
  std::mt19937 rng(5);
  const int saved = galley::num_threads();
  for (const Case& k : all) {
    const Conv2dGeometry g = geometry(k);
    const auto [x, w, b, gy] = exact_operands(g, 11);
    for (const float* bias : {b.data(), static_cast<const float*>(nullptr)}) {
      std::vector<float> want(gy.size(), -1.f), got(gy.size(), -2.f);
      cpu::conv2d_forward_im2col(g, x.data(), w.data(), bias, want.data());
      cpu::conv2d_channels_forward(g, x.data(), w.data(), bias, got.data());
      ASSERT_EQ(got, want) << name(k) << (bias ? " with bias" : " without bias");
    }
    {
      // At one thread too: one chunk of every image, whose batches of several images have
      // tiles that cross from one image into the next.
      std::vector<float> want(w.size(), -1.f);
      cpu::conv2d_backward_im2col(g, x.data(), w.data(), gy.data(), nullptr, want.data());
      for (int threads : {saved, 1}) {
        galley::set_num_threads(threads);
        std::vector<float> got(w.size(), -2.f);
        cpu::conv2d_channels_weight_grad(g, x.data(), gy.data(), got.data());
        galley::set_num_threads(saved);
        ASSERT_EQ(got, want) << name(k) << " weight gradient, " << threads << " threads";
      }
    }
    if (k.dilation == 1) {
      std::vector<float> want(x.size(), -1.f), got(x.size(), -2.f);
      cpu::conv2d_backward_im2col(g, x.data(), w.data(), gy.data(), want.data(), nullptr);
      cpu::conv2d_channels_input_grad(g, w.data(), gy.data(), got.data());
      ASSERT_EQ(got, want) << name(k) << " input gradient";
    }
    // Sums that round: the direct path's order (its strided path takes dilation 1 only).
    if (k.stride == 1 || k.dilation == 1) {
      const std::vector<float> xr = normal_values(rng, x.size()), wr = normal_values(rng, w.size()),
                               br = normal_values(rng, b.size()),
                               gyr = normal_values(rng, gy.size());
      std::vector<float> want(gy.size(), -1.f), got(gy.size(), -2.f);
      cpu::conv2d_direct_forward(g, xr.data(), wr.data(), br.data(), want.data());
      cpu::conv2d_channels_forward(g, xr.data(), wr.data(), br.data(), got.data());
      EXPECT_EQ(got, want) << name(k) << " on rounding sums";
      if (k.stride > 1) {
        std::vector<float> gx_want(x.size(), -1.f), gx(x.size(), -2.f);
        cpu::conv2d_direct_backward(g, xr.data(), wr.data(), gyr.data(), gx_want.data(), nullptr);
        cpu::conv2d_channels_input_grad(g, wr.data(), gyr.data(), gx.data());
        EXPECT_EQ(gx, gx_want) << name(k) << " input gradient on rounding sums";
      }
    }
    for (galley::DType dt : {galley::DType::Float16, galley::DType::BFloat16}) {
      const galley::DType f32 = galley::DType::Float32;
      std::vector<uint16_t> x16(x.size()), y16(gy.size()), want16(gy.size());
      std::vector<float> y(gy.size());
      cpu::convert(x.data(), f32, x16.data(), dt, int64_t(x.size()));
      cpu::conv2d_channels_forward(g, x.data(), w.data(), b.data(), y.data());
      cpu::convert(y.data(), f32, want16.data(), dt, int64_t(y.size()));
      cpu::conv2d_channels_forward(g, x16.data(), w.data(), b.data(), y16.data(), dt);
      EXPECT_EQ(y16, want16) << name(k) << " " << galley::dtype_name(dt);
      std::vector<uint16_t> gy16(gy.size()), gx16(x.size()), gx_want16(x.size());
      std::vector<float> gy_rounded(gy.size()), gx(x.size()), gw(w.size()), gw16(w.size());
      cpu::convert(gy.data(), f32, gy16.data(), dt, int64_t(gy.size()));
      cpu::convert(gy16.data(), dt, gy_rounded.data(), f32, int64_t(gy.size()));
      cpu::conv2d_channels_weight_grad(g, x.data(), gy_rounded.data(), gw.data());
      cpu::conv2d_channels_weight_grad(g, x16.data(), gy16.data(), gw16.data(), dt);
      EXPECT_EQ(gw16, gw) << name(k) << " " << galley::dtype_name(dt) << " weight gradient";
      if (k.dilation != 1) continue;
      cpu::conv2d_channels_input_grad(g, w.data(), gy_rounded.data(), gx.data());
      cpu::convert(gx.data(), f32, gx_want16.data(), dt, int64_t(x.size()));
      cpu::conv2d_channels_input_grad(g, w.data(), gy16.data(), gx16.data(), dt);
      EXPECT_EQ(gx16, gx_want16) << name(k) << " " << galley::dtype_name(dt) << " input gradient";
    }
  }
}

// Where the direct path takes the dot products (AVX512-BF16 without AMX), bfloat16 data runs the
// channels path's forward pass and input gradient on pairs of channels: the products of the
// bfloat16 values exact, their sums in float32 but in another order than the float32 path's. So
// each result is the float32 sum on the same values (the weights rounded to bfloat16 too) within
// its own rounding to bfloat16 (2^-8 of it) and 1e-3 of the results' root mean square for the
// order of the sums; a pair out of place is off by about a whole product.
TEST(ConvChannels, Bf16PairsRoundTheFloat32SumsOnce) {
  namespace cpu = galley::kernels::cpu;
  if (cpu::bf16_kernels() != cpu::Bf16Kernels::DotProducts)
    GTEST_SKIP() << "the bfloat16 convolutions do not take the dot products here (they need "
                    "AVX512-BF16 at compile time, no AMX tiles, and an AMD core or "
                    "GALLEY_BF16_KERNELS=dot)";
  const galley::DType bf = galley::DType::BFloat16;
  std::vector<Case> all = strided_cases();
  all.insert(all.end(), {{3, 17, 13, 13, 40, 3, 3, 1, 1, 2}, {2, 33, 9, 9, 64, 3, 3, 1, 1, 2}});
  std::mt19937 rng(61);
  for (const Case& k : all) {
    const Conv2dGeometry g = geometry(k);
    const std::vector<float> w = normal_values(rng, size_t(g.o * g.c * g.kh * g.kw)),
                             b = normal_values(rng, size_t(g.o));
    const std::vector<uint16_t> x16 = narrow_to(normal_values(rng, size_t(g.n * g.c * g.h * g.w)),
                                                bf),
                                gy16 = narrow_to(
                                    normal_values(rng, size_t(g.n * g.o * g.oh * g.ow)), bf);
    const std::vector<float> x = widen_from(x16, bf), gy = widen_from(gy16, bf),
                             wr = widen_from(narrow_to(w, bf), bf);
    std::vector<float> y_ref(gy.size()), gx_ref(x.size());
    cpu::conv2d_forward_im2col(g, x.data(), wr.data(), b.data(), y_ref.data());
    cpu::conv2d_backward_im2col(g, x.data(), wr.data(), gy.data(), gx_ref.data(), nullptr);
    std::vector<uint16_t> y16(gy.size()), gx16(x.size());
    cpu::conv2d_channels_forward(g, x16.data(), w.data(), b.data(), y16.data(), bf);
    cpu::conv2d_channels_input_grad(g, w.data(), gy16.data(), gx16.data(), bf);
    auto check = [&](const std::vector<uint16_t>& got16, const std::vector<float>& ref,
                     const char* what) {
      const std::vector<float> got = widen_from(got16, bf);
      const double rms = worst_and_rms(ref, ref).second;
      for (size_t i = 0; i < got.size(); ++i)
        ASSERT_LE(std::fabs(got[i] - ref[i]), std::ldexp(std::fabs(ref[i]), -8) + 1e-3 * rms)
            << name(k) << " " << what << " at " << i << ": " << got[i] << " against " << ref[i];
    };
    check(y16, y_ref, "forward");
    if (k.dilation == 1) check(gx16, gx_ref, "input gradient");
  }
}

// Where the dispatcher takes the channels-across-lanes path, and what the path refuses.
TEST(ConvChannels, TakenForStridedConvolutionsWithVectorLanesAndRefusesGroups) {
  namespace cpu = galley::kernels::cpu;
  const int lanes = cpu::conv2d_vector_lanes();
  const bool vectors = lanes > 0, avx512 = lanes == 16;
  // (the path wants an image a thread: the cases' 8 images, on one thread whatever the host has)
  const int saved = galley::num_threads();
  galley::set_num_threads(1);
  auto use = [](const Case& k, galley::DType dt = galley::DType::Float32) {
    const cpu::ConvChannelsUse u = cpu::conv2d_channels_use(geometry(k), dt);
    return std::array<bool, 3>{u.forward, u.input_grad, u.weight_grad};
  };
  using Parts = std::array<bool, 3>;
  // resnet's 16->32 3x3/2 (14-wide outputs: on AVX2 the weight gradient stays direct) and 32->64
  // (7 wide); 16->32 on 56x56 (28-wide outputs).
  // (one vector of input channels: the input gradient on the direct path's phases where a core
  // issues two FMAs a cycle)
  const bool one_vector_gx = vectors && !cpu::intel_avx512_cores();
  EXPECT_EQ(use({8, 16, 28, 28, 32, 3, 3, 1, 1, 2}), (Parts{vectors, one_vector_gx, avx512}));
  EXPECT_EQ(use({8, 16, 28, 28, 32, 3, 3, 1, 1, 2}, galley::DType::Float16),
            (Parts{vectors, one_vector_gx, avx512}));
  EXPECT_EQ(use({8, 32, 14, 14, 64, 3, 3, 1, 1, 2}), (Parts{vectors, vectors, vectors}));
  // bfloat16 widened, except on AMX's tiles (which take the phases); on the dot products the
  // weight gradient runs on pairs on the direct path
  const bool widened = cpu::bf16_kernels() != cpu::Bf16Kernels::Tiles;
  const bool dots = cpu::bf16_kernels() == cpu::Bf16Kernels::DotProducts;
  EXPECT_EQ(use({8, 32, 14, 14, 64, 3, 3, 1, 1, 2}, galley::DType::BFloat16),
            (Parts{vectors && widened, vectors && widened, vectors && widened && !dots}));
  const Conv2dGeometry strided = geometry({8, 32, 14, 14, 64, 3, 3, 1, 1, 2});
  const cpu::ConvDirectUse direct = cpu::conv2d_direct_use(strided, galley::DType::BFloat16);
  if (cpu::bf16_kernels() == cpu::Bf16Kernels::Widened) {
    // widened values follow float32's choices (the channels path, asked first, takes them)
    const cpu::ConvDirectUse f32 = cpu::conv2d_direct_use(strided);
    EXPECT_EQ((Parts{direct.forward, direct.input_grad, direct.weight_grad}),
              (Parts{f32.forward, f32.input_grad, f32.weight_grad}));
  } else {
    EXPECT_EQ(direct.weight_grad, vectors && dots);
    EXPECT_FALSE(direct.forward || direct.input_grad);
  }
  EXPECT_EQ(use({8, 16, 56, 56, 32, 3, 3, 1, 1, 2}), (Parts{vectors, one_vector_gx, avx512}));
  EXPECT_EQ(use({8, 8, 28, 28, 16, 3, 3, 1, 1, 2}), (Parts{vectors, false, false})) << "8 channels";
  const Parts none{false, false, false};
  EXPECT_EQ(use({8, 16, 28, 28, 32, 3, 3, 1, 1, 1}), none) << "stride 1";
  EXPECT_EQ(use({8, 16, 28, 28, 32, 1, 1, 0, 1, 2}), none) << "a 1x1 kernel";
  EXPECT_EQ(use({8, 16, 28, 28, 32, 3, 3, 2, 2, 2}), none) << "dilation 2";
  EXPECT_EQ(use({8, 4, 28, 28, 32, 3, 3, 1, 1, 2}), none) << "four input channels";
  EXPECT_EQ(use({8, 16, 28, 28, 8, 3, 3, 1, 1, 2}), none) << "eight output channels";
  Conv2dGeometry grouped = geometry({8, 16, 28, 28, 32, 3, 3, 1, 1, 2});
  grouped.groups = 2;
  const cpu::ConvChannelsUse g2 = cpu::conv2d_channels_use(grouped);
  EXPECT_FALSE(g2.forward || g2.input_grad || g2.weight_grad);
  std::vector<float> x(size_t(8 * 16 * 28 * 28)), w(size_t(32 * 8 * 9)), y(size_t(8 * 32 * 196));
  EXPECT_THROW(cpu::conv2d_channels_forward(grouped, x.data(), w.data(), nullptr, y.data()),
               galley::Error);
  EXPECT_THROW(cpu::conv2d_channels_weight_grad(grouped, x.data(), y.data(), w.data()),
               galley::Error);
  Conv2dGeometry dilated = geometry({2, 16, 12, 12, 32, 3, 3, 2, 2, 2});
  EXPECT_THROW(cpu::conv2d_channels_input_grad(dilated, w.data(), y.data(), x.data()),
               galley::Error);
  galley::set_num_threads(2);
  EXPECT_EQ(use({1, 32, 14, 14, 64, 3, 3, 1, 1, 2}), none) << "fewer images than threads";
  galley::set_num_threads(saved);
}

// The 16-bit activations: bfloat16 and float16 x and gy, read by the kernels directly, must give
// the bits of the float32 kernels on the widened values with each output rounded once: the
// direct path, the im2col path (strided, pointwise and grouped geometries too), forward and
// backward, and the bias gradient.
TEST(Conv16Bit, KernelsMatchTheFloat32KernelsOnWidenedInputsBitForBit) {
  namespace k = galley::kernels;
  namespace cpu = galley::kernels::cpu;
  std::vector<Conv2dGeometry> geoms;
  for (const Case& c : cases()) geoms.push_back(geometry(c));
  // im2col-only geometries: stride 2 (3x3 and 1x1), pointwise, grouped.
  for (auto [c, h, o, kk, stride, pad, groups] :
       std::vector<std::array<int64_t, 7>>{{8, 9, 16, 3, 2, 1, 1},
                                           {16, 8, 32, 1, 2, 0, 1},
                                           {12, 7, 20, 1, 1, 0, 1},
                                           {8, 6, 8, 3, 1, 1, 2}}) {
    Conv2dGeometry g{2, c, h, h, o, kk, kk, stride, pad, 1, groups, 0, 0};
    g.oh = (h + 2 * pad - kk) / stride + 1;
    g.ow = g.oh;
    geoms.push_back(g);
  }
  std::mt19937 rng(11);
  auto randoms = [&](size_t n) { return normal_values(rng, n); };
  for (galley::DType dt : {galley::DType::BFloat16, galley::DType::Float16}) {
    const size_t es = galley::dtype_size(dt);
    // float32 values -> 16-bit bits and back to float32 (the widened input).
    auto narrow = [&](const std::vector<float>& v) { return narrow_to(v, dt); };
    auto widen = [&](const std::vector<uint16_t>& bits) { return widen_from(bits, dt); };
    ASSERT_EQ(es, 2u);
    for (const Conv2dGeometry& g : geoms) {
      const std::string what = std::string(galley::dtype_name(dt)) + " n" + std::to_string(g.n) +
                               " c" + std::to_string(g.c) + " " + std::to_string(g.h) + "x" +
                               std::to_string(g.w) + " o" + std::to_string(g.o) + " k" +
                               std::to_string(g.kh) + " s" + std::to_string(g.stride) + " g" +
                               std::to_string(g.groups);
      const auto x16 = narrow(randoms(size_t(g.n * g.c * g.h * g.w)));
      const auto gy16 = narrow(randoms(size_t(g.n * g.o * g.oh * g.ow)));
      const auto xw = widen(x16), gyw = widen(gy16);
      // A bfloat16 convolution's weights are bfloat16 values (the op widens them).
      const auto w = widen(narrow(randoms(size_t(g.o * (g.c / g.groups) * g.kh * g.kw))));
      const auto b = randoms(size_t(g.o));
      const bool direct = g.stride == 1 && g.groups == 1;
      for (int path = 0; path < (direct ? 3 : 2); ++path) {
        // 0: the dispatcher, 1: im2col, 2: direct.
        std::vector<float> y_ref(gyw.size()), gx_ref(xw.size()), gw_ref(w.size()), gb_ref(g.o);
        std::vector<uint16_t> y(gyw.size()), gx(xw.size());
        std::vector<float> gw(w.size()), gb(g.o);
        if (path == 0) {
          cpu::conv2d_forward(g, xw.data(), w.data(), b.data(), y_ref.data());
          cpu::conv2d_forward(g, x16.data(), w.data(), b.data(), y.data(), dt);
          cpu::conv2d_backward(g, xw.data(), w.data(), gyw.data(), gx_ref.data(), gw_ref.data(),
                               gb_ref.data());
          cpu::conv2d_backward(g, x16.data(), w.data(), gy16.data(), gx.data(), gw.data(),
                               gb.data(), dt);
          EXPECT_EQ(gb, gb_ref) << what << ": bias gradient";
        } else if (path == 1) {
          cpu::conv2d_forward_im2col(g, xw.data(), w.data(), b.data(), y_ref.data());
          cpu::conv2d_forward_im2col(g, x16.data(), w.data(), b.data(), y.data(), dt);
          cpu::conv2d_backward_im2col(g, xw.data(), w.data(), gyw.data(), gx_ref.data(),
                                      gw_ref.data());
          cpu::conv2d_backward_im2col(g, x16.data(), w.data(), gy16.data(), gx.data(), gw.data(),
                                      dt);
        } else {
          cpu::conv2d_direct_forward(g, xw.data(), w.data(), b.data(), y_ref.data());
          cpu::conv2d_direct_forward(g, x16.data(), w.data(), b.data(), y.data(), dt);
          cpu::conv2d_direct_backward(g, xw.data(), w.data(), gyw.data(), gx_ref.data(),
                                      gw_ref.data());
          cpu::conv2d_direct_backward(g, x16.data(), w.data(), gy16.data(), gx.data(), gw.data(),
                                      dt);
        }
        const char* names[] = {"dispatcher", "im2col", "direct"};
        // bfloat16 on the tile or dot-product kernels (the direct path, and im2col on the
        // bfloat16 GEMM) sums in another order: within a float32 sum's error (relative to the sum
        // of magnitudes, at most K terms) and then one rounding.
        const bool reordered =
            dt == galley::DType::BFloat16 && cpu::bf16_kernels() != cpu::Bf16Kernels::Widened;
        if (!reordered) {
          EXPECT_EQ(y, narrow(y_ref)) << what << " " << names[path] << ": output";
          EXPECT_EQ(gx, narrow(gx_ref)) << what << " " << names[path] << ": input gradient";
          EXPECT_EQ(gw, gw_ref) << what << " " << names[path] << ": weight gradient";
        } else {
          auto near = [&](const std::vector<float>& got, const std::vector<float>& want, float rel,
                          const char* part) {
            for (size_t i = 0; i < want.size(); ++i)
              ASSERT_NEAR(got[i], want[i],
                          rel * std::abs(want[i]) + 2e-4f * (1.f + std::abs(want[i])))
                  << what << " " << names[path] << ": " << part << " [" << i << "]";
          };
          const float ulp = 1.f / 128;  // bfloat16's spacing relative to a value
          if (path == 0 && cpu::conv2d_winograd_applies(g, dt)) {
            // the products on bfloat16 pairs (the Winograd path's transforms rounded)
            const auto [ey, ry] = worst_and_rms(widen(y), y_ref);
            const auto [ex, rx] = worst_and_rms(widen(gx), gx_ref);
            EXPECT_LT(ey, kPairProductsError * ry) << what << ": output";
            EXPECT_LT(ex, kPairProductsError * rx) << what << ": input gradient";
          } else {
            near(widen(y), y_ref, ulp, "output");
            near(widen(gx), gx_ref, ulp, "input gradient");
          }
          if (path == 0 && cpu::conv2d_winograd_weight_grad_applies(g, dt)) {
            // the products on bfloat16 pairs of tiles
            const auto [ew, rw] = worst_and_rms(gw, gw_ref);
            EXPECT_LT(ew, kPairProductsError * rw) << what << ": weight gradient";
          } else {
            near(gw, gw_ref, 1e-5f, "weight gradient");
          }
        }
      }
    }
  }
}

// The bfloat16 kernels of the direct path (AMX tiles, vdpbf16ps, widening), each where this
// build and host have it, on the exact values: their float32 sums are then the im2col path's to
// the bit, and so are the rounded outputs. Every tail of their blocks (channels off 32, odd
// channel and flat-output counts, rows wider than a tile) is in cases().
TEST(ConvDirect, Bf16KernelsMatchIm2colBitForBitOnExactValues) {
  namespace cpu = galley::kernels::cpu;
  using cpu::Bf16Kernels;
  const galley::DType bf = galley::DType::BFloat16;
  auto narrow = [&](const std::vector<float>& v) { return narrow_to(v, bf); };
  int ran = 0;
  for (Bf16Kernels kernels : {Bf16Kernels::Tiles, Bf16Kernels::DotProducts, Bf16Kernels::Widened}) {
    const char* kname = kernels == Bf16Kernels::Tiles         ? "tiles"
                        : kernels == Bf16Kernels::DotProducts ? "dot products"
                                                              : "widened";
    if (!cpu::bf16_kernels_available(kernels)) {
      EXPECT_THROW(cpu::conv2d_direct_forward(geometry(cases()[0]), nullptr, nullptr, nullptr,
                                              nullptr, bf, kernels),
                   galley::Error)
          << kname;
      continue;
    }
    ++ran;
    for (const Case& k : cases()) {
      const Conv2dGeometry g = geometry(k);
      const auto [x, w, b, gy] = exact_operands(g, 21);
      std::vector<float> y_ref(gy.size()), gx_ref(x.size()), gw_ref(w.size());
      cpu::conv2d_forward_im2col(g, x.data(), w.data(), b.data(), y_ref.data());
      cpu::conv2d_backward_im2col(g, x.data(), w.data(), gy.data(), gx_ref.data(), gw_ref.data());
      const auto x16 = narrow(x), gy16 = narrow(gy);
      std::vector<uint16_t> y(gy.size()), gx(x.size());
      std::vector<float> gw(w.size());
      cpu::conv2d_direct_forward(g, x16.data(), w.data(), b.data(), y.data(), bf, kernels);
      EXPECT_EQ(y, narrow(y_ref)) << kname << " " << name(k) << ": output";
      // Both gradients, then each alone.
      for (int which = 0; which < 3; ++which) {
        std::fill(gx.begin(), gx.end(), uint16_t(1));
        std::fill(gw.begin(), gw.end(), -2.f);
        uint16_t* pgx = which != 2 ? gx.data() : nullptr;
        float* pgw = which != 1 ? gw.data() : nullptr;
        cpu::conv2d_direct_backward(g, x16.data(), w.data(), gy16.data(), pgx, pgw, bf, kernels);
        if (pgx) EXPECT_EQ(gx, narrow(gx_ref)) << kname << " " << name(k) << ": input gradient";
        if (pgw) EXPECT_EQ(gw, gw_ref) << kname << " " << name(k) << ": weight gradient";
        if (!pgx)
          EXPECT_EQ(gx, std::vector<uint16_t>(gx.size(), 1))
              << kname << " " << name(k) << " wrote gx";
        if (!pgw) EXPECT_EQ(gw, std::vector<float>(gw.size(), -2.f)) << kname << " wrote gw";
      }
    }
  }
  EXPECT_GE(ran, 1);
  EXPECT_TRUE(cpu::bf16_kernels_available(cpu::bf16_kernels()));
}

// The kernels' scratch buffers and packed weights begin on a cache line, whatever their size
// (the allocator's large blocks begin 16 bytes past a page), so that whole vectors at whole-vector
// offsets into them never straddle two lines.
TEST(Scratch, BuffersBeginOnACacheLine) {
  namespace cpu = galley::kernels::cpu;
  // (from 2^16 floats, 256 KiB, the allocator maps blocks of their own, 16 bytes past a page)
  for (size_t floats : {size_t(1), size_t(17), size_t(4096), size_t(1) << 16, size_t(3) << 16}) {
    for (int slot = 0; slot < 6; ++slot)
      EXPECT_EQ(reinterpret_cast<uintptr_t>(cpu::thread_scratch(slot, floats)) % 64, 0u)
          << floats << " floats, slot " << slot;
    cpu::aligned_vector<float> v(floats);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(v.data()) % 64, 0u) << floats << " floats";
    v.resize(2 * floats + 3);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(v.data()) % 64, 0u) << "grown from " << floats;
  }
}

// The bfloat16 kernels the library takes by default: the tiles where granted; vdpbf16ps only on
// AMD's cores, which issue it at their float32 FMA rate (Intel's issue it at half that, so a Xeon
// whose tiles are hidden widens); else widened.
galley::kernels::cpu::Bf16Kernels expected_default_bf16_kernels() {
  namespace cpu = galley::kernels::cpu;
  if (cpu::bf16_kernels_available(cpu::Bf16Kernels::Tiles)) return cpu::Bf16Kernels::Tiles;
#if defined(__x86_64__) || defined(__i386__)
  if (cpu::bf16_kernels_available(cpu::Bf16Kernels::DotProducts) && __builtin_cpu_is("amd"))
    return cpu::Bf16Kernels::DotProducts;
#endif
  return cpu::Bf16Kernels::Widened;
}

TEST(Bf16Kernels, TheDefaultFollowsTheHost) {
  if (std::getenv("GALLEY_BF16_KERNELS"))
    GTEST_SKIP() << "GALLEY_BF16_KERNELS chooses in this process";
  EXPECT_EQ(galley::kernels::cpu::bf16_kernels(), expected_default_bf16_kernels());
}

// GALLEY_BF16_KERNELS=tiles|dot|widened chooses where the host and build have those kernels;
// anything else leaves the default and says so on stderr (the bf16_kernels_env_* ctests run this
// with the variable set).
TEST(Bf16Kernels, TheEnvironmentChooses) {
  namespace cpu = galley::kernels::cpu;
  const char* env = std::getenv("GALLEY_BF16_KERNELS");
  if (!env)
    GTEST_SKIP() << "GALLEY_BF16_KERNELS is not set here (the bf16_kernels_env_* ctests set it)";
  const std::string v = env;
  const bool named = v == "tiles" || v == "dot" || v == "widened";
  const cpu::Bf16Kernels asked = v == "tiles" ? cpu::Bf16Kernels::Tiles
                                 : v == "dot" ? cpu::Bf16Kernels::DotProducts
                                              : cpu::Bf16Kernels::Widened;
  // (the first call in this process reads the variable and says on stderr what it refuses: the
  // ctests run this test alone in its process)
  testing::internal::CaptureStderr();
  const cpu::Bf16Kernels got = cpu::bf16_kernels();
  const std::string said = testing::internal::GetCapturedStderr();
  if (named && cpu::bf16_kernels_available(asked)) {
    EXPECT_EQ(got, asked) << v;
    EXPECT_EQ(said, "") << v;
  } else {
    EXPECT_EQ(got, expected_default_bf16_kernels()) << v;
    EXPECT_NE(said.find("GALLEY_BF16_KERNELS='" + v + "' is not one of"), std::string::npos)
        << said;
  }
}

// Strided bfloat16 convolutions, which on the tiles run as stride-1 ones over their phases, and on
// the dot products take the channels path with the direct path's weight gradient on pairs over the
// phases (from 16 input channels), on the exact values: the im2col path's float32 result to the
// bit. Strides 2 to 4, kernels 1, 2, 3 and 5, paddings up to 2, odd sizes and channel counts,
// phases the kernel leaves unread (a 1x1 kernel reads one phase of four).
TEST(ConvStrided, Bf16MatchesIm2colBitForBitOnExactValues) {
  namespace cpu = galley::kernels::cpu;
  const galley::DType bf = galley::DType::BFloat16;
  auto narrow = [&](const std::vector<float>& v) { return narrow_to(v, bf); };
  for (auto [n, c, h, w, o, k, stride, pad] : std::vector<std::array<int64_t, 8>>{
           {2, 16, 28, 28, 32, 3, 2, 1},
           {2, 16, 28, 28, 32, 1, 2, 0},
           {3, 8, 9, 11, 20, 3, 2, 1},
           {2, 5, 13, 10, 17, 5, 3, 2},
           {2, 9, 8, 8, 16, 2, 2, 0},
           {2, 7, 7, 9, 33, 3, 3, 0},
           {2, 17, 11, 13, 20, 3, 2, 1},
           {3, 16, 13, 10, 17, 5, 3, 2},
           {2, 18, 12, 15, 16, 2, 4, 0},
           {2, 32, 14, 14, 64, 3, 2, 1},
           {2, 3, 15, 17, 16, 3, 2, 1},  // a stem: the weight gradient on pairs of outputs
       }) {
    Conv2dGeometry g{n, c, h, w, o, k, k, stride, pad, 1, 1, 0, 0};
    g.oh = (h + 2 * pad - k) / stride + 1;
    g.ow = (w + 2 * pad - k) / stride + 1;
    const std::string what = "c" + std::to_string(c) + " " + std::to_string(h) + "x" +
                             std::to_string(w) + " o" + std::to_string(o) + " k" +
                             std::to_string(k) + " s" + std::to_string(stride) + " pad" +
                             std::to_string(pad);
    const auto [x, wt, b, gy] = exact_operands(g, 31);
    std::vector<float> y_ref(gy.size()), gx_ref(x.size()), gw_ref(wt.size()), gb_ref(g.o);
    cpu::conv2d_forward_im2col(g, x.data(), wt.data(), b.data(), y_ref.data());
    cpu::conv2d_backward_im2col(g, x.data(), wt.data(), gy.data(), gx_ref.data(), gw_ref.data());
    const auto x16 = narrow(x), gy16 = narrow(gy);
    std::vector<uint16_t> y(gy.size()), gx(x.size(), 1);
    std::vector<float> gw(wt.size(), -2.f), gb(g.o);
    cpu::conv2d_forward(g, x16.data(), wt.data(), b.data(), y.data(), bf);
    cpu::conv2d_backward(g, x16.data(), wt.data(), gy16.data(), gx.data(), gw.data(), gb.data(),
                         bf);
    EXPECT_EQ(y, narrow(y_ref)) << what << ": output";
    EXPECT_EQ(gx, narrow(gx_ref)) << what << ": input gradient";
    EXPECT_EQ(gw, gw_ref) << what << ": weight gradient";
    // Each gradient alone.
    std::vector<uint16_t> gx_only(x.size(), 1);
    cpu::conv2d_backward(g, x16.data(), wt.data(), gy16.data(), gx_only.data(), nullptr, nullptr,
                         bf);
    EXPECT_EQ(gx_only, gx) << what << ": input gradient alone";
    std::vector<float> gw_only(wt.size(), -2.f);
    cpu::conv2d_backward(g, x16.data(), wt.data(), gy16.data(), nullptr, gw_only.data(), nullptr,
                         bf);
    EXPECT_EQ(gw_only, gw) << what << ": weight gradient alone";
  }
}

TEST(ConvDirect, SameResultOnOneAndTwoThreads) {
  const int saved = galley::num_threads();
  const Case k{5, 7, 10, 12, 20, 3, 3, 1, 1};
  const Conv2dGeometry g = geometry(k);
  const auto x = exact_values(size_t(g.n * g.c * g.h * g.w), 7, 1.f);
  const auto w = exact_values(size_t(g.o * g.c * g.kh * g.kw), 8, 0.25f);
  const auto gy = exact_values(size_t(g.n * g.o * g.oh * g.ow), 9, 0.5f);
  std::vector<std::vector<float>> results;
  for (int threads : {1, 2}) {
    galley::set_num_threads(threads);
    std::vector<float> y(gy.size()), gx(x.size()), gw(w.size());
    galley::kernels::cpu::conv2d_direct_forward(g, x.data(), w.data(), nullptr, y.data());
    galley::kernels::cpu::conv2d_direct_backward(g, x.data(), w.data(), gy.data(), gx.data(),
                                                 gw.data());
    y.insert(y.end(), gx.begin(), gx.end());
    y.insert(y.end(), gw.begin(), gw.end());
    results.push_back(y);
  }
  galley::set_num_threads(saved);
  EXPECT_EQ(results[0], results[1]);
}

// The threads take the images in chunks as each comes free, so which thread sums which images
// changes from run to run; the weight gradient (summed per chunk, chunks added in order) must
// not. Values whose sums round, and a thread competing for the cores on some runs, on the paths
// the build takes: a 3x3 "same" convolution, a 3x3/2 one of 16 input channels (on AVX2 hosts the
// channels-across-lanes path) and one of 4 (the direct path's phases).
TEST(ConvBackward, RepeatsItsBitsWhicheverThreadTakesWhichImages) {
  const int saved = galley::num_threads();
  galley::set_num_threads(2);
  const Conv2dGeometry strided{16, 16, 12, 12, 16, 3, 3, 2, 1, 1, 1, 6, 6};
  const Conv2dGeometry narrow{16, 4, 12, 12, 16, 3, 3, 2, 1, 1, 1, 6, 6};
  for (const Conv2dGeometry& g :
       {geometry(Case{16, 16, 12, 12, 16, 3, 3, 1, 1}), strided, narrow}) {
    auto values = [](size_t n, float shift) {
      std::vector<float> v(n);
      for (size_t i = 0; i < n; ++i) v[i] = 1.f / float(3 + (i * 7919) % 101) - shift;
      return v;
    };
    const auto x = values(size_t(g.n * g.c * g.h * g.w), 0.1f);
    const auto w = values(size_t(g.o * g.c * g.kh * g.kw), 0.2f);
    const auto gy = values(size_t(g.n * g.o * g.oh * g.ow), 0.15f);
    std::vector<float> first;
    for (int run = 0; run < 6; ++run) {
      std::atomic<bool> stop{false};
      std::thread rival;
      if (run % 2 == 1)
        rival = std::thread([&] {
          while (!stop.load()) {
          }
        });
      std::vector<float> gx(x.size()), gw(w.size());
      galley::kernels::cpu::conv2d_backward(g, x.data(), w.data(), gy.data(), gx.data(), gw.data(),
                                            nullptr);
      stop = true;
      if (rival.joinable()) rival.join();
      gw.insert(gw.end(), gx.begin(), gx.end());
      if (run == 0)
        first = gw;
      else
        ASSERT_EQ(gw, first) << "stride " << g.stride << " run " << run;
    }
  }
  galley::set_num_threads(saved);
}

// The Winograd path on the exact values: the transforms' coefficients are 0, +-1 and +-1/2, so
// its sums are exact too and match im2col's to the bit. Wide planes (tiles across the lanes) and
// narrow ones (channels across the lanes); odd and even sizes (tiles that hang over the edge), a
// single pixel, rows wider than a vector of tiles, chunks of images that do not divide the
// batch, channel counts off the register blocks and the vectors.
const std::vector<Case>& winograd_cases() {
  static const std::vector<Case> all = {
      {3, 16, 28, 28, 16, 3, 3, 1, 1},  // resnet's first stage
      {7, 32, 7, 7, 64, 3, 3, 1, 1},    // narrow: 16 tiles an image, three images a chunk
      {5, 17, 9, 13, 19, 3, 3, 1, 1},   // odd everything
      {2, 16, 1, 1, 16, 3, 3, 1, 1},    // a single pixel
      {3, 20, 2, 67, 24, 3, 3, 1, 1},   // 34 tiles a row: three vectors, the last of two
      {2, 16, 5, 58, 17, 3, 3, 1, 1},   // 29 tiles a row: two whole vectors where laid out so
      {4, 64, 14, 14, 32, 3, 3, 1, 1},  // resnet's second stage, fewer outputs than inputs
      {2, 3, 5, 6, 2, 3, 3, 1, 1},      // fewer channels than the path is taken for
      {2, 16, 0, 14, 16, 3, 3, 1, 1},   // empty planes
      {2, 16, 0, 7, 16, 3, 3, 1, 1},    // ... narrow ones
      {3, 17, 9, 11, 33, 3, 3, 1, 1},   // narrow, odd, channels off the vectors
      {2, 64, 8, 8, 128, 3, 3, 1, 1},   // vgg's narrow layer: two blocks of four output vectors
      {3, 40, 12, 12, 70, 3, 3, 1, 1},  // the widest narrow plane; 4 + 1 output vectors
      {3, 16, 16, 16, 24, 3, 3, 1, 1},  // 8 tiles a row (vgg's 16x16): two tile rows a vector
      {2, 17, 11, 15, 18, 3, 3, 1, 1},  // ... 15 wide, an odd tile row left alone at the bottom
  };
  return all;
}

TEST(ConvWinograd, MatchesIm2colBitForBitOnExactValues) {
  namespace cpu = galley::kernels::cpu;
  if (!cpu::conv2d_winograd_applies(geometry(winograd_cases()[0])))
    GTEST_SKIP() << "this build has no Winograd path (it needs AVX-512, or AVX2 with FMA, at "
                    "compile time)";
  // The tiled form's tile rows dense and, on AVX-512 hosts, in whole vectors (Intel's layout),
  // whichever this host takes.
  struct Restore {
    ~Restore() { galley::kernels::cpu::conv2d_winograd_whole_vector_rows_for_tests(-1); }
  } restore;
  for (int whole_rows : {0, 1})
    for (const Case& k : winograd_cases()) {
      cpu::conv2d_winograd_whole_vector_rows_for_tests(whole_rows);
      const std::string layout = whole_rows ? " (whole-vector rows)" : " (dense rows)";
      const Conv2dGeometry g = geometry(k);
      const auto [x, w, b, gy] = exact_operands(g, 51);
      const size_t ny = gy.size(), nx = x.size();
      for (const float* bias : {b.data(), static_cast<const float*>(nullptr)}) {
        std::vector<float> want(ny, -1.f), got(ny, -2.f);
        cpu::conv2d_forward_im2col(g, x.data(), w.data(), bias, want.data());
        cpu::conv2d_winograd_forward(g, x.data(), w.data(), bias, got.data());
        ASSERT_EQ(got, want) << name(k) << layout << (bias ? " with bias" : " without bias");
      }
      std::vector<float> gx_want(nx, -1.f), gx(nx, -2.f), gw_want(w.size(), -1.f),
          gw(w.size(), -2.f);
      cpu::conv2d_backward_im2col(g, x.data(), w.data(), gy.data(), gx_want.data(), gw_want.data());
      cpu::conv2d_winograd_input_grad(g, w.data(), gy.data(), gx.data());
      ASSERT_EQ(gx, gx_want) << name(k) << layout << " input gradient";
      cpu::conv2d_winograd_weight_grad(g, x.data(), gy.data(), gw.data());
      ASSERT_EQ(gw, gw_want) << name(k) << layout << " weight gradient";
      {
        // float16 data (exact here): the forward pass and the input gradient read and write it,
        // rounding the float32 results once.
        const galley::DType h = galley::DType::Float16;
        std::vector<uint16_t> x16(nx), gy16(ny), y16(ny, 1), gx16(nx, 1), y_want(ny), gx_want16(nx);
        cpu::convert(x.data(), galley::DType::Float32, x16.data(), h, int64_t(nx));
        cpu::convert(gy.data(), galley::DType::Float32, gy16.data(), h, int64_t(ny));
        std::vector<float> want(ny);
        cpu::conv2d_forward_im2col(g, x.data(), w.data(), b.data(), want.data());
        cpu::convert(want.data(), galley::DType::Float32, y_want.data(), h, int64_t(ny));
        cpu::convert(gx_want.data(), galley::DType::Float32, gx_want16.data(), h, int64_t(nx));
        cpu::conv2d_winograd_forward(g, x16.data(), w.data(), b.data(), y16.data(), h);
        ASSERT_EQ(y16, y_want) << name(k) << layout << " float16 forward";
        cpu::conv2d_winograd_input_grad(g, w.data(), gy16.data(), gx16.data(), h);
        ASSERT_EQ(gx16, gx_want16) << name(k) << layout << " float16 input gradient";
      }
      // 16-bit data (exact here) widened as it is read: the same weight gradient.
      for (galley::DType dt : {galley::DType::Float16, galley::DType::BFloat16}) {
        std::vector<uint16_t> x16(nx), gy16(ny);
        cpu::convert(x.data(), galley::DType::Float32, x16.data(), dt, int64_t(nx));
        cpu::convert(gy.data(), galley::DType::Float32, gy16.data(), dt, int64_t(ny));
        std::vector<float> gw16(w.size(), -2.f);
        cpu::conv2d_winograd_weight_grad(g, x16.data(), gy16.data(), gw16.data(), dt);
        ASSERT_EQ(gw16, gw_want) << name(k) << " " << galley::dtype_name(dt) << " weight gradient";
      }
    }
}

// On values whose sums round, the transforms add rounding of their own: within a few units in
// the last place of the largest terms of the im2col path's sums.
TEST(ConvWinograd, CloseToIm2colOnRandomValues) {
  namespace cpu = galley::kernels::cpu;
  if (!cpu::conv2d_winograd_applies(geometry(winograd_cases()[0])))
    GTEST_SKIP() << "this build has no Winograd path (it needs AVX-512, or AVX2 with FMA, at "
                    "compile time)";
  std::mt19937 rng(55);
  std::normal_distribution<float> normal(0.f, 1.f);
  for (const Case& k : winograd_cases()) {
    const Conv2dGeometry g = geometry(k);
    std::vector<float> x(size_t(g.n * g.c * g.h * g.w)), w(size_t(g.o * g.c * 9)),
        gy(size_t(g.n * g.o * g.oh * g.ow));
    for (auto* v : {&x, &w, &gy})
      for (float& e : *v) e = normal(rng);
    std::vector<float> want(gy.size()), got(gy.size()), gx_want(x.size()), gx(x.size()),
        gw_want(w.size()), gw(w.size());
    cpu::conv2d_forward_im2col(g, x.data(), w.data(), nullptr, want.data());
    cpu::conv2d_winograd_forward(g, x.data(), w.data(), nullptr, got.data());
    cpu::conv2d_backward_im2col(g, x.data(), w.data(), gy.data(), gx_want.data(), gw_want.data());
    cpu::conv2d_winograd_input_grad(g, w.data(), gy.data(), gx.data());
    cpu::conv2d_winograd_weight_grad(g, x.data(), gy.data(), gw.data());
    // The sums run over 9 * channels terms of unit variance: their largest terms are about 3.
    const float tol_y = 3.f * 9 * float(g.c) * 1e-6f, tol_x = 3.f * 9 * float(g.o) * 1e-6f;
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_NEAR(got[i], want[i], tol_y) << name(k) << " output " << i;
    for (size_t i = 0; i < gx.size(); ++i)
      ASSERT_NEAR(gx[i], gx_want[i], tol_x) << name(k) << " input gradient " << i;
    // The weight gradient's sums run over every output of the batch.
    const float tol_w = 3.f * float(g.n * g.h * g.w) * 1e-6f;
    for (size_t i = 0; i < gw.size(); ++i)
      ASSERT_NEAR(gw[i], gw_want[i], tol_w) << name(k) << " weight gradient " << i;
  }
}

// float32 to bfloat16 (vcvtneps2bf16 where the build has AVX512-BF16, a vector of 16 at a time):
// the scalar conversion's bits for every class of value. Vectors of normal values, of one
// subnormal among them (the instruction reads subnormals as zero: such vectors must take the
// integer rounding), ties to even, overflow to infinity, NaNs (quieted, sign and payload's top
// kept), and random bit patterns; a tail that is not a whole vector.
TEST(Convert, Float32ToBFloat16RoundsAsTheScalarConversionOnEveryClassOfValue) {
  std::vector<uint32_t> bits = {0x00000000u, 0x80000000u, 0x3f808000u, 0x3f818000u,
                                0x3f808001u, 0xbf818000u, 0x7f7fffffu, 0xff7fffffu,
                                0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7f800001u,
                                0xffa12345u, 0x7fffffffu, 0x00800000u, 0x80800000u};
  for (uint32_t sub : {0x00000001u, 0x807fffffu, 0x00400000u, 0x8000ffffu, 0x007f8000u}) {
    std::vector<uint32_t> v(16, 0x3f800000u);  // ones around one subnormal
    v[sub % 16] = sub;
    bits.insert(bits.end(), v.begin(), v.end());
  }
  std::mt19937 rng(71);
  for (int i = 0; i < 4096 + 7; ++i) bits.push_back(uint32_t(rng()));
  std::vector<float> x(bits.size());
  std::memcpy(x.data(), bits.data(), bits.size() * sizeof(float));
  const std::vector<uint16_t> got = narrow_to(x, galley::DType::BFloat16);
  for (size_t i = 0; i < x.size(); ++i)
    ASSERT_EQ(got[i], galley::detail::float_to_bf16_bits(x[i]))
        << "float32 bits 0x" << std::hex << bits[i] << " at " << std::dec << i;
}

// bfloat16 add, sub, mul and div (16 lanes in registers where the build has AVX-512) give the
// bits of the float32 operation on the widened values rounded by the scalar conversion, on every
// class of value (subnormal results, infinities, NaNs), on runs that end mid-vector, and with
// either side a single element broadcast.
TEST(Binary, BFloat16OpsRoundTheFloat32OperationOnEveryClassOfValue) {
  namespace cpu = galley::kernels::cpu;
  using galley::kernels::BinaryOp;
  std::mt19937 rng(73);
  const int64_t n = 16 * 40 + 7;
  std::vector<uint16_t> a(n), b(n);
  const uint16_t special[] = {0x0000, 0x8000, 0x0001, 0x807f, 0x0080, 0x7f80, 0xff80,
                              0x7fc0, 0x7f7f, 0xff7f, 0x3f80, 0x00ff, 0x0100, 0xffc1};
  for (int64_t i = 0; i < n; ++i) {
    a[size_t(i)] = i < 196 ? special[i % 14] : uint16_t(rng());
    b[size_t(i)] = i < 196 ? special[(i / 14) % 14] : uint16_t(rng());
  }
  auto widen = [](uint16_t h) { return galley::detail::bf16_bits_to_float(h); };
  for (const BinaryOp op : {BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div})
    for (int form = 0; form < 3; ++form) {  // both runs, b broadcast, a broadcast
      const int64_t full[] = {n}, one[] = {1};
      const int64_t* as = form == 2 ? one : full;
      const int64_t* bs = form == 1 ? one : full;
      std::vector<uint16_t> got(n);
      cpu::binary(op, galley::DType::BFloat16, a.data(), as, b.data(), bs, got.data(), full, 1);
      for (int64_t i = 0; i < n; ++i) {
        const float x = widen(a[size_t(form == 2 ? 0 : i)]),
                    y = widen(b[size_t(form == 1 ? 0 : i)]);
        const float r = op == BinaryOp::Add   ? x + y
                        : op == BinaryOp::Sub ? x - y
                        : op == BinaryOp::Mul ? x * y
                                              : x / y;
        const uint16_t want = galley::detail::float_to_bf16_bits(r);
        const bool both_nan = std::isnan(r) && std::isnan(widen(got[size_t(i)]));
        ASSERT_TRUE(got[size_t(i)] == want || both_nan)
            << "op " << int(op) << " form " << form << " at " << i << ": " << x << ", " << y
            << " gave 0x" << std::hex << got[size_t(i)] << " not 0x" << want;
      }
    }
}

// The bias gradient of a bfloat16 convolution (its planes read straight into the float32 partial
// sums where the build has AVX-512) has the float32 one's bits on the widened values, on values
// of every magnitude from 2^-20 to 2^20 (whose sums round, so that the order shows) and planes of
// every length up to past three blocks of partial sums.
TEST(ConvBiasGrad, BFloat16HasTheFloat32BitsOnValuesWhoseSumsRound) {
  namespace cpu = galley::kernels::cpu;
  std::mt19937 rng(83);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::uniform_int_distribution<int> scale(-20, 20);
  for (int64_t side = 1; side <= 11; ++side) {
    const Conv2dGeometry g = geometry({3, 2, side, side, 5, 1, 1, 0, 1, 1});
    std::vector<float> gy(size_t(g.n * g.o * g.oh * g.ow));
    for (float& v : gy) v = std::ldexp(normal(rng), scale(rng));
    const std::vector<uint16_t> gy16 = narrow_to(gy, galley::DType::BFloat16);
    gy = widen_from(gy16, galley::DType::BFloat16);
    std::vector<float> x(size_t(g.n * g.c * g.h * g.w)), w(size_t(g.o * g.c)), want(g.o), got(g.o);
    std::vector<uint16_t> x16(x.size());
    cpu::conv2d_backward(g, x.data(), w.data(), gy.data(), nullptr, nullptr, want.data());
    cpu::conv2d_backward(g, x16.data(), w.data(), gy16.data(), nullptr, nullptr, got.data(),
                         galley::DType::BFloat16);
    ASSERT_EQ(got, want) << side << "x" << side << " planes";
  }
}

// bfloat16 relu and its backward (16 lanes in registers where the build has AVX-512) give the
// scalar forms' bits on every value: a NaN stays NaN (made quiet, signalling ones too), -0 becomes
// 0, the gradient passes where y > 0 only (not at -0, NaN or a negative subnormal), quieted as the
// rounding quiets it. Every one of the 65,536 bit patterns as x, against special and random
// gradients, then a run that ends mid-vector.
TEST(Unary, BFloat16ReluAndItsBackwardHaveTheScalarBits) {
  namespace cpu = galley::kernels::cpu;
  namespace um = galley::kernels::unary_math;
  std::mt19937 rng(79);
  const int64_t n = 65536 + 32 * 3 + 9;
  std::vector<uint16_t> x(n), g(n);
  const uint16_t special[] = {0x0000, 0x8000, 0x0001, 0x8001, 0x0080, 0x7f80, 0xff80,
                              0x7fc0, 0xffc0, 0x7f81, 0xff81, 0x3f80, 0xbf80};
  for (int64_t i = 0; i < n; ++i) {
    x[size_t(i)] = i < 65536 ? uint16_t(i) : uint16_t(rng());
    g[size_t(i)] = i % 3 ? special[i % 13] : uint16_t(rng());
  }
  auto widen = [](uint16_t h) { return galley::detail::bf16_bits_to_float(h); };
  const galley::DType bf = galley::DType::BFloat16;
  std::vector<uint16_t> y(n), gx(n);
  cpu::unary(galley::kernels::UnaryOp::Relu, bf, x.data(), y.data(), n, 0.f, 0.f);
  cpu::relu_backward(bf, g.data(), x.data(), gx.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    const size_t k = size_t(i);
    const uint16_t want_y = galley::detail::float_to_bf16_bits(um::relu(widen(x[k])));
    const uint16_t want_g =
        galley::detail::float_to_bf16_bits(um::relu_backward(widen(g[k]), widen(x[k])));
    ASSERT_EQ(y[k], want_y) << "relu of 0x" << std::hex << x[k];
    ASSERT_EQ(gx[k], want_g) << "relu_backward of 0x" << std::hex << g[k] << " at y 0x" << x[k];
  }
}

// bfloat16 on the dot products (AVX512-BF16 without AMX): the products on pairs (input channels
// in the tiled and narrow forms, tiles in the weight gradient), the transformed values rounded to
// bfloat16. Against the float32 path on the same (bfloat16) values: within a few units of
// bfloat16's precision of the sums' terms, all three ways, odd channel counts (a zero partner),
// tiles past a vector and odd tile counts included; and on values that stay exact through the
// rounding (small integers, weights of +-1), im2col's bits.
TEST(ConvWinograd, Bf16PairProductsStayWithinBf16PrecisionOfFloat32) {
  namespace cpu = galley::kernels::cpu;
  const galley::DType bf = galley::DType::BFloat16;
  if (!cpu::conv2d_winograd_applies(geometry({2, 64, 16, 16, 64, 3, 3, 1, 1}), bf))
    GTEST_SKIP() << "the bfloat16 convolutions do not take the pair products here (they need "
                    "AVX512-BF16 at compile time, no AMX tiles, and an AMD core or "
                    "GALLEY_BF16_KERNELS=dot)";
  std::mt19937 rng(57);
  std::normal_distribution<float> normal(0.f, 1.f);
  for (const Case& k : std::vector<Case>{{2, 64, 16, 16, 64, 3, 3, 1, 1},
                                         {3, 65, 13, 15, 67, 3, 3, 1, 1},
                                         {2, 64, 32, 32, 72, 3, 3, 1, 1},
                                         {2, 32, 32, 33, 32, 3, 3, 1, 1},
                                         {2, 16, 28, 28, 16, 3, 3, 1, 1},
                                         {3, 17, 13, 14, 16, 3, 3, 1, 1},
                                         {2, 64, 8, 8, 128, 3, 3, 1, 1},
                                         {3, 33, 7, 7, 64, 3, 3, 1, 1},
                                         {2, 16, 5, 6, 20, 3, 3, 1, 1}}) {
    const Conv2dGeometry g = geometry(k);
    std::vector<float> x(size_t(g.n * g.c * g.h * g.w)), w(size_t(g.o * g.c * 9)),
        gy(size_t(g.n * g.o * g.h * g.w)), b(size_t(g.o));
    for (auto* v : {&x, &w, &gy, &b})
      for (float& e : *v) e = normal(rng);
    // the float32 reference on the bfloat16 values
    const std::vector<uint16_t> x16 = narrow_to(x, bf), gy16 = narrow_to(gy, bf);
    x = widen_from(x16, bf), gy = widen_from(gy16, bf), w = widen_from(narrow_to(w, bf), bf);
    std::vector<float> want(gy.size()), gx_want(x.size()), gw(w.size());
    cpu::conv2d_forward_im2col(g, x.data(), w.data(), b.data(), want.data());
    cpu::conv2d_backward_im2col(g, x.data(), w.data(), gy.data(), gx_want.data(), gw.data());
    std::vector<uint16_t> y16(gy.size()), gx16(x.size());
    cpu::conv2d_winograd_forward(g, x16.data(), w.data(), b.data(), y16.data(), bf);
    cpu::conv2d_winograd_input_grad(g, w.data(), gy16.data(), gx16.data(), bf);
    std::vector<float> gw_pairs(w.size());
    cpu::conv2d_winograd_weight_grad(g, x16.data(), gy16.data(), gw_pairs.data(), bf);
    const std::vector<float> y = widen_from(y16, bf), gx = widen_from(gx16, bf);
    const auto [ey, ry] = worst_and_rms(y, want);
    const auto [ex, rx] = worst_and_rms(gx, gx_want);
    const auto [ew, rw] = worst_and_rms(gw_pairs, gw);
    EXPECT_LT(ey, kPairProductsError * ry) << name(k) << " forward";
    EXPECT_LT(ex, kPairProductsError * rx) << name(k) << " input gradient";
    EXPECT_LT(ew, kPairProductsError * rw) << name(k) << " weight gradient";
    // Small integers and weights of -3..3: the transformed values (|V| <= 12, U in quarters up
    // to 27/4) are exact in bfloat16 and every sum exact in float32, so the output is im2col's,
    // rounded once.
    auto [xe, we, be, gye] = exact_operands(g, 59);
    we = exact_values(we.size(), 60, 1.f);
    const std::vector<uint16_t> xe16 = narrow_to(xe, bf), gye16 = narrow_to(gye, bf);
    cpu::conv2d_forward_im2col(g, xe.data(), we.data(), be.data(), want.data());
    cpu::conv2d_backward_im2col(g, xe.data(), we.data(), gye.data(), gx_want.data(), nullptr);
    cpu::conv2d_winograd_forward(g, xe16.data(), we.data(), be.data(), y16.data(), bf);
    cpu::conv2d_winograd_input_grad(g, we.data(), gye16.data(), gx16.data(), bf);
    EXPECT_EQ(y16, narrow_to(want, bf)) << name(k) << " forward, exact values";
    EXPECT_EQ(gx16, narrow_to(gx_want, bf)) << name(k) << " input gradient, exact values";
    // the weight gradient's sums of small integers, exact in any order
    cpu::conv2d_backward_im2col(g, xe.data(), we.data(), gye.data(), nullptr, gw.data());
    cpu::conv2d_winograd_weight_grad(g, xe16.data(), gye16.data(), gw_pairs.data(), bf);
    EXPECT_EQ(gw_pairs, gw) << name(k) << " weight gradient, exact values";
  }
}

TEST(ConvWinograd, TakenForFloat32SameConvolutionsOfSixteenChannels) {
  namespace cpu = galley::kernels::cpu;
  const Conv2dGeometry g = geometry({8, 16, 28, 28, 16, 3, 3, 1, 1});
  if (!cpu::conv2d_winograd_applies(g))
    GTEST_SKIP() << "this build has no Winograd path (it needs AVX-512, or AVX2 with FMA, at "
                    "compile time)";
  Conv2dGeometry strided = g;
  strided.stride = 2;
  Conv2dGeometry grouped = g;
  grouped.groups = 2;
  for (const Conv2dGeometry& other :
       {strided, grouped, geometry({8, 16, 28, 28, 16, 3, 3, 0, 1}),
        geometry({8, 16, 28, 28, 16, 3, 3, 2, 2}), geometry({8, 16, 28, 28, 16, 5, 5, 2, 1}),
        geometry({8, 15, 28, 28, 16, 3, 3, 1, 1}), geometry({8, 16, 28, 28, 15, 3, 3, 1, 1}),
        geometry({8, 15, 7, 7, 64, 3, 3, 1, 1})})
    EXPECT_FALSE(cpu::conv2d_winograd_applies(other));
  // 16-bit data computes in float32 here, as float32 does; bfloat16 on the host's bfloat16
  // kernels keeps to the direct path on AMX tiles, and takes the products on pairs on the dot
  // products. Narrow planes too (channels across the lanes there): vgg's 64->128 on 8x8,
  // resnet's 64->64 on 7x7.
  EXPECT_TRUE(cpu::conv2d_winograd_applies(geometry({8, 64, 8, 8, 128, 3, 3, 1, 1})));
  EXPECT_TRUE(cpu::conv2d_winograd_applies(geometry({8, 64, 7, 7, 64, 3, 3, 1, 1})));
  EXPECT_TRUE(cpu::conv2d_winograd_applies(g, galley::DType::Float16));
  EXPECT_EQ(cpu::conv2d_winograd_applies(g, galley::DType::BFloat16),
            cpu::bf16_kernels() != cpu::Bf16Kernels::Tiles);
  // bfloat16 on the dot products: the forward (and input gradient) on pairs, tiled and narrow
  // planes; the weight gradient on pairs of tiles from 64 channels each way. `pairs`: taken but on
  // the AMX tiles; `widened`: taken only where bfloat16 computes in float32.
  const bool widened = cpu::bf16_kernels() == cpu::Bf16Kernels::Widened;
  const bool pairs = cpu::bf16_kernels() != cpu::Bf16Kernels::Tiles;
  struct Route {
    Case k;
    bool forward, weight_grad;
  };
  for (const Route& r : std::vector<Route>{{{8, 64, 16, 16, 64, 3, 3, 1, 1}, pairs, pairs},
                                           {{8, 64, 8, 8, 128, 3, 3, 1, 1}, pairs, pairs},
                                           {{8, 64, 7, 7, 64, 3, 3, 1, 1}, pairs, pairs},
                                           {{8, 32, 32, 32, 32, 3, 3, 1, 1}, pairs, widened},
                                           {{8, 32, 14, 14, 32, 3, 3, 1, 1}, pairs, widened},
                                           {{8, 32, 12, 12, 32, 3, 3, 1, 1}, pairs, widened}}) {
    const Conv2dGeometry rg = geometry(r.k);
    EXPECT_EQ(cpu::conv2d_winograd_applies(rg, galley::DType::BFloat16), r.forward) << name(r.k);
    EXPECT_EQ(cpu::conv2d_winograd_weight_grad_applies(rg, galley::DType::BFloat16), r.weight_grad)
        << name(r.k);
  }
  EXPECT_THROW(cpu::conv2d_winograd_forward(strided, nullptr, nullptr, nullptr, nullptr),
               galley::Error);
  // The weight gradient from 32 channels each way with AVX-512 (with 16 its transforms cost more
  // than its products save there), from 16 with AVX2.
  const bool sixteen = cpu::conv2d_vector_lanes() == 8;
  EXPECT_EQ(cpu::conv2d_winograd_weight_grad_applies(g), sixteen);
  EXPECT_EQ(cpu::conv2d_winograd_weight_grad_applies(geometry({8, 64, 7, 7, 16, 3, 3, 1, 1})),
            sixteen);
  EXPECT_FALSE(cpu::conv2d_winograd_weight_grad_applies(geometry({8, 64, 7, 7, 15, 3, 3, 1, 1})));
  EXPECT_TRUE(cpu::conv2d_winograd_weight_grad_applies(geometry({8, 32, 14, 14, 32, 3, 3, 1, 1})));
  EXPECT_TRUE(cpu::conv2d_winograd_weight_grad_applies(geometry({8, 64, 7, 7, 64, 3, 3, 1, 1})));
  EXPECT_FALSE(cpu::conv2d_winograd_weight_grad_applies(geometry({8, 64, 7, 7, 64, 3, 3, 1, 1}),
                                                        galley::DType::Int64));
}

TEST(ConvDirect, TakenOnlyWhereItIsCorrectAndPays) {
  using galley::kernels::cpu::conv2d_direct_use;
  auto none = [](const Conv2dGeometry& g) {
    const auto u = conv2d_direct_use(g);
    return !u.forward && !u.input_grad && !u.weight_grad;
  };
  const Conv2dGeometry g = geometry({8, 32, 14, 14, 64, 3, 3, 1, 1});
  Conv2dGeometry few_images = g;
  few_images.n = 1;
  if (galley::num_threads() > 1) EXPECT_TRUE(none(few_images)) << "an image per thread is needed";
  const Conv2dGeometry strided = geometry({8, 32, 14, 14, 64, 3, 3, 1, 1, 2});
  const Conv2dGeometry strided_dilated = geometry({8, 32, 14, 14, 64, 3, 3, 2, 2, 2});
  Conv2dGeometry grouped = g;
  grouped.groups = 2;
  const Conv2dGeometry pointwise = geometry({8, 32, 14, 14, 64, 1, 1, 0, 1});
  const Conv2dGeometry overpadded = geometry({8, 32, 14, 14, 64, 3, 3, 3, 1});
  for (const Conv2dGeometry* other :
       std::vector<const Conv2dGeometry*>{&strided_dilated, &grouped, &pointwise, &overpadded})
    EXPECT_TRUE(none(*other));
  if (none(g))
    GTEST_SKIP() << "this build has no direct path (it needs AVX-512, or AVX2 with FMA, at "
                    "compile time)";
  const auto u = conv2d_direct_use(g);
  EXPECT_TRUE(u.forward && u.input_grad && u.weight_grad);
  // Strided: every part.
  const auto s = conv2d_direct_use(strided);
  EXPECT_TRUE(s.forward && s.input_grad && s.weight_grad);
  // A one-channel input (the first layer of a grey-scale model) and three channels: the forward
  // pass and the weight gradient (a 3x3 kernel's 9 taps are enough), the input gradient on
  // im2col.
  const auto grey = conv2d_direct_use(geometry({8, 1, 28, 28, 32, 3, 3, 1, 1}));
  const auto rgb = conv2d_direct_use(geometry({8, 3, 32, 32, 32, 3, 3, 1, 1}));
  EXPECT_TRUE(grey.forward && !grey.input_grad && grey.weight_grad);
  EXPECT_TRUE(rgb.forward && !rgb.input_grad && rgb.weight_grad);
  // bfloat16: every part on the tiles or the dot products from 16 input channels where the host
  // has them; fewer channels as float32 decides, on the widened kernels.
  namespace cpu = galley::kernels::cpu;
  const galley::DType bf = galley::DType::BFloat16;
  const bool fast = cpu::bf16_kernels() != cpu::Bf16Kernels::Widened;
  const auto wide16 = conv2d_direct_use(geometry({8, 16, 14, 14, 32, 3, 3, 1, 1}), bf);
  EXPECT_EQ(wide16.bf16, cpu::bf16_kernels());
  EXPECT_EQ(wide16.bf16_backward, cpu::bf16_kernels());
  if (fast) EXPECT_TRUE(wide16.forward && wide16.input_grad && wide16.weight_grad);
  // The stems: the forward pass widened, the weight gradient on the dot products' pairs of
  // outputs where the host has them (else as float32 decides); the input gradient on im2col.
  const bool dots = cpu::bf16_kernels() == cpu::Bf16Kernels::DotProducts;
  for (const Case& k : {Case{8, 3, 32, 32, 32, 3, 3, 1, 1}, Case{8, 1, 28, 28, 32, 3, 3, 1, 1}}) {
    const auto stem16 = conv2d_direct_use(geometry(k), bf);
    const auto stem = conv2d_direct_use(geometry(k));
    EXPECT_EQ(stem16.bf16, cpu::Bf16Kernels::Widened) << name(k);
    EXPECT_EQ(stem16.bf16_backward,
              dots ? cpu::Bf16Kernels::DotProducts : cpu::Bf16Kernels::Widened)
        << name(k);
    EXPECT_TRUE(stem16.forward == stem.forward && stem16.input_grad == stem.input_grad &&
                stem16.weight_grad == stem.weight_grad)
        << name(k);
  }
}

// batch_norm_train_forward (the statistics and the normalisation in one call, a channel at a
// time on planes of 512 and more) has the bits of batch_norm_stats then batch_norm_forward, the
// running statistics included, in every dtype, with and without the ReLU and a residual, at one
// and two threads; short planes (49) and [N, C] take the two calls themselves.
TEST(BatchNormKernels, TrainForwardEqualsStatsThenForwardBitForBit) {
  namespace cpu = galley::kernels::cpu;
  using galley::DType;
  using galley::Tensor;
  const int saved = galley::num_threads();
  // ([24, 2, 24, 24] sums two blocks of images a channel.)
  const std::vector<galley::Shape> shapes = {
      {4, 3, 28, 28}, {24, 2, 24, 24}, {3, 2, 23, 23}, {5, 4, 7, 7}, {9, 6}};
  for (const DType dt : {DType::Float32, DType::BFloat16, DType::Float16})
    for (const galley::Shape& shape : shapes)
      for (const int threads : {1, 2})
        for (const bool relu : {false, true})
          for (const bool residual : {false, true}) {
            galley::set_num_threads(threads);
            galley::kernels::BatchNormGeometry g;
            g.outer = shape[0], g.channels = shape[1];
            for (size_t k = 2; k < shape.size(); ++k) g.inner *= shape[k];
            const int64_t C = g.channels;
            galley::Generator gen(3);
            const Tensor x = (galley::randn(shape, gen) * 2.f + 0.5f).to(dt);
            const Tensor r = galley::randn(shape, gen).to(dt);
            const Tensor w = galley::randn({C}, gen), b = galley::randn({C}, gen);
            std::vector<float> mean[2], var[2], rm[2], rv[2], y[2];
            for (int fused = 0; fused < 2; ++fused) {
              mean[fused].assign(C, 0.f), var[fused].assign(C, 0.f);
              rm[fused].assign(C, 0.25f), rv[fused].assign(C, 2.f);
              Tensor out = Tensor::empty(shape, dt);
              galley::kernels::BatchNormRunning run{rm[fused].data(), rv[fused].data(), 0.1f};
              galley::kernels::BatchNormParams p;
              p.eps = 1e-5f, p.weight = w.data_ptr<float>(), p.bias = b.data_ptr<float>();
              const void* pr = residual ? r.raw_data() : nullptr;
              if (fused) {
                cpu::batch_norm_train_forward(dt, x.raw_data(), g, run, mean[1].data(),
                                              var[1].data(), p, relu, out.raw_data(), pr);
              } else {
                cpu::batch_norm_stats(dt, x.raw_data(), g, run, mean[0].data(), var[0].data());
                p.mean = mean[0].data(), p.var = var[0].data();
                cpu::batch_norm_forward(dt, x.raw_data(), g, p, relu, out.raw_data(), pr);
              }
              y[fused] = out.to(DType::Float32).to_vector();
            }
            const std::string what = galley::dtype_name(dt) + " " + galley::shape_str(shape) +
                                     " threads " + std::to_string(threads) + (relu ? " relu" : "") +
                                     (residual ? " residual" : "");
            EXPECT_EQ(y[1], y[0]) << what;
            EXPECT_EQ(mean[1], mean[0]) << what;
            EXPECT_EQ(var[1], var[0]) << what;
            EXPECT_EQ(rm[1], rm[0]) << what;
            EXPECT_EQ(rv[1], rv[0]) << what;
          }
  galley::set_num_threads(saved);
}

// Products large enough to be split into bands of C across threads, along rows (m > n) and along
// columns, in every transposition, overwriting and accumulating, with sizes off the band width.
TEST(Gemm, ThreadedMatchesOneThreadAndANaiveProduct) {
  struct Dims {
    int64_t m, n, k;
  };
  const int saved = galley::num_threads();
  for (Dims d : {Dims{40, 1000, 130}, Dims{300, 20, 700}, Dims{64, 160, 400}, Dims{3, 2, 5}}) {
    const auto a = exact_values(size_t(d.m * d.k), 10, 1.f);
    const auto b = exact_values(size_t(d.k * d.n), 11, 0.25f);
    const auto c0 = exact_values(size_t(d.m * d.n), 12, 1.f);
    for (int ta = 0; ta < 2; ++ta)
      for (int tb = 0; tb < 2; ++tb)
        for (float beta : {0.f, 1.f}) {
          // a is m x k (or k x m transposed), b is k x n (or n x k); both row-major, packed.
          const int64_t lda = ta ? d.m : d.k, ldb = tb ? d.k : d.n;
          std::vector<float> want(c0);
          for (int64_t i = 0; i < d.m; ++i)
            for (int64_t j = 0; j < d.n; ++j) {
              float s = 0.f;
              for (int64_t p = 0; p < d.k; ++p)
                s +=
                    (ta ? a[p * lda + i] : a[i * lda + p]) * (tb ? b[j * ldb + p] : b[p * ldb + j]);
              want[i * d.n + j] = 0.5f * s + beta * c0[i * d.n + j];
            }
          for (int threads : {1, 2, 3}) {
            galley::set_num_threads(threads);
            std::vector<float> c(c0);
            galley::kernels::cpu::gemm(ta, tb, d.m, d.n, d.k, 0.5f, a.data(), lda, b.data(), ldb,
                                       beta, c.data(), d.n);
            EXPECT_EQ(c, want) << d.m << "x" << d.n << "x" << d.k << " trans " << ta << tb
                               << " beta " << beta << " threads " << threads;
          }
        }
  }
  galley::set_num_threads(saved);
}

// 16-bit max pooling reads and writes its planes directly: the float32 kernel's winners, outputs
// and gradients (summed in float32 where windows overlap, rounded once), bit for bit.
TEST(MaxPool16Bit, MatchesTheFloat32KernelOnWidenedInputsBitForBit) {
  namespace cpu = galley::kernels::cpu;
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  for (galley::DType dt : {galley::DType::BFloat16, galley::DType::Float16})
    for (auto [h, w, k, stride, pad] : std::vector<std::array<int64_t, 5>>{{8, 8, 2, 2, 0},
                                                                           {7, 9, 2, 2, 0},
                                                                           {4, 70, 2, 2, 0},
                                                                           {16, 16, 2, 2, 0},
                                                                           {9, 9, 3, 2, 1},
                                                                           {6, 7, 3, 1, 1}}) {
      galley::kernels::Pool2dGeometry g{6, h, w, k, stride, pad, 0, 0};
      g.oh = (h + 2 * pad - k) / stride + 1;
      g.ow = (w + 2 * pad - k) / stride + 1;
      const size_t nx = size_t(g.planes * h * w), ny = size_t(g.planes * g.oh * g.ow);
      std::vector<float> xf(nx), gyf(ny);
      for (auto& v : xf) v = normal(rng);
      for (auto& v : gyf) v = normal(rng);
      std::vector<uint16_t> x16(nx), gy16(ny);
      cpu::convert(xf.data(), galley::DType::Float32, x16.data(), dt, int64_t(nx));
      cpu::convert(gyf.data(), galley::DType::Float32, gy16.data(), dt, int64_t(ny));
      // A signalling and a quiet NaN, and -0, among the inputs (bfloat16 bits; float16's NaNs
      // and -0 alike), and a signalling NaN among the gradients.
      const bool bf = dt == galley::DType::BFloat16;
      for (size_t i = 5; i < nx; i += 37)
        x16[i] = i % 3 == 0 ? (bf ? 0x7f81 : 0x7c01) : i % 3 == 1 ? (bf ? 0xffc0 : 0xfe00) : 0x8000;
      gy16[ny / 2] = bf ? 0x7f81 : 0x7c01;
      cpu::convert(x16.data(), dt, xf.data(), galley::DType::Float32, int64_t(nx));
      cpu::convert(gy16.data(), dt, gyf.data(), galley::DType::Float32, int64_t(ny));
      std::vector<float> y_ref(ny), gx_ref(nx);
      std::vector<int32_t> idx_ref(ny), idx(ny);
      cpu::max_pool2d_forward(g, xf.data(), y_ref.data(), idx_ref.data());
      cpu::max_pool2d_backward(g, gyf.data(), idx_ref.data(), gx_ref.data());
      std::vector<uint16_t> y(ny), gx(nx), y_want(ny), gx_want(nx);
      cpu::max_pool2d_forward(g, x16.data(), y.data(), idx.data(), dt);
      cpu::max_pool2d_backward(g, gy16.data(), idx.data(), gx.data(), dt);
      cpu::convert(y_ref.data(), galley::DType::Float32, y_want.data(), dt, int64_t(ny));
      cpu::convert(gx_ref.data(), galley::DType::Float32, gx_want.data(), dt, int64_t(nx));
      const std::string what = std::string(galley::dtype_name(dt)) + " " + std::to_string(h) + "x" +
                               std::to_string(w) + " k" + std::to_string(k) + " s" +
                               std::to_string(stride);
      EXPECT_EQ(idx, idx_ref) << what;
      EXPECT_EQ(y, y_want) << what;
      EXPECT_EQ(gx, gx_want) << what;
    }
}

// 2x2/2 pooling of planes a few outputs wide (8x8, 16x16, 16x4, 32x2, 8x16: the ones whose
// windows a vector takes several output rows of) against the same planes one column wider, which
// the kernel takes a row at a time (the extra column lies outside every window): the same
// maxima, winners (mapped back to the narrower rows) and gradients, zero in the extra column. The
// inputs repeat a few values, so that windows tie, with NaNs of both kinds and -0 among them.
TEST(MaxPool, SeveralOutputRowsAVectorMatchOneRowAtATime) {
  namespace cpu = galley::kernels::cpu;
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> pick(0, 6);
  const float kValues[7] = {-1.f, 0.f, 1.f, 2.f, -0.f, std::numeric_limits<float>::quiet_NaN(),
                            1.f};
  for (galley::DType dt : {galley::DType::Float32, galley::DType::BFloat16})
    for (auto [h, w] :
         std::vector<std::array<int64_t, 2>>{{8, 8}, {16, 16}, {16, 4}, {32, 2}, {8, 16}}) {
      const int64_t planes = 5, oh = h / 2, ow = w / 2;
      const galley::kernels::Pool2dGeometry g{planes, h, w, 2, 2, 0, oh, ow};
      const galley::kernels::Pool2dGeometry wide{planes, h, w + 1, 2, 2, 0, oh, ow};
      const size_t nx = size_t(planes * h * w), nw = size_t(planes * h * (w + 1));
      const size_t ny = size_t(planes * oh * ow);
      std::vector<float> x(nx), xw(nw, 100.f), gy(ny);
      for (size_t i = 0; i < nx; ++i) x[i] = kValues[pick(rng)];
      for (size_t i = 0; i < ny; ++i) gy[i] = float(pick(rng)) - 3.f;
      for (int64_t r = 0; r < planes * h; ++r)
        std::copy_n(x.data() + r * w, w, xw.data() + r * (w + 1));
      const bool bf = dt == galley::DType::BFloat16;
      // a signalling NaN (bfloat16 bits 0x7f81) among the bfloat16 inputs
      std::vector<uint16_t> x16(nx), xw16(nw), gy16(ny);
      if (bf) {
        cpu::convert(x.data(), galley::DType::Float32, x16.data(), dt, int64_t(nx));
        x16[nx / 3] = 0x7f81;
        cpu::convert(x16.data(), dt, x.data(), galley::DType::Float32, int64_t(nx));
        for (int64_t r = 0; r < planes * h; ++r)
          std::copy_n(x.data() + r * w, w, xw.data() + r * (w + 1));
        cpu::convert(xw.data(), galley::DType::Float32, xw16.data(), dt, int64_t(nw));
        xw16[size_t(nx / 3 / w) * size_t(w + 1) + nx / 3 % size_t(w)] = 0x7f81;
        cpu::convert(gy.data(), galley::DType::Float32, gy16.data(), dt, int64_t(ny));
      }
      auto ptr = [&](std::vector<float>& f, std::vector<uint16_t>& b) -> void* {
        return bf ? static_cast<void*>(b.data()) : static_cast<void*>(f.data());
      };
      std::vector<float> y(ny), yw(ny), gx(nx), gxw(nw);
      std::vector<uint16_t> y16(ny), yw16(ny), gx16(nx), gxw16(nw);
      std::vector<int32_t> idx(ny), idxw(ny);
      cpu::max_pool2d_forward(g, ptr(x, x16), ptr(y, y16), idx.data(), dt);
      cpu::max_pool2d_forward(wide, ptr(xw, xw16), ptr(yw, yw16), idxw.data(), dt);
      cpu::max_pool2d_backward(g, ptr(gy, gy16), idx.data(), ptr(gx, gx16), dt);
      cpu::max_pool2d_backward(wide, ptr(gy, gy16), idxw.data(), ptr(gxw, gxw16), dt);
      const std::string what =
          std::string(galley::dtype_name(dt)) + " " + std::to_string(h) + "x" + std::to_string(w);
      for (int32_t& i : idxw) i = i / int32_t(w + 1) * int32_t(w) + i % int32_t(w + 1);
      EXPECT_EQ(idx, idxw) << what;
      auto bits = [&](std::vector<float>& f, std::vector<uint16_t>& b, size_t i) -> uint32_t {
        if (bf) return b[i];
        uint32_t u;
        std::memcpy(&u, &f[i], 4);
        return u;
      };
      for (size_t i = 0; i < ny; ++i) ASSERT_EQ(bits(y, y16, i), bits(yw, yw16, i)) << what;
      for (int64_t r = 0; r < planes * h; ++r) {
        for (int64_t c = 0; c < w; ++c)
          ASSERT_EQ(bits(gx, gx16, size_t(r * w + c)), bits(gxw, gxw16, size_t(r * (w + 1) + c)))
              << what << " row " << r << " column " << c;
        ASSERT_EQ(bits(gxw, gxw16, size_t(r * (w + 1) + w)), 0u) << what;
      }
    }
}

// The bfloat16 GEMM (AMX tiles or vdpbf16ps, whichever the host runs) against the float32 GEMM on
// exact values (small integers times
// quarters, so every order of summing gives the same bits): every transpose, sizes off every
// block (16 rows and columns, 32 along k), leading dimensions wider than the matrices, and
// accumulation onto C.
TEST(Gemm, Bf16MatchesFloat32BitForBitOnExactValues) {
  namespace cpu = galley::kernels::cpu;
  if (!cpu::gemm_bf16_available()) {
    std::vector<float> c(1);
    EXPECT_THROW(cpu::gemm_bf16(false, false, 1, 1, 1, nullptr, 1, nullptr, 1, false, c.data(), 1),
                 galley::Error);
    GTEST_SKIP() << "neither AMX tiles nor AVX512-BF16 at the float32 FMA rate in this build or "
                    "on this host: the bfloat16 GEMM is not built";
  }
  for (auto [m, n, k] : std::vector<std::array<int64_t, 3>>{
           {1, 1, 1}, {16, 16, 32}, {37, 19, 70}, {64, 10, 2048}, {5, 100, 33}, {130, 48, 7}})
    for (int ta = 0; ta < 2; ++ta)
      for (int tb = 0; tb < 2; ++tb)
        for (int acc = 0; acc < 2; ++acc) {
          const int64_t lda = (ta ? m : k) + 3, ldb = (tb ? k : n) + 1, ldc = n + 2;
          const auto af = exact_values(size_t((ta ? k : m) * lda), 41, 1.f);
          const auto bf = exact_values(size_t((tb ? n : k) * ldb), 42, 0.25f);
          const auto c0 = exact_values(size_t(m * ldc), 43, 0.5f);
          std::vector<uint16_t> a16(af.size()), b16(bf.size());
          cpu::convert(af.data(), galley::DType::Float32, a16.data(), galley::DType::BFloat16,
                       int64_t(af.size()));
          cpu::convert(bf.data(), galley::DType::Float32, b16.data(), galley::DType::BFloat16,
                       int64_t(bf.size()));
          std::vector<float> want = c0, got = c0;
          cpu::gemm(ta, tb, m, n, k, 1.f, af.data(), lda, bf.data(), ldb, acc ? 1.f : 0.f,
                    want.data(), ldc);
          cpu::gemm_bf16(ta, tb, m, n, k, reinterpret_cast<const galley::bfloat16*>(a16.data()),
                         lda, reinterpret_cast<const galley::bfloat16*>(b16.data()), ldb, acc,
                         got.data(), ldc);
          ASSERT_EQ(got, want) << m << "x" << n << "x" << k << " trans " << ta << tb
                               << (acc ? " accumulating" : "");
        }
}
