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

/// Which fan Kaiming initialisation scales by: fan_in keeps the forward's variance, fan_out the
/// backward's.
enum class FanMode { In, Out };
/// Normal with mean 0 and std gain / sqrt(fan), gain sqrt(2 / (1 + a^2)) for a leaky ReLU of
/// slope `a` (0: a ReLU), as torch.nn.init.kaiming_normal_.
void kaiming_normal_(Tensor& t, float a = 0.f, FanMode mode = FanMode::In,
                     Generator& gen = default_generator());
/// Uniform in +-gain sqrt(6 / (fan_in + fan_out)) (Glorot), as torch.nn.init.xavier_uniform_.
void xavier_uniform_(Tensor& t, float gain = 1.f, Generator& gen = default_generator());
/// Normal with std gain sqrt(2 / (fan_in + fan_out)), as torch.nn.init.xavier_normal_.
void xavier_normal_(Tensor& t, float gain = 1.f, Generator& gen = default_generator());
/// Normal with the given mean and std.
void normal_(Tensor& t, float mean = 0.f, float std = 1.f, Generator& gen = default_generator());
/// Every element `value` (zeros_ and ones_ alike).
void constant_(Tensor& t, float value);
void zeros_(Tensor& t);
void ones_(Tensor& t);

/// Each initialiser draws on the host, from the generator's stream, and writes the tensor in
/// place: a 16-bit one, a GPU one and a view alike. The normal ones draw float32 values (the same
/// whatever the dtype or device) rounded once; the uniform ones (uniform_, kaiming_uniform_,
/// xavier_uniform_) draw a 16-bit tensor's values on its dtype's grid, as PyTorch's uniform_, so
/// that none reaches the bound, and a float32 tensor's as float32.

}  // namespace galley::nn::init
