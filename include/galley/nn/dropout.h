#pragma once
/// \file The dropout layer.
#include <cstdint>
#include <string>

#include "galley/nn/layer.h"
#include "galley/ops.h"

namespace galley::nn {

/// Inverted dropout (PyTorch's Dropout), active in training mode only: in evaluation mode it
/// returns its input. It has no parameters or buffers, so it adds nothing to state_dict.
///
/// Each layer draws its masks from a generator of its own, seeded from its seed and its random
/// stream (Layer::set_random_stream): the same seed gives the same masks on every run, on the
/// CPU and on a GPU, and the replicas of DataParallel and the processes of a job, which get
/// different streams, drop different elements.
class Dropout : public Layer {
 public:
  /// Drops with probability `p` in [0, 1]; the seed is drawn from the default generator (so
  /// galley::manual_seed before building the model makes the masks reproducible).
  explicit Dropout(float p = 0.5f);
  /// Drops with probability `p`, masks seeded by `seed`.
  Dropout(float p, uint64_t seed);
  Tensor forward(const Tensor& x) override;
  std::string repr() const override;
  /// Restarts the masks from the layer's seed and `stream` (stream 0: the seed alone).
  void set_random_stream(uint64_t stream) override;
  /// The probability of dropping an element.
  float p() const { return p_; }
  /// The generator the masks come from (registered as "generator": checkpoints keep its state).
  Generator& generator() { return gen_; }

 private:
  float p_;
  uint64_t seed_;
  Generator gen_;
};

}  // namespace galley::nn
