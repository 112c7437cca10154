// The benchmark models in galley. models_torch.py, models_libtorch.h and train_step_paddle.py
// define the same ones, layer for layer (resnet: models_torch.py only), with the same
// initialisation (PyTorch's default: kaiming-uniform with a = sqrt(5), i.e. weights and biases
// uniform in +-1/sqrt(fan_in)).
//
//   simple   the SimpleCNN of the README, input [B, 3, 32, 32]:
//            conv 3->64 (3x3) relu pool2 | fc 14400->10
//   fashion  the Fashion-MNIST CNN of examples/fashion_mnist.cpp, input [B, 1, 28, 28]:
//            conv 1->32 pad1 relu pool2 | conv 32->64 pad1 relu pool2 | fc 3136->128 relu | fc 10
//   vgg      a VGG-style CNN, input [B, 3, 32, 32], every conv 3x3 with padding 1:
//            [conv 32, conv 32, pool] [conv 64, conv 64, pool] [conv 128, pool] | fc 2048->10
//   resnet   the ResNet-20 of examples/resnet.cpp (galley::models::ResNet), input [B, 1, 28, 28]:
//            stem conv 1->16 BN ReLU | 3 stages of 3 basic blocks (16, 32, 64 channels at 28,
//            14 and 7 pixels; 1x1 projections where the shape changes) | global avg pool | fc 10
#pragma once

#include <galley/galley.h>

#include <array>
#include <memory>
#include <stdexcept>
#include <string>

namespace bench {

/// A model and the shape of one input sample (channels, height, width).
struct Model {
  std::shared_ptr<galley::nn::Layer> net;
  std::array<int64_t, 3> input;
};

namespace detail {
using namespace galley::nn;
inline std::shared_ptr<Conv2D> conv(int64_t in, int64_t out, int64_t pad) {
  return std::make_shared<Conv2D>(in, out, 3, Conv2DOptions{.padding = pad});
}
inline std::shared_ptr<ReLU> relu() {
  return std::make_shared<ReLU>();
}
inline std::shared_ptr<MaxPool2D> pool() {
  return std::make_shared<MaxPool2D>(2);
}
inline std::shared_ptr<Flatten> flatten() {
  return std::make_shared<Flatten>(1);
}
inline std::shared_ptr<Linear> fc(int64_t in, int64_t out) {
  return std::make_shared<Linear>(in, out);
}
}  // namespace detail

/// The models make_model knows, for usage messages.
constexpr const char* kModelNames = "simple, fashion, vgg, resnet";

/// Builds model `name` (one of kModelNames) from galley's default generator.
inline Model make_model(const std::string& name) {
  using namespace detail;
  if (name == "simple")
    return {std::make_shared<Sequential>(conv(3, 64, 0), relu(), pool(), flatten(),
                                         fc(64 * 15 * 15, 10)),
            {3, 32, 32}};
  if (name == "fashion")
    return {
        std::make_shared<Sequential>(conv(1, 32, 1), relu(), pool(), conv(32, 64, 1), relu(),
                                     pool(), flatten(), fc(64 * 7 * 7, 128), relu(), fc(128, 10)),
        {1, 28, 28}};
  if (name == "vgg")
    return {std::make_shared<Sequential>(conv(3, 32, 1), relu(), conv(32, 32, 1), relu(), pool(),
                                         conv(32, 64, 1), relu(), conv(64, 64, 1), relu(), pool(),
                                         conv(64, 128, 1), relu(), pool(), flatten(),
                                         fc(128 * 4 * 4, 10)),
            {3, 32, 32}};
  if (name == "resnet")
    return {std::make_shared<galley::models::ResNet>(
                galley::models::ResNetOptions{.in_channels = 1, .num_classes = 10}),
            {1, 28, 28}};
  throw std::invalid_argument("unknown model '" + name + "' (" + kModelNames + ")");
}

}  // namespace bench
