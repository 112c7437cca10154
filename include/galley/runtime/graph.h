#pragma once
/// \file CUDA graphs: a whole training step captured once and replayed with one launch.
///
/// A small model's step is hundreds of short kernels; launching them one by one from the host
/// costs more than running them. A captured step is replayed as a single graph launch.
///
///     // Static inputs: the captured step reads these tensors at every replay.
///     Tensor x = galley::zeros({64, 3, 32, 32}, DType::Float32, gpu);
///     Tensor y = galley::zeros({64}, DType::Int64, gpu);
///     Tensor loss;
///     auto step = [&] {
///       loss = loss_fn(model(x), y);
///       loss.backward();
///       optimizer.step();
///       optimizer.clear_grad();
///     };
///     step();                          // once eagerly: optimizer state, cuDNN algorithms
///     galley::cuda::Graph graph;
///     graph.capture(gpu, step);        // records the step; runs nothing
///     for (auto& [data, label] : loader) {
///       x.copy_(data);  y.copy_(label);
///       graph.replay();                // the whole step; `loss` holds its loss
///     }
///
/// What a captured step may do: any galley op on tensors of the capture's device, including
/// backward and the optimizers (Adam and SGD keep their step counts on the device, so replays
/// keep counting). What it may not do: copy between the host and the GPU or read values back
/// (item(), to_vector()); change shapes between replays; depend on host values that change
/// between replays (a learning rate set later is not seen: capture again after changing it, or
/// after loading an optimizer's state, which replaces its tensors). The step must have run
/// eagerly once before the capture: optimizer state created inside a capture is an error.
/// Memory the capture allocates comes from a pool private to the graph, so replays write into
/// the same addresses: tensors created inside the step (like `loss` above) are overwritten by
/// each replay, and the pool is returned when the graph is destroyed.
#include <functional>
#include <memory>

#include "galley/device.h"

namespace galley::cuda {

/// A captured sequence of GPU work, replayable. Move-only.
class Graph {
 public:
  Graph();
  ~Graph();
  Graph(Graph&&) noexcept;
  Graph& operator=(Graph&&) noexcept;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  /// Records what `step` queues on `device`'s compute stream, without running it. The work
  /// queued before is finished first. Errors (a host copy inside the step, something
  /// initialised for the first time during capture) name the device and leave no capture
  /// behind; run the step eagerly once before capturing.
  void capture(Device device, const std::function<void()>& step);
  /// Queues the captured work on the device's compute stream; returns without waiting.
  void replay();
  /// True after a successful capture.
  bool captured() const;
  /// The device of the capture.
  Device device() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace galley::cuda
