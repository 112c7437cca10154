#pragma once
// Helpers shared by the mixed-precision tests (test_amp, test_cuda_amp).
#include <gtest/gtest.h>

#include <cmath>
#include <string>

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

}  // namespace amp_test
