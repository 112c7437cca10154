#pragma once
/// \file A chain of layers.
#include <memory>

#include "galley/nn/layer.h"

namespace galley::nn {

/// Runs its layers in order; they are named "0", "1", ... as in PyTorch.
class Sequential : public Layer {
 public:
  Sequential() = default;
  /// Builds from owned layers: Sequential(std::make_shared<Linear>(4, 2), ...).
  template <typename... Ls>
  explicit Sequential(std::shared_ptr<Ls>... layers) {
    (push_back(std::move(layers)), ...);
  }
  /// Appends a layer.
  template <typename L>
  Sequential& push_back(std::shared_ptr<L> layer) {
    layers_.push_back(register_layer(std::to_string(layers_.size()), std::move(layer)));
    return *this;
  }
  /// Runs every layer; errors name the failing layer's index and kind.
  Tensor forward(const Tensor& x) override;
  /// Number of layers.
  size_t size() const { return layers_.size(); }
  /// Layer `i`.
  Layer& operator[](size_t i) {
    GALLEY_CHECK(i < layers_.size(), "Sequential: index ", i, " out of range for ", layers_.size(),
                 " layers");
    return *layers_[i];
  }
  std::string repr() const override;

 private:
  std::vector<std::shared_ptr<Layer>> layers_;
};

}  // namespace galley::nn
