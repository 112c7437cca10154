#pragma once
// Models shared by the tests.
#include "galley/galley.h"

namespace testmodels {

/// The SimpleCNN of the design: conv 3->64 k3, relu, 2x2 max pooling, flatten, linear to 10.
/// Parameter names match the PyTorch module of tests/parity (conv.weight, fc.bias, ...).
class SimpleCNN : public galley::nn::Layer {
 public:
  SimpleCNN() {
    register_layer("conv", conv_);
    register_layer("pool", pool_);
    register_layer("fc", fc_);
  }
  galley::Tensor forward(const galley::Tensor& x) override {
    return fc_(galley::flatten(pool_(galley::relu(conv_(x))), 1));
  }

 private:
  galley::nn::Conv2D conv_{3, 64, 3};
  galley::nn::MaxPool2D pool_{2};
  galley::nn::Linear fc_{64 * 15 * 15, 10};
};

/// Adds its one-element buffer "count" to the input, then counts the call in the buffer:
/// replicas whose buffers are not kept in step drift apart.
class CountingBuffer : public galley::nn::Layer {
 public:
  CountingBuffer() { count_ = &register_buffer("count", galley::zeros({1})); }
  galley::Tensor forward(const galley::Tensor& x) override {
    galley::Tensor y = galley::add(x, *count_);
    galley::NoGradGuard no_grad;
    count_->copy_(galley::add(*count_, 1.f));
    return y;
  }

 private:
  galley::Tensor* count_;
};

/// A Linear(8, 512) (parameters to replicate) followed by a Dropout(0.5) of a fixed seed: every
/// replica and process builds the same layer, so only its random stream tells their masks apart.
class DropoutNet : public galley::nn::Layer {
 public:
  DropoutNet() {
    register_layer("fc", fc_);
    register_layer("drop", drop_);
  }
  galley::Tensor forward(const galley::Tensor& x) override { return drop_(fc_(x)); }

 private:
  galley::nn::Linear fc_{8, 512};
  galley::nn::Dropout drop_{0.5f, 1234};
};

}  // namespace testmodels
