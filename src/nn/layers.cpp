// The built-in layers: Conv2D, MaxPool2D, Linear, the activations, Flatten, Sequential,
// CrossEntropyLoss, and PyTorch's default initialisation.
#include <cmath>

#include "galley/amp/autocast.h"
#include "galley/nn/activation.h"
#include "galley/nn/conv2d.h"
#include "galley/nn/init.h"
#include "galley/nn/linear.h"
#include "galley/nn/loss.h"
#include "galley/nn/max_pool2d.h"
#include "galley/nn/sequential.h"
#include "src/ops/copy.h"

namespace galley::nn {

// ---------------------------------------------------------------------------------------------
// init

namespace init {
std::pair<int64_t, int64_t> fans(const Tensor& w) {
  GALLEY_CHECK(w.dim() >= 2, "init: fan in/out need a weight of rank >= 2, got ",
               shape_str(w.shape()));
  int64_t receptive = 1;
  for (int64_t i = 2; i < w.dim(); ++i) receptive *= w.size(i);
  return {w.size(1) * receptive, w.size(0) * receptive};
}

namespace {
// The dtype of the tensor to initialise, which must be a defined floating one.
DType init_dtype(const Tensor& t) {
  GALLEY_CHECK(t.defined() && is_floating_point(t.dtype()),
               "init: the tensor to initialise must be a defined floating tensor");
  return t.dtype();
}

// Values drawn on the host written into `t` in place (rounded to its dtype, copied to its device):
// a 16-bit tensor, a GPU one or a view of one alike.
void write_into(Tensor& t, Tensor values) {
  init_dtype(t);
  if (t.dtype() != values.dtype() || t.device() != values.device())
    values = values.to(t.dtype()).to(t.device());
  t.bump_version();
  detail::copy_strided(values, t);
}

// A defined tensor of no elements: the fan-based initialisers leave it as it is, as PyTorch does
// (its fans may be 0, which would make their bounds infinite).
bool zero_elements(const Tensor& t) {
  return t.defined() && t.numel() == 0;
}

float leaky_relu_gain(float a) {
  return std::sqrt(2.f / (1.f + a * a));
}
}  // namespace

void uniform_(Tensor& t, float low, float high, Generator& gen) {
  // In the tensor's dtype's grid, as PyTorch's uniform_: float32 values rounded to 16 bits could
  // reach high (bfloat16 over [0, 1) gave 1.0 two times in a thousand).
  const DType dtype = init_dtype(t);
  write_into(t, uniform(t.shape(), low, high, {.dtype = dtype}, gen));
}

void normal_(Tensor& t, float mean, float std, Generator& gen) {
  GALLEY_CHECK(std >= 0, "init::normal_: std ", std, " is negative");
  write_into(t, randn(t.shape(), gen) * std + mean);
}

void constant_(Tensor& t, float value) {
  write_into(t, full(t.shape(), value));
}
void zeros_(Tensor& t) {
  constant_(t, 0.f);
}
void ones_(Tensor& t) {
  constant_(t, 1.f);
}

void kaiming_uniform_(Tensor& t, float a, Generator& gen) {
  if (zero_elements(t)) return;
  const float bound = leaky_relu_gain(a) * std::sqrt(3.f / float(fans(t).first));
  uniform_(t, -bound, bound, gen);
}

void kaiming_normal_(Tensor& t, float a, FanMode mode, Generator& gen) {
  if (zero_elements(t)) return;
  const auto [in, out] = fans(t);
  normal_(t, 0.f, leaky_relu_gain(a) / std::sqrt(float(mode == FanMode::In ? in : out)), gen);
}

void xavier_uniform_(Tensor& t, float gain, Generator& gen) {
  if (zero_elements(t)) return;
  const auto [in, out] = fans(t);
  const float bound = gain * std::sqrt(6.f / float(in + out));
  uniform_(t, -bound, bound, gen);
}

void xavier_normal_(Tensor& t, float gain, Generator& gen) {
  if (zero_elements(t)) return;
  const auto [in, out] = fans(t);
  normal_(t, 0.f, gain * std::sqrt(2.f / float(in + out)), gen);
}
}  // namespace init

namespace {
// PyTorch's reset_parameters() for Linear and Conv: weight kaiming-uniform with a = sqrt(5),
// bias uniform in +-1/sqrt(fan_in).
void default_init(Tensor& weight, Tensor& bias) {
  init::kaiming_uniform_(weight, std::sqrt(5.f));
  if (bias.defined()) {
    const float bound = 1.f / std::sqrt(float(init::fans(weight).first));
    init::uniform_(bias, -bound, bound);
  }
}

// f(), an error from it prefixed with the layer's description.
template <typename F>
Tensor in_layer(const Layer& layer, F&& f) {
  try {
    return f();
  } catch (...) {
    detail::rethrow_with_prefix(layer.repr() + ": ");
  }
}

// Whether a layer's ReLU may take the bias in its own pass (bias_relu) after a product without
// it: exact where the product is float32. A 16-bit product (autocast's, or 16-bit data) would be
// rounded before the bias is added and again after, where relu(op(x, w, b)) rounds once, as
// PyTorch does.
bool fused_bias_relu_exact(const Tensor& x) {
  const DType product = amp::is_autocast_enabled() ? amp::autocast_dtype() : x.dtype();
  return product == DType::Float32;
}
}  // namespace

// ---------------------------------------------------------------------------------------------
// Conv2D

Conv2D::Conv2D(int64_t in_channels, int64_t out_channels, int64_t kernel_size,
               Conv2DOptions options)
    : in_(in_channels), out_(out_channels), k_(kernel_size), opt_(options) {
  GALLEY_CHECK(in_ > 0 && out_ > 0 && k_ > 0, "Conv2D: channels and kernel must be positive, got ",
               in_, ", ", out_, ", ", k_);
  GALLEY_CHECK(opt_.stride > 0 && opt_.dilation > 0 && opt_.padding >= 0 && opt_.groups > 0,
               "Conv2D: stride ", opt_.stride, ", dilation ", opt_.dilation, ", padding ",
               opt_.padding, ", groups ", opt_.groups, " are invalid");
  GALLEY_CHECK(in_ % opt_.groups == 0 && out_ % opt_.groups == 0, "Conv2D: groups ", opt_.groups,
               " must divide in_channels ", in_, " and out_channels ", out_);
  Tensor w = Tensor::empty({out_, in_ / opt_.groups, k_, k_});
  Tensor b = opt_.bias ? Tensor::empty({out_}) : Tensor();
  default_init(w, b);
  weight_ = register_parameter("weight", w);
  if (opt_.bias) bias_ = register_parameter("bias", b);
}

Tensor Conv2D::forward(const Tensor& x) {
  GALLEY_CHECK(x.defined() && x.dim() == 4 && x.size(1) == in_, repr(), ": expected input [N, ",
               in_, ", H, W], got ", x.defined() ? shape_str(x.shape()) : "undefined");
  try {
    const Conv2dOptions o{.stride = opt_.stride,
                          .padding = opt_.padding,
                          .dilation = opt_.dilation,
                          .groups = opt_.groups};
    if (!opt_.relu) return conv2d(x, weight_, bias_, o);
    if (!bias_.defined() || !fused_bias_relu_exact(x)) return relu(conv2d(x, weight_, bias_, o));
    return bias_relu(conv2d(x, weight_, Tensor(), o), bias_, 1);
  } catch (...) {
    detail::rethrow_with_prefix(repr() + ": ");
  }
}

std::string Conv2D::repr() const {
  // The options that differ from their defaults beyond stride and padding, as PyTorch's repr.
  return detail::str_cat(
      "Conv2D(", in_, ", ", out_, ", kernel=", k_, ", stride=", opt_.stride,
      ", padding=", opt_.padding,
      opt_.dilation != 1 ? detail::str_cat(", dilation=", opt_.dilation) : std::string(),
      opt_.groups != 1 ? detail::str_cat(", groups=", opt_.groups) : std::string(),
      opt_.bias ? "" : ", bias=false", opt_.relu ? ", relu" : "", ")");
}

// ---------------------------------------------------------------------------------------------
// MaxPool2D

MaxPool2D::MaxPool2D(int64_t kernel_size, int64_t stride, int64_t padding)
    : opt_{kernel_size, stride == 0 ? kernel_size : stride, padding} {
  GALLEY_CHECK(kernel_size > 0 && opt_.stride > 0 && padding >= 0 && padding <= kernel_size / 2,
               "MaxPool2D: kernel ", kernel_size, ", stride ", opt_.stride, ", padding ", padding,
               " are invalid (padding at most half the kernel)");
}

Tensor MaxPool2D::forward(const Tensor& x) {
  try {
    return max_pool2d(x, opt_);
  } catch (...) {
    detail::rethrow_with_prefix(repr() + ": ");
  }
}

std::string MaxPool2D::repr() const {
  return detail::str_cat("MaxPool2D(kernel=", opt_.kernel_size, ", stride=", opt_.stride,
                         ", padding=", opt_.padding, ")");
}

// ---------------------------------------------------------------------------------------------
// Linear

Linear::Linear(int64_t in_features, int64_t out_features, bool bias)
    : Linear(in_features, out_features, LinearOptions{.bias = bias}) {}

Linear::Linear(int64_t in_features, int64_t out_features, LinearOptions options)
    : in_(in_features), out_(out_features), relu_(options.relu) {
  const bool bias = options.bias;
  GALLEY_CHECK(in_ > 0 && out_ > 0, "Linear: features must be positive, got ", in_, ", ", out_);
  Tensor w = Tensor::empty({out_, in_});
  Tensor b = bias ? Tensor::empty({out_}) : Tensor();
  default_init(w, b);
  weight_ = register_parameter("weight", w);
  if (bias) bias_ = register_parameter("bias", b);
}

Tensor Linear::forward(const Tensor& x) {
  GALLEY_CHECK(x.defined() && x.dim() >= 1 && x.size(-1) == in_, repr(), ": expected input [..., ",
               in_, "], got ", x.defined() ? shape_str(x.shape()) : "undefined");
  try {
    if (!relu_) return linear(x, weight_, bias_);
    if (!bias_.defined() || !fused_bias_relu_exact(x)) return relu(linear(x, weight_, bias_));
    return bias_relu(linear(x, weight_, Tensor()), bias_, -1);
  } catch (...) {
    detail::rethrow_with_prefix(repr() + ": ");
  }
}

std::string Linear::repr() const {
  return detail::str_cat("Linear(", in_, ", ", out_, relu_ ? ", relu" : "", ")");
}

// ---------------------------------------------------------------------------------------------
// Activations, Flatten, Sequential

Tensor ReLU::forward(const Tensor& x) {
  return in_layer(*this, [&] { return relu(x); });
}

GELU::GELU(GELUOptions options) : opt_(options) {
  GALLEY_CHECK(
      opt_.approximate == GeluApproximate::None || opt_.approximate == GeluApproximate::Tanh,
      "GELU: approximate must be GeluApproximate::None or Tanh, got ",
      static_cast<int>(opt_.approximate));
}

Tensor GELU::forward(const Tensor& x) {
  return in_layer(*this, [&] { return gelu(x, opt_.approximate); });
}

std::string GELU::repr() const {
  return opt_.approximate == GeluApproximate::Tanh ? "GELU(approximate='tanh')" : "GELU()";
}

Tensor SiLU::forward(const Tensor& x) {
  return in_layer(*this, [&] { return silu(x); });
}

Tensor Sigmoid::forward(const Tensor& x) {
  return in_layer(*this, [&] { return sigmoid(x); });
}

Tensor Tanh::forward(const Tensor& x) {
  return in_layer(*this, [&] { return tanh(x); });
}

LeakyReLU::LeakyReLU(LeakyReLUOptions options) : opt_(options) {
  GALLEY_CHECK(std::isfinite(opt_.negative_slope), "LeakyReLU: negative_slope must be finite, got ",
               opt_.negative_slope);
}

Tensor LeakyReLU::forward(const Tensor& x) {
  return in_layer(*this, [&] { return leaky_relu(x, opt_.negative_slope); });
}

std::string LeakyReLU::repr() const {
  return detail::str_cat("LeakyReLU(negative_slope=", opt_.negative_slope, ")");
}

Tensor Flatten::forward(const Tensor& x) {
  return in_layer(*this, [&] { return flatten(x, start_, end_); });
}

std::string Flatten::repr() const {
  return detail::str_cat("Flatten(", start_, ", ", end_, ")");
}

Tensor Sequential::forward(const Tensor& x) {
  Tensor h = x;
  for (size_t i = 0; i < layers_.size(); ++i) {
    try {
      h = (*layers_[i])(h);  // through the call operator, which tracks the layer path
    } catch (...) {
      detail::rethrow_with_prefix(detail::str_cat("Sequential[", i, "] "));
    }
  }
  return h;
}

std::string Sequential::repr() const {
  std::string s = "Sequential(";
  for (size_t i = 0; i < layers_.size(); ++i) s += (i ? ", " : "") + layers_[i]->repr();
  return s + ")";
}

// ---------------------------------------------------------------------------------------------
// CrossEntropyLoss

CrossEntropyLoss::CrossEntropyLoss(CrossEntropyOptions options) : opt_(options) {
  GALLEY_CHECK(opt_.label_smoothing >= 0.f && opt_.label_smoothing <= 1.f,
               "CrossEntropyLoss: label_smoothing ", opt_.label_smoothing, " is outside [0, 1]");
}

Tensor CrossEntropyLoss::operator()(const Tensor& logits, const Tensor& labels) const {
  try {
    return cross_entropy(logits, labels, opt_);
  } catch (...) {
    detail::rethrow_with_prefix("CrossEntropyLoss: ");
  }
}

}  // namespace galley::nn
