#pragma once
// Helpers shared by the mixed-precision tests (test_amp, test_cuda_amp).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "galley/galley.h"

namespace amp_test {

// Bit-for-bit equality of two tensors of one dtype and shape.
inline void expect_same(const galley::Tensor& got, const galley::Tensor& want,
                        const std::string& what) {
  ASSERT_EQ(got.dtype(), want.dtype()) << what;
  ASSERT_EQ(got.shape(), want.shape()) << what;
  auto g = got.to(galley::DType::Float32).to_vector(),
       w = want.to(galley::DType::Float32).to_vector();
  for (size_t i = 0; i < g.size(); ++i) ASSERT_EQ(g[i], w[i]) << what << " element " << i;
}

inline void expect_near(const galley::Tensor& got, const galley::Tensor& want, float tol,
                        const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  auto g = got.to(galley::DType::Float32).to_vector(),
       w = want.to(galley::DType::Float32).to_vector();
  for (size_t i = 0; i < g.size(); ++i)
    ASSERT_NEAR(g[i], w[i], tol * (1.f + std::fabs(w[i]))) << what << " element " << i;
}

inline galley::Tensor param(const galley::Shape& shape, uint64_t seed) {
  galley::Generator gen(seed);
  return galley::randn(shape, gen).set_requires_grad();
}

// Two DataParallel replicas of a Linear(3, 2) on `devices`, trained under autocast in `low`
// with a loss scaler. A batch of 4 whose last sample (replica 1's share) holds an Inf: the
// all-reduce carries it into replica 0's gradients (unscale_ checks every replica's, so a skip
// alone would not show it), every replica skips the step and keeps its parameters, and the
// scale backs off. The next, clean, step is taken by both replicas alike.
inline void expect_replicas_skip_together(const std::vector<galley::Device>& devices,
                                          galley::DType low) {
  galley::DataParallel<galley::nn::Linear> model(devices, {}, 3, 2);
  galley::optim::SGD opt(model.parameters(), {.learning_rate = 0.1});
  galley::amp::GradScaler scaler;
  std::vector<float> x(4 * 3, 0.5f);
  x[3 * 3 + 1] = INFINITY;  // the last sample: replica 1's share
  const galley::Tensor labels =
      galley::Tensor::from_vector(std::vector<int64_t>{0, 1, 0, 1}, {4}).to(devices[0]);
  const auto params = model.parameters();
  std::vector<std::vector<float>> before;
  for (auto& p : params) before.push_back(p.to_vector());
  auto step = [&] {
    galley::amp::Autocast autocast(low);
    opt.clear_grad();
    galley::Tensor loss =
        galley::cross_entropy(model(galley::Tensor::from_vector(x, {4, 3})), labels);
    scaler.scale(loss).backward();
  };
  step();
  bool replica0_nonfinite = false;
  for (size_t k = 0; k < params.size() / 2; ++k)
    for (float v : params[k].grad().to_vector()) replica0_nonfinite |= !std::isfinite(v);
  EXPECT_TRUE(replica0_nonfinite) << "replica 1's Inf did not reach replica 0's gradients";
  EXPECT_FALSE(scaler.step(opt));
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 32768.0);
  for (size_t k = 0; k < params.size(); ++k)
    EXPECT_EQ(params[k].to_vector(), before[k]) << "parameter " << k << " changed";
  x[3 * 3 + 1] = 0.25f;
  step();
  EXPECT_TRUE(scaler.step(opt));
  scaler.update();
  const size_t per = params.size() / 2;
  for (size_t k = 0; k < per; ++k)
    EXPECT_EQ(params[k].to_vector(), params[k + per].to_vector()) << "replicas differ";
}

}  // namespace amp_test
