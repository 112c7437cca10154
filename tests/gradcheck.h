#pragma once
// The finite-difference gradient checker shared by the gradient tests (test_gradcheck, and the
// op-case table of test_backend_ops), and the input generators that keep ops away from their
// kinks.
//
// gradcheck builds loss = sum(fn(inputs) * R) for a fixed random R, then compares the analytic
// gradient of every input with a central difference (default step 1e-2) of that loss, summed in
// double from the op's float32 outputs. Two tolerances, tol 2e-2 by default (the scale Caffe's
// checker uses for single precision):
//   each element   |analytic - numeric| <= tol * max(1, |numeric|);
//   each input     sum |analytic - numeric| <= tol * sum |numeric| over the elements checked,
//                  so that an input whose gradients are all small (a small weight behind it)
//                  cannot pass with a wrong or zero gradient under the first one's floor of tol.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include "galley/galley.h"

namespace testutil {

using galley::Shape;
using galley::Tensor;

using GradFn = std::function<Tensor(const std::vector<Tensor>&)>;

inline void gradcheck(const char* name, GradFn fn, std::vector<Tensor> inputs, uint64_t seed = 7,
                      float step = 1e-2f, float tol = 2e-2f) {
  galley::Generator gen(seed);
  for (auto& t : inputs) t.set_requires_grad(true);
  Tensor out = fn(inputs);
  Tensor r = galley::randn(out.shape(), gen);
  galley::sum(out * r).backward();
  std::vector<Tensor> grads;
  for (auto& t : inputs) {
    ASSERT_TRUE(t.grad().defined()) << name << ": no gradient reached an input";
    grads.push_back(t.grad().clone());
  }
  galley::NoGradGuard no_grad;
  const std::vector<float> rv = r.to_vector();
  auto objective = [&] {
    const std::vector<float> o = fn(inputs).to(galley::DType::Float32).to_vector();
    double s = 0;
    for (size_t i = 0; i < o.size(); ++i) s += double(o[i]) * double(rv[i]);
    return s;
  };
  for (size_t k = 0; k < inputs.size(); ++k) {
    float* p = inputs[k].data<float>();
    const float* g = grads[k].data<float>();
    const int64_t n = inputs[k].numel();
    // Every element of small inputs, a spread of 64 elements of large ones.
    const int64_t stride = std::max<int64_t>(1, n / 64);
    double off = 0, size = 0;  // sum |analytic - numeric| and sum |numeric|
    for (int64_t i = 0; i < n; i += stride) {
      const float saved = p[i];
      p[i] = saved + step;
      const double plus = objective();
      p[i] = saved - step;
      const double minus = objective();
      p[i] = saved;
      const double numeric = (plus - minus) / (2.0 * step);
      ASSERT_NEAR(g[i], numeric, tol * std::max(1.0, std::abs(numeric)))
          << name << ": input " << k << " element " << i << " of shape "
          << galley::shape_str(inputs[k].shape());
      off += std::abs(g[i] - numeric);
      size += std::abs(numeric);
    }
    // (an input whose gradient is zero, as a dead relu's, passes with off ~ 0)
    EXPECT_LE(off, tol * size + 1e-6 * double(n / stride + 1))
        << name << ": input " << k << " of shape " << galley::shape_str(inputs[k].shape())
        << ": the gradients are off by " << off << " in all against a size of " << size;
  }
}

inline Tensor rnd(const Shape& s, uint64_t seed, float scale = 1.f) {
  galley::Generator gen(seed);
  return galley::randn(s, gen) * scale;
}

// Values kept away from 0 so that relu and max have no kink within a finite-difference step.
inline Tensor away_from_zero(const Shape& s, uint64_t seed) {
  Tensor t = rnd(s, seed);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] += p[i] >= 0 ? 0.1f : -0.1f;
  return t;
}

// Distinct values spaced wider than the step, so that max-pool winners never swap.
inline Tensor distinct(const Shape& s, uint64_t seed) {
  Tensor t = galley::Tensor::empty(s);
  const int64_t n = t.numel();
  std::vector<int64_t> perm(n);
  for (int64_t i = 0; i < n; ++i) perm[i] = i;
  galley::Generator gen(seed);
  for (int64_t i = n - 1; i > 0; --i) std::swap(perm[i], perm[gen.next_u64() % (i + 1)]);
  for (int64_t i = 0; i < n; ++i) t.data<float>()[i] = 0.05f * float(perm[i] - n / 2);
  return t;
}

}  // namespace testutil
