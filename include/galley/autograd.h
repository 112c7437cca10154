#pragma once
/// \file The graph that backward() walks, the helper ops use to record themselves, and the
/// checks for non-finite values: the loss guard of backward() and anomaly detection.
///
/// An op computes its output, then calls autograd::record() with its inputs and a closure
/// that turns the output's gradient into the inputs' gradients. Nothing is recorded when
/// no input requires a gradient or a NoGradGuard is alive, so inference pays nothing.
#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "galley/profiler.h"
#include "galley/tensor.h"

namespace galley {

/// Turns the loss guard of backward() on (the default) or off, for every thread.
///
/// With the guard on, backward() without a gradient from a one-element tensor (the loss) whose
/// value is NaN or infinite raises a galley::Error naming the value, "backward: the loss is nan
/// ...". A backward given its gradient is not from a loss (DataParallel's replicas run theirs so,
/// from their share of the output) and is not checked.
/// - On the CPU the loss is read where it lies (no copy, no wait) and the error is raised before
///   any gradient is computed: every parameter's gradient stays as it was.
/// - On a GPU reading the loss would make the host wait for the device at every step, so no value
///   is read: backward() queues a one-thread check on the device's stream and runs. A NaN or
///   infinite loss is reported at the device's next synchronisation (item(), a copy to the host,
///   galley::cuda::synchronize, or the next cross_entropy), as a galley::Error with the same
///   message; by then that step's gradients (and an optimizer step queued after them) are not
///   finite. Read the loss (loss.item()) before backward() to stop on the CPU side first.
/// Turn it off where a non-finite loss is expected and handled (e.g. a dynamic loss scaler that
/// skips such steps).
void set_check_loss_finite(bool on);
/// True while the loss guard is on.
bool check_loss_finite_enabled();

namespace detail {
/// Bit 0: set_detect_anomaly(true); above it, twice the number of live DetectAnomalyGuards.
extern std::atomic<unsigned> anomaly_state;
}  // namespace detail

/// Turns anomaly detection on or off, for every thread (off by default). It is process-wide
/// rather than per thread because a model's forward and backward may run on other threads than
/// the caller's (DataParallel's replicas), and all of them must check.
///
/// While it is on, the output of every op autograd records (every op with an input that requires
/// a gradient: the whole forward of training) and every gradient backward computes are checked
/// for NaN and infinite values. The first one found raises a galley::Error naming the op, the
/// direction (forward or backward), the tensor's shape, and the path of the layer being called
/// when the op ran (the dotted registration names, "layer3.1.conv2"; a backward error names the
/// layer of the op's forward). Checking reads every value: on a GPU each check waits for the
/// device, so expect training to be several times slower. When off, the cost is one relaxed
/// atomic load per op and per layer call.
void set_detect_anomaly(bool on);
/// True while anomaly detection is on (set_detect_anomaly(true) or a live DetectAnomalyGuard).
inline bool is_anomaly_enabled() {
  return detail::anomaly_state.load(std::memory_order_relaxed) != 0;
}

/// Turns anomaly detection on while alive (PyTorch's torch.autograd.detect_anomaly). Guards may
/// nest and live on several threads at once: detection stays on until the last one ends (or
/// while set_detect_anomaly(true) holds).
class DetectAnomalyGuard {
 public:
  DetectAnomalyGuard();
  ~DetectAnomalyGuard();
  DetectAnomalyGuard(const DetectAnomalyGuard&) = delete;
  DetectAnomalyGuard& operator=(const DetectAnomalyGuard&) = delete;
};

}  // namespace galley

namespace galley::autograd {

/// Turns the gradient of an op's output into the gradients of its inputs. It writes
/// `grad_inputs[i]` for each input that needs one and may leave the others undefined.
using BackwardFn = std::function<void(const Tensor& grad_output, std::vector<Tensor>& grad_inputs)>;

/// A tensor an op's backward reads, named for the error that a write into it raises ("weight",
/// "input", "output").
struct Saved {
  const char* role = "";
  Tensor tensor{};
};

/// A saved tensor's data and the version it had when the op was recorded.
struct SavedVersion {
  const char* role = "";
  std::shared_ptr<Storage> storage{};
  uint64_t version = 0;
  Shape shape{};
  DType dtype = DType::Float32;
};

/// One recorded op: its inputs (kept alive until backward has run) and its closure.
struct Node {
  Node() = default;
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;
  /// Releases the chain of nodes it alone holds (through inputs it alone holds) one after
  /// another rather than by recursion, so that dropping a graph a million ops deep without its
  /// backward does not overflow the stack.
  ~Node();

  const char* name = "";
  std::vector<Tensor> inputs{};
  BackwardFn backward;
  /// The versions of the tensors the closure reads (see record()); released with the closure.
  std::vector<SavedVersion> saved{};
  /// The roots of graphs the closure runs backward through itself (DataParallel's replica
  /// outputs): backward checks their saved tensors with this graph's, before anything runs.
  std::vector<Tensor> nested{};
  std::atomic<bool> released{false};  // set once backward has consumed it
  /// Taken by the backward that runs the node (atomically, before it reads the node's inputs):
  /// a second backward through the same graph at the same time is an error, not a race.
  std::atomic<bool> claimed{false};
  /// Set on a node whose closure holds nothing but what its inputs already keep alive
  /// (autocast's cached low-precision copy of a parameter): backward leaves it in place, so that
  /// every graph recorded through the one cached copy can run its own backward, as in PyTorch.
  bool reusable = false;
  /// Set on the node of a scaled loss (amp::GradScaler::scale), and on that of a one-element
  /// value computed from one (scaled losses summed, or divided by the accumulation steps): the
  /// loss guard lets backward start from its output when it is not finite, since the scaler
  /// skips that step itself.
  bool nonfinite_loss_ok = false;
  /// The layer path at the op's forward ("features.1"), kept while anomaly detection is on or a
  /// profiler records (layer_tracked then; "" is outside any named layer).
  std::string layer_path{};
  bool layer_tracked = false;
};

/// True when an op on `inputs` must be recorded.
bool needs_grad(std::initializer_list<const Tensor*> inputs);

/// Attaches a Node to `output` when any input requires a gradient. Returns `output`. With
/// anomaly detection on, first checks `output` for non-finite values (see set_detect_anomaly).
///
/// `saved` lists the tensors whose values the closure reads (an input, the weight, the op's own
/// output; undefined ones are skipped), with the version of their data now. A backward that
/// reaches the node after one of them was written in place (Tensor::version() moved: an
/// optimizer step, copy_, fill_, add_, a load) is refused before any gradient is computed, as
/// PyTorch refuses it ("modified by an inplace operation"): the gradient would be computed from
/// the new values.
Tensor record(Tensor output, const char* name, std::vector<Tensor> inputs, BackwardFn backward,
              std::initializer_list<Saved> saved = {});

/// Runs backward from `root` with `gradient` (same shape as root). With the loss guard on and
/// `from_loss` (backward() without a gradient), a one-element root that is NaN or infinite is an
/// error (see set_check_loss_finite).
void run_backward(const Tensor& root, const Tensor& gradient, bool from_loss = false);

/// True while ops record the path of the layer they run in (Node::layer_path, the profiler's
/// events): while anomaly detection is on or a profiler records.
inline bool layer_paths_enabled() {
  return is_anomaly_enabled() || profiler::is_recording();
}

/// While alive, `name` is the innermost layer being called on this thread. nn::Layer's call
/// operator opens one, with the name the layer was registered under, always (a pointer pushed
/// and popped), so that a profiler started inside a forward pass sees the layers already
/// entered. The name must outlive the scope; an empty name (the top-level model) adds nothing to
/// the path.
class LayerScope {
 public:
  explicit LayerScope(const std::string& name);
  ~LayerScope();
  LayerScope(const LayerScope&) = delete;
  LayerScope& operator=(const LayerScope&) = delete;
};

/// The dotted names of the layers being called on this thread, outermost first
/// ("layer3.1.conv2"); "" outside any named layer.
std::string current_layer_path();

}  // namespace galley::autograd
