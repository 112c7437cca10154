#pragma once
/// \file Parameter-free layers: ReLU and Flatten.
#include "galley/nn/layer.h"

namespace galley::nn {

/// max(x, 0).
class ReLU : public Layer {
 public:
  Tensor forward(const Tensor& x) override;
  std::string repr() const override { return "ReLU()"; }
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
