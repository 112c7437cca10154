// The benchmark models in libtorch: the same three as models.h (see there), built from
// torch::nn with its default initialisation.
#pragma once

#include <torch/torch.h>

#include <array>
#include <stdexcept>
#include <string>

namespace bench {

/// A model and the shape of one input sample (channels, height, width).
struct TorchModel {
  torch::nn::Sequential net;
  std::array<int64_t, 3> input;
};

namespace detail {
inline torch::nn::Conv2d conv(int64_t in, int64_t out, int64_t pad) {
  return torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 3).padding(pad));
}
inline torch::nn::MaxPool2d pool() {
  return torch::nn::MaxPool2d(torch::nn::MaxPool2dOptions(2));
}
inline torch::nn::Flatten flatten() {
  return torch::nn::Flatten(torch::nn::FlattenOptions().start_dim(1));
}
}  // namespace detail

/// Builds model `name` ("simple", "fashion" or "vgg").
inline TorchModel make_torch_model(const std::string& name) {
  using namespace detail;
  using torch::nn::Linear;
  using torch::nn::ReLU;
  using torch::nn::Sequential;
  if (name == "simple")
    return {Sequential(conv(3, 64, 0), ReLU(), pool(), flatten(), Linear(64 * 15 * 15, 10)),
            {3, 32, 32}};
  if (name == "fashion")
    return {Sequential(conv(1, 32, 1), ReLU(), pool(), conv(32, 64, 1), ReLU(), pool(), flatten(),
                       Linear(64 * 7 * 7, 128), ReLU(), Linear(128, 10)),
            {1, 28, 28}};
  if (name == "vgg")
    return {Sequential(conv(3, 32, 1), ReLU(), conv(32, 32, 1), ReLU(), pool(), conv(32, 64, 1),
                       ReLU(), conv(64, 64, 1), ReLU(), pool(), conv(64, 128, 1), ReLU(), pool(),
                       flatten(), Linear(128 * 4 * 4, 10)),
            {3, 32, 32}};
  throw std::invalid_argument("unknown model '" + name + "' (simple, fashion, vgg)");
}

}  // namespace bench
