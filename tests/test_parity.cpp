// Parity with PyTorch: every op's output and gradients, a SimpleCNN trained 20 Adam steps, a
// BatchNorm ResNet trained 20 SGD-momentum steps and then evaluated,
// the optimizers and the learning-rate schedules, against reference tensors that
// tests/parity/make_reference.py writes with torch (see that script for the file layout).
//
// The references live in $GALLEY_PARITY_DIR (ctest sets it and generates them first); when
// the variable is unset or the directory is missing, every test here is skipped.
//
// Tolerances. An element a_i of galley's result passes against torch's b_i when
//     |a_i - b_i| <= atol + rtol * s_i
// with s_i = max_j |b_j| ("normwise") or s_i = |b_i| ("elementwise"):
//   * op outputs and gradients: atol = rtol = 1e-5, normwise. Reductions (matmul, conv,
//     the gradients of broadcast inputs, sums) are accurate relative to the size of the
//     terms they add, not to the result, which cancellation can bring near zero; so the
//     error is measured against the tensor's largest entry. Measured against float64,
//     torch's own float32 references stay within 0.15 of this tolerance (worst case: the
//     weight gradient of the SimpleCNN convolution, 1800 terms per entry), which leaves room
//     for galley to add in another order.
//   * activations (gelu and its tanh form, silu, sigmoid, tanh, leaky_relu), forward and
//     backward: rtol = 1e-6 normwise, no atol. Elementwise, where 1 + erf(x) or 1 + tanh(x)
//     cancels (x < -3), torch float32 is itself far from float64 (1.0 relative at the tails);
//     normwise it is within 3e-8 of it, and galley's erf/tanh/exp (a few ulps) are as close.
//   * SimpleCNN losses: rtol = 1e-4 elementwise (torch float32 vs float64: 5e-6).
//   * SimpleCNN final parameters: atol = 1e-4, a tenth of one Adam step at lr 1e-3. Away
//     from kinks the runs agree to ~5e-7 (torch float32 vs float64: 6e-7), but each step
//     has 230k max-pool windows and a few are near-ties (gaps below 1e-6): rounding-level
//     differences let galley pick the other element of such a window, which changes one
//     conv channel's gradient by ~1e-3 for that step, and Adam turns this into parameter
//     differences of a few hundredths of a step (2.3e-5 seen). A wrong update rule moves
//     parameters by a sizeable fraction of a step each time and is caught here and by the
//     losses.
//   * tiny-model optimizer runs: as the ops (torch float32 vs float64: 1e-7).
//   * ResNet: first-step logits and gradients, state after 20 steps and eval logits as the ops,
//     losses as SimpleCNN's. Torch float32 against float64 on the same run: 8e-7 normwise on
//     the gradients, 1.4e-6 on the final state, 3.5e-6 on the eval logits, 2e-7 on the losses.
//   * learning rates: rtol = 1e-6 elementwise (the references are stored as float32).
#include <gtest/gtest.h>

#include <galley/galley.h>

#include "models.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace {

using galley::Shape;
using galley::Tensor;
using Refs = std::map<std::string, Tensor>;

// ----------------------------------------------------------------------------- loading

/// The reference directory, or nullopt with the reason to skip.
std::optional<std::string> parity_dir(std::string* why) {
  const char* dir = std::getenv("GALLEY_PARITY_DIR");
  if (dir == nullptr || *dir == '\0') {
    *why =
        "GALLEY_PARITY_DIR is not set; run through ctest, or generate the references with "
        "tests/parity/make_reference.py --out DIR and set GALLEY_PARITY_DIR=DIR";
    return std::nullopt;
  }
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    *why = std::string("GALLEY_PARITY_DIR=") + dir +
           " is not a directory; generate it with tests/parity/make_reference.py --out " + dir +
           " (needs python3 with torch)";
    return std::nullopt;
  }
  return std::string(dir);
}

/// Loads DIR/<name>.safetensors into `refs`; skips the test without a directory, and fails
/// it when the file is absent or unreadable.
#define LOAD_REFS(refs, name)                                               \
  Refs refs;                                                                \
  do {                                                                      \
    std::string why_;                                                       \
    auto dir_ = parity_dir(&why_);                                          \
    if (!dir_) GTEST_SKIP() << why_;                                        \
    const std::string path_ = *dir_ + "/" + (name) + ".safetensors";        \
    try {                                                                   \
      refs = galley::io::load_safetensors(path_);                           \
    } catch (const std::exception& e_) {                                    \
      FAIL() << "cannot load the references " << path_ << ": " << e_.what() \
             << " (regenerate with tests/parity/make_reference.py)";        \
    }                                                                       \
  } while (0)

const Tensor& at(const Refs& refs, const std::string& key) {
  auto it = refs.find(key);
  if (it == refs.end())
    throw std::runtime_error("reference tensor '" + key + "' is missing from the file");
  return it->second;
}

/// The case names of an op file: the part of each key before its first dot, in file order.
std::vector<std::string> case_names(const Refs& refs) {
  std::vector<std::string> names;
  std::set<std::string> seen;
  for (const auto& [key, t] : refs) {
    std::string c = key.substr(0, key.find('.'));
    if (seen.insert(c).second) names.push_back(c);
  }
  return names;
}

// ----------------------------------------------------------------------------- comparing

struct Tol {
  double atol;
  double rtol;
  bool normwise;
};
constexpr Tol kOpTol{1e-5, 1e-5, true};
constexpr Tol kActivationTol{0.0, 1e-6, true};
constexpr Tol kLossTol{0.0, 1e-4, false};
constexpr Tol kCnnParamTol{1e-4, 0.0, false};
constexpr Tol kLrTol{0.0, 1e-6, false};
/// Ops that only move data (and multiply by small integers): bit for bit.
constexpr Tol kExact{0.0, 0.0, false};

std::string index_str(int64_t flat, const Shape& shape) {
  std::vector<int64_t> idx(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    idx[d] = shape[d] == 0 ? 0 : flat % shape[d];
    flat = shape[d] == 0 ? 0 : flat / shape[d];
  }
  std::ostringstream os;
  os << "[";
  for (size_t d = 0; d < idx.size(); ++d) os << (d ? ", " : "") << idx[d];
  os << "]";
  return os.str();
}

/// Compares galley's `actual` with torch's `expected` (float32 within `tol`, int64 exactly).
/// The failure message names `what` (op, case and tensor), the worst element and how many fail.
::testing::AssertionResult close(const std::string& what, const Tensor& actual,
                                 const Tensor& expected, Tol tol) {
  if (!actual.defined())
    return ::testing::AssertionFailure() << what << ": galley's tensor is undefined";
  if (actual.shape() != expected.shape())
    return ::testing::AssertionFailure() << what << ": shape " << galley::shape_str(actual.shape())
                                         << ", torch has " << galley::shape_str(expected.shape());
  if (actual.dtype() != expected.dtype())
    return ::testing::AssertionFailure() << what << ": dtype " << galley::dtype_name(actual.dtype())
                                         << ", torch has " << galley::dtype_name(expected.dtype());
  const Shape& shape = expected.shape();
  if (expected.dtype() == galley::DType::Int64) {
    auto a = actual.to_vector<int64_t>(), b = expected.to_vector<int64_t>();
    int64_t bad = 0, first = -1;
    for (size_t i = 0; i < b.size(); ++i)
      if (a[i] != b[i] && bad++ == 0) first = static_cast<int64_t>(i);
    if (bad == 0) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure()
           << what << ": " << bad << " of " << b.size() << " elements differ; first at "
           << index_str(first, shape) << ": galley " << a[first] << ", torch " << b[first];
  }
  auto a = actual.to_vector<float>(), b = expected.to_vector<float>();
  double max_abs = 0;
  for (float v : b) max_abs = std::max(max_abs, std::fabs(static_cast<double>(v)));
  int64_t bad = 0, worst = -1;
  double worst_ratio = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    const double ai = a[i], bi = b[i];
    const double limit = tol.atol + tol.rtol * (tol.normwise ? max_abs : std::fabs(bi));
    const double err = std::fabs(ai - bi);
    const double ratio = err == 0.0 ? 0.0 : std::isnan(err) ? INFINITY : err / limit;  // 0/0: equal
    if (!(ratio <= 1.0)) ++bad;
    if (worst < 0 || ratio > worst_ratio || std::isnan(ai)) {
      worst = static_cast<int64_t>(i);
      worst_ratio = ratio;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  const double limit = tol.atol + tol.rtol * (tol.normwise ? max_abs : std::fabs(b[worst]));
  std::ostringstream os;
  os.precision(9);
  os << what << ": " << bad << " of " << b.size() << " elements out of tolerance; worst at "
     << index_str(worst, shape) << ": galley " << a[worst] << ", torch " << b[worst] << ", |diff| "
     << std::fabs(static_cast<double>(a[worst]) - b[worst]) << " > allowed " << limit << " (atol "
     << tol.atol << " + rtol " << tol.rtol;
  if (tol.normwise)
    os << " x max|torch| " << max_abs << ")";
  else
    os << " x |torch|)";
  return ::testing::AssertionFailure() << os.str();
}

// ----------------------------------------------------------------------------- op cases

/// One case of an op file: hands out its inputs (marking float ones as wanting gradients)
/// and its settings.
class Case {
 public:
  Case(const Refs& refs, std::string op, std::string name)
      : refs_(refs), op_(std::move(op)), name_(std::move(name)) {}

  /// Input `role`; float inputs become leaves whose gradients are checked afterwards.
  Tensor in(const std::string& role) {
    Tensor t = at(refs_, key(role)).detach().clone();
    if (t.dtype() == galley::DType::Float32) {
      t.set_requires_grad(true);
      inputs_.emplace_back(role, t);
    }
    return t;
  }
  bool has(const std::string& role) const { return refs_.count(key(role)) != 0; }
  int64_t i(const std::string& role) const { return at(refs_, key(role)).to_vector<int64_t>()[0]; }
  float f(const std::string& role) const { return at(refs_, key(role)).to_vector<float>()[0]; }
  const Tensor& ref(const std::string& role) const { return at(refs_, key(role)); }
  const std::string& name() const { return name_; }
  std::string what(const std::string& role) const { return op_ + "/" + name_ + " " + role; }
  const std::vector<std::pair<std::string, Tensor>>& inputs() const { return inputs_; }

 private:
  std::string key(const std::string& role) const { return name_ + "." + role; }

  const Refs& refs_;
  std::string op_, name_;
  std::vector<std::pair<std::string, Tensor>> inputs_;
};

/// Runs `fn` on every case of `op`'s file and checks the output, then back-propagates
/// grad_out and checks the gradient of every float input.
void check_op(const Refs& refs, const std::string& op, const std::function<Tensor(Case&)>& fn,
              Tol tol = kOpTol) {
  const auto names = case_names(refs);
  ASSERT_FALSE(names.empty()) << op << ": the reference file holds no case";
  for (const auto& name : names) {
    Case c(refs, op, name);
    try {
      Tensor out = fn(c);
      EXPECT_TRUE(close(c.what("out"), out, c.ref("out"), tol));
      if (!c.has("grad_out")) continue;  // integer output: no gradient
      out.backward(c.ref("grad_out"));
      for (const auto& [role, input] : c.inputs()) {
        if (!c.has("grad_" + role)) continue;
        EXPECT_TRUE(close(c.what("grad_" + role), input.grad(), c.ref("grad_" + role), tol));
      }
    } catch (const std::exception& e) {
      ADD_FAILURE() << op << "/" << name << ": " << e.what();
    }
  }
}

TEST(parity, Add) {
  LOAD_REFS(refs, "add");
  check_op(refs, "add", [](Case& c) { return galley::add(c.in("a"), c.in("b")); });
}

TEST(parity, Sub) {
  LOAD_REFS(refs, "sub");
  check_op(refs, "sub", [](Case& c) { return galley::sub(c.in("a"), c.in("b")); });
}

TEST(parity, Mul) {
  LOAD_REFS(refs, "mul");
  check_op(refs, "mul", [](Case& c) { return galley::mul(c.in("a"), c.in("b")); });
}

TEST(parity, Div) {
  LOAD_REFS(refs, "div");
  check_op(refs, "div", [](Case& c) { return galley::div(c.in("a"), c.in("b")); });
}

TEST(parity, ScalarAddMul) {
  LOAD_REFS(refs, "scalar");
  check_op(refs, "scalar", [](Case& c) {
    const bool is_add = c.name().rfind("add", 0) == 0;
    return is_add ? galley::add(c.in("a"), c.f("s")) : galley::mul(c.in("a"), c.f("s"));
  });
}

TEST(parity, Neg) {
  LOAD_REFS(refs, "neg");
  check_op(refs, "neg", [](Case& c) { return galley::neg(c.in("x")); });
}

TEST(parity, Exp) {
  LOAD_REFS(refs, "exp");
  check_op(refs, "exp", [](Case& c) { return galley::exp(c.in("x")); });
}

TEST(parity, Log) {
  LOAD_REFS(refs, "log");
  check_op(refs, "log", [](Case& c) { return galley::log(c.in("x")); });
}

TEST(parity, Pow) {
  LOAD_REFS(refs, "pow");
  check_op(refs, "pow", [](Case& c) { return galley::pow(c.in("x"), c.f("p")); });
}

TEST(parity, Relu) {
  LOAD_REFS(refs, "relu");
  check_op(refs, "relu", [](Case& c) { return galley::relu(c.in("x")); });
}

TEST(parity, Gelu) {
  LOAD_REFS(refs, "gelu");
  check_op(
      refs, "gelu", [](Case& c) { return galley::gelu(c.in("x")); }, kActivationTol);
}

TEST(parity, GeluTanh) {
  LOAD_REFS(refs, "gelu_tanh");
  check_op(
      refs, "gelu_tanh",
      [](Case& c) { return galley::gelu(c.in("x"), galley::GeluApproximate::Tanh); },
      kActivationTol);
}

TEST(parity, Silu) {
  LOAD_REFS(refs, "silu");
  check_op(
      refs, "silu", [](Case& c) { return galley::silu(c.in("x")); }, kActivationTol);
}

TEST(parity, Sigmoid) {
  LOAD_REFS(refs, "sigmoid");
  check_op(
      refs, "sigmoid", [](Case& c) { return galley::sigmoid(c.in("x")); }, kActivationTol);
}

TEST(parity, Tanh) {
  LOAD_REFS(refs, "tanh");
  check_op(
      refs, "tanh", [](Case& c) { return galley::tanh(c.in("x")); }, kActivationTol);
}

TEST(parity, LeakyRelu) {
  LOAD_REFS(refs, "leaky_relu");
  check_op(
      refs, "leaky_relu",
      [](Case& c) { return galley::leaky_relu(c.in("x"), c.f("negative_slope")); }, kActivationTol);
}

// The layers on the same references: each calls its op with its options.
TEST(parity, ActivationLayers) {
  namespace nn = galley::nn;
  struct Layer {
    const char* file;
    std::function<std::shared_ptr<nn::Layer>(const Case&)> make;
  };
  const Layer layers[] = {
      {"gelu", [](const Case&) { return std::make_shared<nn::GELU>(); }},
      {"gelu_tanh",
       [](const Case&) {
         return std::make_shared<nn::GELU>(
             nn::GELUOptions{.approximate = galley::GeluApproximate::Tanh});
       }},
      {"silu", [](const Case&) { return std::make_shared<nn::SiLU>(); }},
      {"sigmoid", [](const Case&) { return std::make_shared<nn::Sigmoid>(); }},
      {"tanh", [](const Case&) { return std::make_shared<nn::Tanh>(); }},
      {"leaky_relu",
       [](const Case& c) {
         return std::make_shared<nn::LeakyReLU>(
             nn::LeakyReLUOptions{.negative_slope = c.f("negative_slope")});
       }},
  };
  for (const Layer& l : layers) {
    LOAD_REFS(refs, l.file);
    check_op(
        refs, std::string("layer ") + l.file, [&](Case& c) { return (*l.make(c))(c.in("x")); },
        kActivationTol);
  }
}

TEST(parity, Matmul) {
  LOAD_REFS(refs, "matmul");
  check_op(refs, "matmul", [](Case& c) { return galley::matmul(c.in("a"), c.in("b")); });
}

TEST(parity, Linear) {
  LOAD_REFS(refs, "linear");
  check_op(refs, "linear", [](Case& c) {
    Tensor x = c.in("x"), w = c.in("weight");
    return galley::linear(x, w, c.has("bias") ? c.in("bias") : Tensor());
  });
}

TEST(parity, Conv2d) {
  LOAD_REFS(refs, "conv2d");
  check_op(refs, "conv2d", [](Case& c) {
    galley::Conv2dOptions o;
    o.stride = c.i("stride");
    o.padding = c.i("padding");
    o.dilation = c.i("dilation");
    o.groups = c.i("groups");
    Tensor x = c.in("x"), w = c.in("weight");
    return galley::conv2d(x, w, c.has("bias") ? c.in("bias") : Tensor(), o);
  });
}

TEST(parity, MaxPool2d) {
  LOAD_REFS(refs, "max_pool2d");
  check_op(refs, "max_pool2d", [](Case& c) {
    galley::MaxPool2dOptions o;
    o.kernel_size = c.i("kernel_size");
    o.stride = c.i("stride");
    o.padding = c.i("padding");
    return galley::max_pool2d(c.in("x"), o);
  });
}

TEST(parity, BatchNorm) {
  LOAD_REFS(refs, "batch_norm");
  check_op(refs, "batch_norm", [](Case& c) {
    // The running statistics are settings: copies, updated in training, without gradients.
    Tensor rm = c.ref("running_mean").clone(), rv = c.ref("running_var").clone();
    Tensor x = c.in("x");
    Tensor w = c.has("weight") ? c.in("weight") : Tensor();
    Tensor b = c.has("bias") ? c.in("bias") : Tensor();
    Tensor y = galley::batch_norm(x, rm, rv, w, b,
                                  {.training = c.i("training") != 0,
                                   .momentum = c.f("momentum"),
                                   .eps = c.f("eps"),
                                   .relu = c.i("relu") != 0});
    if (c.has("running_mean_after")) {  // the running statistics as the call left them
      EXPECT_TRUE(close(c.what("running_mean"), rm, c.ref("running_mean_after"), kOpTol));
      EXPECT_TRUE(close(c.what("running_var"), rv, c.ref("running_var_after"), kOpTol));
    }
    return y;
  });
}

// BatchNorm2d / BatchNorm1d: a training step's output and gradients, the running statistics
// after two training steps, and the eval output.
TEST(parity, BatchNormLayers) {
  LOAD_REFS(refs, "batch_norm_layers");
  for (const std::string name : {"bn2d", "bn1d", "bn2d_cumulative", "bn2d_eps_momentum",
                                 "bn2d_no_affine", "bn1d_no_running"}) {
    SCOPED_TRACE(name);
    auto ref = [&](const std::string& role) { return at(refs, name + "." + role); };
    auto has = [&](const std::string& role) { return refs.count(name + "." + role) != 0; };
    auto what = [&](const std::string& role) { return "batch_norm_layers/" + name + " " + role; };
    auto number = [&](const std::string& role) { return ref(role).to_vector<float>()[0]; };
    auto flag = [&](const std::string& role) { return ref(role).to_vector<int64_t>()[0] != 0; };
    const int64_t channels = ref("x0").size(1);
    galley::nn::BatchNormLayerOptions o{.eps = number("eps"),
                                        .affine = flag("affine"),
                                        .track_running_stats = flag("track_running_stats")};
    if (number("momentum") < 0)
      o.momentum = std::nullopt;
    else
      o.momentum = number("momentum");
    std::unique_ptr<galley::nn::BatchNorm> m;
    if (ref("x0").dim() == 4)
      m = std::make_unique<galley::nn::BatchNorm2D>(channels, o);
    else
      m = std::make_unique<galley::nn::BatchNorm1D>(channels, o);
    if (o.affine) {
      m->weight().copy_(ref("weight"));
      m->bias().copy_(ref("bias"));
    }
    Tensor x = ref("x0").clone();
    x.set_requires_grad(true);
    Tensor out = (*m)(x);
    EXPECT_TRUE(close(what("out0"), out, ref("out0"), kOpTol));
    out.backward(ref("grad_out"));
    EXPECT_TRUE(close(what("grad_x"), x.grad(), ref("grad_x"), kOpTol));
    if (o.affine) {
      EXPECT_TRUE(close(what("grad_weight"), m->weight().grad(), ref("grad_weight"), kOpTol));
      EXPECT_TRUE(close(what("grad_bias"), m->bias().grad(), ref("grad_bias"), kOpTol));
    }
    EXPECT_TRUE(close(what("out1"), (*m)(ref("x1")), ref("out1"), kOpTol));
    EXPECT_EQ(has("running_mean"), o.track_running_stats);
    if (o.track_running_stats) {
      EXPECT_TRUE(close(what("running_mean"), m->running_mean(), ref("running_mean"), kOpTol));
      EXPECT_TRUE(close(what("running_var"), m->running_var(), ref("running_var"), kOpTol));
      EXPECT_TRUE(close(what("num_batches_tracked"), m->num_batches_tracked(),
                        ref("num_batches_tracked"), kOpTol));
    }
    m->eval();
    EXPECT_TRUE(close(what("out2"), (*m)(ref("x2")), ref("out2"), kOpTol));
  }
}

TEST(parity, Flatten) {
  LOAD_REFS(refs, "flatten");
  check_op(refs, "flatten",
           [](Case& c) { return galley::flatten(c.in("x"), c.i("start"), c.i("end")); });
}

TEST(parity, Sum) {
  LOAD_REFS(refs, "sum");
  check_op(refs, "sum", [](Case& c) {
    Tensor x = c.in("x");
    return c.has("dim") ? galley::sum(x, c.i("dim"), c.i("keepdim") != 0) : galley::sum(x);
  });
}

TEST(parity, Mean) {
  LOAD_REFS(refs, "mean");
  check_op(refs, "mean", [](Case& c) {
    Tensor x = c.in("x");
    return c.has("dim") ? galley::mean(x, c.i("dim"), c.i("keepdim") != 0) : galley::mean(x);
  });
}

TEST(parity, Softmax) {
  LOAD_REFS(refs, "softmax");
  check_op(refs, "softmax", [](Case& c) { return galley::softmax(c.in("x"), c.i("dim")); });
}

TEST(parity, LogSoftmax) {
  LOAD_REFS(refs, "log_softmax");
  check_op(refs, "log_softmax", [](Case& c) { return galley::log_softmax(c.in("x"), c.i("dim")); });
}

galley::CrossEntropyOptions ce_options(const Case& c) {
  static const galley::Reduction kReductions[] = {galley::Reduction::Mean, galley::Reduction::Sum,
                                                  galley::Reduction::None};
  galley::CrossEntropyOptions o;
  o.reduction = kReductions[c.i("reduction")];
  o.label_smoothing = c.f("label_smoothing");
  o.ignore_index = c.i("ignore_index");
  return o;
}

TEST(parity, CrossEntropy) {
  LOAD_REFS(refs, "cross_entropy");
  check_op(refs, "cross_entropy", [](Case& c) {
    Tensor logits = c.in("logits"), labels = c.in("labels");
    return galley::cross_entropy(logits, labels, ce_options(c));
  });
}

TEST(parity, CrossEntropyLossLayer) {
  LOAD_REFS(refs, "cross_entropy");
  check_op(refs, "nn::CrossEntropyLoss", [](Case& c) {
    Tensor logits = c.in("logits"), labels = c.in("labels");
    return galley::nn::CrossEntropyLoss(ce_options(c))(logits, labels);
  });
}

TEST(parity, Argmax) {
  LOAD_REFS(refs, "argmax");
  check_op(refs, "argmax",
           [](Case& c) { return galley::argmax(c.in("x"), c.i("dim"), c.i("keepdim") != 0); });
}

/// The inputs t0, t1, ... of a cat or stack case.
std::vector<Tensor> numbered_inputs(Case& c) {
  std::vector<Tensor> ts;
  for (int k = 0; c.has("t" + std::to_string(k)); ++k) ts.push_back(c.in("t" + std::to_string(k)));
  return ts;
}

TEST(parity, Cat) {
  LOAD_REFS(refs, "cat");
  check_op(
      refs, "cat", [](Case& c) { return galley::cat(numbered_inputs(c), c.i("dim")); }, kExact);
}

TEST(parity, Stack) {
  LOAD_REFS(refs, "stack");
  check_op(
      refs, "stack", [](Case& c) { return galley::stack(numbered_inputs(c), c.i("dim")); }, kExact);
}

TEST(parity, Split) {
  LOAD_REFS(refs, "split");
  // As make_reference.py's split_rejoined: piece k times k + 1, joined in reverse order.
  check_op(
      refs, "split",
      [](Case& c) {
        Tensor x = c.in("x");
        const int64_t dim = c.i("dim");
        std::vector<Tensor> parts = c.has("sizes")
                                        ? galley::split(x, c.ref("sizes").to_vector<int64_t>(), dim)
                                        : galley::split(x, c.i("split_size"), dim);
        std::vector<Tensor> scaled;
        for (size_t k = parts.size(); k-- > 0;) scaled.push_back(parts[k] * float(k + 1));
        return galley::cat(scaled, dim);
      },
      kExact);
}

TEST(parity, PermuteContiguous) {
  LOAD_REFS(refs, "permute");
  check_op(
      refs, "permute",
      [](Case& c) {
        Tensor p = galley::permute(c.in("x"), c.ref("dims").to_vector<int64_t>());
        EXPECT_FALSE(p.is_contiguous()) << c.name();
        return p.contiguous();
      },
      kExact);
}

TEST(parity, NarrowSelectTranspose) {
  LOAD_REFS(refs, "views");
  check_op(
      refs, "views",
      [](Case& c) {
        Tensor x = c.in("x");
        const int64_t a = c.i("a"), b = c.i("b");
        switch (c.i("op")) {
          case 0:
            return galley::narrow(x, a, b, c.i("length")).contiguous();
          case 1:
            return galley::select(x, a, b).contiguous();
          default:
            return galley::transpose(x, a, b).contiguous();
        }
      },
      kExact);
}

TEST(parity, AvgPool2d) {
  LOAD_REFS(refs, "avg_pool2d");
  check_op(refs, "avg_pool2d", [](Case& c) {
    return galley::avg_pool2d(c.in("x"), {.kernel_size = c.i("kernel_size"),
                                          .stride = c.i("stride"),
                                          .padding = c.i("padding"),
                                          .count_include_pad = c.i("count_include_pad") != 0,
                                          .ceil_mode = c.i("ceil_mode") != 0});
  });
}

TEST(parity, AdaptiveAvgPool2d) {
  LOAD_REFS(refs, "adaptive_avg_pool2d");
  check_op(refs, "adaptive_avg_pool2d", [](Case& c) {
    return galley::adaptive_avg_pool2d(c.in("x"), c.ref("output_size").to_vector<int64_t>());
  });
}

// ----------------------------------------------------------------------------- training

using testmodels::SimpleCNN;

/// The parameters a file holds under `prefix` + name, for every parameter of `model`.
std::map<std::string, Tensor> params_from(const Refs& refs, const galley::nn::Layer& model,
                                          const std::string& prefix) {
  std::map<std::string, Tensor> state;
  for (const auto& [name, p] : model.named_parameters()) state[name] = at(refs, prefix + name);
  return state;
}

/// Compares the per-step losses, reported one by one so a divergence shows where it starts.
void expect_losses(const std::string& what, const std::vector<float>& got, const Tensor& ref,
                   Tol tol) {
  EXPECT_TRUE(close(what + " losses", Tensor::from_vector(got, {static_cast<int64_t>(got.size())}),
                    ref, tol));
}

TEST(parity, SimpleCnnAdam20Steps) {
  LOAD_REFS(refs, "simple_cnn");
  SimpleCNN model;
  std::vector<std::string> names;
  for (const auto& [name, p] : model.named_parameters()) names.push_back(name);
  ASSERT_EQ(names, (std::vector<std::string>{"conv.weight", "conv.bias", "fc.weight", "fc.bias"}));
  model.load_state_dict(params_from(refs, model, ""));

  galley::optim::Adam opt(model.parameters(), {.learning_rate = 1e-3});
  galley::nn::CrossEntropyLoss loss_fn;
  const Tensor& ref_losses = at(refs, "losses");
  const int64_t steps = ref_losses.numel();
  ASSERT_EQ(steps, 20);
  std::vector<float> losses;
  for (int64_t s = 0; s < steps; ++s) {
    opt.zero_grad();
    Tensor loss =
        loss_fn(model(at(refs, "x" + std::to_string(s))), at(refs, "y" + std::to_string(s)));
    losses.push_back(loss.item());
    loss.backward();
    opt.step();
  }
  expect_losses("simple_cnn", losses, ref_losses, kLossTol);
  for (const auto& [name, p] : model.named_parameters())
    EXPECT_TRUE(close("simple_cnn final " + name, p, at(refs, "final." + name), kCnnParamTol));
}

// galley::models::ResNet (2 stages of 2 basic blocks at width 4: identity and projection
// shortcuts, in-place residual sums, fused BN+ReLU, global average pooling) from PyTorch's
// initial state: the first step's logits, gradients and running statistics, the losses of 20
// SGD steps with momentum and weight decay in training mode, every parameter and buffer after
// them, then the logits and loss of an eval batch, which use the running statistics.
TEST(parity, ResNetSgdMomentum20StepsThenEval) {
  LOAD_REFS(refs, "resnet");
  galley::models::ResNet model(
      {.in_channels = 3, .num_classes = 10, .width = 4, .stages = 2, .blocks_per_stage = 2});
  std::map<std::string, Tensor> init;
  for (const auto& [name, t] : model.named_state()) init[name] = at(refs, "init." + name);
  size_t file_entries = 0;
  for (const auto& [key, t] : refs) file_entries += key.rfind("init.", 0) == 0;
  ASSERT_EQ(file_entries, init.size()) << "galley's state and PyTorch's have other names";
  model.load_state_dict(init);

  galley::optim::SGD opt(model.parameters(),
                         {.learning_rate = 0.05, .momentum = 0.9, .weight_decay = 5e-4});
  const Tensor& ref_losses = at(refs, "losses");
  ASSERT_EQ(ref_losses.numel(), 20);
  std::vector<float> losses;
  for (int64_t s = 0; s < ref_losses.numel(); ++s) {
    opt.zero_grad();
    Tensor out = model(at(refs, "x" + std::to_string(s)));
    Tensor loss = galley::cross_entropy(out, at(refs, "y" + std::to_string(s)));
    losses.push_back(loss.item());
    loss.backward();
    if (s == 0) {
      EXPECT_TRUE(close("resnet step 0 logits", out, at(refs, "out0"), kOpTol));
      for (const auto& [name, b] : model.named_buffers())
        if (name.find("running") != std::string::npos)
          EXPECT_TRUE(close("resnet step 0 " + name, b, at(refs, "step0." + name), kOpTol));
      for (const auto& [name, p] : model.named_parameters())
        EXPECT_TRUE(
            close("resnet step 0 grad " + name, p.grad(), at(refs, "grad0." + name), kOpTol));
    }
    opt.step();
  }
  expect_losses("resnet", losses, ref_losses, kLossTol);
  for (const auto& [name, t] : model.named_state())
    EXPECT_TRUE(close("resnet after 20 steps " + name, t, at(refs, "final." + name),
                      t.dtype() == galley::DType::Int64 ? kExact : kOpTol));

  model.eval();
  Tensor out = model(at(refs, "eval_x"));
  EXPECT_TRUE(close("resnet eval logits", out, at(refs, "eval_out"), kOpTol));
  EXPECT_TRUE(close("resnet eval loss", galley::cross_entropy(out, at(refs, "eval_y")).reshape({1}),
                    at(refs, "eval_loss"), kLossTol));
}

/// Checks that a hyper-parameter in the file is the one the C++ side uses.
void expect_setting(const Refs& refs, const std::string& key, double value) {
  EXPECT_EQ(at(refs, key).to_vector<float>()[0], static_cast<float>(value))
      << key << ": the references were made with another value; update test_parity.cpp";
}

/// Trains a Linear(6, 4) from the file's initial parameters with `opt` and cross-entropy and
/// compares the losses and the final parameters.
void check_tiny_run(const std::string& file, const Refs& refs, galley::nn::Linear& model,
                    galley::optim::Optimizer& opt) {
  const Tensor& ref_losses = at(refs, "losses");
  std::vector<float> losses;
  for (int64_t s = 0; s < ref_losses.numel(); ++s) {
    opt.zero_grad();
    Tensor loss = galley::cross_entropy(model(at(refs, "x" + std::to_string(s))),
                                        at(refs, "y" + std::to_string(s)));
    losses.push_back(loss.item());
    loss.backward();
    opt.step();
  }
  expect_losses(file, losses, ref_losses, kOpTol);
  for (const auto& [name, p] : model.named_parameters())
    EXPECT_TRUE(close(file + " final " + name, p, at(refs, "final." + name), kOpTol));
}

TEST(parity, SgdNesterovWeightDecay) {
  LOAD_REFS(refs, "optim_sgd_nesterov");
  expect_setting(refs, "lr", 0.1);
  expect_setting(refs, "momentum", 0.9);
  expect_setting(refs, "weight_decay", 1e-4);
  galley::nn::Linear model(6, 4);
  model.load_state_dict(params_from(refs, model, ""));
  galley::optim::SGD opt(
      model.parameters(),
      {.learning_rate = 0.1, .momentum = 0.9, .weight_decay = 1e-4, .nesterov = true});
  check_tiny_run("optim_sgd_nesterov", refs, model, opt);
}

TEST(parity, AdamW) {
  LOAD_REFS(refs, "optim_adamw");
  expect_setting(refs, "lr", 1e-2);
  expect_setting(refs, "beta1", 0.9);
  expect_setting(refs, "beta2", 0.999);
  expect_setting(refs, "eps", 1e-8);
  expect_setting(refs, "weight_decay", 1e-2);
  galley::nn::Linear model(6, 4);
  model.load_state_dict(params_from(refs, model, ""));
  galley::optim::AdamW opt(
      model.parameters(),
      {.learning_rate = 1e-2, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 1e-2});
  check_tiny_run("optim_adamw", refs, model, opt);
}

TEST(parity, AdamAmsgradWeightDecay) {
  LOAD_REFS(refs, "optim_adam_amsgrad");
  expect_setting(refs, "lr", 1e-2);
  expect_setting(refs, "beta1", 0.8);
  expect_setting(refs, "beta2", 0.99);
  expect_setting(refs, "eps", 1e-8);
  expect_setting(refs, "weight_decay", 1e-2);
  galley::nn::Linear model(6, 4);
  model.load_state_dict(params_from(refs, model, ""));
  galley::optim::Adam opt(model.parameters(), {.learning_rate = 1e-2,
                                               .beta1 = 0.8,
                                               .beta2 = 0.99,
                                               .eps = 1e-8,
                                               .weight_decay = 1e-2,
                                               .amsgrad = true});
  check_tiny_run("optim_adam_amsgrad", refs, model, opt);
}

TEST(parity, SgdMaximize) {
  LOAD_REFS(refs, "optim_sgd_maximize");
  expect_setting(refs, "lr", 0.05);
  expect_setting(refs, "momentum", 0.9);
  expect_setting(refs, "dampening", 0.2);
  expect_setting(refs, "weight_decay", 1e-2);
  galley::nn::Linear model(6, 4);
  model.load_state_dict(params_from(refs, model, ""));
  galley::optim::SGD opt(model.parameters(), {.learning_rate = 0.05,
                                              .momentum = 0.9,
                                              .dampening = 0.2,
                                              .weight_decay = 1e-2,
                                              .maximize = true});
  check_tiny_run("optim_sgd_maximize", refs, model, opt);
}

// torch.optim.AdamW(lr=1e-2, maximize=True): its weight decay is the default, left unset here.
TEST(parity, AdamWMaximizeDefaultWeightDecay) {
  LOAD_REFS(refs, "optim_adamw_maximize");
  expect_setting(refs, "lr", 1e-2);
  galley::nn::Linear model(6, 4);
  model.load_state_dict(params_from(refs, model, ""));
  galley::optim::AdamW opt(model.parameters(), {.learning_rate = 1e-2, .maximize = true});
  check_tiny_run("optim_adamw_maximize", refs, model, opt);
}

/// Records the rate in force for each of `periods` periods, stepping `sched` after each, and
/// checks lr_at() agrees with what step() set.
std::vector<float> lr_sequence(galley::optim::Optimizer& opt, galley::optim::LRScheduler& sched,
                               int64_t periods) {
  std::vector<float> lrs;
  for (int64_t e = 0; e < periods; ++e) {
    lrs.push_back(static_cast<float>(opt.learning_rate()));
    EXPECT_DOUBLE_EQ(sched.lr_at(e), opt.learning_rate()) << "period " << e;
    sched.step();
  }
  return lrs;
}

TEST(parity, LrSchedulers) {
  LOAD_REFS(refs, "lr_scheduler");
  expect_setting(refs, "step.base_lr", 0.1);
  expect_setting(refs, "step.gamma", 0.5);
  EXPECT_EQ(at(refs, "step.step_size").to_vector<int64_t>()[0], 3);
  expect_setting(refs, "cosine.base_lr", 0.1);
  expect_setting(refs, "cosine.eta_min", 1e-4);
  EXPECT_EQ(at(refs, "cosine.t_max").to_vector<int64_t>()[0], 8);
  {
    Tensor p = galley::zeros({1});
    p.set_requires_grad(true);
    galley::optim::SGD opt(std::vector<Tensor>{p}, {.learning_rate = 0.1});
    galley::optim::StepLR sched(opt, 3, 0.5);
    const Tensor& ref = at(refs, "step.lrs");
    auto lrs = lr_sequence(opt, sched, ref.numel());
    EXPECT_TRUE(close("StepLR lrs", Tensor::from_vector(lrs, ref.shape()), ref, kLrTol));
  }
  {
    Tensor p = galley::zeros({1});
    p.set_requires_grad(true);
    galley::optim::SGD opt(std::vector<Tensor>{p}, {.learning_rate = 0.1});
    galley::optim::CosineAnnealingLR sched(opt, 8, 1e-4);
    const Tensor& ref = at(refs, "cosine.lrs");
    auto lrs = lr_sequence(opt, sched, ref.numel());
    EXPECT_TRUE(close("CosineAnnealingLR lrs", Tensor::from_vector(lrs, ref.shape()), ref, kLrTol));
  }
}

/// Checks a setting the references were made with: int64 ones exactly, float32 ones as floats.
void expect_lr_setting(const Refs& refs, const std::string& key, double value) {
  const Tensor& t = at(refs, key);
  if (t.dtype() == galley::DType::Int64)
    EXPECT_EQ(t.to_vector<int64_t>()[0], static_cast<int64_t>(value))
        << key << ": the references were made with another value; update test_parity.cpp";
  else
    expect_setting(refs, key, value);
}

/// One schedule of lr_scheduler_more: the settings torch used (keys under the case name) and
/// a maker returning the schedulers, the one to step last (a SequentialLR's children first).
struct LrCase {
  std::string name;
  std::vector<std::pair<std::string, double>> settings;
  std::function<std::vector<std::unique_ptr<galley::optim::LRScheduler>>(galley::optim::Optimizer&)>
      make;
};

template <class S, class... Args>
std::vector<std::unique_ptr<galley::optim::LRScheduler>> one(Args&&... args) {
  std::vector<std::unique_ptr<galley::optim::LRScheduler>> v;
  v.push_back(std::make_unique<S>(std::forward<Args>(args)...));
  return v;
}

/// Compares galley's rates with torch's for the case; ReduceLROnPlateau is stepped with the
/// file's metrics.
void check_lr_case(const Refs& refs, const LrCase& c) {
  SCOPED_TRACE(c.name);
  expect_setting(refs, c.name + ".base_lr", 0.1);
  for (const auto& [key, value] : c.settings) expect_lr_setting(refs, c.name + "." + key, value);
  Tensor p = galley::zeros({1});
  p.set_requires_grad(true);
  galley::optim::SGD opt(std::vector<Tensor>{p}, {.learning_rate = 0.1});
  auto scheds = c.make(opt);
  galley::optim::LRScheduler& sched = *scheds.back();
  const Tensor& ref = at(refs, c.name + ".lrs");
  std::vector<float> lrs;
  if (auto* plateau = dynamic_cast<galley::optim::ReduceLROnPlateau*>(&sched)) {
    const std::vector<float> metrics = at(refs, c.name + ".metrics").to_vector<float>();
    ASSERT_EQ(int64_t(metrics.size()) + 1, ref.numel());
    for (int64_t e = 0; e < ref.numel(); ++e) {
      lrs.push_back(static_cast<float>(opt.learning_rate()));
      EXPECT_DOUBLE_EQ(plateau->lr_at(e), opt.learning_rate()) << "period " << e;
      if (e < int64_t(metrics.size())) plateau->step(double(metrics[size_t(e)]));
    }
  } else {
    lrs = lr_sequence(opt, sched, ref.numel() - 1);
    lrs.push_back(static_cast<float>(opt.learning_rate()));
  }
  // torch's OneCycleLR sets a negative rate at period total_steps (one past the cycle) when its
  // linear anneal overshoots; galley holds it at 0. Those periods are checked apart, since a
  // relative tolerance of a zero rate is zero.
  const std::vector<float> want_all = ref.to_vector<float>();
  std::vector<float> got, want;
  for (size_t i = 0; i < want_all.size(); ++i) {
    if (want_all[i] < 0) {
      EXPECT_EQ(lrs[i], 0.f) << "period " << i << ": torch's rate " << want_all[i];
      continue;
    }
    got.push_back(lrs[i]);
    want.push_back(want_all[i]);
  }
  const Shape shape{int64_t(want.size())};
  EXPECT_TRUE(close(c.name + " lrs", Tensor::from_vector(got, shape),
                    Tensor::from_vector(want, shape), kLrTol));
}

TEST(parity, LrSchedulersMore) {
  LOAD_REFS(refs, "lr_scheduler_more");
  using namespace galley::optim;
  using Scheds = std::vector<std::unique_ptr<LRScheduler>>;
  const std::vector<LrCase> cases = {
      {"linear_warmup",
       {{"start_factor", 0.25}, {"end_factor", 1.0}, {"total_iters", 4}},
       [](Optimizer& o) {
         return one<LinearLR>(o, LinearLROptions{.start_factor = 0.25, .total_iters = 4});
       }},
      {"linear_decay",
       {{"start_factor", 1.0}, {"end_factor", 0.1}, {"total_iters", 6}},
       [](Optimizer& o) {
         return one<LinearLR>(
             o, LinearLROptions{.start_factor = 1.0, .end_factor = 0.1, .total_iters = 6});
       }},
      {"linear_default",
       {{"start_factor", 1.0 / 3}, {"end_factor", 1.0}, {"total_iters", 5}},
       [](Optimizer& o) { return one<LinearLR>(o, LinearLROptions{}); }},
      {"onecycle_cos",
       {{"max_lr", 0.5}, {"total_steps", 20}, {"linear", 0}},
       [](Optimizer& o) {
         return one<OneCycleLR>(o, OneCycleLROptions{.max_lr = 0.5, .total_steps = 20});
       }},
      {"onecycle_linear",
       {{"max_lr", 0.5},
        {"total_steps", 20},
        {"pct_start", 0.25},
        {"div_factor", 10.0},
        {"final_div_factor", 100.0},
        {"linear", 1}},
       [](Optimizer& o) {
         return one<OneCycleLR>(o, OneCycleLROptions{.max_lr = 0.5,
                                                     .total_steps = 20,
                                                     .pct_start = 0.25,
                                                     .anneal_strategy = AnnealStrategy::Linear,
                                                     .div_factor = 10.0,
                                                     .final_div_factor = 100.0});
       }},
      {"onecycle_cos_3p",
       {{"max_lr", 0.5}, {"total_steps", 20}, {"three_phase", 1}, {"linear", 0}},
       [](Optimizer& o) {
         return one<OneCycleLR>(
             o, OneCycleLROptions{.max_lr = 0.5, .total_steps = 20, .three_phase = true});
       }},
      {"onecycle_linear_3p",
       {{"max_lr", 0.2},
        {"epochs", 4},
        {"steps_per_epoch", 5},
        {"pct_start", 0.4},
        {"three_phase", 1},
        {"linear", 1}},
       [](Optimizer& o) {
         return one<OneCycleLR>(o, OneCycleLROptions{.max_lr = 0.2,
                                                     .epochs = 4,
                                                     .steps_per_epoch = 5,
                                                     .pct_start = 0.4,
                                                     .anneal_strategy = AnnealStrategy::Linear,
                                                     .three_phase = true});
       }},
      {"plateau_min_rel",
       {{"factor", 0.5}, {"patience", 2}, {"threshold", 1e-2}, {"max", 0}, {"abs", 0}},
       [](Optimizer& o) {
         return one<ReduceLROnPlateau>(
             o, ReduceLROnPlateauOptions{.factor = 0.5, .patience = 2, .threshold = 1e-2});
       }},
      {"plateau_min_abs_cooldown",
       {{"factor", 0.5},
        {"patience", 1},
        {"threshold", 0.05},
        {"cooldown", 2},
        {"min_lr", 0.02},
        {"max", 0},
        {"abs", 1}},
       [](Optimizer& o) {
         return one<ReduceLROnPlateau>(
             o, ReduceLROnPlateauOptions{.factor = 0.5,
                                         .patience = 1,
                                         .threshold = 0.05,
                                         .threshold_mode = ThresholdMode::Abs,
                                         .cooldown = 2,
                                         .min_lr = 0.02});
       }},
      {"plateau_max_rel",
       {{"factor", 0.3},
        {"patience", 2},
        {"threshold", 0.01},
        {"cooldown", 1},
        {"min_lr", 1e-3},
        {"max", 1},
        {"abs", 0}},
       [](Optimizer& o) {
         return one<ReduceLROnPlateau>(o, ReduceLROnPlateauOptions{.mode = PlateauMode::Max,
                                                                   .factor = 0.3,
                                                                   .patience = 2,
                                                                   .threshold = 0.01,
                                                                   .cooldown = 1,
                                                                   .min_lr = 1e-3});
       }},
      {"plateau_max_abs",
       {{"factor", 0.5},
        {"patience", 0},
        {"threshold", 0.02},
        {"min_lr", 0.01},
        {"max", 1},
        {"abs", 1}},
       [](Optimizer& o) {
         return one<ReduceLROnPlateau>(
             o, ReduceLROnPlateauOptions{.mode = PlateauMode::Max,
                                         .factor = 0.5,
                                         .patience = 0,
                                         .threshold = 0.02,
                                         .threshold_mode = ThresholdMode::Abs,
                                         .min_lr = 0.01});
       }},
      {"plateau_default",
       {{"max", 0}, {"abs", 0}},
       [](Optimizer& o) { return one<ReduceLROnPlateau>(o, ReduceLROnPlateauOptions{}); }},
      {"seq_warmup_cosine",
       {{"milestone", 3}, {"t_max", 7}},
       [](Optimizer& o) {
         Scheds v;
         v.push_back(
             std::make_unique<LinearLR>(o, LinearLROptions{.start_factor = 0.1, .total_iters = 3}));
         v.push_back(std::make_unique<CosineAnnealingLR>(o, 7, 1e-3));
         v.push_back(std::make_unique<SequentialLR>(
             o, std::vector<LRScheduler*>{v[0].get(), v[1].get()}, std::vector<int64_t>{3}));
         return v;
       }},
      {"seq_three",
       {{"milestone0", 4}, {"milestone1", 9}},
       [](Optimizer& o) {
         Scheds v;
         v.push_back(
             std::make_unique<LinearLR>(o, LinearLROptions{.start_factor = 0.2, .total_iters = 4}));
         v.push_back(std::make_unique<CosineAnnealingLR>(o, 5));
         v.push_back(std::make_unique<LinearLR>(
             o, LinearLROptions{.start_factor = 1.0, .end_factor = 0.1, .total_iters = 4}));
         v.push_back(std::make_unique<SequentialLR>(
             o, std::vector<LRScheduler*>{v[0].get(), v[1].get(), v[2].get()},
             std::vector<int64_t>{4, 9}));
         return v;
       }},
  };
  std::set<std::string> tested;
  for (const LrCase& c : cases) {
    check_lr_case(refs, c);
    tested.insert(c.name);
  }
  for (const std::string& name : case_names(refs))
    EXPECT_TRUE(tested.count(name)) << "reference case '" << name << "' has no galley schedule";
}

/// The low 16 bits of each element of a 16-bit tensor, as int64 like the references.
std::vector<int64_t> bits16(const Tensor& t) {
  std::vector<uint16_t> raw(static_cast<size_t>(t.numel()));
  t.copy_to_host(raw.data());
  return std::vector<int64_t>(raw.begin(), raw.end());
}

/// Counts the elements where `got` differs from `want` and reports the first few.
void expect_same_bits(const std::string& what, const std::vector<int64_t>& got,
                      const std::vector<int64_t>& want, const std::vector<float>& inputs) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int64_t wrong = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] == want[i]) continue;
    if (++wrong <= 5)
      ADD_FAILURE() << what << ": element " << i << " (input " << std::hexfloat
                    << (i < inputs.size() ? inputs[i] : 0.f) << std::defaultfloat << ") gave 0x"
                    << std::hex << got[i] << ", PyTorch 0x" << want[i] << std::dec;
  }
  EXPECT_EQ(wrong, 0) << what << ": " << wrong << " of " << got.size() << " elements differ";
}

TEST(parity, ConvertRoundsAsPyTorch) {
  LOAD_REFS(refs, "convert");
  const Tensor& x = at(refs, "float32.x");
  const std::vector<float> inputs = x.to_vector();
  expect_same_bits("float32 -> bfloat16", bits16(x.to(galley::DType::BFloat16)),
                   at(refs, "float32.bfloat16_bits").to_vector<int64_t>(), inputs);
  expect_same_bits("float32 -> float16", bits16(x.to(galley::DType::Float16)),
                   at(refs, "float32.float16_bits").to_vector<int64_t>(), inputs);
  // Fewer elements than a vector holds take the scalar path: the same bits.
  const std::vector<float> head(inputs.begin() + 1000, inputs.begin() + 1007);
  const std::vector<int64_t> want = at(refs, "float32.float16_bits").to_vector<int64_t>();
  expect_same_bits("float32 -> float16 (7 elements)",
                   bits16(Tensor::from_vector(head, {7}).to(galley::DType::Float16)),
                   std::vector<int64_t>(want.begin() + 1000, want.begin() + 1007), head);
}

TEST(parity, WidenEvery16BitPatternAsPyTorch) {
  LOAD_REFS(refs, "convert");
  const std::vector<int64_t> patterns = at(refs, "widen.bits").to_vector<int64_t>();
  std::vector<uint16_t> raw(patterns.begin(), patterns.end());
  for (auto [dtype, key] : {std::pair{galley::DType::BFloat16, "widen.from_bfloat16"},
                            std::pair{galley::DType::Float16, "widen.from_float16"}}) {
    Tensor h = Tensor::from_host(raw.data(), {int64_t(raw.size())}, dtype);
    const std::vector<float> wide = h.to(galley::DType::Float32).to_vector();
    std::vector<int64_t> got(wide.size());
    for (size_t i = 0; i < wide.size(); ++i) {
      uint32_t b;
      std::memcpy(&b, &wide[i], 4);
      got[i] = b;
    }
    // A NaN pattern widens to a NaN; PyTorch and galley keep the same payload.
    expect_same_bits(std::string(galley::dtype_name(dtype)) + " -> float32", got,
                     at(refs, key).to_vector<int64_t>(), {});
  }
}

}  // namespace
