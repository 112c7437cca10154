#pragma once
/// \file Residual networks of the CIFAR kind (He et al. 2016, section 4.2): a 3x3 stem, stages
/// of basic blocks that double the channels and halve the resolution from the second stage on,
/// global average pooling and one linear layer. ResNet-20 is the default: 3 stages of 3 blocks,
/// 16, 32 and 64 channels. State names are galley's own flat layout ("conv", "bn",
/// "layer1_0.conv1", "layer1_0.bn1", "layer2_0.shortcut_conv", "layer2_0.shortcut_bn", ...,
/// "fc"), not torchvision's nested one ("layer1.0.conv1", "layer2.0.downsample.0"): a PyTorch
/// module whose submodules carry these names (as the parity suite's reference model does)
/// exchanges state dicts with it directly; a torchvision-style one needs its keys renamed.
#include <memory>
#include <string>
#include <vector>

#include "galley/nn/batch_norm.h"
#include "galley/nn/conv2d.h"
#include "galley/nn/layer.h"
#include "galley/nn/linear.h"
#include "galley/nn/pooling.h"

namespace galley::models {

/// conv3x3 (stride) - BatchNorm - ReLU - conv3x3 - BatchNorm, added in place to the shortcut,
/// then ReLU. The shortcut is the input itself, or a 1x1 convolution (with that stride) and a
/// BatchNorm where the channels or the resolution change ("option B"). Convolutions have no
/// bias: the BatchNorm after each one has its own.
class BasicBlock : public nn::Layer {
 public:
  BasicBlock(int64_t in_channels, int64_t out_channels, int64_t stride);
  Tensor forward(const Tensor& x) override;
  std::string repr() const override;

  /// Whether the shortcut is a projection (conv + BatchNorm) rather than the identity.
  bool projects() const { return proj_ != nullptr; }

 private:
  int64_t in_, out_, stride_;
  nn::Conv2D conv1_;
  nn::BatchNorm2D bn1_;  // with its ReLU fused
  nn::Conv2D conv2_;
  nn::BatchNorm2D bn2_;
  std::unique_ptr<nn::Conv2D> proj_;
  std::unique_ptr<nn::BatchNorm2D> proj_bn_;
};

/// The shape of a ResNet.
struct ResNetOptions {
  /// Channels of the input image (1 for Fashion-MNIST, 3 for CIFAR).
  int64_t in_channels = 3;
  /// Outputs of the final linear layer.
  int64_t num_classes = 10;
  /// Channels of the stem and the first stage; each later stage doubles them.
  int64_t width = 16;
  /// Stages; the first keeps the stem's resolution, each later one halves it.
  int64_t stages = 3;
  /// Basic blocks per stage (3: ResNet-20, 5: ResNet-32, 9: ResNet-56).
  int64_t blocks_per_stage = 3;
};

/// A CIFAR-style ResNet over inputs [N, in_channels, H, W] (any H, W that the strides leave at
/// least 1 pixel of), returning logits [N, num_classes].
class ResNet : public nn::Layer {
 public:
  explicit ResNet(ResNetOptions options = {});
  Tensor forward(const Tensor& x) override;
  std::string repr() const override;

  const ResNetOptions& options() const { return opt_; }

 private:
  ResNetOptions opt_;
  nn::Conv2D stem_;
  nn::BatchNorm2D stem_bn_;  // with its ReLU fused
  std::vector<std::unique_ptr<BasicBlock>> blocks_;
  nn::AdaptiveAvgPool2D pool_;
  nn::Linear fc_;
};

}  // namespace galley::models
