#pragma once
/// \file Loss functions as objects.
#include "galley/ops.h"

namespace galley::nn {

/// Softmax cross-entropy of logits [N, C] against int64 labels [N] (PyTorch's options).
class CrossEntropyLoss {
 public:
  /// Checks the options (label_smoothing in [0, 1]).
  explicit CrossEntropyLoss(CrossEntropyOptions options = {});
  /// The loss; errors name both shapes when logits and labels disagree.
  Tensor operator()(const Tensor& logits, const Tensor& labels) const;

 private:
  CrossEntropyOptions opt_;
};

}  // namespace galley::nn
