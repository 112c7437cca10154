// Per-sample transforms: values, in-place crop against a padded reference, seeding.
#include <gtest/gtest.h>

#include "test_util.h"

#include <galley/data/cifar.h>
#include <galley/data/transforms.h>

#include <cmath>
#include <vector>

namespace {

using galley::Generator;
using galley::Shape;
using galley::Tensor;
namespace data = galley::data;

TEST(Transforms, NormalizePerChannel) {
  std::vector<float> x = {1, 2, 3, 4, 10, 20, 30, 40};  // [2, 2, 2]
  Generator gen(0);
  data::normalize({1.f, 10.f}, {2.f, 5.f})(x.data(), {2, 2, 2}, gen);
  EXPECT_EQ(x, (std::vector<float>{0, 0.5f, 1, 1.5f, 0, 2, 4, 6}));
  std::vector<float> y = {2, 4};
  data::normalize({2.f}, {2.f})(y.data(), {2, 1}, gen);  // one value for every channel
  EXPECT_EQ(y, (std::vector<float>{0, 1}));
  testutil::expect_contains(testutil::error_of([] { data::normalize({0.f}, {0.f}); }),
                            {"stddev[0] = 0"});
  testutil::expect_contains(testutil::error_of([] {
                              data::normalize({0.f, 1.f}, {1.f});
                            }),
                            {"2 means and 1 standard deviations"});
}

TEST(Transforms, NormalizeDividesAsTorchvisionDoes) {
  // Every byte value over 255 with CIFAR-10's statistics: (x - mean) / std to the bit, which a
  // product with the reciprocal misses by an ulp in about one value in eight.
  std::vector<float> x(3 * 256), want(x.size());
  for (int c = 0; c < 3; ++c)
    for (int v = 0; v < 256; ++v) {
      x[size_t(c * 256 + v)] = float(v) / 255.f;
      want[size_t(c * 256 + v)] =
          (float(v) / 255.f - data::kCifar10Mean[size_t(c)]) / data::kCifar10Std[size_t(c)];
    }
  Generator gen(0);
  data::normalize(data::kCifar10Mean, data::kCifar10Std)(x.data(), {3, 16, 16}, gen);
  EXPECT_EQ(x, want);
}

// Pads to (H + 2p) x (W + 2p) and crops at (oy, ox): the definition random_crop must match.
std::vector<float> crop_reference(const std::vector<float>& x, int64_t c, int64_t h, int64_t w,
                                  int64_t p, int64_t oy, int64_t ox, float fill) {
  std::vector<float> out(x.size());
  for (int64_t k = 0; k < c; ++k)
    for (int64_t y = 0; y < h; ++y)
      for (int64_t z = 0; z < w; ++z) {
        const int64_t sy = y + oy - p, sx = z + ox - p;
        out[(k * h + y) * w + z] =
            sy >= 0 && sy < h && sx >= 0 && sx < w ? x[(k * h + sy) * w + sx] : fill;
      }
  return out;
}

TEST(Transforms, RandomCropMatchesPadThenCrop) {
  const int64_t c = 2, h = 5, w = 7;
  std::vector<float> x(c * h * w);
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(i);
  for (int64_t p : {0, 1, 3, 9})
    for (uint64_t seed = 0; seed < 40; ++seed) {
      Generator draw(seed);  // the same two draws random_crop makes
      const int64_t oy = int64_t(draw.next_u64() % uint64_t(2 * p + 1));
      const int64_t ox = int64_t(draw.next_u64() % uint64_t(2 * p + 1));
      std::vector<float> got = x;
      Generator gen(seed);
      data::random_crop(p, -1.f)(got.data(), {c, h, w}, gen);
      EXPECT_EQ(got, crop_reference(x, c, h, w, p, oy, ox, -1.f))
          << "padding " << p << " offset " << oy << "," << ox;
    }
  Generator gen(0);
  std::vector<float> v(4);
  testutil::expect_contains(testutil::error_of([&] { data::random_crop(1)(v.data(), {4}, gen); }),
                            {"no (H, W)"});
}

TEST(Transforms, HorizontalFlip) {
  std::vector<float> x = {1, 2, 3, 4, 5, 6};  // [1, 2, 3]
  Generator gen(0);
  auto flipped = x;
  data::random_horizontal_flip(1.f)(flipped.data(), {1, 2, 3}, gen);
  EXPECT_EQ(flipped, (std::vector<float>{3, 2, 1, 6, 5, 4}));
  auto kept = x;
  data::random_horizontal_flip(0.f)(kept.data(), {1, 2, 3}, gen);
  EXPECT_EQ(kept, x);
  int flips = 0;
  for (uint64_t s = 0; s < 1000; ++s) {
    Generator g(s);
    auto y = x;
    data::random_horizontal_flip()(y.data(), {1, 2, 3}, g);
    flips += y != x;
  }
  EXPECT_NEAR(flips, 500, 60);
}

TEST(Transforms, SeededPerSample) {
  EXPECT_EQ(data::sample_seed(1, 2, 3), data::sample_seed(1, 2, 3));
  EXPECT_NE(data::sample_seed(1, 2, 3), data::sample_seed(1, 2, 4));
  EXPECT_NE(data::sample_seed(1, 2, 3), data::sample_seed(1, 3, 3));
  EXPECT_NE(data::sample_seed(1, 2, 3), data::sample_seed(2, 2, 3));
  // A sample's result depends on its index, not on its row in the batch.
  std::vector<float> vals(2 * 1 * 4 * 4);
  for (size_t i = 0; i < vals.size(); ++i) vals[i] = float(i % 16);
  Tensor a = Tensor::from_vector(vals, {2, 1, 4, 4});
  Tensor b = Tensor::from_vector(vals, {2, 1, 4, 4});
  std::vector<data::Transform> t = {data::random_crop(2), data::random_horizontal_flip()};
  data::apply_transforms(t, a, {5, 9}, 1, 0);
  data::apply_transforms(t, b, {9, 5}, 1, 0);
  auto va = a.to_vector(), vb = b.to_vector();
  EXPECT_EQ(std::vector<float>(va.begin(), va.begin() + 16),
            std::vector<float>(vb.begin() + 16, vb.end()));
}

TEST(Transforms, Uint8ToFloat) {
  const uint8_t src[] = {0, 51, 255};
  float dst[3];
  data::uint8_to_float(src, dst, 3);
  EXPECT_FLOAT_EQ(dst[0], 0.f);
  EXPECT_FLOAT_EQ(dst[1], 0.2f);
  EXPECT_FLOAT_EQ(dst[2], 1.f);
}

// The default scale divides by 255, as torchvision's ToTensor does (the product with the rounded
// reciprocal 1/255 differs from it by an ulp in 126 of the 256 byte values); any other scale
// multiplies.
TEST(Transforms, Uint8ToFloatDividesBy255AsToTensorDoes) {
  uint8_t src[256];
  for (int v = 0; v < 256; ++v) src[v] = uint8_t(v);
  float dst[256];
  data::uint8_to_float(src, dst, 256);
  for (int v = 0; v < 256; ++v) ASSERT_EQ(dst[v], float(v) / 255.f) << "byte " << v;
  data::uint8_to_float(src, dst, 256, 0.3f);
  for (int v = 0; v < 256; ++v) ASSERT_EQ(dst[v], float(v) * 0.3f) << "byte " << v;
}

// Statistics that are not finite would fill every sample with NaN: refused when given.
TEST(Transforms, NonFiniteStatisticsAreRefused) {
  using testutil::error_of;
  using testutil::expect_contains;
  expect_contains(error_of([] { data::normalize({NAN}, {1.f}); }), {"normalize", "finite"});
  expect_contains(error_of([] { data::normalize({0.f}, {INFINITY}); }), {"normalize", "finite"});
  expect_contains(error_of([] { data::random_crop(int64_t(1) << 62); }), {"random_crop"});
  expect_contains(error_of([] {
                    data::UInt8ImageDataset({0, 0}, {0, 1}, {1}, NAN);
                  }),
                  {"UInt8ImageDataset", "scale"});
}

}  // namespace
