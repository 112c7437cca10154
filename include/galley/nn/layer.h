#pragma once
/// \file The base of every model and layer: parameters and sub-layers, registered in order.
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "galley/tensor.h"

namespace galley::nn {

/// A named parameter.
using NamedTensor = std::pair<std::string, Tensor>;

/// Base of every layer and model. Parameters and sub-layers are registered in a fixed order,
/// which is the order named_parameters() returns and the order replicas and ranks agree on.
/// Layers hold their children by reference, so a Layer is neither copied nor moved.
class Layer {
 public:
  Layer() = default;
  virtual ~Layer() = default;
  Layer(const Layer&) = delete;
  Layer& operator=(const Layer&) = delete;

  /// The layer's computation on one input. Every layer overrides this or, if it takes several
  /// inputs (a residual join, an attention block), the form below.
  virtual Tensor forward(const Tensor& x);
  /// The computation on several inputs, for layers that take more than one. The default is an
  /// error naming the layer and the number of inputs.
  virtual Tensor forward(const std::vector<Tensor>& inputs);
  /// Calls forward(), recording that this layer is being called, so that anomaly errors and
  /// profiler events name the layer path ("features.1"); call sub-layers through it
  /// (`conv_(x)`, not `conv_.forward(x)`) for their names to appear.
  Tensor operator()(const Tensor& x);
  /// Calls the forward of several inputs (one input goes to the one-input forward).
  Tensor operator()(const std::vector<Tensor>& inputs);
  /// `block(x, skip)`: the same with the inputs as arguments.
  template <typename... More>
  Tensor operator()(const Tensor& first, const Tensor& second, const More&... more) {
    return (*this)(std::vector<Tensor>{first, second, more...});
  }

  /// Registers `value` as a parameter called `name` (it becomes a leaf that wants gradients
  /// when `requires_grad`). Returns the stored handle.
  Tensor& register_parameter(const std::string& name, Tensor value, bool requires_grad = true);
  /// Registers a tensor that is state but not a parameter (e.g. running statistics). With
  /// `keep_dtype`, to(DType) leaves it in its dtype (float32 statistics of a 16-bit layer).
  Tensor& register_buffer(const std::string& name, Tensor value, bool keep_dtype = false);
  /// Registers a generator the layer draws from (Dropout's masks), owned by the layer, so that
  /// checkpoints save and restore where it stands (named_generators). Returns it. Its name
  /// follows the rules of the others: non-empty, no '.', not taken by a parameter, buffer, layer
  /// or generator of this layer.
  Generator& register_generator(const std::string& name, Generator& gen);
  /// Registers a sub-layer that the caller owns (typically a data member). Returns it.
  template <typename L>
  L& register_layer(const std::string& name, L& layer) {
    add_child(name, &layer, nullptr);
    return layer;
  }
  /// Registers a sub-layer that this layer shares ownership of. Returns it.
  template <typename L>
  std::shared_ptr<L> register_layer(const std::string& name, std::shared_ptr<L> layer) {
    add_child(name, layer.get(), layer);
    return layer;
  }

  /// Every parameter, depth first in registration order, with dotted names ("fc.weight"); one
  /// reached twice (a layer registered in two places) once, under its first name, as PyTorch.
  std::vector<NamedTensor> named_parameters() const;
  /// The same list without names.
  std::vector<Tensor> parameters() const;
  /// Every buffer (register_buffer: running statistics, counters), depth first in registration
  /// order, with dotted names ("bn.running_mean"); no parameters.
  std::vector<NamedTensor> named_buffers() const;
  /// Every parameter and buffer with dotted names, each layer's parameters before its buffers
  /// (PyTorch's state_dict order): what state_dict, to() and the replicas of DataParallel carry.
  std::vector<NamedTensor> named_state() const;
  /// Every registered generator, depth first in registration order, with dotted names
  /// ("drop.generator"): what io::save_checkpoint keeps beside the state.
  std::vector<std::pair<std::string, Generator*>> named_generators() const;
  /// Direct children in registration order.
  std::vector<std::pair<std::string, Layer*>> children() const;

  /// Puts this layer and its children in training (true) or evaluation mode.
  virtual void train(bool on = true);
  /// Same as train(false).
  void eval() { train(false); }
  /// True in training mode.
  bool is_training() const { return training_; }

  /// Gives this layer and its children the random stream `stream`: a layer that draws random
  /// numbers (Dropout) restarts from a function of its seed and the stream. DataParallel gives
  /// replica i of process r the stream r * 2^32 + i, so no two replicas or processes draw the
  /// same masks; stream 0 is what a layer draws outside DataParallel.
  virtual void set_random_stream(uint64_t stream);

  /// Moves every parameter and buffer to `device`, keeping the handles (optimizers stay valid).
  void to(Device device);
  /// Converts every floating parameter and buffer (and gradient) to floating `dtype`, keeping
  /// the handles; integer buffers (counters) stay as they are.
  void to(DType dtype);

  /// Copies of every parameter and buffer by dotted name.
  std::map<std::string, Tensor> state_dict() const;
  /// What load_state_dict left unmatched, as PyTorch's `missing_keys` and `unexpected_keys`:
  /// this layer's entries that the state lacks, and the state's entries this layer lacks, each
  /// in name order.
  struct LoadResult {
    std::vector<std::string> missing_keys{}, unexpected_keys{};
  };
  /// Overwrites parameters and buffers by name, as PyTorch does: with `strict`, the state must
  /// hold exactly this layer's entries, and an error lists every missing and unexpected name;
  /// without, those are skipped (and returned) and the rest is loaded. In both, an entry this
  /// layer has must match its shape (an error names the entry and both shapes) and be floating
  /// where it is (half-precision values load into float32 entries). Everything is checked before
  /// anything is written: an error leaves the layer as it was.
  LoadResult load_state_dict(const std::map<std::string, Tensor>& state, bool strict = true);

  /// Sets every parameter's gradient to undefined.
  void zero_grad();

  /// Human-readable name used in error messages ("Conv2D(3, 64, kernel=3)").
  virtual std::string repr() const { return "Layer"; }
  /// The name this layer was registered under in its parent ("conv", "1"); "" for a layer that
  /// is not a registered child (the top-level model). A layer registered twice keeps the last.
  const std::string& name() const { return name_; }

 private:
  void add_child(const std::string& name, Layer* layer, std::shared_ptr<Layer> owned);
  // Whether `other` is this layer or one of its descendants.
  bool reaches(const Layer* other) const;
  void collect(const std::string& prefix, bool params, bool buffers,
               std::vector<NamedTensor>& out) const;
  bool keeps_dtype(const Tensor& t) const;

  bool training_ = true;
  std::string name_;
  // Deques: the handles register_parameter and register_buffer return stay valid as more are
  // registered (a vector's growth moved them, and a layer keeping the reference read freed
  // memory).
  std::deque<std::pair<std::string, Tensor>> params_;
  std::deque<std::pair<std::string, Tensor>> buffers_;
  std::vector<std::pair<std::string, Generator*>> generators_;
  std::vector<const void*> keep_dtype_;  // the TensorImpls of buffers registered keep_dtype
  std::vector<std::pair<std::string, Layer*>> children_;
  std::vector<std::shared_ptr<Layer>> owned_;
};

}  // namespace galley::nn
