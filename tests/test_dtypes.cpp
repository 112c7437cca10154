// bfloat16 and float16 through the ops that take them: conversions, the elementwise ops forward
// and backward (each computed in float32 and rounded once, so bit for bit the float32 op on the
// widened inputs, rounded), gradients in the parameter's dtype, and the errors of a dtype
// mismatch. The CPU-vs-CUDA half of each case runs where a GPU is present.
#include <gtest/gtest.h>

#include <galley/galley.h>

#include <cmath>
#include <cstring>
#include <functional>
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
};

const std::vector<UnaryCase>& unary_cases() {
  static const std::vector<UnaryCase> cases = {
      {"exp", [](const Tensor& x) { return galley::exp(x); }, -3.f, 3.f},
      {"log", [](const Tensor& x) { return galley::log(x); }, 0.1f, 5.f},
      {"pow", [](const Tensor& x) { return galley::pow(x, 1.7f); }, 0.1f, 3.f},
      {"relu", [](const Tensor& x) { return galley::relu(x); }, -2.f, 2.f},
      {"neg", [](const Tensor& x) { return galley::neg(x); }, -2.f, 2.f},
      {"add_scalar", [](const Tensor& x) { return galley::add(x, 0.75f); }, -2.f, 2.f},
      {"mul_scalar", [](const Tensor& x) { return galley::mul(x, -1.25f); }, -2.f, 2.f},
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
      if (std::string(c.name) == "exp" || std::string(c.name) == "log" ||
          std::string(c.name) == "pow")
        continue;  // the GPU's exp/log/pow may differ from the host's in the last float32 bit
      SCOPED_TRACE(std::string(c.name) + " in " + galley::dtype_name(dtype));
      EXPECT_EQ(bits(c.op(a.to(gpu))), bits(c.op(a)));
    }
  }
}

}  // namespace
