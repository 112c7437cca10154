// The CIFAR-style ResNet: basic blocks with identity or projection shortcuts.
#include "galley/models/resnet.h"

#include "galley/error.h"
#include "galley/ops.h"

namespace galley::models {

namespace {
// The block's stride, checked before any layer is built from it.
int64_t checked_stride(int64_t in, int64_t out, int64_t stride) {
  GALLEY_CHECK(stride >= 1, "BasicBlock(", in, ", ", out, "): stride ", stride, " must be >= 1");
  return stride;
}
}  // namespace

BasicBlock::BasicBlock(int64_t in_channels, int64_t out_channels, int64_t stride)
    : in_(in_channels),
      out_(out_channels),
      stride_(checked_stride(in_channels, out_channels, stride)),
      conv1_(in_channels, out_channels, 3, {.stride = stride, .padding = 1, .bias = false}),
      bn1_(out_channels, {.relu = true}),
      conv2_(out_channels, out_channels, 3, {.padding = 1, .bias = false}),
      bn2_(out_channels, {.relu = true}) {
  register_layer("conv1", conv1_);
  register_layer("bn1", bn1_);
  register_layer("conv2", conv2_);
  register_layer("bn2", bn2_);
  if (stride != 1 || in_channels != out_channels) {
    proj_ = std::make_unique<nn::Conv2D>(in_channels, out_channels, 1,
                                         nn::Conv2DOptions{.stride = stride, .bias = false});
    proj_bn_ = std::make_unique<nn::BatchNorm2D>(out_channels);
    register_layer("shortcut_conv", *proj_);
    register_layer("shortcut_bn", *proj_bn_);
  }
}

Tensor BasicBlock::forward(const Tensor& x) {
  try {
    // bn2 adds the shortcut and applies the ReLU in its own pass.
    const Tensor h = conv2_(bn1_(conv1_(x)));
    return bn2_(h, proj_ ? (*proj_bn_)((*proj_)(x)) : x);
  } catch (...) {
    detail::rethrow_with_prefix(repr() + ": ");
  }
}

std::string BasicBlock::repr() const {
  return detail::str_cat("BasicBlock(", in_, ", ", out_, ", stride=", stride_,
                         proj_ ? ", projection" : "", ")");
}

namespace {
// "ResNet(in_channels=1, ...)": the model's name in messages, also before it is built.
std::string describe(const ResNetOptions& o) {
  return detail::str_cat("ResNet(in_channels=", o.in_channels, ", num_classes=", o.num_classes,
                         ", width=", o.width, ", stages=", o.stages,
                         ", blocks_per_stage=", o.blocks_per_stage, ")");
}

// The options, checked before any layer is built from them.
const ResNetOptions& checked(const ResNetOptions& o) {
  GALLEY_CHECK(o.in_channels >= 1 && o.num_classes >= 1 && o.width >= 1 && o.stages >= 1 &&
                   o.stages <= 8 && o.blocks_per_stage >= 1,
               describe(o), ": every size must be positive, and there are 1 to 8 stages");
  return o;
}
}  // namespace

ResNet::ResNet(ResNetOptions options)
    : opt_(checked(options)),
      stem_(options.in_channels, options.width, 3, {.padding = 1, .bias = false}),
      stem_bn_(options.width, {.relu = true}),
      pool_(1),
      fc_(options.width << (options.stages - 1), options.num_classes) {
  register_layer("conv", stem_);
  register_layer("bn", stem_bn_);
  int64_t in = opt_.width;
  for (int64_t stage = 0; stage < opt_.stages; ++stage) {
    const int64_t out = opt_.width << stage;
    for (int64_t b = 0; b < opt_.blocks_per_stage; ++b) {
      blocks_.push_back(std::make_unique<BasicBlock>(in, out, stage > 0 && b == 0 ? 2 : 1));
      register_layer(detail::str_cat("layer", stage + 1, "_", b), *blocks_.back());
      in = out;
    }
  }
  register_layer("pool", pool_);
  register_layer("fc", fc_);
}

Tensor ResNet::forward(const Tensor& x) {
  GALLEY_CHECK(x.defined() && x.dim() == 4 && x.size(1) == opt_.in_channels, repr(),
               ": expected input [N, ", opt_.in_channels, ", H, W], got ",
               x.defined() ? shape_str(x.shape()) : "undefined");
  Tensor h = stem_bn_(stem_(x));
  for (auto& b : blocks_) h = (*b)(h);
  return fc_(flatten(pool_(h), 1));
}

std::string ResNet::repr() const {
  return describe(opt_);
}

}  // namespace galley::models
