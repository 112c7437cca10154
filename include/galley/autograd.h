#pragma once
/// \file The graph that backward() walks, and the helper ops use to record themselves.
///
/// An op computes its output, then calls autograd::record() with its inputs and a closure
/// that turns the output's gradient into the inputs' gradients. Nothing is recorded when
/// no input requires a gradient or a NoGradGuard is alive, so inference pays nothing.
#include <functional>
#include <memory>
#include <vector>

#include "galley/tensor.h"

namespace galley::autograd {

/// Turns the gradient of an op's output into the gradients of its inputs. It writes
/// `grad_inputs[i]` for each input that needs one and may leave the others undefined.
using BackwardFn = std::function<void(const Tensor& grad_output, std::vector<Tensor>& grad_inputs)>;

/// One recorded op: its inputs (kept alive until backward has run) and its closure.
struct Node {
  const char* name = "";
  std::vector<Tensor> inputs;
  BackwardFn backward;
  bool released = false;  // set once backward has consumed it
};

/// True when an op on `inputs` must be recorded.
bool needs_grad(std::initializer_list<const Tensor*> inputs);

/// Attaches a Node to `output` when any input requires a gradient. Returns `output`.
Tensor record(Tensor output, const char* name, std::vector<Tensor> inputs, BackwardFn backward);

/// Runs backward from `root` with `gradient` (same shape as root).
void run_backward(const Tensor& root, const Tensor& gradient);

}  // namespace galley::autograd
