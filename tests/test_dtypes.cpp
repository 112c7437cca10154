// bfloat16 and float16 through the ops that take them: conversions, the elementwise ops forward
// and backward (each computed in float32 and rounded once, so bit for bit the float32 op on the
// widened inputs, rounded), the ops on float32 kernels (matmul, linear, conv2d, bias_relu,
// max_pool2d, cross_entropy, argmax) against the float32 op, gradients in the parameter's dtype,
// a bfloat16 network, and the errors of a dtype mismatch. The CPU-vs-CUDA half of each case runs
// where a GPU is present.
#include <gtest/gtest.h>

#include <galley/galley.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "test_util.h"

namespace {

using galley::DType;
using galley::Shape;
using galley::Tensor;
using testutil::error_of;
using testutil::expect_contains;

const DType kHalfTypes[] = {DType::BFloat16, DType::Float16};

// Relative precision of one rounding (half an ulp at 1).
double epsilon(DType t) {
  return t == DType::BFloat16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
}

std::vector<uint16_t> bits(const Tensor& t) {
  std::vector<uint16_t> out(static_cast<size_t>(t.numel()));
  t.contiguous().copy_to_host(out.data());
  return out;
}

// Values in [lo, hi), already representable in `dtype`, so that the float32 reference sees the
// very inputs the 16-bit op sees.
Tensor representable(const Shape& shape, DType dtype, float lo, float hi, uint64_t seed) {
  galley::Generator gen(seed);
  return galley::uniform(shape, lo, hi, gen).to(dtype).to(DType::Float32);
}

struct UnaryCase {
  const char* name;
  std::function<Tensor(const Tensor&)> op;
  float lo, hi;  // input range (log and pow want positive inputs)
  // Computed with exp, log, pow, erf or tanh, whose GPU and host forms may differ in the last
  // float32 bit (and so, rarely, in the 16-bit result).
  bool libm = false;
};

const std::vector<UnaryCase>& unary_cases() {
  static const std::vector<UnaryCase> cases = {
      {"exp", [](const Tensor& x) { return galley::exp(x); }, -3.f, 3.f, true},
      {"log", [](const Tensor& x) { return galley::log(x); }, 0.1f, 5.f, true},
      {"pow", [](const Tensor& x) { return galley::pow(x, 1.7f); }, 0.1f, 3.f, true},
      {"relu", [](const Tensor& x) { return galley::relu(x); }, -2.f, 2.f},
      {"neg", [](const Tensor& x) { return galley::neg(x); }, -2.f, 2.f},
      {"add_scalar", [](const Tensor& x) { return galley::add(x, 0.75f); }, -2.f, 2.f},
      {"mul_scalar", [](const Tensor& x) { return galley::mul(x, -1.25f); }, -2.f, 2.f},
      {"gelu", [](const Tensor& x) { return galley::gelu(x); }, -4.f, 4.f, true},
      {"gelu_tanh", [](const Tensor& x) { return galley::gelu(x, galley::GeluApproximate::Tanh); },
       -4.f, 4.f, true},
      {"silu", [](const Tensor& x) { return galley::silu(x); }, -4.f, 4.f, true},
      // sigmoid's and tanh's backward read the rounded output: ranges where their slope is not
      // small beside that rounding (as in PyTorch, whose 16-bit backward reads it too)
      {"sigmoid", [](const Tensor& x) { return galley::sigmoid(x); }, -1.5f, 1.5f, true},
      {"tanh", [](const Tensor& x) { return galley::tanh(x); }, -1.f, 1.f, true},
      {"leaky_relu", [](const Tensor& x) { return galley::leaky_relu(x, 0.2f); }, -2.f, 2.f},
  };
  return cases;
}

TEST(Dtypes, UnaryOpsAreTheFloat32OpRoundedOnce) {
  for (DType dtype : kHalfTypes) {
    for (const UnaryCase& c : unary_cases()) {
      SCOPED_TRACE(std::string(c.name) + " in " + galley::dtype_name(dtype));
      // 70000 elements: several worker-thread chunks and a tail shorter than a stage block.
      const Tensor x = representable({70001}, dtype, c.lo, c.hi, 11);
      const Tensor low = c.op(x.to(dtype));
      ASSERT_EQ(low.dtype(), dtype);
      EXPECT_EQ(bits(low), bits(c.op(x).to(dtype)));
    }
  }
}

TEST(Dtypes, UnaryGradientsComeInTheInputsDtypeWithinItsPrecision) {
  for (DType dtype : kHalfTypes) {
    for (const UnaryCase& c : unary_cases()) {
      SCOPED_TRACE(std::string(c.name) + " in " + galley::dtype_name(dtype));
      const Tensor x32 = representable({257}, dtype, c.lo, c.hi, 12);
      Tensor a = x32.detach().set_requires_grad();
      galley::sum(c.op(a)).backward();
      Tensor b = x32.to(dtype).detach().set_requires_grad();
      galley::sum(c.op(b)).backward();
      ASSERT_EQ(b.grad().dtype(), dtype);
      const std::vector<float> want = a.grad().to_vector();
      const std::vector<float> got = b.grad().to(DType::Float32).to_vector();
      // The backward rounds its output and each intermediate: a few roundings of error.
      for (size_t i = 0; i < want.size(); ++i)
        ASSERT_NEAR(got[i], want[i], 4 * epsilon(dtype) * (std::abs(want[i]) + 1e-3))
            << "element " << i;
    }
  }
}

struct BinaryCase {
  const char* name;
  std::function<Tensor(const Tensor&, const Tensor&)> op;
};

const std::vector<BinaryCase>& binary_cases() {
  static const std::vector<BinaryCase> cases = {
      {"add", [](const Tensor& a, const Tensor& b) { return galley::add(a, b); }},
      {"sub", [](const Tensor& a, const Tensor& b) { return galley::sub(a, b); }},
      {"mul", [](const Tensor& a, const Tensor& b) { return galley::mul(a, b); }},
      {"div", [](const Tensor& a, const Tensor& b) { return galley::div(a, b); }},
  };
  return cases;
}

// Same shapes, a scalar, and broadcasts on either side and both.
const std::vector<std::pair<Shape, Shape>>& binary_shapes() {
  static const std::vector<std::pair<Shape, Shape>> shapes = {
      {{300, 301}, {300, 301}}, {{300, 301}, {1}},    {{4, 3, 500}, {3, 1}},
      {{4, 1, 500}, {3, 1}},    {{500}, {2, 3, 500}}, {{8, 600}, {600}},
  };
  return shapes;
}

TEST(Dtypes, BinaryOpsAreTheFloat32OpRoundedOnce) {
  for (DType dtype : kHalfTypes) {
    for (const BinaryCase& c : binary_cases()) {
      for (const auto& [sa, sb] : binary_shapes()) {
        SCOPED_TRACE(std::string(c.name) + " " + galley::shape_str(sa) + " with " +
                     galley::shape_str(sb) + " in " + galley::dtype_name(dtype));
        const Tensor a = representable(sa, dtype, -3.f, 3.f, 21);
        const Tensor b = representable(sb, dtype, 0.5f, 3.f, 22);  // no division by ~0
        const Tensor low = c.op(a.to(dtype), b.to(dtype));
        ASSERT_EQ(low.dtype(), dtype);
        EXPECT_EQ(bits(low), bits(c.op(a, b).to(dtype)));
      }
    }
  }
}

// The float32 gradients of op with respect to a and b expanded to the output's shape: the terms a
// broadcast side's gradient sums.
std::pair<Tensor, Tensor> unreduced_gradients(const BinaryCase& c, const Tensor& a,
                                              const Tensor& b) {
  const Shape out = c.op(a, b).shape();
  Tensor af = galley::add(a, galley::zeros(out)).detach().set_requires_grad();
  Tensor bf = galley::add(b, galley::zeros(out)).detach().set_requires_grad();
  galley::sum(c.op(af, bf)).backward();
  return {af.grad(), bf.grad()};
}

float max_abs(const Tensor& t) {
  float m = 0;
  for (float v : t.to_vector()) m = std::max(m, std::abs(v));
  return m;
}

TEST(Dtypes, BinaryGradientsComeInTheInputsDtypeWithinItsPrecision) {
  for (DType dtype : kHalfTypes) {
    for (const BinaryCase& c : binary_cases()) {
      for (const auto& [sa, sb] : binary_shapes()) {
        SCOPED_TRACE(std::string(c.name) + " " + galley::shape_str(sa) + " with " +
                     galley::shape_str(sb) + " in " + galley::dtype_name(dtype));
        const Tensor a32 = representable(sa, dtype, -3.f, 3.f, 31);
        const Tensor b32 = representable(sb, dtype, 0.5f, 3.f, 32);
        Tensor a = a32.detach().set_requires_grad(), b = b32.detach().set_requires_grad();
        galley::sum(c.op(a, b)).backward();
        Tensor a16 = a32.to(dtype).detach().set_requires_grad();
        Tensor b16 = b32.to(dtype).detach().set_requires_grad();
        // Seeded with ones rather than through a sum, which float16 could not hold.
        Tensor out16 = c.op(a16, b16);
        out16.backward(galley::ones(out16.shape(), dtype));
        const auto [terms_a, terms_b] = unreduced_gradients(c, a32, b32);
        for (auto [want, got, terms] : {std::tuple{a.grad(), a16.grad(), terms_a},
                                        std::tuple{b.grad(), b16.grad(), terms_b}}) {
          ASSERT_EQ(got.dtype(), dtype);
          const std::vector<float> w = want.to_vector(), g = got.to(DType::Float32).to_vector();
          // Each of the k terms a broadcast side sums carries a few roundings; their sum is
          // rounded once: |error| <= 4 eps (|sum| + k max|term|).
          const double k = double(terms.numel()) / double(want.numel());
          const double bound = 4 * epsilon(dtype) * k * max_abs(terms);
          for (size_t i = 0; i < w.size(); ++i) {
            const double tol = 4 * epsilon(dtype) * std::abs(w[i]) + bound;
            // A float16 sum past 65504 overflows to infinity, as in PyTorch.
            if (dtype == DType::Float16 && std::abs(w[i]) + tol > 65504 && std::isinf(g[i]))
              continue;
            ASSERT_NEAR(g[i], w[i], tol) << "element " << i;
          }
        }
      }
    }
  }
}

TEST(Dtypes, ABroadcastGradientIsSummedInFloat32) {
  // 3000 ones summed: a bfloat16 or float16 accumulator would stop growing at 256 or 2048; the
  // float32 one reaches 3000, rounded once.
  for (DType dtype : kHalfTypes) {
    Tensor a = galley::ones({3000}, dtype).set_requires_grad();
    Tensor b = galley::ones({1}, dtype).set_requires_grad();
    galley::sum(galley::add(a, b)).backward();
    EXPECT_EQ(b.grad().to(DType::Float32).to_vector(),
              galley::full({1}, 3000.f).to(dtype).to(DType::Float32).to_vector())
        << galley::dtype_name(dtype);
    EXPECT_EQ(galley::sum(a).to(DType::Float32).to_vector(),
              galley::full({1}, 3000.f).to(dtype).to(DType::Float32).to_vector());
  }
}

TEST(Dtypes, MixedDtypesAreAnErrorNamingBoth) {
  const Tensor a = galley::ones({2, 3});
  const Tensor b = galley::ones({2, 3}, DType::BFloat16);
  expect_contains(error_of([&] { galley::add(a, b); }), {"add", "float32", "bfloat16", "[2, 3]"});
  expect_contains(error_of([&] { galley::div(b, galley::ones({3}, DType::Float16)); }),
                  {"div", "bfloat16", "float16"});
  expect_contains(error_of([&] { galley::exp(galley::ones({2}, DType::Int64)); }),
                  {"exp", "int64"});
}

TEST(Dtypes, ToRecordsAGradientInTheSourceDtype) {
  Tensor x = galley::full({5}, 1.5f).set_requires_grad();
  Tensor y = galley::mul(x.to(DType::BFloat16), 3.f);
  EXPECT_EQ(y.dtype(), DType::BFloat16);
  galley::sum(y).backward();
  ASSERT_EQ(x.grad().dtype(), DType::Float32);
  EXPECT_EQ(x.grad().to_vector(), std::vector<float>(5, 3.f));
}

TEST(Dtypes, ConversionsBetweenTheHalfTypesGoThroughFloat32) {
  // 1 + 2^-9 is a float16 value that bfloat16 (7 mantissa bits) rounds to 1.
  Tensor h = galley::full({3}, 1.f + std::ldexp(1.f, -9), DType::Float16);
  EXPECT_EQ(h.to(DType::Float32).to_vector()[0], 1.f + std::ldexp(1.f, -9));
  Tensor b = h.to(DType::BFloat16);
  EXPECT_EQ(b.to(DType::Float32).to_vector(), std::vector<float>(3, 1.f));
  EXPECT_EQ(galley::full({1}, 65520.f).to(DType::Float16).item(), INFINITY);
  EXPECT_TRUE(std::isnan(galley::full({1}, NAN).to(DType::BFloat16).item()));
  expect_contains(error_of([&] { galley::ones({2}, DType::Int64).to(DType::BFloat16); }),
                  {"int64", "bfloat16", "float32"});
}

TEST(Dtypes, A16BitTensorPrintsItsValues) {
  const std::string text = galley::full({2}, 1.5f, DType::BFloat16).to_string();
  expect_contains(text, {"1.5000", "bfloat16"});
  expect_contains(galley::full({1}, -2.f, DType::Float16).to_string(), {"-2.0000", "float16"});
}

TEST(Dtypes, OnlyFloatingTensorsTakeGradients) {
  EXPECT_NO_THROW(galley::ones({2}, DType::BFloat16).set_requires_grad());
  EXPECT_NO_THROW(galley::ones({2}, DType::Float16).set_requires_grad());
  expect_contains(error_of([&] { galley::ones({2}, DType::Int64).set_requires_grad(); }),
                  {"set_requires_grad", "int64"});
}

TEST(Dtypes, TheLossGuardReadsA16BitLoss) {
  Tensor x = galley::full({2}, 1.f, DType::BFloat16).set_requires_grad();
  Tensor loss = galley::sum(galley::mul(x, INFINITY));
  expect_contains(error_of([&] { loss.backward(); }), {"backward", "loss", "inf"});
}

TEST(Dtypes, CpuAndCudaAgreeBitForBit) {
  REQUIRE_GPU();
  const galley::Device gpu = galley::Device::cuda(0);
  for (DType dtype : kHalfTypes) {
    const Tensor a = representable({4, 3, 500}, dtype, -3.f, 3.f, 41).to(dtype);
    const Tensor b = representable({3, 1}, dtype, 0.5f, 3.f, 42).to(dtype);
    EXPECT_EQ(bits(a.to(gpu).to(DType::Float32).to(dtype)), bits(a));
    for (const BinaryCase& c : binary_cases()) {
      SCOPED_TRACE(std::string(c.name) + " in " + galley::dtype_name(dtype));
      EXPECT_EQ(bits(c.op(a.to(gpu), b.to(gpu))), bits(c.op(a, b)));
    }
    for (const UnaryCase& c : unary_cases()) {
      if (c.libm) continue;  // the GPU's libm may differ from the host's in the last bit
      SCOPED_TRACE(std::string(c.name) + " in " + galley::dtype_name(dtype));
      EXPECT_EQ(bits(c.op(a.to(gpu))), bits(c.op(a)));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// The ops whose kernels take float32 only: a 16-bit call widens its inputs, runs the float32
// kernels and rounds each result once, forward and backward.

struct KernelCase {
  const char* name;
  std::vector<Shape> shapes;  // one per input; every input is floating and takes a gradient
  std::function<Tensor(const std::vector<Tensor>&)> op;
};

// Labels for logits [6, 5] on the logits' device, one of them ignored (the default
// ignore_index).
Tensor class_labels(const galley::Device& device = galley::Device::cpu()) {
  return Tensor::from_vector(std::vector<int64_t>{0, 4, 2, -100, 1, 4}, {6}).to(device);
}

const std::vector<KernelCase>& kernel_cases() {
  using V = std::vector<Tensor>;
  static const std::vector<KernelCase> cases = {
      {"matmul", {{7, 33}, {33, 9}}, [](const V& t) { return galley::matmul(t[0], t[1]); }},
      {"linear",
       {{2, 5, 33}, {9, 33}, {9}},
       [](const V& t) { return galley::linear(t[0], t[1], t[2]); }},
      {"linear_without_bias",
       {{6, 33}, {9, 33}},
       [](const V& t) { return galley::linear(t[0], t[1]); }},
      {"conv2d",
       {{2, 3, 9, 8}, {4, 3, 3, 3}, {4}},
       [](const V& t) { return galley::conv2d(t[0], t[1], t[2], {.stride = 2, .padding = 1}); }},
      {"conv2d_grouped",
       {{2, 4, 7, 7}, {6, 2, 3, 3}},
       [](const V& t) { return galley::conv2d(t[0], t[1], Tensor(), {.groups = 2}); }},
      {"bias_relu",
       {{2, 4, 5, 6}, {4}},
       [](const V& t) { return galley::bias_relu(t[0], t[1], 1); }},
      {"max_pool2d",
       {{2, 3, 8, 8}},
       [](const V& t) { return galley::max_pool2d(t[0], {.kernel_size = 2}); }},
      {"max_pool2d_padded",
       {{2, 3, 9, 9}},
       [](const V& t) {
         return galley::max_pool2d(t[0], {.kernel_size = 3, .stride = 2, .padding = 1});
       }},
      {"cross_entropy",
       {{6, 5}},
       [](const V& t) { return galley::cross_entropy(t[0], class_labels(t[0].device())); }},
      {"cross_entropy_sum_smoothed",
       {{6, 5}},
       [](const V& t) {
         return galley::cross_entropy(
             t[0], class_labels(t[0].device()),
             {.reduction = galley::Reduction::Sum, .label_smoothing = 0.1f});
       }},
      {"cross_entropy_per_row",
       {{6, 5}},
       [](const V& t) {
         return galley::cross_entropy(t[0], class_labels(t[0].device()),
                                      {.reduction = galley::Reduction::None});
       }},
  };
  return cases;
}

std::vector<Tensor> kernel_inputs(const KernelCase& c, DType dtype, uint64_t seed) {
  std::vector<Tensor> out;
  for (const Shape& s : c.shapes) out.push_back(representable(s, dtype, -2.f, 2.f, seed++));
  return out;
}

std::vector<Tensor> converted(const std::vector<Tensor>& ts, DType dtype) {
  std::vector<Tensor> out;
  for (const Tensor& t : ts) out.push_back(t.to(dtype).detach());
  return out;
}

// `got` (any floating dtype, any device) within `ulps` units in the last place of `dtype` of
// `want` (float32), or within `floor` times the largest |want|. Half an ulp is one rounding.
void expect_within_ulps(const Tensor& got, const Tensor& want, DType dtype, double ulps,
                        double floor = 0) {
  const galley::Device host = galley::Device::cpu();
  const std::vector<float> g = got.to(host).to(DType::Float32).to_vector();
  const std::vector<float> w = want.to(host).to(DType::Float32).to_vector();
  ASSERT_EQ(g.size(), w.size());
  // 1e-6 covers float16's subnormals (6e-8 apart).
  const double abs_floor = floor * max_abs(want.to(host).to(DType::Float32)) + 1e-6;
  for (size_t i = 0; i < w.size(); ++i)
    ASSERT_NEAR(g[i], w[i], 2 * ulps * epsilon(dtype) * std::abs(w[i]) + abs_floor)
        << "element " << i;
}

TEST(Dtypes, Float32KernelOpsAreTheFloat32OpWithinOneRounding) {
  for (DType dtype : kHalfTypes) {
    for (const KernelCase& c : kernel_cases()) {
      SCOPED_TRACE(std::string(c.name) + " in " + galley::dtype_name(dtype));
      const std::vector<Tensor> x = kernel_inputs(c, dtype, 61);
      const Tensor low = c.op(converted(x, dtype));
      ASSERT_EQ(low.dtype(), dtype);
      const Tensor want = c.op(x);
      ASSERT_EQ(low.shape(), want.shape());
      expect_within_ulps(low, want, dtype, 0.5);
    }
  }
}

TEST(Dtypes, Float32KernelOpGradientsComeInTheInputsDtypeWithinOneRounding) {
  for (DType dtype : kHalfTypes) {
    for (const KernelCase& c : kernel_cases()) {
      SCOPED_TRACE(std::string(c.name) + " in " + galley::dtype_name(dtype));
      const std::vector<Tensor> x = kernel_inputs(c, dtype, 71);
      std::vector<Tensor> a = converted(x, DType::Float32), b = converted(x, dtype);
      for (Tensor& t : a) t.set_requires_grad();
      for (Tensor& t : b) t.set_requires_grad();
      const Tensor out32 = c.op(a);
      // A seed with mixed signs, the same values in both dtypes.
      const Tensor seed = representable(out32.shape(), dtype, -1.f, 1.f, 79);
      out32.backward(seed);
      // Each input reaches the op through a 16-bit mul by ones, whose backward refuses a gradient
      // of another dtype: the op itself must hand back 16-bit gradients (a leaf would convert).
      std::vector<Tensor> through;
      for (const Tensor& t : b) through.push_back(galley::mul(t, galley::ones(t.shape(), dtype)));
      c.op(through).backward(seed.to(dtype));
      for (size_t i = 0; i < a.size(); ++i) {
        SCOPED_TRACE("input " + std::to_string(i));
        ASSERT_TRUE(b[i].grad().defined());
        ASSERT_EQ(b[i].grad().dtype(), dtype);
        ASSERT_EQ(b[i].grad().shape(), a[i].grad().shape());
        expect_within_ulps(b[i].grad(), a[i].grad(), dtype, 0.5);
      }
    }
  }
}

TEST(Dtypes, ArgmaxOfA16BitTensorIsTheFloat32ArgmaxInInt64) {
  // Random values, and small integers with ties (where the first index wins).
  const Tensor ties = Tensor::from_vector(
      {0.f, 2.f, 2.f, -1.f, 3.f, 3.f, 1.f, 3.f, -1.f, -1.f, -1.f, -1.f}, {3, 4});
  for (DType dtype : kHalfTypes) {
    for (const Tensor& x : {representable({5, 7, 3}, dtype, -2.f, 2.f, 81), ties.view({3, 2, 2})}) {
      for (int64_t dim : {0, 1, 2, -1}) {
        SCOPED_TRACE(galley::dtype_name(dtype) + " " + galley::shape_str(x.shape()) + " along " +
                     std::to_string(dim));
        const Tensor got = galley::argmax(x.to(dtype), dim);
        ASSERT_EQ(got.dtype(), DType::Int64);
        EXPECT_EQ(got.to_vector<int64_t>(), galley::argmax(x, dim).to_vector<int64_t>());
        EXPECT_EQ(galley::argmax(x.to(dtype), dim, true).shape(),
                  galley::argmax(x, dim, true).shape());
      }
    }
  }
}

TEST(Dtypes, CrossEntropyReturnsTheLossInTheLogitsDtype) {
  const Tensor logits = representable({6, 5}, DType::Float32, -2.f, 2.f, 91);
  for (DType dtype : {DType::Float32, DType::BFloat16, DType::Float16}) {
    for (galley::Reduction r :
         {galley::Reduction::Mean, galley::Reduction::Sum, galley::Reduction::None}) {
      const Tensor loss = galley::cross_entropy(logits.to(dtype), class_labels(), {.reduction = r});
      EXPECT_EQ(loss.dtype(), dtype) << galley::dtype_name(dtype);
    }
    // Every row ignored: a mean over no rows is 0, in the logits' dtype.
    const Tensor none =
        galley::cross_entropy(logits.to(dtype), galley::full({6}, -100.f).to(DType::Int64));
    EXPECT_EQ(none.dtype(), dtype);
    EXPECT_EQ(none.item(), 0.f);
  }
  expect_contains(error_of([&] {
                    galley::cross_entropy(logits.to(DType::BFloat16),
                                          galley::zeros({6}, DType::BFloat16));
                  }),
                  {"cross_entropy", "labels", "int64", "bfloat16"});
}

TEST(Dtypes, Float32KernelOpsOnMixedDtypesAreAnErrorNamingBoth) {
  const Tensor bf = galley::ones({4, 3}, DType::BFloat16);
  expect_contains(error_of([&] {
                    galley::matmul(bf, galley::ones({3, 2}));
                  }),
                  {"matmul", "bfloat16", "float32", "[4, 3]", "[3, 2]"});
  expect_contains(error_of([&] {
                    galley::linear(bf, galley::ones({2, 3}));
                  }),
                  {"linear", "bfloat16", "float32"});
  expect_contains(error_of([&] {
                    galley::linear(bf, galley::ones({2, 3}, DType::BFloat16),
                                   galley::ones({2}, DType::Float16));
                  }),
                  {"linear", "bfloat16", "float16"});
  const Tensor x16 = galley::ones({1, 2, 4, 4}, DType::Float16);
  expect_contains(error_of([&] {
                    galley::conv2d(x16, galley::ones({3, 2, 3, 3}));
                  }),
                  {"conv2d", "float16", "float32"});
  expect_contains(error_of([&] {
                    galley::conv2d(x16, galley::ones({3, 2, 3, 3}, DType::Float16),
                                   galley::ones({3}, DType::BFloat16));
                  }),
                  {"conv2d", "float16", "bfloat16"});
  expect_contains(error_of([&] { galley::bias_relu(x16, galley::ones({2}), 1); }),
                  {"bias_relu", "float16", "float32"});
  const Tensor ints = galley::ones({1, 1, 4, 4}, DType::Int64);
  expect_contains(error_of([&] { galley::max_pool2d(ints, {.kernel_size = 2}); }),
                  {"max_pool2d", "int64"});
  expect_contains(error_of([&] { galley::argmax(ints, 1); }), {"argmax", "int64"});
  expect_contains(error_of([&] {
                    galley::cross_entropy(ints.view({4, 4}), class_labels());
                  }),
                  {"cross_entropy", "int64"});
  // Through a layer the message also names the layer.
  galley::nn::Linear fc(3, 2);
  expect_contains(error_of([&] { fc(bf); }), {"Linear", "bfloat16", "float32"});
}

// Conv2D -> ReLU -> MaxPool2D -> flatten -> Linear (a fused Linear + ReLU, then a plain one).
std::shared_ptr<galley::nn::Sequential> small_cnn() {
  namespace nn = galley::nn;
  return std::make_shared<nn::Sequential>(
      std::make_shared<nn::Conv2D>(3, 4, 3), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::MaxPool2D>(2), std::make_shared<nn::Flatten>(1),
      std::make_shared<nn::Linear>(4 * 3 * 3, 8, galley::nn::LinearOptions{.relu = true}),
      std::make_shared<nn::Linear>(8, 5));
}

TEST(Dtypes, ABFloat16ConvNetRunsForwardAndBackwardInBFloat16) {
  auto net = small_cnn();
  net->to(DType::BFloat16);
  const Tensor x = representable({2, 3, 8, 8}, DType::BFloat16, -1.f, 1.f, 101);
  const Tensor labels = Tensor::from_vector(std::vector<int64_t>{1, 3}, {2});
  const Tensor logits = (*net)(x.to(DType::BFloat16));
  ASSERT_EQ(logits.dtype(), DType::BFloat16);
  const Tensor loss = galley::nn::CrossEntropyLoss()(logits, labels);
  ASSERT_EQ(loss.dtype(), DType::BFloat16);
  loss.backward();
  std::vector<Tensor> grads16;
  for (const auto& [name, p] : net->named_parameters()) {
    SCOPED_TRACE(name);
    ASSERT_EQ(p.dtype(), DType::BFloat16);
    ASSERT_TRUE(p.grad().defined());
    ASSERT_EQ(p.grad().dtype(), DType::BFloat16);
    for (float v : p.grad().to(DType::Float32).to_vector()) ASSERT_TRUE(std::isfinite(v));
    grads16.push_back(p.grad().to(DType::Float32));
  }
  // The same (bfloat16-valued) weights in float32: the gradients agree to bfloat16's precision,
  // compounded over the layers' rounded activations.
  net->zero_grad();
  net->to(DType::Float32);
  galley::nn::CrossEntropyLoss()((*net)(x), labels).backward();
  const std::vector<Tensor> params = net->parameters();
  ASSERT_EQ(params.size(), grads16.size());
  for (size_t i = 0; i < params.size(); ++i) {
    const std::vector<float> want = params[i].grad().to_vector(), got = grads16[i].to_vector();
    const double tol = 0.05 * max_abs(params[i].grad()) + 1e-4;
    for (size_t j = 0; j < want.size(); ++j)
      ASSERT_NEAR(got[j], want[j], tol) << "parameter " << i << " element " << j;
  }
}

TEST(Dtypes, Float32KernelOpsAgreeBetweenCpuAndCuda) {
  REQUIRE_GPU();
  const galley::Device gpu = galley::Device::cuda(0);
  for (DType dtype : kHalfTypes) {
    for (const KernelCase& c : kernel_cases()) {
      SCOPED_TRACE(std::string(c.name) + " in " + galley::dtype_name(dtype));
      std::vector<Tensor> host = converted(kernel_inputs(c, dtype, 111), dtype), dev;
      for (const Tensor& t : host) dev.push_back(t.to(gpu).detach());
      for (Tensor& t : host) t.set_requires_grad();
      for (Tensor& t : dev) t.set_requires_grad();
      const Tensor out_host = c.op(host), out_dev = c.op(dev);
      ASSERT_EQ(out_dev.dtype(), dtype);
      ASSERT_EQ(out_dev.device(), gpu);
      // cuBLAS and cuDNN sum in another order: float32 results a few float32 ulps apart, which
      // the rounding to 16 bits may put one ulp apart (or, near 0, leave a float32-sized gap).
      expect_within_ulps(out_dev, out_host, dtype, 1.5, 1e-4);
      // A tie in a pooling window may send the gradient to another of the equal inputs.
      if (std::string(c.name).rfind("max_pool2d", 0) == 0) continue;
      const Tensor seed = representable(out_host.shape(), dtype, -1.f, 1.f, 119).to(dtype);
      out_host.backward(seed);
      out_dev.backward(seed.to(gpu));
      for (size_t i = 0; i < host.size(); ++i) {
        SCOPED_TRACE("input " + std::to_string(i));
        ASSERT_EQ(dev[i].grad().dtype(), dtype);
        ASSERT_EQ(dev[i].grad().device(), gpu);
        expect_within_ulps(dev[i].grad(), host[i].grad(), dtype, 1.5, 1e-4);
      }
    }
  }
}

}  // namespace
