#pragma once
/// \file Parameter initialisers (in place, no autograd).
#include "galley/tensor.h"

namespace galley::nn::init {

/// fan_in and fan_out of a weight [out, in, ...] as PyTorch computes them.
std::pair<int64_t, int64_t> fans(const Tensor& w);
/// Uniform in [low, high).
void uniform_(Tensor& t, float low, float high, Generator& gen = default_generator());
/// Kaiming-uniform with leaky-ReLU slope `a` on fan_in (PyTorch's default for Linear and Conv).
void kaiming_uniform_(Tensor& t, float a, Generator& gen = default_generator());

}  // namespace galley::nn::init
