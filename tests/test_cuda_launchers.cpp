// The CUDA launchers of the elementwise, reduction, softmax, loss, pooling and optimizer kernels
// against the CPU kernels they mirror (the oracle), called directly with raw pointers: odd sizes,
// misaligned pointers, NaNs and infinities, in-place calls, bit-exact sums and their determinism,
// split sums in CUDA graphs and on concurrent streams, and the launchers no op exposes (column
// sums, broadcasts, fill_scaled, the optimizer updates). The op-level comparison of every op,
// backend and dtype with the CPU float32 result is the table in test_backend_ops.cpp. Compiled
// always; skipped with the reason when there is no GPU (or the build has no CUDA backend).
//
// Tolerances: results that are the same float operations in the same order (binary ops, relu,
// broadcasts, pooling, argmax, gathers) must be bit-identical. Sums use values that are
// multiples of 1/16 no larger than 8, so every partial sum is exact in float and any summation
// order gives the same bits: they too must be bit-identical, which catches a missing or doubled
// element that a tolerance would hide; sum_all (double accumulation) is also checked on normal
// data to 1e-6 of the sum of magnitudes. Transcendentals differ by the libraries' documented
// ulp errors (CUDA expf 2 ulp, logf 1 ulp, powf 4 ulp; glibc under 1 ulp), and expressions of the
// form a * b + c may be fused into one FMA by either compiler (1 ulp): those are compared in ulps
// or relative to the magnitudes that enter the last operation.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "galley/galley.h"
#include "galley/runtime/cuda.h"
#include "kernels/batch_norm.h"
#include "kernels/bias_relu.h"
#include "kernels/binary.h"
#include "kernels/cross_entropy.h"
#include "kernels/gemm.h"
#include "kernels/max_pool2d.h"
#include "kernels/optimizer_update.h"
#include "kernels/reduce.h"
#include "kernels/softmax.h"
#include "kernels/unary.h"
#ifdef GALLEY_HAVE_CUDA
#include "src/runtime/device_memory.h"
#endif

using galley::Device;
using galley::Shape;
using galley::Tensor;

#ifdef GALLEY_HAVE_CUDA
namespace {

namespace cpu = galley::kernels::cpu;
namespace gk = galley::kernels::cuda;
using galley::kernels::BinaryOp;
using galley::kernels::UnaryOp;

const Device gpu = Device::cuda(0);
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// grad * p * a^(p-1) by the host kernel.
std::vector<float> host_pow_backward(const std::vector<float>& grad, const std::vector<float>& a,
                                     float p) {
  std::vector<float> out(a.size());
  cpu::pow_backward(galley::DType::Float32, grad.data(), a.data(), out.data(),
                    static_cast<int64_t>(a.size()), p);
  return out;
}

std::mt19937& rng() {
  static std::mt19937 r(20240611);
  return r;
}

int64_t numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

std::vector<float> normal(int64_t n, float scale = 1.f) {
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng());
  return v;
}

std::vector<float> uniform(int64_t n, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng());
  return v;
}

// Multiples of 1/16 in [-8, 8]: partial sums of up to 2^19 of them are exact in float.
std::vector<float> exact_values(int64_t n) {
  std::uniform_int_distribution<int> d(-128, 128);
  std::vector<float> v(n);
  for (float& x : v) x = float(d(rng())) / 16.f;
  return v;
}

// Small integers: many ties for max and argmax.
std::vector<float> small_ints(int64_t n, int hi) {
  std::uniform_int_distribution<int> d(0, hi - 1);
  std::vector<float> v(n);
  for (float& x : v) x = float(d(rng()));
  return v;
}

// Overwrites about one element in `every` with NaN, +inf or -inf.
void sprinkle_specials(std::vector<float>& v, int every) {
  std::uniform_int_distribution<int> d(0, every - 1);
  const float specials[] = {kNaN, kInf, -kInf};
  for (size_t i = 0; i < v.size(); ++i)
    if (d(rng()) == 0) v[i] = specials[i % 3];
}

// Makes sure nothing galley queued (copies, fills) is still running before a launcher runs on
// the default stream, and that the launcher finished before results are read.
void sync() {
  galley::cuda::synchronize(gpu);
}

// A device copy of host floats, `pad` elements after the start of its allocation, so that
// get() is misaligned for 16-byte loads when pad is odd.
class DeviceFloats {
 public:
  explicit DeviceFloats(const std::vector<float>& v, int64_t pad = 0) : pad_(pad), n_(v.size()) {
    std::vector<float> padded(pad, 0.f);
    padded.insert(padded.end(), v.begin(), v.end());
    if (padded.empty()) padded.push_back(0.f);
    t_ = Tensor::from_vector(padded, {int64_t(padded.size())}).to(gpu);
    sync();
  }
  static DeviceFloats zeros(int64_t n, int64_t pad = 0) {
    return DeviceFloats(std::vector<float>(n, 0.f), pad);
  }
  float* get() const { return static_cast<float*>(t_.raw_data()) + pad_; }
  std::vector<float> host() const {
    sync();
    std::vector<float> all = t_.to(Device::cpu()).to_vector();
    return std::vector<float>(all.begin() + pad_, all.begin() + pad_ + n_);
  }
  // The same bytes read as int32 (pooling indices).
  std::vector<int32_t> host_int32() const {
    std::vector<float> f = host();
    std::vector<int32_t> out(f.size());
    std::memcpy(out.data(), f.data(), f.size() * sizeof(float));
    return out;
  }

 private:
  Tensor t_;
  int64_t pad_;
  int64_t n_;
};

class DeviceInts {
 public:
  explicit DeviceInts(const std::vector<int64_t>& v) : n_(v.size()) {
    std::vector<int64_t> padded = v;
    if (padded.empty()) padded.push_back(0);
    t_ = Tensor::from_vector(padded, {int64_t(padded.size())}).to(gpu);
    sync();
  }
  static DeviceInts zeros(int64_t n) { return DeviceInts(std::vector<int64_t>(n, 0)); }
  int64_t* get() const { return static_cast<int64_t*>(t_.raw_data()); }
  std::vector<int64_t> host() const {
    sync();
    std::vector<int64_t> all = t_.to(Device::cpu()).to_vector<int64_t>();
    all.resize(n_);
    return all;
  }

 private:
  Tensor t_;
  int64_t n_;
};

bool same(float a, float b) {
  return a == b || (std::isnan(a) && std::isnan(b));
}

// Distance in representable floats between two finite values.
int64_t ulps(float a, float b) {
  auto key = [](float f) {
    int32_t i;
    std::memcpy(&i, &f, sizeof i);
    return i < 0 ? int64_t(INT32_MIN) - i : int64_t(i);
  };
  return std::llabs(key(a) - key(b));
}

// Reports at most a few mismatches per check, with their index and both values.
class Mismatches {
 public:
  explicit Mismatches(std::string what) : what_(std::move(what)) {}
  ~Mismatches() { EXPECT_EQ(count_, 0) << what_ << ": " << count_ << " mismatching element(s)"; }
  template <typename T>
  void add(size_t i, T got, T want) {
    if (count_++ < 5) ADD_FAILURE() << what_ << " [" << i << "]: got " << got << ", want " << want;
  }

 private:
  std::string what_;
  int64_t count_ = 0;
};

void expect_same(const std::vector<float>& got, const std::vector<float>& want,
                 const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  Mismatches m(what);
  for (size_t i = 0; i < got.size(); ++i)
    if (!same(got[i], want[i])) m.add(i, got[i], want[i]);
}

template <typename T>
void expect_equal(const std::vector<T>& got, const std::vector<T>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  Mismatches m(what);
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i] != want[i]) m.add(i, got[i], want[i]);
}

void expect_ulps(const std::vector<float>& got, const std::vector<float>& want, int64_t max_ulps,
                 const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  Mismatches m(what);
  for (size_t i = 0; i < got.size(); ++i) {
    if (same(got[i], want[i])) continue;
    if (std::isfinite(got[i]) && std::isfinite(want[i]) && ulps(got[i], want[i]) <= max_ulps)
      continue;
    m.add(i, got[i], want[i]);
  }
}

// |got - want| <= tol[i] (NaN matches NaN, infinities must be equal).
void expect_within(const std::vector<float>& got, const std::vector<float>& want,
                   const std::vector<double>& tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  Mismatches m(what);
  for (size_t i = 0; i < got.size(); ++i) {
    if (same(got[i], want[i])) continue;
    if (std::isfinite(got[i]) && std::isfinite(want[i]) &&
        std::abs(double(got[i]) - double(want[i])) <= tol[i])
      continue;
    m.add(i, got[i], want[i]);
  }
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want, double rel,
                  double abs, const std::string& what) {
  std::vector<double> tol(want.size());
  for (size_t i = 0; i < want.size(); ++i) tol[i] = abs + rel * std::abs(double(want[i]));
  expect_within(got, want, tol, what);
}

std::string shape_text(const Shape& s) {
  std::string t = "[";
  for (size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + "]";
}

// `s` with leading 1s up to `rank` dimensions.
Shape aligned(const Shape& s, size_t rank) {
  Shape out(rank - s.size(), 1);
  out.insert(out.end(), s.begin(), s.end());
  return out;
}

}  // namespace
#endif

#ifdef GALLEY_HAVE_CUDA
#define REQUIRE_GPU()             \
  if (!galley::cuda::available()) \
  GTEST_SKIP() << "no CUDA device here: the CUDA kernels are compiled but cannot run"
#else
#define REQUIRE_GPU() \
  GTEST_SKIP() << "this build has no CUDA backend (GALLEY_HAVE_CUDA is not defined)"
#endif

// ----------------------------------------------------------------------------------------------
// binary.cu

TEST(CudaLaunchers, BinaryOpsMatchTheCpuWithBroadcasting) {
  REQUIRE_GPU();
#ifdef GALLEY_HAVE_CUDA
  struct Case {
    Shape a, b;
    int64_t pad;
  };
  const Case cases[] = {
      {{7, 13}, {7, 13}, 0},
      {{1037}, {1037}, 1},
      {{1037}, {1}, 0},
      {{1}, {1037}, 1},
      {{}, {3}, 0},
      {{}, {}, 0},
      {{4, 5, 6}, {5, 1}, 0},
      {{2, 3, 4, 5}, {1, 3, 1, 1}, 0},
      {{3, 1, 5}, {1, 4, 1}, 0},
      {{6, 1}, {1, 7}, 1},
      {{2049, 3}, {2049, 1}, 0},
      {{2, 1, 3, 1, 5}, {4, 1, 2, 1}, 0},
      {{9000001}, {1}, 0},
      {{3000001}, {3000001}, 0},
  };
  const BinaryOp ops[] = {BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div};
  Tensor (*host_ops[])(const Tensor&, const Tensor&) = {galley::add, galley::sub, galley::mul,
                                                        galley::div};
  const char* names[] = {"add", "sub", "mul", "div"};
  for (const Case& c : cases) {
    std::vector<float> va = normal(numel(c.a)), vb = normal(numel(c.b));
    sprinkle_specials(va, 97);
    sprinkle_specials(vb, 89);
    if (vb.size() > 5) vb[5] = 0.f;  // x / 0
    const Tensor ta = Tensor::from_vector(va, c.a), tb = Tensor::from_vector(vb, c.b);
    const DeviceFloats da(va, c.pad), db(vb, c.pad);
    for (int op = 0; op < 4; ++op) {
      const Tensor want = host_ops[op](ta, tb);
      const Shape out = want.shape();
      const Shape as = aligned(c.a, out.size()), bs = aligned(c.b, out.size());
      DeviceFloats dout = DeviceFloats::zeros(want.numel(), c.pad);
      gk::binary(ops[op], galley::DType::Float32, da.get(), as.data(), db.get(), bs.data(),
                 dout.get(), out.data(), static_cast<int>(out.size()), nullptr);
      expect_same(dout.host(), want.to_vector(),
                  std::string(names[op]) + " " + shape_text(c.a) + " " + shape_text(c.b));
    }
  }
#endif
}

TEST(CudaLaunchers, AddInplaceMatchesTheCpu) {
  REQUIRE_GPU();
#ifdef GALLEY_HAVE_CUDA
  for (int64_t n : {1, 7, 1024, 1000003})
    for (int64_t pad : {0, 1}) {
      std::vector<float> acc = normal(n), g = normal(n);
      sprinkle_specials(g, 101);
      std::vector<float> want = acc;
      cpu::add_inplace(galley::DType::Float32, want.data(), g.data(), n);
      DeviceFloats dacc(acc, pad), dg(g, pad);
      gk::add_inplace(galley::DType::Float32, dacc.get(), dg.get(), n, nullptr);
      expect_same(dacc.host(), want,
                  "add_inplace n=" + std::to_string(n) + " pad=" + std::to_string(pad));
    }
#endif
}

TEST(CudaLaunchers, BroadcastRowsAndChannelsSeedEveryElement) {
  REQUIRE_GPU();
#ifdef GALLEY_HAVE_CUDA
  for (auto [rows, n] : {std::pair<int64_t, int64_t>{5, 12}, {5, 7}, {1, 1}, {300, 1024}}) {
    const std::vector<float> bias = normal(n);
    std::vector<float> want(rows * n);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < n; ++j) want[r * n + j] = bias[j];
    DeviceFloats db(bias), dout = DeviceFloats::zeros(rows * n);
    gk::broadcast_rows(db.get(), rows, n, dout.get(), nullptr);
    expect_same(dout.host(), want,
                "broadcast_rows " + std::to_string(rows) + "x" + std::to_string(n));
  }
  struct Case {
    int64_t n, o, p, pad;
  };
  for (const Case& c :
       {Case{2, 3, 16, 0}, Case{2, 3, 5, 0}, Case{4, 64, 49, 0}, Case{3, 5, 8, 1}}) {
    const std::vector<float> bias = normal(c.o);
    std::vector<float> want(c.n * c.o * c.p);
    for (int64_t i = 0; i < c.n; ++i)
      for (int64_t ch = 0; ch < c.o; ++ch)
        for (int64_t q = 0; q < c.p; ++q) want[(i * c.o + ch) * c.p + q] = bias[ch];
    DeviceFloats db(bias), dout = DeviceFloats::zeros(c.n * c.o * c.p, c.pad);
    gk::broadcast_channels(db.get(), c.n, c.o, c.p, dout.get(), nullptr);
    expect_same(
        dout.host(), want,
        "broadcast_channels " + shape_text({c.n, c.o, c.p}) + " pad=" + std::to_string(c.pad));
  }
#endif
}

// ----------------------------------------------------------------------------------------------
// unary.cu

TEST(CudaLaunchers, UnaryOpsMatchTheCpu) {
  REQUIRE_GPU();
#ifdef GALLEY_HAVE_CUDA
  std::vector<float> base = normal(1003, 3.f);
  const float specials[] = {kNaN, kInf, -kInf, 0.f, -0.f, -1.f, 1e-40f, 88.7f, -104.f, 1.f};
  for (size_t i = 0; i < std::size(specials); ++i) base[i * 37] = specials[i];
  const Tensor t = Tensor::from_vector(base, {int64_t(base.size())});
  const int64_t n = t.numel();
  struct Case {
    const char* name;
    galley::kernels::UnaryOp op;
    float p0, p1;
    Tensor want;
    int64_t max_ulps;
  };
  const Case cases[] = {
      {"exp", UnaryOp::Exp, 0.f, 0.f, galley::exp(t), 3},
      {"log", UnaryOp::Log, 0.f, 0.f, galley::log(t), 3},
      {"pow 2.5", UnaryOp::Pow, 2.5f, 0.f, galley::pow(t, 2.5f), 8},
      {"pow 2", UnaryOp::Pow, 2.f, 0.f, galley::pow(t, 2.f), 8},
      {"pow -1.5", UnaryOp::Pow, -1.5f, 0.f, galley::pow(t, -1.5f), 8},
      {"relu", UnaryOp::Relu, 0.f, 0.f, galley::relu(t), 0},
  };
  for (const Case& c : cases)
    for (int64_t pad : {0, 1}) {
      DeviceFloats da(base, pad), dout = DeviceFloats::zeros(n, pad);
      gk::unary(c.op, galley::DType::Float32, da.get(), dout.get(), n, c.p0, c.p1, nullptr);
      expect_ulps(dout.host(), c.want.to_vector(), c.max_ulps,
                  std::string(c.name) + " pad=" + std::to_string(pad));
    }
  // x * 0.7 - 1.3 may be one FMA on either side: within one rounding of the product.
  for (int64_t pad : {0, 1}) {
    DeviceFloats da(base, pad), dout = DeviceFloats::zeros(n, pad);
    gk::unary(UnaryOp::Affine, galley::DType::Float32, da.get(), dout.get(), n, 0.7f, -1.3f,
              nullptr);
    std::vector<double> tol(n);
    for (int64_t i = 0; i < n; ++i) tol[i] = FLT_EPSILON * (std::abs(base[i] * 0.7) + 1.3);
    expect_within(dout.host(), (t * 0.7f + -1.3f).to_vector(), tol,
                  "affine pad=" + std::to_string(pad));
  }
  // In place (out == a), as the op layer's relu_ does.
  DeviceFloats inplace(base);
  gk::unary(UnaryOp::Relu, galley::DType::Float32, inplace.get(), inplace.get(), n, 0.f, 0.f,
            nullptr);
  expect_same(inplace.host(), galley::relu(t).to_vector(), "relu in place");
#endif
}

TEST(CudaLaunchers, PowAndReluBackwardMatchTheCpu) {
  REQUIRE_GPU();
#ifdef GALLEY_HAVE_CUDA
  const int64_t n = 1003;
  std::vector<float> grad = normal(n), a = normal(n, 2.f);
  a[3] = 0.f;
  a[10] = kNaN;
  grad[20] = kNaN;
  for (float p : {2.5f, 3.f, 0.5f})
    for (int64_t pad : {0, 1}) {
      DeviceFloats dg(grad, pad), da(a, pad), dout = DeviceFloats::zeros(n, pad);
      gk::pow_backward(galley::DType::Float32, dg.get(), da.get(), dout.get(), n, p, nullptr);
      // g * p * a^(p-1): powf's error plus two roundings, either side.
      expect_ulps(dout.host(), host_pow_backward(grad, a, p), 12,
                  "pow_backward p=" + std::to_string(p) + " pad=" + std::to_string(pad));
    }
  std::vector<float> y = normal(n);
  y[0] = 0.f;
  y[1] = -0.f;
  y[2] = kNaN;
  std::vector<float> want(n);
  cpu::relu_backward(galley::DType::Float32, grad.data(), y.data(), want.data(), n);
  for (int64_t pad : {0, 1}) {
    DeviceFloats dg(grad, pad), dy(y, pad), dout = DeviceFloats::zeros(n, pad);
    gk::relu_backward(galley::DType::Float32, dg.get(), dy.get(), dout.get(), n, nullptr);
    expect_same(dout.host(), want, "relu_backward pad=" + std::to_string(pad));
  }
  DeviceFloats dg(grad), dy(y);  // in place into grad
  gk::relu_backward(galley::DType::Float32, dg.get(), dy.get(), dg.get(), n, nullptr);
  expect_same(dg.host(), want, "relu_backward in place");
#endif
}

// The activations forward and backward, against the host kernels (which share their formulas,
// kernels/unary_math.h): specials (NaN, infinities, zeros, subnormals, saturating and huge
// values), odd sizes, a misaligned start, and in place. Their erf/exp/tanh differ by a few ulps
// between the libraries, and 1 + erf(x) cancels for x < 0, so the tolerance is a few ulps of the
// magnitudes entering the last operations: 16 eps (|want| + |g| (|x| + 1)). leaky_relu is one
// product on either side: bit-identical.
TEST(CudaLaunchers, ActivationsMatchTheCpu) {
  REQUIRE_GPU();
#ifdef GALLEY_HAVE_CUDA
  std::vector<float> x = normal(1003, 4.f), g = normal(1003);
  const float specials[] = {kNaN,   kInf,  -kInf,  0.f,   -0.f,   1e-40f, -1e-40f, 88.7f, -88.7f,
                            -104.f, 1e20f, -1e20f, 3e38f, -3e38f, 9.f,    -9.f,    1e-3f};
  for (size_t i = 0; i < std::size(specials); ++i) x[i * 31 + 5] = specials[i];
  const int64_t n = int64_t(x.size());
  struct Case {
    const char* name;
    UnaryOp op;
    float p0;
  };
  const Case cases[] = {{"gelu", UnaryOp::Gelu, 0.f},
                        {"gelu_tanh", UnaryOp::GeluTanh, 0.f},
                        {"silu", UnaryOp::Silu, 0.f},
                        {"sigmoid", UnaryOp::Sigmoid, 0.f},
                        {"tanh", UnaryOp::Tanh, 0.f},
                        {"leaky_relu", UnaryOp::LeakyRelu, 0.01f},
                        {"leaky_relu 0.2", UnaryOp::LeakyRelu, 0.2f}};
  for (const Case& c : cases) {
    const bool exact = c.op == UnaryOp::LeakyRelu;
    std::vector<float> y(n), dx(n);
    cpu::unary(c.op, galley::DType::Float32, x.data(), y.data(), n, c.p0, 0.f);
    const std::vector<float>& saved = galley::kernels::backward_reads_output(c.op) ? y : x;
    cpu::unary_backward(c.op, galley::DType::Float32, g.data(), saved.data(), dx.data(), n, c.p0);
    std::vector<double> tol_y(n), tol_dx(n);
    for (int64_t i = 0; i < n; ++i) {
      const double ax = std::isfinite(x[i]) ? std::abs(x[i]) : 0.0;
      tol_y[i] = exact ? 0.0 : 16 * FLT_EPSILON * (std::abs(double(y[i])) + ax + 1);
      tol_dx[i] =
          exact ? 0.0 : 16 * FLT_EPSILON * (std::abs(double(dx[i])) + std::abs(g[i]) * (ax + 1));
    }
    for (int64_t pad : {0, 1}) {
      const std::string what = std::string(c.name) + " pad=" + std::to_string(pad);
      DeviceFloats dxin(x, pad), dy = DeviceFloats::zeros(n, pad);
      gk::unary(c.op, galley::DType::Float32, dxin.get(), dy.get(), n, c.p0, 0.f, nullptr);
      expect_within(dy.host(), y, tol_y, what);
      DeviceFloats dg(g, pad), dsaved(saved, pad), ddx = DeviceFloats::zeros(n, pad);
      gk::unary_backward(c.op, galley::DType::Float32, dg.get(), dsaved.get(), ddx.get(), n, c.p0,
                         nullptr);
      expect_within(ddx.host(), dx, tol_dx, what + " backward");
    }
    // In place: out == x forward, out == grad backward.
    DeviceFloats inplace(x);
    gk::unary(c.op, galley::DType::Float32, inplace.get(), inplace.get(), n, c.p0, 0.f, nullptr);
    expect_within(inplace.host(), y, tol_y, std::string(c.name) + " in place");
    DeviceFloats dg(g), dsaved(saved);
    gk::unary_backward(c.op, galley::DType::Float32, dg.get(), dsaved.get(), dg.get(), n, c.p0,
                       nullptr);
    expect_within(dg.host(), dx, tol_dx, std::string(c.name) + " backward in place");
  }
  // An op without an activation's backward is refused by name.
  DeviceFloats a(x), b(x), o = DeviceFloats::zeros(n);
  EXPECT_THROW(gk::unary_backward(UnaryOp::Exp, galley::DType::Float32, a.get(), b.get(), o.get(),
                                  n, 0.f, nullptr),
               galley::Error);
#endif
}

// ----------------------------------------------------------------------------------------------
// reduce.cu

TEST(CudaLaunchers, SumToMatchesTheCpuForEveryBroadcastPattern) {
  REQUIRE_GPU();
#ifdef GALLEY_HAVE_CUDA
  struct Case {
    Shape g, to;
  };
  const Case cases[] = {
      {{4, 5, 6}, {5, 1}},
      {{2, 3, 4, 5}, {1, 3, 1, 1}},
      {{3, 4}, {4}},
      {{3, 4}, {3, 1}},
      {{1000, 3}, {3}},
      {{3, 1000}, {3, 1}},
      {{5000, 7}, {1, 1}},
      {{70000}, {1}},
      {{2, 3, 4, 5}, {2, 1, 4, 1}},
      {{6, 7}, {6, 7}},
      {{2, 3000, 2}, {2, 1, 2}},
      {{40, 3000}, {40, 1}},
      {{8, 3, 300}, {1, 3, 1}},
      {{8, 3, 50}, {3, 1}},
      {{8, 3, 7}, {1, 3, 1}},
      {{64, 64, 7, 7}, {64, 1, 1}},
      {{3, 1, 4}, {1, 1, 4}},
      {{1, 1}, {1}},
  };
  for (const Case& c : cases) {
    const std::vector<float> g = exact_values(numel(c.g));
    const Shape to = aligned(c.to, c.g.size());
    Tensor want = galley::zeros(c.to);
    cpu::sum_to(galley::DType::Float32, g.data(), c.g.data(), want.data<float>(), to.data(),
                static_cast<int>(c.g.size()));
    DeviceFloats dg(g), dout = DeviceFloats::zeros(numel(c.to));
    gk::sum_to(galley::DType::Float32, dg.get(), c.g.data(), dout.get(), to.data(),
               static_cast<int>(c.g.size()), nullptr);
    expect_same(dout.host(), want.to_vector(),
                "sum_to " + shape_text(c.g) + " -> " + shape_text(c.to));
  }
#endif
}

TEST(CudaLaunchers, SumDimMatchesTheCpu) {
  REQUIRE_GPU();
#ifdef GALLEY_HAVE_CUDA
  struct Case {
    int64_t outer, len, inner;
  };
  const Case cases[] = {{3, 1000, 1}, {2, 5000, 1}, {1, 70000, 1}, {4, 33, 17},
                        {1, 3000, 5}, {5, 1, 7},    {7, 3, 1},     {16, 2, 1000},
                        {64, 64, 49}, {1, 1, 1},    {300, 9, 1},   {2, 100000, 3}};
  for (const Case& c : cases)
    for (bool mean : {false, true}) {
      const float divisor = mean ? float(c.len) : 1.f;
      const std::vector<float> x = exact_values(c.outer * c.len * c.inner);
      // The op layer's CPU path: the sum, divided by the count for a mean.
      std::vector<float> want(c.outer * c.inner);
      cpu::sum_dim(x.data(), c.outer, c.len, c.inner, want.data(), divisor);
      DeviceFloats dx(x), dout = DeviceFloats::zeros(c.outer * c.inner);
      gk::sum_dim(dx.get(), c.outer, c.len, c.inner, divisor, dout.get(), nullptr);
      expect_same(dout.host(), want,
                  "sum_dim " + shape_text({c.outer, c.len, c.inner}) + (mean ? " mean" : ""));
    }
  // Normal data: within the worst-case error of float summation, len * eps * sum |x|, of the
  // exact (double) sum.
  for (const Case& c : {Case{3, 1000, 1}, Case{4, 333, 17}, Case{2, 20000, 1}}) {
    const std::vector<float> x = normal(c.outer * c.len * c.inner);
    std::vector<float> want(c.outer * c.inner);
    std::vector<double> tol(c.outer * c.inner);
    for (int64_t o = 0; o < c.outer; ++o)
      for (int64_t i = 0; i < c.inner; ++i) {
        double s = 0, a = 0;
        for (int64_t l = 0; l < c.len; ++l) {
          const double v = x[(o * c.len + l) * c.inner + i];
          s += v;
          a += std::abs(v);
        }
        want[o * c.inner + i] = static_cast<float>(s);
        tol[o * c.inner + i] = double(c.len) * FLT_EPSILON * a;
      }
    DeviceFloats dx(x), dout = DeviceFloats::zeros(c.outer * c.inner);
    gk::sum_dim(dx.get(), c.outer, c.len, c.inner, 1.f, dout.get(), nullptr);
    expect_within(dout.host(), want, tol,
                  "sum_dim normal " + shape_text({c.outer, c.len, c.inner}));
  }
#endif
}

TEST(CudaLaunchers, ColumnSumsMatchTheCpu) {
  REQUIRE_GPU();
#ifdef GALLEY_HAVE_CUDA
  for (auto [rows, n] : {std::pair<int64_t, int64_t>{256, 10},
                         {1000, 4096},
                         {3, 1},
                         {7, 1},
                         {1, 5},
                         {20000, 3},
                         {5000, 1}})
    for (bool accumulate : {false, true}) {
      const std::vector<float> g = exact_values(rows * n), init = exact_values(n);
      std::vector<float> want = init;
      cpu::column_sums(g.data(), rows, n, want.data(), accumulate);
      DeviceFloats dg(g), dout(init);
      gk::column_sums(dg.get(), rows, n, dout.get(), accumulate, nullptr);
      expect_same(dout.host(), want,
                  "column_sums " + std::to_string(rows) + "x" + std::to_string(n) +
                      (accumulate ? " accumulate" : ""));
    }
#endif
}

// Tall matrices (the bias gradients of large batches) split their rows over blocks and add the
// partials in a fixed order; wide or short ones run in one pass. Both must count every row once,
// stay close to the exact sum, and give the same bits at every run.
TEST(CudaLaunchers, ColumnSumsOfLargeShapesMatchADoubleSumAndRepeatTheirBits) {
  REQUIRE_GPU();
#ifdef GALLEY_HAVE_CUDA
  for (auto [rows, n] : {std::pair<int64_t, int64_t>{70000, 3},
                         {257, 4099},
                         {65536, 64},
                         {4097, 33},
                         {1, 100003},
                         {100003, 1}})
    for (bool accumulate : {false, true}) {
      const std::string what = "column_sums " + std::to_string(rows) + "x" + std::to_string(n) +
                               (accumulate ? " accumulate" : "");
      {
        // Exact data: bit-identical with the CPU, so a row missed or added twice shows.
        const std::vector<float> g = exact_values(rows * n), init = exact_values(n);
        std::vector<float> want = init;
        cpu::column_sums(g.data(), rows, n, want.data(), accumulate);
        DeviceFloats dg(g), dout(init);
        gk::column_sums(dg.get(), rows, n, dout.get(), accumulate, nullptr);
        expect_same(dout.host(), want, what);
      }
      // Normal data: within 1e-5 of the column's sum of magnitudes of the exact (double) sum.
      const std::vector<float> g = normal(rows * n), init = normal(n);
      std::vector<double> sum(n, 0.0), mag(n, 0.0);
      for (int64_t j = 0; j < n && accumulate; ++j) sum[j] = init[j], mag[j] = std::abs(init[j]);
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < n; ++j) {
          sum[j] += g[i * n + j];
          mag[j] += std::abs(g[i * n + j]);
        }
      std::vector<float> want(n);
      std::vector<double> tol(n);
      for (int64_t j = 0; j < n; ++j) {
        want[j] = static_cast<float>(sum[j]);
        tol[j] = 1e-5 * mag[j] + 1e-30;
      }
      DeviceFloats dg(g), first(init), second(init);
      gk::column_sums(dg.get(), rows, n, first.get(), accumulate, nullptr);
      gk::column_sums(dg.get(), rows, n, second.get(), accumulate, nullptr);
      const std::vector<float> got = first.host();
      expect_within(got, want, tol, what + " normal");
      expect_same(second.host(), got, what + " run twice");
    }
#endif
}

TEST(CudaLaunchers, SumAllMatchesTheCpuAndIsDeterministic) {
  REQUIRE_GPU();
#ifdef GALLEY_HAVE_CUDA
  for (int64_t n : {1, 1000, 4096, 4097, 100003, 3000001})
    for (int64_t pad : {0, 1})
      for (bool mean : {false, true}) {
        const float divisor = mean ? float(n) : 1.f;
        const std::string what = "sum_all n=" + std::to_string(n) + " pad=" + std::to_string(pad) +
                                 (mean ? " mean" : "");
        // Exact data: every order of summation gives the same bits.
        const std::vector<float> x = exact_values(n);
        DeviceFloats dx(x, pad), dout = DeviceFloats::zeros(1);
        gk::sum_all(dx.get(), n, divisor, dout.get(), nullptr);
        expect_same(dout.host(), {static_cast<float>(cpu::sum_all(x.data(), n) / divisor)}, what);
        // Normal data: double accumulation on both sides agrees far below float resolution.
        const std::vector<float> y = normal(n);
        double abs_sum = 0;
        for (float v : y) abs_sum += std::abs(v);
        DeviceFloats dy(y, pad), first = DeviceFloats::zeros(1), second = DeviceFloats::zeros(1);
        gk::sum_all(dy.get(), n, divisor, first.get(), nullptr);
        gk::sum_all(dy.get(), n, divisor, second.get(), nullptr);
        const float want = static_cast<float>(cpu::sum_all(y.data(), n) / divisor);
        expect_within(first.host(), {want}, {1e-6 * abs_sum / divisor + 1e-30}, what + " normal");
        expect_same(second.host(), first.host(), what + " run twice");
      }
#endif
}

TEST(CudaLaunchers, ExpandDimMatchesTheCpu) {
  REQUIRE_GPU();
#ifdef GALLEY_HAVE_CUDA
  struct Case {
    int64_t outer, len, inner, pad;
  };
  for (const Case& c : {Case{3, 5, 7, 0}, Case{2, 4, 8, 0}, Case{1, 1000, 1, 0}, Case{5, 3, 12, 1},
                        Case{2, 3, 1000000, 0}}) {
    const std::vector<float> g = normal(c.outer * c.inner);
    const int64_t total = c.outer * c.len * c.inner;
    std::vector<float> want(total);
    cpu::expand_dim(g.data(), c.outer, c.len, c.inner, want.data());
    DeviceFloats dg(g, c.pad), dout = DeviceFloats::zeros(total, c.pad);
    gk::expand_dim(dg.get(), c.outer, c.len, c.inner, dout.get(), nullptr);
    expect_same(
        dout.host(), want,
        "expand_dim " + shape_text({c.outer, c.len, c.inner}) + " pad=" + std::to_string(c.pad));
  }
#endif
}

TEST(CudaLaunchers, ArgmaxTakesTheFirstMaximumAndLetsNaNWin) {
  REQUIRE_GPU();
#ifdef GALLEY_HAVE_CUDA
  struct Case {
    int64_t outer, len, inner;
  };
  for (const Case& c : {Case{6, 100, 1}, Case{6, 10, 1}, Case{6, 50, 3}, Case{5, 5000, 1},
                        Case{6, 40, 1}, Case{5, 33, 64}}) {
    std::vector<float> x = small_ints(c.outer * c.len * c.inner, 5);  // many ties
    auto at = [&](int64_t o, int64_t l, int64_t i) -> float& {
      return x[(o * c.len + l) * c.inner + i];
    };
    // Row 1: one NaN; row 2: two NaNs (the first wins); row 3: all -inf; row 4: NaN first.
    for (int64_t i = 0; i < c.inner; ++i) {
      at(1, (37 + i) % c.len, i) = kNaN;
      at(2, 3 % c.len, i) = kNaN;
      at(2, (c.len - 1 + i) % c.len, i) = kNaN;
      for (int64_t l = 0; l < c.len; ++l) at(3, l, i) = -kInf;
      at(4, 0, i) = kNaN;
    }
    std::vector<int64_t> want(c.outer * c.inner);
    cpu::argmax_dim(x.data(), c.outer, c.len, c.inner, want.data());
    DeviceFloats dx(x);
    DeviceInts dout = DeviceInts::zeros(c.outer * c.inner);
    gk::argmax_dim(dx.get(), c.outer, c.len, c.inner, dout.get(), nullptr);
    expect_equal(dout.host(), want, "argmax_dim " + shape_text({c.outer, c.len, c.inner}));
  }
#endif
}

// ----------------------------------------------------------------------------------------------
// bias_relu.cu

TEST(CudaLaunchers, BiasReluForwardAndBackwardMatchTheCpu) {
  REQUIRE_GPU();
#ifdef GALLEY_HAVE_CUDA
  struct Case {
    int64_t outer, channels, inner, pad;
  };
  const Case cases[] = {
      {2, 3, 5, 0},
      {64, 32, 784, 0},   // a convolution's output: float4 forward, channels x chunks backward
      {64, 32, 784, 1},   // misaligned: the scalar forward
      {33, 17, 1001, 0},  // numel not a multiple of the block, chunks with a ragged end
      {3, 70000, 2, 0},   // more channels than the grid has rows
      {1, 1, 300001, 0},  // one channel in many chunks
      {1, 5, 3, 1},
      {256, 64, 1, 0},  // a linear layer's features: masked, then column sums
      {70001, 3, 1, 1},
      {4, 2, 4, 0},
  };
  for (const Case& c : cases) {
    const int64_t total = c.outer * c.channels * c.inner;
    const std::string what =
        "bias_relu " + shape_text({c.outer, c.channels, c.inner}) + " pad=" + std::to_string(c.pad);
    std::vector<float> x = normal(total);
    sprinkle_specials(x, 97);
    x[0] = -0.f;
    const std::vector<float> b = normal(c.channels);
    std::vector<float> y(total);
    cpu::bias_relu_forward(x.data(), b.data(), c.outer, c.channels, c.inner, y.data());
    {
      DeviceFloats dx(x, c.pad), db(b), dy = DeviceFloats::zeros(total, c.pad);
      gk::bias_relu_forward(dx.get(), db.get(), c.outer, c.channels, c.inner, dy.get(), nullptr);
      expect_same(dy.host(), y, what + " forward");
    }
    // Backward from the CPU's y (NaN, inf and zeros included) with exact gradients (infinities
    // and NaNs among them): every order of summation gives the same bias gradient bits.
    std::vector<float> gy = exact_values(total);
    sprinkle_specials(gy, 1009);
    std::vector<float> gx(total), gb(c.channels);
    cpu::bias_relu_backward(gy.data(), y.data(), c.outer, c.channels, c.inner, gx.data(),
                            gb.data());
    DeviceFloats dy(y, c.pad), dgy(gy, c.pad);
    for (bool with_gb : {true, false}) {
      DeviceFloats dgx = DeviceFloats::zeros(total, c.pad), dgb = DeviceFloats::zeros(c.channels);
      gk::bias_relu_backward(dgy.get(), dy.get(), c.outer, c.channels, c.inner, dgx.get(),
                             with_gb ? dgb.get() : nullptr, nullptr);
      expect_same(dgx.host(), gx, what + " backward gx" + (with_gb ? "" : " without gb"));
      if (with_gb) expect_same(dgb.host(), gb, what + " backward gb");
    }
    // Normal gradients: close to the exact sum, and the same bits at every run.
    const std::vector<float> gn = normal(total);
    std::vector<double> sum(c.channels, 0.0), mag(c.channels, 0.0);
    for (int64_t k = 0; k < total; ++k) {
      const int64_t ch = (k / c.inner) % c.channels;
      const double g = y[k] > 0.f ? gn[k] : 0.f;
      sum[ch] += g;
      mag[ch] += std::abs(g);
    }
    std::vector<float> want(c.channels);
    std::vector<double> tol(c.channels);
    for (int64_t ch = 0; ch < c.channels; ++ch) {
      want[ch] = static_cast<float>(sum[ch]);
      tol[ch] = 1e-5 * mag[ch] + 1e-30;
    }
    DeviceFloats dgn(gn, c.pad), dgx = DeviceFloats::zeros(total, c.pad);
    DeviceFloats first = DeviceFloats::zeros(c.channels), second = DeviceFloats::zeros(c.channels);
    gk::bias_relu_backward(dgn.get(), dy.get(), c.outer, c.channels, c.inner, dgx.get(),
                           first.get(), nullptr);
    gk::bias_relu_backward(dgn.get(), dy.get(), c.outer, c.channels, c.inner, dgx.get(),
                           second.get(), nullptr);
    const std::vector<float> got = first.host();
    expect_within(got, want, tol, what + " backward gb normal");
    expect_same(second.host(), got, what + " backward gb run twice");
  }
#endif
}

// ----------------------------------------------------------------------------------------------
// split sums in CUDA graphs and on concurrent streams (reduce.cu, bias_relu.cu)

#ifdef GALLEY_HAVE_CUDA
namespace {

// The split sums of a training step's shapes, with their inputs and outputs on the GPU: a loss
// (sum_all over 1M elements), a linear layer's bias gradient ([16384 x 64] column sums) and a
// convolution's (bias_relu backward of [32, 32, 196]). The sums have kSlots places each, so
// that repeated runs keep every result.
struct SplitSums {
  static constexpr int64_t kN = 1000003, kRows = 16384, kCols = 64;
  static constexpr int64_t kOuter = 32, kChannels = 32, kInner = 196;
  static constexpr int64_t kConv = kOuter * kChannels * kInner;
  static constexpr int kSlots = 20;
  DeviceFloats x, g, gy, y;
  DeviceFloats gx = DeviceFloats::zeros(kConv);
  DeviceFloats sum = DeviceFloats::zeros(kSlots), cols = DeviceFloats::zeros(kSlots * kCols),
               gb = DeviceFloats::zeros(kSlots * kChannels);

  SplitSums() : x(normal(kN)), g(normal(kRows * kCols)), gy(normal(kConv)), y(normal(kConv)) {}
  // Queues the three sums on `stream`, into place `slot`.
  void run(void* stream, int slot = 0) {
    gk::sum_all(x.get(), kN, 2.0, sum.get() + slot, stream);  // a mean's division too
    gk::column_sums(g.get(), kRows, kCols, cols.get() + slot * kCols, /*accumulate=*/false, stream);
    gk::bias_relu_backward(gy.get(), y.get(), kOuter, kChannels, kInner, gx.get(),
                           gb.get() + slot * kChannels, stream);
  }
  // The results in place `slot` (once the work queued on every stream is done).
  std::vector<std::vector<float>> results(int slot = 0) const {
    auto part = [](const std::vector<float>& v, int64_t at, int64_t n) {
      return std::vector<float>(v.begin() + at, v.begin() + at + n);
    };
    return {part(sum.host(), slot, 1), part(cols.host(), slot * kCols, kCols), gx.host(),
            part(gb.host(), slot * kChannels, kChannels)};
  }
  // Overwrites this one's inputs with `o`'s, on `stream`: x * 1 + 0 keeps every bit that a sum
  // sees.
  void load_inputs(const SplitSums& o, void* stream) {
    gk::unary(UnaryOp::Affine, galley::DType::Float32, o.x.get(), x.get(), kN, 1.f, 0.f, stream);
    gk::unary(UnaryOp::Affine, galley::DType::Float32, o.g.get(), g.get(), kRows * kCols, 1.f, 0.f,
              stream);
    gk::unary(UnaryOp::Affine, galley::DType::Float32, o.gy.get(), gy.get(), kConv, 1.f, 0.f,
              stream);
    gk::unary(UnaryOp::Affine, galley::DType::Float32, o.y.get(), y.get(), kConv, 1.f, 0.f, stream);
  }
};

void expect_same_results(const std::vector<std::vector<float>>& got,
                         const std::vector<std::vector<float>>& want, const std::string& what) {
  const char* names[] = {"sum_all", "column_sums", "bias_relu gx", "bias_relu gb"};
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) expect_same(got[i], want[i], what + ": " + names[i]);
}

}  // namespace
#endif

// A captured graph must replay the split sums with scratch of its own: a choice frozen at
// capture (a one-block fallback, or the capturing stream's eager buffer) would be slow, or
// shared with every later eager sum and other graph.
TEST(CudaLaunchers, CapturedSplitSumsReplayWithTheBitsOfEagerRuns) {
  REQUIRE_GPU();
#ifdef GALLEY_HAVE_CUDA
  void* stream = galley::detail::compute_stream(gpu);
  SplitSums a, b;  // two sets of inputs
  SplitSums eager;
  eager.load_inputs(a, stream);
  eager.run(stream);
  const auto want_a = eager.results();
  eager.load_inputs(b, stream);
  eager.run(stream);
  const auto want_b = eager.results();

  // Two graphs over two sets of buffers, captured before those buffers ever ran eagerly.
  SplitSums s1, s2;
  galley::cuda::Graph g1, g2;
  g1.capture(gpu, [&] { s1.run(stream); });
  g2.capture(gpu, [&] { s2.run(stream); });
  for (int round = 0; round < 3; ++round) {
    const std::string what = "round " + std::to_string(round);
    const bool flip = round % 2 == 1;
    s1.load_inputs(flip ? b : a, stream);
    s2.load_inputs(flip ? a : b, stream);
    g1.replay();
    eager.load_inputs(flip ? a : b, stream);
    eager.run(stream);  // eager split sums between the replays, on the same stream
    g2.replay();
    expect_same_results(s1.results(), flip ? want_b : want_a, what + ", graph 1");
    expect_same_results(s2.results(), flip ? want_a : want_b, what + ", graph 2");
    expect_same_results(eager.results(), flip ? want_a : want_b, what + ", eager");
  }
#endif
}

// Split sums queued at once by four host threads, two on streams of their own and two sharing
// one, each on its own inputs: every result has the bits of a lone run.
TEST(CudaLaunchers, SplitSumsOnConcurrentStreamsAndThreadsKeepTheirScratchApart) {
  REQUIRE_GPU();
#ifdef GALLEY_HAVE_CUDA
  constexpr int kWorkers = 4, kIterations = SplitSums::kSlots;
  std::vector<std::unique_ptr<SplitSums>> work;
  std::vector<std::vector<std::vector<float>>> want;
  for (int t = 0; t < kWorkers; ++t) {
    work.push_back(std::make_unique<SplitSums>());
    work[t]->run(nullptr);
    want.push_back(work[t]->results());
  }
  galley::detail::make_current(gpu);
  void* own[2] = {galley::detail::create_stream(gpu), galley::detail::create_stream(gpu)};
  void* shared = galley::detail::create_stream(gpu);
  std::vector<std::string> errors(kWorkers);
  std::vector<std::thread> threads;
  for (int t = 0; t < kWorkers; ++t)
    threads.emplace_back([&, t] {
      try {
        galley::detail::make_current(gpu);
        void* stream = t < 2 ? own[t] : shared;
        for (int i = 0; i < kIterations; ++i) work[t]->run(stream, i);
      } catch (const std::exception& e) {
        errors[t] = e.what();
      }
    });
  for (auto& th : threads) th.join();
  galley::cuda::synchronize(gpu);
  for (void* st : {own[0], own[1], shared}) galley::detail::destroy_stream(gpu, st);
  for (int t = 0; t < kWorkers; ++t) {
    const std::string who = "thread " + std::to_string(t);
    ASSERT_TRUE(errors[t].empty()) << who << ": " << errors[t];
    for (int i = 0; i < kIterations; ++i)
      expect_same_results(work[t]->results(i), want[t], who + ", run " + std::to_string(i));
  }
#endif
}

// ----------------------------------------------------------------------------------------------
// batch_norm.cu against cuDNN's batch normalisation (blas.cu)

// galley's training forward (statistics, running update, normalisation) and backward against
// cuDNN's on the same data: resnet's BatchNorm shapes, a BatchNorm1D one ([N, C]) and odd sizes,
// in both of cuDNN's spatial modes. Different summation orders (galley's shifted sums in double,
// cuDNN's own), so within float32's error: per element relative to its value above an absolute
// floor (the values are O(1): the floor is ~100 units in the last place), per channel sum in
// proportion to the square root of the count.
TEST(CudaLaunchers, BatchNormMatchesCudnn) {
  REQUIRE_GPU();
#ifdef GALLEY_HAVE_CUDA
  using galley::kernels::BatchNormGeometry;
  using galley::kernels::BatchNormParams;
  using galley::kernels::BatchNormRunning;
  const galley::DType f32 = galley::DType::Float32;
  const float eps = 1e-5f, momentum = 0.1f;
  for (const BatchNormGeometry g :
       {BatchNormGeometry{8, 16, 28 * 28}, BatchNormGeometry{8, 32, 14 * 14},
        BatchNormGeometry{8, 64, 7 * 7}, BatchNormGeometry{64, 10, 1}, BatchNormGeometry{5, 7, 33}})
    for (bool persistent : {false, true}) {
      const int64_t n = g.outer * g.channels * g.inner, c = g.channels;
      const std::string what = "[" + std::to_string(g.outer) + ", " + std::to_string(c) + ", " +
                               std::to_string(g.inner) + "]" + (persistent ? " persistent" : "");
      std::vector<float> x = normal(n, 2.f), gy = normal(n), w = normal(c), b = normal(c);
      for (float& v : x) v += 0.5f;
      const std::vector<float> rv0 = uniform(c, 0.5f, 1.5f), rm0 = normal(c, 0.1f);
      DeviceFloats dx(x), dgy(gy), dw(w), db(b);
      // galley's kernels
      DeviceFloats rm(rm0), rv(rv0), mean = DeviceFloats::zeros(c), var = DeviceFloats::zeros(c);
      DeviceFloats y = DeviceFloats::zeros(n), gx = DeviceFloats::zeros(n);
      DeviceFloats gw = DeviceFloats::zeros(c), gb = DeviceFloats::zeros(c);
      gk::batch_norm_stats(f32, dx.get(), g, BatchNormRunning{rm.get(), rv.get(), momentum},
                           mean.get(), var.get(), nullptr);
      const BatchNormParams p{mean.get(), var.get(), eps, dw.get(), db.get()};
      gk::batch_norm_forward(f32, dx.get(), g, p, false, y.get(), nullptr, nullptr);
      gk::batch_norm_backward(f32, dgy.get(), dx.get(), nullptr, g, p, true, gx.get(), gw.get(),
                              gb.get(), nullptr, nullptr);
      // cuDNN's
      DeviceFloats rm2(rm0), rv2(rv0), smean = DeviceFloats::zeros(c),
                                       sinv = DeviceFloats::zeros(c);
      DeviceFloats y2 = DeviceFloats::zeros(n), gx2 = DeviceFloats::zeros(n);
      DeviceFloats gw2 = DeviceFloats::zeros(c), gb2 = DeviceFloats::zeros(c);
      gk::batch_norm_cudnn_train_forward(
          0, dx.get(), g, BatchNormRunning{rm2.get(), rv2.get(), momentum}, dw.get(), db.get(), eps,
          y2.get(), smean.get(), sinv.get(), persistent, nullptr);
      gk::batch_norm_cudnn_backward(0, dgy.get(), dx.get(), g, dw.get(), eps, smean.get(),
                                    sinv.get(), gx2.get(), gw2.get(), gb2.get(), persistent,
                                    nullptr);
      // The persistent mode's sums may overflow (cuDNN says so only through this flag): then its
      // results are no reference for galley's.
      if (persistent && gk::batch_norm_cudnn_overflowed(0)) {
        std::cout << what << ": cuDNN flagged an overflow in persistent mode; not compared\n";
        continue;
      }
      const double count = double(g.outer * g.inner), sum_tol = 1e-5 * std::sqrt(count) * 8;
      std::vector<float> invstd = var.host();
      for (float& v : invstd) v = 1.f / std::sqrt(v + eps);
      expect_close(mean.host(), smean.host(), 0, 1e-5, what + " mean");
      expect_close(invstd, sinv.host(), 2e-5, 0, what + " 1 / sqrt(var + eps)");
      expect_close(rm.host(), rm2.host(), 1e-5, 1e-6, what + " running mean");
      expect_close(rv.host(), rv2.host(), 2e-5, 1e-6, what + " running var");
      expect_close(y.host(), y2.host(), 1e-5, 2e-5, what + " y");
      expect_close(gw.host(), gw2.host(), 1e-5, sum_tol, what + " gweight");
      expect_close(gb.host(), gb2.host(), 1e-5, sum_tol, what + " gbias");
      expect_close(gx.host(), gx2.host(), 1e-4, 1e-4, what + " gx");
    }
#endif
}

// ----------------------------------------------------------------------------------------------
// softmax.cu

TEST(CudaLaunchers, SoftmaxForwardAndBackwardMatchTheCpu) {
  REQUIRE_GPU();
#ifdef GALLEY_HAVE_CUDA
  struct Case {
    int64_t outer, len, inner;
  };
  for (const Case& c : {Case{64, 10, 1}, Case{3, 2000, 1}, Case{2, 20000, 1}, Case{4, 7, 9},
                        Case{5, 1000, 1}, Case{2, 1, 1}})
    for (bool log : {false, true}) {
      const int64_t total = c.outer * c.len * c.inner;
      const std::string what =
          std::string(log ? "log_softmax " : "softmax ") + shape_text({c.outer, c.len, c.inner});
      std::vector<float> x = normal(total, 4.f);
      if (c.outer > 1) x[c.len * c.inner + 0] = kNaN;  // the second row/column group turns NaN
      if (total > 3) x[2] = -kInf;
      std::vector<float> want(total);
      cpu::softmax_forward(x.data(), c.outer, c.len, c.inner, log, want.data());
      DeviceFloats dx(x), dy = DeviceFloats::zeros(total);
      gk::softmax_forward(dx.get(), c.outer, c.len, c.inner, log, dy.get(), nullptr);
      // Both sides exponentiate and sum in double and round once at the end.
      expect_close(dy.host(), want, 2e-6, 1e-30, what);

      // Backward from the CPU's y, so both sides start from the same bits.
      const std::vector<float> gy = normal(total);
      std::vector<float> gx(total);
      cpu::softmax_backward(want.data(), gy.data(), c.outer, c.len, c.inner, log, gx.data());
      // Tolerance: a few ulps of the magnitudes that meet in the final subtraction.
      std::vector<double> tol(total);
      for (int64_t o = 0; o < c.outer; ++o)
        for (int64_t i = 0; i < c.inner; ++i) {
          double s = 0;
          for (int64_t l = 0; l < c.len; ++l) {
            const int64_t k = (o * c.len + l) * c.inner + i;
            s += log ? double(gy[k]) : double(gy[k]) * want[k];
          }
          for (int64_t l = 0; l < c.len; ++l) {
            const int64_t k = (o * c.len + l) * c.inner + i;
            const double mag = log ? std::abs(gy[k]) + std::exp(double(want[k])) * std::abs(s)
                                   : std::abs(double(want[k])) * (std::abs(gy[k]) + std::abs(s));
            tol[k] = 8 * FLT_EPSILON * mag + 1e-30;
          }
        }
      DeviceFloats dyy(want), dgy(gy), dgx = DeviceFloats::zeros(total);
      gk::softmax_backward(dyy.get(), dgy.get(), c.outer, c.len, c.inner, log, dgx.get(), nullptr);
      expect_within(dgx.host(), gx, tol, what + " backward");
    }
#endif
}

// ----------------------------------------------------------------------------------------------
// cross_entropy.cu

TEST(CudaLaunchers, CrossEntropyMatchesTheCpuWithSmoothingAndIgnoredRows) {
  REQUIRE_GPU();
#ifdef GALLEY_HAVE_CUDA
  struct Case {
    int64_t n, c;
    float eps;
    int64_t ignore;
    bool bad;
  };
  for (const Case& cs : {Case{37, 10, 0.f, -100, false}, Case{37, 10, 0.1f, 3, false},
                         Case{5, 3000, 0.1f, -100, false}, Case{3, 20000, 0.f, -100, false},
                         Case{12, 10, 0.2f, -100, true}, Case{1, 1, 0.f, -100, false}}) {
    const std::string what = "cross_entropy n=" + std::to_string(cs.n) +
                             " c=" + std::to_string(cs.c) + " eps=" + std::to_string(cs.eps);
    std::vector<float> logits = normal(cs.n * cs.c, 3.f);
    std::uniform_int_distribution<int64_t> label(0, cs.c - 1);
    std::vector<int64_t> labels(cs.n);
    for (int64_t& y : labels) y = label(rng());
    if (cs.n > 5) {
      labels[1] = cs.ignore;
      labels[5] = -100;
      logits[2 * cs.c + cs.c / 2] = kNaN;  // row 2: NaN loss and probabilities
    }
    if (cs.bad) {
      labels[4] = cs.c + 2;
      labels[9] = -7;
    }
    std::vector<float> loss(cs.n), prob(cs.n * cs.c);
    int64_t bad = -2;
    const int64_t count =
        cpu::cross_entropy_forward(logits.data(), labels.data(), cs.n, cs.c, cs.eps, cs.ignore,
                                   loss.data(), prob.data(), &bad);
    DeviceFloats dlogits(logits), dloss = DeviceFloats::zeros(cs.n),
                                  dprob = DeviceFloats::zeros(cs.n * cs.c);
    DeviceInts dlabels(labels), dcount = DeviceInts::zeros(1), dbad = DeviceInts::zeros(1);
    gk::cross_entropy_forward(dlogits.get(), dlabels.get(), cs.n, cs.c, cs.eps, cs.ignore,
                              dloss.get(), dprob.get(), dcount.get(), dbad.get(), nullptr, nullptr);
    expect_close(dloss.host(), loss, 2e-6, 1e-7, what + " loss");
    expect_close(dprob.host(), prob, 2e-6, 1e-30, what + " prob");
    EXPECT_EQ(dcount.host()[0], count) << what;
    EXPECT_EQ(dbad.host()[0], bad) << what;

    // Backward from the CPU's probabilities; each element is s * (p - eps/c), minus
    // s * (1 - eps) at the label: a few ulps of |s|.
    const std::vector<float> row_scale = normal(cs.n);
    std::vector<float> gx(cs.n * cs.c);
    cpu::cross_entropy_backward(prob.data(), labels.data(), row_scale.data(), cs.n, cs.c, cs.eps,
                                cs.ignore, gx.data());
    std::vector<double> tol(cs.n * cs.c);
    for (int64_t i = 0; i < cs.n; ++i)
      for (int64_t j = 0; j < cs.c; ++j)
        tol[i * cs.c + j] = 4 * FLT_EPSILON * std::abs(row_scale[i]);
    DeviceFloats dp(prob), dscale(row_scale), dgx = DeviceFloats::zeros(cs.n * cs.c);
    gk::cross_entropy_backward(dp.get(), dlabels.get(), dscale.get(), cs.n, cs.c, cs.eps, cs.ignore,
                               dgx.get(), nullptr);
    expect_within(dgx.host(), gx, tol, what + " backward");
  }
#endif
}

TEST(CudaLaunchers, FillScaledReadsTheScalarOnTheDevice) {
  REQUIRE_GPU();
#ifdef GALLEY_HAVE_CUDA
  DeviceFloats scalar({2.5f}), out = DeviceFloats::zeros(1001);
  gk::fill_scaled(scalar.get(), 0.125f, nullptr, out.get(), 1001, nullptr);
  expect_same(out.host(), std::vector<float>(1001, 2.5f * 0.125f), "fill_scaled");
  DeviceInts four({4}), none({0});
  gk::fill_scaled(scalar.get(), 2.f, four.get(), out.get(), 7, nullptr);
  expect_same(std::vector<float>(out.host().begin(), out.host().begin() + 7),
              std::vector<float>(7, 2.5f * 2.f / 4.f), "fill_scaled / count");
  gk::fill_scaled(scalar.get(), 2.f, none.get(), out.get(), 7, nullptr);
  expect_same(std::vector<float>(out.host().begin(), out.host().begin() + 7),
              std::vector<float>(7, 0.f), "fill_scaled / 0 rows");
#endif
}

// ----------------------------------------------------------------------------------------------
// max_pool2d.cu

TEST(CudaLaunchers, MaxPoolPicksTheCpuWinnersAndRoutesGradients) {
  REQUIRE_GPU();
#ifdef GALLEY_HAVE_CUDA
  struct Case {
    int64_t planes, h, w, k, stride, pad;
  };
  for (const Case& c : {Case{6, 13, 11, 2, 2, 0}, Case{4, 12, 12, 2, 2, 0}, Case{3, 9, 9, 3, 2, 1},
                        Case{2, 7, 8, 3, 1, 0}, Case{5, 10, 10, 2, 1, 0}, Case{2, 6, 6, 3, 3, 1},
                        Case{128, 32, 32, 2, 2, 0}}) {
    galley::kernels::Pool2dGeometry g{};
    g.planes = c.planes, g.h = c.h, g.w = c.w, g.k = c.k, g.stride = c.stride, g.pad = c.pad;
    g.oh = (c.h + 2 * c.pad - c.k) / c.stride + 1;
    g.ow = (c.w + 2 * c.pad - c.k) / c.stride + 1;
    const std::string what = "max_pool2d planes=" + std::to_string(c.planes) + " " +
                             std::to_string(c.h) + "x" + std::to_string(c.w) +
                             " k=" + std::to_string(c.k) + " s=" + std::to_string(c.stride) +
                             " p=" + std::to_string(c.pad);
    const int64_t in = g.planes * g.h * g.w, out = g.planes * g.oh * g.ow;
    std::vector<float> x = small_ints(in, 4);  // ties in most windows
    sprinkle_specials(x, 53);
    std::vector<float> y(out);
    std::vector<int32_t> idx(out);
    cpu::max_pool2d_forward(g, x.data(), y.data(), idx.data());
    DeviceFloats dx(x), dy = DeviceFloats::zeros(out), didx = DeviceFloats::zeros(out);
    gk::max_pool2d_forward(g, dx.get(), dy.get(), reinterpret_cast<int32_t*>(didx.get()), nullptr);
    expect_same(dy.host(), y, what + " values");
    expect_equal(didx.host_int32(), idx, what + " indices");

    // Overlapping windows add several gradients into one input: in the CPU's order, so exact.
    const std::vector<float> gy = normal(out);
    std::vector<float> gx(in);
    cpu::max_pool2d_backward(g, gy.data(), idx.data(), gx.data());
    DeviceFloats dgy(gy), dgx(normal(in));  // stale contents must be overwritten
    gk::max_pool2d_backward(g, dgy.get(), reinterpret_cast<const int32_t*>(didx.get()), dgx.get(),
                            nullptr);
    expect_same(dgx.host(), gx, what + " backward");
  }
#endif
}

// ----------------------------------------------------------------------------------------------
// optimizer_update.cu

TEST(CudaLaunchers, AdamAndAdamWUpdatesMatchTheCpu) {
  REQUIRE_GPU();
#ifdef GALLEY_HAVE_CUDA
  struct Case {
    float weight_decay;
    bool decoupled, amsgrad, maximize;
  };
  const int t = 3;
  const float lr = 1e-2f, beta1 = 0.9f, beta2 = 0.999f;
  for (const Case& c : {Case{0.01f, false, false, false}, Case{0.05f, true, false, false},
                        Case{0.f, false, true, false}, Case{0.02f, true, true, false},
                        Case{0.01f, false, false, true}, Case{0.02f, true, true, true}})
    for (int64_t n : {1003, 1 << 20})
      for (int64_t pad : {0, 1}) {
        galley::kernels::AdamStep s{};
        s.lr = lr, s.beta1 = beta1, s.beta2 = beta2, s.eps = 1e-8f;
        s.one_minus_beta1 = static_cast<float>(1.0 - double(beta1));
        s.one_minus_beta2 = static_cast<float>(1.0 - double(beta2));
        s.shrink = static_cast<float>(1.0 - double(lr) * double(c.weight_decay));
        s.weight_decay = c.weight_decay;
        // As the optimizer computes them (in double); the GPU derives them from its step counter.
        s.step_size = static_cast<float>(double(lr) / (1.0 - std::pow(double(beta1), t)));
        s.bias2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(double(beta2), t)));
        s.decoupled = c.decoupled, s.amsgrad = c.amsgrad, s.maximize = c.maximize;
        const std::string what = std::string(c.decoupled ? "AdamW" : "Adam") +
                                 (c.amsgrad ? " amsgrad" : "") + (c.maximize ? " maximize" : "") +
                                 " n=" + std::to_string(n) + " pad=" + std::to_string(pad);
        std::vector<float> p = normal(n), g = normal(n), m = normal(n, 0.1f),
                           v = uniform(n, 0.f, 0.01f), vmax = uniform(n, 0.f, 0.01f);
        DeviceFloats dp(p, pad), dg(g, pad), dm(m, pad), dv(v, pad), dvmax(vmax, pad);
        DeviceInts step({t - 1});  // steps taken before this one
        cpu::adam_update(s, n, p.data(), g.data(), m.data(), v.data(),
                         c.amsgrad ? vmax.data() : nullptr);
        galley::kernels::OptimizerTensor ot{};
        ot.p = dp.get(), ot.g = dg.get(), ot.m = dm.get(), ot.v = dv.get();
        ot.vmax = c.amsgrad ? dvmax.get() : nullptr, ot.step = step.get(), ot.n = n;
        gk::adam_update_multi(s, lr, beta1, beta2, &ot, 1, nullptr);
        EXPECT_EQ(step.host()[0], t) << what << ": the step counter advances";
        // The same float operations; either compiler may fuse a multiply-add (1 ulp per step).
        expect_close(dp.host(), p, 1e-6, 1e-7, what + " p");
        expect_close(dm.host(), m, 1e-6, 1e-7, what + " m");
        expect_close(dv.host(), v, 1e-6, 1e-9, what + " v");
        if (c.amsgrad) expect_close(dvmax.host(), vmax, 1e-6, 1e-9, what + " vmax");
      }
#endif
}

TEST(CudaLaunchers, SgdUpdatesMatchTheCpu) {
  REQUIRE_GPU();
#ifdef GALLEY_HAVE_CUDA
  struct Case {
    float momentum, dampening, weight_decay;
    bool nesterov, first, maximize;
  };
  for (const Case& c :
       {Case{0.f, 0.f, 1e-4f, false, false, false}, Case{0.9f, 0.f, 0.f, false, true, false},
        Case{0.9f, 0.1f, 1e-4f, true, false, false}, Case{0.9f, 0.f, 0.f, false, false, false},
        Case{0.f, 0.f, 1e-4f, false, false, true}, Case{0.9f, 0.1f, 1e-4f, true, true, true}})
    for (int64_t n : {1003, 1 << 20})
      for (int64_t pad : {0, 1}) {
        galley::kernels::SGDStep s{};
        s.lr = 0.1f, s.momentum = c.momentum, s.dampening = c.dampening;
        s.one_minus_dampening = static_cast<float>(1.0 - double(c.dampening));
        s.weight_decay = c.weight_decay, s.nesterov = c.nesterov, s.first = c.first;
        s.maximize = c.maximize;
        const std::string what = "SGD momentum=" + std::to_string(c.momentum) +
                                 (c.nesterov ? " nesterov" : "") + (c.first ? " first" : "") +
                                 (c.maximize ? " maximize" : "") + " n=" + std::to_string(n) +
                                 " pad=" + std::to_string(pad);
        const bool momentum = c.momentum != 0.f;
        std::vector<float> p = normal(n), g = normal(n), buf = normal(n, 0.1f);
        DeviceFloats dp(p, pad), dg(g, pad), dbuf(buf, pad);
        cpu::sgd_update(s, n, p.data(), g.data(), momentum ? buf.data() : nullptr);
        galley::kernels::OptimizerTensor ot{};
        ot.p = dp.get(), ot.g = dg.get(), ot.buf = momentum ? dbuf.get() : nullptr, ot.n = n;
        ot.first = c.first;
        gk::sgd_update_multi(s, &ot, 1, nullptr);
        expect_close(dp.host(), p, 1e-6, 1e-7, what + " p");
        if (momentum) expect_close(dbuf.host(), buf, 1e-6, 1e-7, what + " buf");
      }
#endif
}
