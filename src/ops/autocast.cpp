// Autocast's per-thread setting and its cache of parameters converted to the low-precision dtype.
#include "src/ops/autocast.h"

#include <atomic>
#include <unordered_map>

#include "galley/amp/autocast.h"
#include "galley/autograd.h"
#include "galley/error.h"

namespace galley {

namespace detail {

thread_local AutocastState autocast_state;

namespace {

// Bumped whenever parameters are given new data (Layer::to): a cached copy made before is stale.
std::atomic<uint64_t> parameter_epoch{0};

struct CachedCast {
  Tensor source;  // held so that its address is not reused by another tensor while cached
  Tensor low;
  uint64_t epoch = 0;
  bool recorded = false;  // made with grad mode on (the conversion is in the graph)
  uint64_t version = 0;   // the source's data version when converted
};

thread_local std::unordered_map<const TensorImpl*, CachedCast> cast_cache;

bool still_valid(const CachedCast& c) {
  if (c.epoch != parameter_epoch.load(std::memory_order_acquire)) return false;
  if (c.version != c.source.version()) return false;  // written since (copy_, a load)
  if (c.recorded != grad_enabled()) return false;
  // The conversion's node outlives backward (Node::reusable); a recorded copy needs it.
  const auto& node = c.low.impl()->grad_fn;
  return !(c.recorded && (!node || node->released));
}

}  // namespace

void parameters_changed() {
  parameter_epoch.fetch_add(1, std::memory_order_acq_rel);
}

AutocastPause::AutocastPause() : paused_(autocast_state) {
  autocast_state.enabled = false;
}

AutocastPause::~AutocastPause() {
  autocast_state.enabled = paused_.enabled;
}

Tensor AutocastPause::to(const Tensor& t, DType dtype) const {
  if (!t.defined() || !is_floating_point(t.dtype()) || t.dtype() == dtype) return t;
  // As PyTorch: only float32 leaves that require a gradient (parameters) converted to the
  // low-precision dtype are cached; an activation is converted by the one op that reads it.
  if (dtype != paused_.dtype || t.dtype() != DType::Float32 || !t.is_leaf() || !t.requires_grad())
    return t.to(dtype);
  auto it = cast_cache.find(t.impl());
  if (it != cast_cache.end() && it->second.low.dtype() == dtype && still_valid(it->second))
    return it->second.low;
  CachedCast c{t, t.to(dtype), parameter_epoch.load(std::memory_order_acquire), grad_enabled(),
               t.version()};
  // Its closure converts the gradient back and saves nothing: every forward of the step shares
  // the node, so each of their backwards runs through it.
  if (const auto& node = c.low.impl()->grad_fn) node->reusable = true;
  Tensor low = c.low;
  cast_cache[t.impl()] = std::move(c);
  return low;
}

Tensor AutocastPause::low(const Tensor& t) const {
  return to(t, paused_.dtype);
}

Tensor AutocastPause::f32(const Tensor& t) const {
  return to(t, DType::Float32);
}

namespace {

// As PyTorch's promotion: a 0-dim tensor (a scalar) takes the dtype of the tensors with
// dimensions, and counts only where every one is 0-dim.
template <class Range, class Get>
DType widest_of(const Range& inputs, Get get) {
  bool dimensioned = false;
  for (const auto& item : inputs) {
    const Tensor& t = get(item);
    dimensioned = dimensioned || (t.defined() && is_floating_point(t.dtype()) && t.dim() > 0);
  }
  bool any = false, mixed = false;
  DType d = DType::Float32;
  for (const auto& item : inputs) {
    const Tensor& t = get(item);
    if (!t.defined() || !is_floating_point(t.dtype()) || (dimensioned && t.dim() == 0)) continue;
    mixed = mixed || (any && t.dtype() != d);
    if (!any) d = t.dtype();
    any = true;
  }
  return mixed ? DType::Float32 : d;
}

}  // namespace

DType AutocastPause::widest(std::initializer_list<const Tensor*> inputs) {
  return widest_of(inputs, [](const Tensor* t) -> const Tensor& { return *t; });
}

DType AutocastPause::widest(const std::vector<Tensor>& inputs) {
  return widest_of(inputs, [](const Tensor& t) -> const Tensor& { return t; });
}

std::vector<Tensor> AutocastPause::widened(const std::vector<Tensor>& inputs) const {
  const DType d = widest(inputs);
  std::vector<Tensor> out;
  out.reserve(inputs.size());
  for (const Tensor& t : inputs) out.push_back(to(t, d));
  return out;
}

}  // namespace detail

namespace amp {

Autocast::Autocast(DType dtype, bool enabled)
    : previous_enabled_(detail::autocast_state.enabled),
      previous_dtype_(detail::autocast_state.dtype) {
  // As PyTorch, a disabled scope takes any dtype (a caller's setting passed through as it is).
  GALLEY_CHECK(!enabled || dtype == DType::BFloat16 || dtype == DType::Float16,
               "amp::Autocast: the low-precision dtype must be bfloat16 or float16, got ",
               dtype_name(dtype));
  detail::autocast_state.enabled = enabled;
  detail::autocast_state.dtype = dtype;
  ++detail::autocast_state.depth;
}

Autocast::~Autocast() {
  detail::autocast_state.enabled = previous_enabled_;
  detail::autocast_state.dtype = previous_dtype_;
  if (--detail::autocast_state.depth == 0) clear_autocast_cache();
}

bool is_autocast_enabled() {
  return detail::autocast_state.enabled;
}

DType autocast_dtype() {
  return detail::autocast_state.dtype;
}

void clear_autocast_cache() {
  detail::cast_cache.clear();
}

}  // namespace amp
}  // namespace galley
