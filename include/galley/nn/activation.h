#pragma once
/// \file Parameter-free layers: the activations (ReLU, GELU, SiLU, Sigmoid, Tanh, LeakyReLU),
/// Identity and Flatten. None holds parameters or buffers: their state_dict is empty.
#include "galley/nn/layer.h"
#include "galley/ops.h"

namespace galley::nn {

/// max(x, 0).
class ReLU : public Layer {
 public:
  Tensor forward(const Tensor& x) override;
  std::string repr() const override { return "ReLU()"; }
};

/// Options of GELU; they mirror PyTorch's.
struct GELUOptions {
  /// None: the exact form with erf; Tanh: PyTorch's tanh approximation.
  GeluApproximate approximate = GeluApproximate::None;
};

/// gelu(x): `nn::GELU()` or `nn::GELU({.approximate = GeluApproximate::Tanh})`.
class GELU : public Layer {
 public:
  explicit GELU(GELUOptions options = {});
  Tensor forward(const Tensor& x) override;
  std::string repr() const override;
  /// The options it was built with.
  const GELUOptions& options() const { return opt_; }

 private:
  GELUOptions opt_;
};

/// silu(x) = x * sigmoid(x).
class SiLU : public Layer {
 public:
  Tensor forward(const Tensor& x) override;
  std::string repr() const override { return "SiLU()"; }
};

/// sigmoid(x) = 1 / (1 + e^-x).
class Sigmoid : public Layer {
 public:
  Tensor forward(const Tensor& x) override;
  std::string repr() const override { return "Sigmoid()"; }
};

/// tanh(x).
class Tanh : public Layer {
 public:
  Tensor forward(const Tensor& x) override;
  std::string repr() const override { return "Tanh()"; }
};

/// Options of LeakyReLU; they mirror PyTorch's.
struct LeakyReLUOptions {
  /// The slope for x <= 0 (finite).
  float negative_slope = 0.01f;
};

/// leaky_relu(x, negative_slope): `nn::LeakyReLU({.negative_slope = 0.2f})`.
class LeakyReLU : public Layer {
 public:
  explicit LeakyReLU(LeakyReLUOptions options = {});
  Tensor forward(const Tensor& x) override;
  std::string repr() const override;
  /// The options it was built with.
  const LeakyReLUOptions& options() const { return opt_; }

 private:
  LeakyReLUOptions opt_;
};

/// Returns its input itself (the same tensor, no copy): a placeholder where a model takes a
/// layer, as PyTorch's nn.Identity.
class Identity : public Layer {
 public:
  Tensor forward(const Tensor& x) override { return x; }
  std::string repr() const override { return "Identity()"; }
};

/// Merges dimensions start_axis..end_axis (default: all but the batch).
class Flatten : public Layer {
 public:
  explicit Flatten(int64_t start_axis = 1, int64_t end_axis = -1)
      : start_(start_axis), end_(end_axis) {}
  Tensor forward(const Tensor& x) override;
  std::string repr() const override;

 private:
  int64_t start_, end_;
};

}  // namespace galley::nn
