// Gradient clipping against PyTorch's formulas computed here by hand: clip_grad_norm_ for
// norms 2, 1, 3 and inf, below and above max_norm, many tensors across chunk boundaries,
// non-finite gradients, clip_grad_value_, and DataParallel replicas staying equal.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "galley/galley.h"
#include "test_util.h"

namespace nn = galley::nn;
using galley::Device;
using galley::Tensor;
using testutil::error_of;
using testutil::expect_contains;

namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// A parameter of `n` elements whose gradient is a random vector times `scale`.
Tensor param_with_grad(int64_t n, float scale, galley::Generator& gen) {
  Tensor p = galley::zeros({n});
  p.set_requires_grad(true);
  p.set_grad(galley::randn({n}, gen) * scale);
  return p;
}

std::vector<Tensor> params_with_grads(const std::vector<int64_t>& sizes, float scale,
                                      uint64_t seed = 1) {
  galley::Generator gen(seed);
  std::vector<Tensor> out;
  for (int64_t n : sizes) out.push_back(param_with_grad(n, scale, gen));
  return out;
}

std::vector<std::vector<float>> grads_of(const std::vector<Tensor>& params) {
  std::vector<std::vector<float>> out;
  for (auto& p : params)
    out.push_back(p.grad().defined() ? p.grad().to_vector() : std::vector<float>{});
  return out;
}

// PyTorch's total norm: torch.norm of the per-tensor norms (max of per-tensor maxima for inf),
// here in double.
double reference_norm(const std::vector<std::vector<float>>& grads, double p) {
  double acc = 0;
  for (auto& g : grads)
    for (float v : g) {
      const double a = std::fabs(double(v));
      if (std::isinf(p))
        acc = std::max(acc, a);
      else
        acc += std::pow(a, p);
    }
  return std::isinf(p) ? acc : std::pow(acc, 1.0 / p);
}

// PyTorch's coefficient: max_norm / (total + 1e-6) in float32 (as reciprocal() * max_norm),
// clamped to at most 1.
float reference_coef(float total, double max_norm) {
  return std::min(1.f, (1.f / (total + 1e-6f)) * float(max_norm));
}

void expect_scaled(const std::vector<Tensor>& params, const std::vector<std::vector<float>>& before,
                   float coef) {
  auto after = grads_of(params);
  ASSERT_EQ(after.size(), before.size());
  for (size_t k = 0; k < after.size(); ++k) {
    ASSERT_EQ(after[k].size(), before[k].size());
    for (size_t i = 0; i < after[k].size(); ++i)
      ASSERT_EQ(after[k][i], before[k][i] * coef) << "tensor " << k << " element " << i;
  }
}

// Sizes on both sides of the chunk of kernels/cpu/clip.h (8192), and empty and tiny tensors.
const std::vector<int64_t> kSizes = {3, 8191, 8192, 8193, 1, 0, 40000, 17};

}  // namespace

TEST(ClipGradNorm, AboveMaxNormScalesEveryGradientAsPyTorch) {
  for (double p : {2.0, 1.0, 3.0, double(INFINITY)}) {
    auto params = params_with_grads(kSizes, 1.f);
    auto before = grads_of(params);
    const double want = reference_norm(before, p);
    const double max_norm = want / 4;
    const float got = nn::clip_grad_norm_(params, max_norm, {.norm_type = p});
    EXPECT_NEAR(got, want, 1e-5 * want) << "norm_type " << p;
    expect_scaled(params, before, reference_coef(got, max_norm));
    // The clipped gradients have the norm asked for.
    EXPECT_NEAR(reference_norm(grads_of(params), p), max_norm, 1e-5 * max_norm) << p;
  }
}

TEST(ClipGradNorm, BelowMaxNormLeavesTheGradientsBitForBit) {
  auto params = params_with_grads(kSizes, 0.01f);
  auto before = grads_of(params);
  const double want = reference_norm(before, 2.0);
  EXPECT_NEAR(nn::clip_grad_norm_(params, want * 2), want, 1e-5 * want);
  EXPECT_EQ(grads_of(params), before);
  // Exactly at max_norm the coefficient is just below 1 (the 1e-6), and PyTorch scales by it.
  const float total = nn::clip_grad_norm_(params, 1e9);
  EXPECT_EQ(grads_of(params), before);
  const float coef = reference_coef(total, total);
  EXPECT_LT(coef, 1.f);
  EXPECT_EQ(nn::clip_grad_norm_(params, total), total);
  expect_scaled(params, before, coef);
}

TEST(ClipGradNorm, TheInfinityNormIsTheLargestMagnitude) {
  Tensor a = galley::zeros({3}), b = galley::zeros({2});
  a.set_requires_grad(true);
  b.set_requires_grad(true);
  a.set_grad(Tensor::from_vector({1.f, -7.f, 2.f}, {3}));
  b.set_grad(Tensor::from_vector({3.f, 5.f}, {2}));
  EXPECT_EQ(nn::clip_grad_norm_({a, b}, 3.5, INFINITY), 7.f);
  const float c = reference_coef(7.f, 3.5);
  EXPECT_EQ(a.grad().to_vector(), (std::vector<float>{1.f * c, -7.f * c, 2.f * c}));
  EXPECT_EQ(b.grad().to_vector(), (std::vector<float>{3.f * c, 5.f * c}));
}

TEST(ClipGradNorm, ParametersWithoutGradientsAreSkipped) {
  Tensor none = galley::zeros({4});
  none.set_requires_grad(true);
  EXPECT_EQ(nn::clip_grad_norm_({none}, 1.0), 0.f);
  EXPECT_EQ(nn::clip_grad_norm_({}, 1.0), 0.f);
  auto params = params_with_grads({5}, 10.f);
  params.push_back(none);
  const double want = reference_norm(grads_of({params[0]}), 2.0);
  EXPECT_NEAR(nn::clip_grad_norm_(params, 1.0), want, 1e-5 * want);
  EXPECT_FALSE(none.grad().defined());
}

TEST(ClipGradNorm, TheResultDoesNotDependOnTheThreadCount) {
  const int threads = galley::num_threads();
  std::vector<float> norms;
  std::vector<std::vector<std::vector<float>>> grads;
  for (int t : {1, 2, 3}) {
    galley::set_num_threads(t);
    auto params = params_with_grads({100000, 30000, 8192 * 5 + 1}, 1.f, 5);
    norms.push_back(nn::clip_grad_norm_(params, 1.0));
    grads.push_back(grads_of(params));
  }
  galley::set_num_threads(threads);
  EXPECT_EQ(norms[0], norms[1]);
  EXPECT_EQ(norms[0], norms[2]);
  EXPECT_EQ(grads[0], grads[1]);
  EXPECT_EQ(grads[0], grads[2]);
}

TEST(ClipGradNorm, ANonFiniteNormRaisesAndChangesNothing) {
  for (float bad : {kNaN, kInf}) {
    auto params = params_with_grads({10, 20, 30}, 1.f);
    {
      Tensor g = params[1].grad();
      auto v = g.to_vector();
      v[7] = bad;
      params[1].set_grad(Tensor::from_vector(v, {20}));
    }
    auto before = grads_of(params);
    const std::string msg = error_of([&] { nn::clip_grad_norm_(params, 1.0); });
    expect_contains(msg, {"clip_grad_norm_", std::isnan(bad) ? "is nan" : "is inf",
                          "parameter with a non-finite gradient is number 1", "[20]",
                          "No gradient was changed", "error_if_nonfinite = false"});
    auto after = grads_of(params);
    for (size_t k = 0; k < before.size(); ++k)
      for (size_t i = 0; i < before[k].size(); ++i)
        EXPECT_TRUE(after[k][i] == before[k][i] || (std::isnan(after[k][i]) && std::isnan(bad)));
    // PyTorch's default: scale by the non-finite norm and return it.
    const float total =
        nn::clip_grad_norm_(params, 1.0, {.norm_type = 2.0, .error_if_nonfinite = false});
    if (std::isnan(bad)) {
      EXPECT_TRUE(std::isnan(total));
      for (float v : params[0].grad().to_vector()) EXPECT_TRUE(std::isnan(v));
    } else {
      EXPECT_TRUE(std::isinf(total));
      for (float v : params[0].grad().to_vector()) EXPECT_EQ(v, 0.f);  // times 1 / inf
    }
  }
}

TEST(ClipGradNorm, TheInfinityNormOfAnInfiniteGradientIsInfinite) {
  auto params = params_with_grads({10}, 1.f);
  auto v = params[0].grad().to_vector();
  v[3] = -kInf;
  params[0].set_grad(Tensor::from_vector(v, {10}));
  EXPECT_TRUE(std::isinf(
      nn::clip_grad_norm_(params, 1.0, {.norm_type = INFINITY, .error_if_nonfinite = false})));
  v[4] = kNaN;
  params[0].set_grad(Tensor::from_vector(v, {10}));
  EXPECT_TRUE(std::isnan(
      nn::clip_grad_norm_(params, 1.0, {.norm_type = INFINITY, .error_if_nonfinite = false})));
}

TEST(ClipGradNorm, BadArgumentsAreErrors) {
  auto params = params_with_grads({4}, 1.f);
  expect_contains(error_of([&] { nn::clip_grad_norm_(params, -1.0); }), {"max_norm -1"});
  expect_contains(error_of([&] { nn::clip_grad_norm_(params, 1.0, 0.0); }), {"norm_type 0"});
  expect_contains(error_of([&] { nn::clip_grad_norm_(params, 1.0, NAN); }), {"norm_type"});
  Tensor p = galley::zeros({2});
  p.set_requires_grad(true);
  const Tensor int_grad = Tensor::from_vector(std::vector<int64_t>{1, 2}, {2});
  expect_contains(error_of([&] { p.set_grad(int_grad); }), {"set_grad", "int64", "float32"});
  testutil::force_grad(p, int_grad);
  expect_contains(error_of([&] {
                    nn::clip_grad_norm_({params[0], p}, 1.0);
                  }),
                  {"gradient of parameter 1", "int64", "float32"});
  expect_contains(error_of([&] { nn::clip_grad_value_({p}, 1.0); }), {"int64"});
  expect_contains(error_of([&] { nn::clip_grad_norm_({Tensor()}, 1.0); }),
                  {"parameter 0 is undefined"});
  expect_contains(error_of([&] { nn::clip_grad_value_(params, -0.5); }), {"clip_value -0.5"});
}

TEST(ClipGradValue, ClampsEveryElementAndKeepsNaN) {
  auto params = params_with_grads(kSizes, 3.f);
  auto v = params[0].grad().to_vector();
  v[1] = kNaN;
  params[0].set_grad(Tensor::from_vector(v, {3}));
  auto before = grads_of(params);
  nn::clip_grad_value_(params, 0.5);
  auto after = grads_of(params);
  for (size_t k = 0; k < before.size(); ++k)
    for (size_t i = 0; i < before[k].size(); ++i) {
      const float b = before[k][i];
      if (std::isnan(b)) {
        EXPECT_TRUE(std::isnan(after[k][i]));
        continue;
      }
      ASSERT_EQ(after[k][i], std::min(0.5f, std::max(-0.5f, b))) << k << " " << i;
    }
}

// ---------------------------------------------------------------------------------------------
// DataParallel

namespace {
class TwoLayers : public nn::Layer {
 public:
  TwoLayers() {
    register_layer("fc1", fc1_);
    register_layer("fc2", fc2_);
  }
  Tensor forward(const Tensor& x) override { return fc2_(galley::relu(fc1_(x))); }

 private:
  nn::Linear fc1_{6, 32};
  nn::Linear fc2_{32, 3};
};
}  // namespace

TEST(ClipGradNorm, KeepsDataParallelReplicasEqual) {
  galley::manual_seed(3);
  auto model = galley::DataParallel<TwoLayers>({Device::cpu(0), Device::cpu(1)});
  nn::CrossEntropyLoss loss_fn;
  Tensor x = galley::randn({9, 6}) * 10.f;
  Tensor y = Tensor::from_vector(std::vector<int64_t>{0, 1, 2, 0, 1, 2, 0, 1, 2}, {9});
  loss_fn(model(x), y).backward();
  auto params = model.parameters();
  const size_t per = params.size() / 2;
  ASSERT_EQ(per * 2, params.size());
  auto before = grads_of(params);
  const std::vector<std::vector<float>> replica0(before.begin(), before.begin() + per);
  for (size_t k = 0; k < per; ++k) ASSERT_EQ(before[k], before[k + per]) << "after all-reduce";
  const double want = reference_norm(replica0, 2.0);  // one replica's gradients
  const double max_norm = want / 3;
  const float got = nn::clip_grad_norm_(params, max_norm);
  EXPECT_NEAR(got, want, 1e-5 * want);
  expect_scaled(params, before, reference_coef(got, max_norm));
  auto after = grads_of(params);
  for (size_t k = 0; k < per; ++k) EXPECT_EQ(after[k], after[k + per]) << "parameter " << k;
  nn::clip_grad_value_(params, 1e-3);
  after = grads_of(params);
  for (size_t k = 0; k < per; ++k) EXPECT_EQ(after[k], after[k + per]) << "parameter " << k;
  // An optimizer step from the clipped gradients keeps the replicas' weights equal too.
  galley::optim::SGD opt(params, {.learning_rate = 0.1});
  opt.step();
  for (size_t k = 0; k < per; ++k)
    EXPECT_EQ(params[k].to_vector(), params[k + per].to_vector()) << "parameter " << k;
}

// ---------------------------------------------------------------------------------------------
// 16-bit gradients: widened for the norm (accumulated in double), scaled or clamped in float32
// and rounded once.

namespace {

// The parameters of params_with_grads with their gradients rounded to `dtype`, and float32
// copies holding the same (widened) gradient values.
std::pair<std::vector<Tensor>, std::vector<Tensor>> sixteen_bit_and_float32(
    const std::vector<int64_t>& sizes, galley::DType dtype, float scale) {
  auto base = params_with_grads(sizes, scale);
  std::vector<Tensor> low, wide;
  for (auto& p : base) {
    Tensor g16 = p.grad().to(dtype);
    Tensor a = galley::zeros(p.shape(), dtype), b = galley::zeros(p.shape());
    a.set_requires_grad(true);
    b.set_requires_grad(true);
    a.set_grad(g16);
    b.set_grad(g16.to(galley::DType::Float32));
    low.push_back(a);
    wide.push_back(b);
  }
  return {low, wide};
}

std::vector<std::vector<float>> widened_grads(const std::vector<Tensor>& params) {
  std::vector<std::vector<float>> out;
  for (auto& p : params) out.push_back(p.grad().to(galley::DType::Float32).to_vector());
  return out;
}

}  // namespace

TEST(ClipGradNorm16Bit, BFloat16AndFloat16NormsMatchFloat32AndScaleRoundsOnce) {
  for (galley::DType dtype : {galley::DType::BFloat16, galley::DType::Float16})
    for (double p : {2.0, 1.0, 3.0, double(INFINITY)}) {
      const std::string what =
          std::string(dtype == galley::DType::BFloat16 ? "bfloat16" : "float16") + " norm_type " +
          std::to_string(p);
      auto [low, wide] = sixteen_bit_and_float32(kSizes, dtype, 0.5f);
      const auto before = widened_grads(low);
      const double max_norm = reference_norm(before, p) / 3;
      const float got = nn::clip_grad_norm_(low, max_norm, {.norm_type = p});
      const float want = nn::clip_grad_norm_(wide, max_norm, {.norm_type = p});
      // Both in double over the same values, only the summation order differs.
      EXPECT_NEAR(got, want, 1e-6 * want) << what;
      EXPECT_NEAR(got, reference_norm(before, p), 1e-5 * want) << what;
      // Each 16-bit gradient is the widened one times the float32 coefficient, rounded once.
      const float coef = reference_coef(got, max_norm);
      for (size_t k = 0; k < low.size(); ++k) {
        EXPECT_EQ(low[k].grad().dtype(), dtype) << what;
        std::vector<float> scaled = before[k];
        for (float& v : scaled) v *= coef;
        const int64_t n = int64_t(scaled.size());
        EXPECT_EQ(low[k].grad().to(galley::DType::Float32).to_vector(),
                  Tensor::from_vector(scaled, {n}).to(dtype).to(galley::DType::Float32).to_vector())
            << what << ", tensor " << k;
      }
    }
}

TEST(ClipGradNorm16Bit, MixedDtypesGiveOneNormOverAll) {
  auto [low, wide] = sixteen_bit_and_float32({100, 9000, 7}, galley::DType::BFloat16, 1.f);
  std::vector<Tensor> mixed{wide[0], low[1], wide[2]};
  const double want = reference_norm(widened_grads(mixed), 2.0);
  EXPECT_NEAR(nn::clip_grad_norm_(mixed, 1e9), want, 1e-6 * want);
  EXPECT_NEAR(nn::clip_grad_norm_(mixed, want / 2), want, 1e-6 * want);
  EXPECT_NEAR(reference_norm(widened_grads(mixed), 2.0), want / 2, 1e-2 * want);
  EXPECT_EQ(mixed[1].grad().dtype(), galley::DType::BFloat16);
}

TEST(ClipGradNorm16Bit, ANonFiniteBFloat16GradientIsNamed) {
  auto [low, wide] = sixteen_bit_and_float32({10, 300, 30}, galley::DType::BFloat16, 1.f);
  auto v = low[1].grad().to(galley::DType::Float32).to_vector();
  v[271] = kInf;
  low[1].set_grad(Tensor::from_vector(v, {300}).to(galley::DType::BFloat16));
  expect_contains(error_of([&] { nn::clip_grad_norm_(low, 1.0); }),
                  {"is inf", "parameter with a non-finite gradient is number 1", "[300]"});
  v[271] = kNaN;
  low[1].set_grad(Tensor::from_vector(v, {300}).to(galley::DType::BFloat16));
  expect_contains(error_of([&] { nn::clip_grad_norm_(low, 1.0); }),
                  {"is nan", "parameter with a non-finite gradient is number 1"});
}

TEST(ClipGradValue16Bit, ClampsFloat16AndBFloat16) {
  for (galley::DType dtype : {galley::DType::BFloat16, galley::DType::Float16}) {
    auto [low, wide] = sixteen_bit_and_float32({5000, 3}, dtype, 2.f);
    nn::clip_grad_value_(low, 0.7);
    nn::clip_grad_value_(wide, 0.7);
    for (size_t k = 0; k < low.size(); ++k) {
      EXPECT_EQ(low[k].grad().dtype(), dtype);
      EXPECT_EQ(low[k].grad().to(galley::DType::Float32).to_vector(),
                wide[k].grad().to(dtype).to(galley::DType::Float32).to_vector());
    }
  }
}
