// The backward pass: a topological walk over the recorded nodes, freeing each as it goes; the
// loss guard and anomaly detection; the per-thread stack of layers being called.
#include "galley/autograd.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <new>
#include <unordered_map>
#include <unordered_set>

#include "src/ops/binary.h"
#include "src/ops/nonfinite.h"
#include "src/runtime/device_memory.h"

namespace galley {

namespace {
std::atomic<bool> check_loss{true};
}  // namespace

namespace detail {
std::atomic<unsigned> anomaly_state{0};
}  // namespace detail

void set_check_loss_finite(bool on) {
  check_loss.store(on, std::memory_order_relaxed);
}

bool check_loss_finite_enabled() {
  return check_loss.load(std::memory_order_relaxed);
}

void set_detect_anomaly(bool on) {
  if (on)
    detail::anomaly_state.fetch_or(1u, std::memory_order_relaxed);
  else
    detail::anomaly_state.fetch_and(~1u, std::memory_order_relaxed);
}

DetectAnomalyGuard::DetectAnomalyGuard() {
  detail::anomaly_state.fetch_add(2u, std::memory_order_relaxed);
}

DetectAnomalyGuard::~DetectAnomalyGuard() {
  detail::anomaly_state.fetch_sub(2u, std::memory_order_relaxed);
}

}  // namespace galley

namespace galley::autograd {

namespace {

// The layers being called on this thread, innermost last.
thread_local std::vector<const std::string*> layer_stack;

// "nan" for any NaN (its sign bit means nothing), else the value as a stream prints it.
std::string value_str(float v) {
  return std::isnan(v) ? std::string("nan") : detail::str_cat(v);
}

// The first NaN or infinite element of a floating tensor: its index (-1 when none) and value.
int64_t find_nonfinite(const Tensor& t, float* value) {
  if (!is_floating_point(t.dtype()) || t.numel() == 0) return -1;
  // The 16-bit types widen exactly, so their float32 copy has the same non-finite elements.
  if (t.dtype() != DType::Float32) return find_nonfinite(t.detach().to(DType::Float32), value);
  GALLEY_CHECK(!t.device().is_cuda() || !detail::capturing(t.device()),
               "detect_anomaly: checking values reads them back, which a CUDA graph capture on ",
               t.device().str(), " forbids; turn anomaly detection off while capturing");
  const int64_t i = detail::first_nonfinite(t);
  if (i >= 0) {
    Tensor c = t.contiguous();
    detail::copy_bytes(value, Device::cpu(), c.data_ptr<float>() + i, c.device(), sizeof(float));
  }
  return i;
}

std::string in_layer(const std::string& path) {
  return path.empty() ? std::string("outside any named layer") : "in layer '" + path + "'";
}

void check_forward(const Tensor& out, const char* op) {
  float v = 0.f;
  const int64_t i = find_nonfinite(out, &v);
  if (i < 0) return;
  throw Error(detail::str_cat("detect_anomaly: the forward of ", op, " ",
                              in_layer(current_layer_path()), " produced ", value_str(v),
                              " (element ", i, " of its output of shape ", shape_str(out.shape()),
                              ", on ", out.device().str(), ")"));
}

void check_backward(const Node& node, const std::vector<Tensor>& grads) {
  for (size_t k = 0; k < grads.size(); ++k) {
    if (!grads[k].defined()) continue;
    float v = 0.f;
    const int64_t i = find_nonfinite(grads[k], &v);
    if (i < 0) continue;
    const std::string where = node.layer_tracked
                                  ? "whose forward ran " + in_layer(node.layer_path)
                                  : std::string(
                                        "whose forward ran with anomaly detection and the "
                                        "profiler off, so its layer is not known");
    throw Error(detail::str_cat("detect_anomaly: the backward of ", node.name, " (", where,
                                ") produced ", value_str(v), " in the gradient of its input ", k,
                                " (element ", i, " of shape ", shape_str(grads[k].shape()), ", on ",
                                grads[k].device().str(), ")"));
  }
}

// The loss guard: on the host the value is read where it lies; on a GPU a check is queued.
void check_loss_value(const Tensor& root) {
  if (root.numel() != 1 || !is_floating_point(root.dtype())) return;
  if (root.impl()->grad_fn && root.impl()->grad_fn->nonfinite_loss_ok) return;
  if (root.device().is_cpu()) {
    const float v = root.item();
    GALLEY_CHECK(std::isfinite(v), "backward: the loss is ", value_str(v),
                 "; no gradient was computed or changed. galley::set_detect_anomaly(true) names "
                 "the op that first produced a non-finite value; "
                 "galley::set_check_loss_finite(false) turns this check off");
    return;
  }
  detail::report_nonfinite_loss(root.dtype() == DType::Float32 ? root
                                                               : root.detach().to(DType::Float32));
}

}  // namespace

LayerScope::LayerScope(const std::string& name) {
  layer_stack.push_back(&name);
}

LayerScope::~LayerScope() {
  layer_stack.pop_back();
}

std::string current_layer_path() {
  std::string path;
  for (const std::string* name : layer_stack) {
    if (name->empty()) continue;
    if (!path.empty()) path += '.';
    path += *name;
  }
  return path;
}

bool needs_grad(std::initializer_list<const Tensor*> inputs) {
  if (!grad_enabled()) return false;
  for (const Tensor* t : inputs)
    if (t->defined() && t->requires_grad()) return true;
  return false;
}

Tensor record(Tensor output, const char* name, std::vector<Tensor> inputs, BackwardFn backward,
              std::initializer_list<Saved> saved) {
  const bool anomaly = is_anomaly_enabled();
  if (anomaly) check_forward(output, name);
  if (!grad_enabled()) return output;
  bool any = false;
  for (const Tensor& t : inputs) any = any || (t.defined() && t.requires_grad());
  if (!any) return output;
  auto node = std::make_shared<Node>();
  node->name = name;
  // A one-element value computed from a scaled loss (scaled losses summed, one divided by the
  // accumulation steps) is a scaled loss too: the guard leaves it to the scaler.
  if (output.numel() == 1)
    for (const Tensor& t : inputs)
      if (t.defined() && t.impl()->grad_fn && t.impl()->grad_fn->nonfinite_loss_ok) {
        node->nonfinite_loss_ok = true;
        break;
      }
  node->inputs = std::move(inputs);
  node->backward = std::move(backward);
  node->saved.reserve(saved.size());
  for (const Saved& t : saved) {
    if (!t.tensor.defined() || !t.tensor.impl()->storage) continue;
    const detail::TensorImpl& impl = *t.tensor.impl();
    node->saved.push_back({t.role, impl.storage, impl.storage->version(), impl.shape, impl.dtype});
  }
  if (anomaly || profiler::is_recording()) {
    node->layer_path = current_layer_path();
    node->layer_tracked = true;
  }
  output.impl()->grad_fn = std::move(node);
  return output;
}

Node::~Node() {
  // Inputs this node alone holds, whose nodes they alone hold, are taken apart here one after
  // another: their closures first (which may hold the same inputs), then their inputs.
  std::vector<std::shared_ptr<Node>> chain;
  auto take_inputs = [&chain](Node& n) {
    n.backward = nullptr;
    for (Tensor& t : n.inputs) {
      if (!t.defined() || t.impl_ptr().use_count() != 1) continue;
      std::shared_ptr<Node>& fn = t.impl()->grad_fn;
      if (fn && fn.use_count() == 1) chain.push_back(std::move(fn));
    }
    n.inputs.clear();
  };
  take_inputs(*this);
  while (!chain.empty()) {
    std::shared_ptr<Node> n = std::move(chain.back());
    chain.pop_back();
    take_inputs(*n);
  }  // each node goes with no inputs left: its own destructor has nothing to walk
}

namespace {

// Leaves' gradients are read, summed into and replaced under one of these (by the leaf's
// address): backwards on several threads that reach one leaf (shared parameters) add both parts.
std::mutex& leaf_mutex(const void* leaf) {
  static std::mutex stripes[64];
  return stripes[(reinterpret_cast<uintptr_t>(leaf) >> 6) % 64];
}

// Adds `g` into `slot` (taking it over when the slot is empty).
void accumulate(Tensor& slot, const Tensor& g) {
  if (!slot.defined()) {
    slot = g;
    return;
  }
  slot = detail::binary(kernels::BinaryOp::Add, slot, g);
}

// `take`: g is the engine's own sum for this leaf, which it drops afterwards.
void accumulate_leaf(const Tensor& leaf, const Tensor& g, bool take = false) {
  detail::TensorImpl* impl = leaf.impl();
  GALLEY_CHECK(g.shape() == impl->shape, "backward: gradient of shape ", shape_str(g.shape()),
               " for a leaf of shape ", shape_str(impl->shape));
  // A leaf's gradient has the leaf's dtype, as in PyTorch. (A converted copy is the engine's
  // own; `g` itself is passed on untouched so that the sole-owner test below can see it is.)
  if (g.dtype() != impl->dtype) return accumulate_leaf(leaf, g.detach().to(impl->dtype), true);
  Tensor grad;
  {
    std::lock_guard<std::mutex> lock(leaf_mutex(impl));
    if (!impl->grad) {
      // A gradient may alias another tensor of the graph (e.g. the output gradient of an add):
      // the leaf gets a private copy so later in-place accumulation cannot leak into it, unless
      // nothing else refers to the gradient's data, which the leaf then takes over.
      const bool sole = take && g.impl_ptr().use_count() == 1 &&
                        g.impl()->storage.use_count() == 1 && g.is_contiguous() &&
                        g.impl()->offset == 0 && !g.impl()->grad_fn && !g.impl()->requires_grad;
      impl->grad = sole ? g.impl_ptr() : g.detach().clone().impl_ptr();
    } else {
      Tensor acc(impl->grad);
      acc.bump_version();
      detail::add_inplace(acc, g);
    }
    grad = Tensor(impl->grad);
  }
  // By index, each hook copied: a hook may register another (which runs from the next gradient
  // on), which can move the list.
  const size_t hooks = impl->grad_hooks.size();
  for (size_t h = 0; h < hooks; ++h) {
    const std::function<void(const Tensor&)> hook = impl->grad_hooks[h];
    hook(grad);
  }
}

// Every tensor `node` saved still holds the data it saved: a write since (its version moved) is
// an error. `before_any`: checked before any node of the backward ran (else just before this one,
// after a gradient hook of this backward may have written it).
void check_saved(const Node& node, bool before_any) {
  for (const SavedVersion& s : node.saved) {
    const uint64_t now = s.storage->version();
    if (now == s.version) continue;
    const std::string where = node.layer_tracked && !node.layer_path.empty()
                                  ? " (" + in_layer(node.layer_path) + ")"
                                  : std::string();
    throw Error(detail::str_cat(
        "backward: the ", s.role, " (", dtype_name(s.dtype), " ", shape_str(s.shape), ") that ",
        node.name, where, " saved for its gradient was modified in place after the forward (its ",
        "data is at version ", now, ", it was saved at version ", s.version,
        "): the gradient would be computed from the new values. Write it after backward() (an "
        "optimizer step, copy_, fill_, add_, load_state_dict), or pass the op a clone(); ",
        before_any ? "no gradient was computed or changed"
                   : "it was written during this backward (by a gradient hook), after the "
                     "gradients of the nodes that ran before it"));
  }
}

// check_saved on `node` and on every node of the graphs its closure runs itself (Node::nested).
void check_node(const Node& node, bool before_any) {
  check_saved(node, before_any);
  if (node.nested.empty()) return;
  std::vector<const Node*> stack;
  std::unordered_set<const Node*> seen;
  auto push = [&](const Tensor& t) {
    const Node* n = t.defined() ? t.impl()->grad_fn.get() : nullptr;
    if (n && !n->released && seen.insert(n).second) stack.push_back(n);
  };
  for (const Tensor& root : node.nested) push(root);
  while (!stack.empty()) {
    const Node* n = stack.back();
    stack.pop_back();
    check_saved(*n, before_any);
    for (const Tensor& t : n->inputs) push(t);
    for (const Tensor& root : n->nested) push(root);
  }
}

// Runs the nodes of `order` (each after every node that feeds it) from the root's gradient.
void run_nodes(const Tensor& root, const Tensor& gradient,
               std::vector<std::shared_ptr<Node>>& order) {
  const bool anomaly = is_anomaly_enabled();
  // A leaf's gradient is written once per backward, when the last node that feeds it has run,
  // so its hooks see the complete gradient as early as possible.
  struct LeafSlot {
    Tensor leaf, sum;
    int pending = 0;
  };
  std::unordered_map<detail::TensorImpl*, LeafSlot> leaves;
  for (auto& node : order)
    for (const Tensor& in : node->inputs)
      if (in.defined() && in.is_leaf() && in.requires_grad()) {
        LeafSlot& slot = leaves[in.impl()];
        slot.leaf = in;
        ++slot.pending;
      }
  std::unordered_map<Node*, Tensor> grads;
  grads[root.impl()->grad_fn.get()] = gradient;
  std::vector<Tensor> grad_inputs;
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    Node* node = it->get();
    auto git = grads.find(node);
    grad_inputs.assign(node->inputs.size(), Tensor());
    if (git != grads.end()) {  // else nothing reached it: its inputs get no gradient from it
      Tensor g = std::move(git->second);
      grads.erase(git);
      check_node(*node, false);  // a hook of this backward may have written what it saved
      profiler::RecordScope prof(node->name, {&g}, profiler::EventKind::Backward,
                                 &node->layer_path);
      try {
        node->backward(g, grad_inputs);
      } catch (const std::bad_alloc&) {  // a kernel's host allocation: an OutOfMemoryError
        detail::rethrow_with_prefix(detail::str_cat("the backward of ", node->name, ": "));
      }
      if (anomaly) check_backward(*node, grad_inputs);
    }
    for (size_t i = 0; i < node->inputs.size(); ++i) {
      const Tensor& in = node->inputs[i];
      if (!in.defined() || !in.requires_grad()) continue;
      const Tensor& gi = grad_inputs[i];
      if (Node* child = in.impl()->grad_fn.get()) {
        if (gi.defined()) accumulate(grads[child], gi);
        continue;
      }
      LeafSlot& slot = leaves[in.impl()];
      if (gi.defined()) {
        if (slot.sum.defined())
          accumulate(slot.sum, gi);
        else
          slot.sum = std::move(grad_inputs[i]);  // so that the leaf may take it over
      }
      if (--slot.pending == 0 && slot.sum.defined()) {
        accumulate_leaf(slot.leaf, slot.sum, /*take=*/true);
        slot.sum = Tensor();
      }
    }
    // Free the graph as we go: saved tensors and closures are no longer needed.
    if (node->reusable) continue;
    node->backward = nullptr;
    node->released = true;
    node->inputs.clear();
    node->saved.clear();
    node->nested.clear();
  }
}

}  // namespace

void run_backward(const Tensor& root, const Tensor& gradient, bool from_loss) {
  if (from_loss && check_loss.load(std::memory_order_relaxed)) check_loss_value(root);
  if (!root.impl()->grad_fn) {  // a leaf: its gradient is the given one
    accumulate_leaf(root, gradient);
    return;
  }
  // Order the graph so that every node runs after all the nodes that feed it a gradient.
  // `order` owns the nodes, so freeing a node's inputs below cannot free a node still to run.
  std::vector<std::shared_ptr<Node>> order;
  std::unordered_set<Node*> seen;
  // Each node (but a reusable one, which backward leaves as it is) is claimed before its inputs
  // are read: another thread's backward through the same graph cannot then run or free it under
  // this one. What this backward claimed and did not run is given back if it fails.
  std::vector<Node*> claimed;
  auto give_back = [&claimed] {
    for (Node* n : claimed)
      if (!n->released.load()) n->claimed.store(false);
  };
  auto claim = [&claimed](Node& n) {
    if (n.reusable) return;
    if (n.claimed.exchange(true)) {
      GALLEY_CHECK(!n.released.load(), "backward: the graph through ", n.name,
                   " was already freed by an earlier backward()");
      GALLEY_CHECK(false, "backward: the graph through ", n.name,
                   " is being run by another backward() at the same time (on another thread)");
    }
    claimed.push_back(&n);
  };
  try {
    std::vector<std::pair<std::shared_ptr<Node>, size_t>> stack{{root.impl()->grad_fn, 0}};
    seen.insert(stack.back().first.get());
    claim(*stack.back().first);
    while (!stack.empty()) {
      auto& [node, next] = stack.back();
      if (next < node->inputs.size()) {
        const Tensor& in = node->inputs[next++];
        const std::shared_ptr<Node>* child = in.defined() ? &in.impl()->grad_fn : nullptr;
        if (child && *child && seen.insert(child->get()).second) {
          claim(**child);
          stack.push_back({*child, 0});
        }
      } else {
        order.push_back(std::move(node));
        stack.pop_back();
      }
    }
    for (const auto& node : order) check_node(*node, /*before_any=*/true);
    run_nodes(root, gradient, order);
  } catch (...) {
    give_back();
    throw;
  }
}

}  // namespace galley::autograd
