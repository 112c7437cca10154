// Layer bookkeeping: registration, traversal in registration order, modes, devices, state.
#include "galley/nn/layer.h"

#include <algorithm>
#include <set>

#include "galley/autograd.h"
#include "src/ops/autocast.h"

namespace galley::nn {

namespace {
bool is_float_dtype(DType d) {
  return d == DType::Float32 || d == DType::Float16 || d == DType::BFloat16;
}

// A name must be usable in a state dict key and free among the layer's parameters, buffers and
// layers (as PyTorch refuses an attribute that already exists): a buffer named as a parameter
// would give two state entries one key.
template <typename Params, typename Children>
void check_name(const Layer& owner, const std::string& name, const char* what, const Params& params,
                const Params& buffers, const Children& children,
                const std::vector<std::pair<std::string, Generator*>>& generators) {
  GALLEY_CHECK(!name.empty() && name.find('.') == std::string::npos, owner.repr(), ": ", what,
               " name '", name, "' must be non-empty and contain no '.'");
  const char* taken = nullptr;
  for (auto& [n, t] : params)
    if (n == name) taken = "parameter";
  for (auto& [n, t] : buffers)
    if (n == name) taken = "buffer";
  for (auto& [n, l] : children)
    if (n == name) taken = "layer";
  for (auto& [n, g] : generators)
    if (n == name) taken = "generator";
  GALLEY_CHECK(!taken, owner.repr(), ": cannot register ", what, " '", name, "': a ", taken,
               " of that name is already registered");
}

// Each entry once, under its first name (a layer registered in two places reaches its entries
// twice), as PyTorch's named_parameters() and named_buffers() list them: a tensor is one by its
// data handle, a generator by its address.
const void* identity(const Tensor& t) {
  return t.impl();
}
const void* identity(const Generator* g) {
  return g;
}
template <typename T>
std::vector<std::pair<std::string, T>> first_of_each(std::vector<std::pair<std::string, T>> all) {
  std::vector<std::pair<std::string, T>> out;
  std::set<const void*> seen;
  for (auto& named : all)
    if (seen.insert(identity(named.second)).second) out.push_back(std::move(named));
  return out;
}
}  // namespace

Tensor& Layer::register_parameter(const std::string& name, Tensor value, bool requires_grad) {
  check_name(*this, name, "parameter", params_, buffers_, children_, generators_);
  GALLEY_CHECK(value.defined(), repr(), ": parameter '", name, "' is undefined");
  GALLEY_CHECK(is_floating_point(value.dtype()), repr(), ": parameter '", name, "' is ",
               dtype_name(value.dtype()), "; parameters are float32, bfloat16 or float16");
  // A parameter is a leaf of its own, whatever graph the value came from. With requires_grad
  // false it is frozen even where the value takes a gradient (another layer's weight): a handle
  // of its own on the same data, as PyTorch's Parameter(v, requires_grad=False), so the value's
  // owner keeps training its own.
  Tensor p = value.is_leaf() && (requires_grad || !value.requires_grad()) ? value : value.detach();
  if (requires_grad) p.set_requires_grad(true);
  params_.emplace_back(name, p);
  return params_.back().second;
}

Tensor& Layer::register_buffer(const std::string& name, Tensor value, bool keep_dtype) {
  check_name(*this, name, "buffer", params_, buffers_, children_, generators_);
  GALLEY_CHECK(value.defined(), repr(), ": buffer '", name, "' is undefined");
  buffers_.emplace_back(name, value.detach());
  if (keep_dtype) keep_dtype_.push_back(buffers_.back().second.impl());
  return buffers_.back().second;
}

bool Layer::keeps_dtype(const Tensor& t) const {
  for (const void* p : keep_dtype_)
    if (p == t.impl()) return true;
  for (auto& [n, l] : children_)
    if (l->keeps_dtype(t)) return true;
  return false;
}

bool Layer::reaches(const Layer* other) const {
  if (this == other) return true;
  for (const auto& [n, l] : children_)
    if (l->reaches(other)) return true;
  return false;
}

void Layer::add_child(const std::string& name, Layer* layer, std::shared_ptr<Layer> owned) {
  check_name(*this, name, "layer", params_, buffers_, children_, generators_);
  GALLEY_CHECK(layer != nullptr && layer != this, repr(), ": cannot register layer '", name, "'");
  // The layers form a tree (a layer may be shared, never its own ancestor): walking it must end.
  GALLEY_CHECK(!layer->reaches(this), repr(), ": layer '", name,
               "' contains this layer; registering it would make a cycle");
  children_.emplace_back(name, layer);
  layer->name_ = name;
  if (owned) owned_.push_back(std::move(owned));
}

Tensor Layer::forward(const Tensor& x) {
  // A layer of several inputs given one: its own forward says whether that is an error.
  return forward(std::vector<Tensor>{x});
}

Tensor Layer::forward(const std::vector<Tensor>& inputs) {
  GALLEY_CHECK(inputs.size() != 1, repr(),
               ": defines no forward (override forward(const Tensor&), or "
               "forward(const std::vector<Tensor>&) for several inputs)");
  GALLEY_CHECK(false, repr(), ": takes one input; it was called with ", inputs.size());
  return Tensor();
}

// The scope is opened whether or not paths are being recorded: a profiler started inside a
// forward pass gives the ops after it the whole path, the layers already entered included.
Tensor Layer::operator()(const Tensor& x) {
  autograd::LayerScope scope(name_);
  return forward(x);
}

Tensor Layer::operator()(const std::vector<Tensor>& inputs) {
  if (inputs.size() == 1) return (*this)(inputs[0]);
  autograd::LayerScope scope(name_);
  return forward(inputs);
}

void Layer::collect(const std::string& prefix, bool params, bool buffers,
                    std::vector<NamedTensor>& out) const {
  if (params)
    for (auto& [n, t] : params_) out.emplace_back(prefix + n, t);
  if (buffers)
    for (auto& [n, t] : buffers_) out.emplace_back(prefix + n, t);
  for (auto& [n, l] : children_) l->collect(prefix + n + ".", params, buffers, out);
}

std::vector<NamedTensor> Layer::named_parameters() const {
  std::vector<NamedTensor> all;
  collect("", true, false, all);
  // An optimizer takes each parameter once.
  return first_of_each(std::move(all));
}

std::vector<Tensor> Layer::parameters() const {
  std::vector<Tensor> out;
  for (auto& [n, t] : named_parameters()) out.push_back(t);
  return out;
}

std::vector<NamedTensor> Layer::named_buffers() const {
  std::vector<NamedTensor> all;
  collect("", false, true, all);
  return first_of_each(std::move(all));
}

std::vector<NamedTensor> Layer::named_state() const {
  std::vector<NamedTensor> out;
  collect("", true, true, out);
  return out;
}

Generator& Layer::register_generator(const std::string& name, Generator& gen) {
  check_name(*this, name, "generator", params_, buffers_, children_, generators_);
  generators_.emplace_back(name, &gen);
  return gen;
}

std::vector<std::pair<std::string, Generator*>> Layer::named_generators() const {
  std::vector<std::pair<std::string, Generator*>> out(generators_);
  for (auto& [n, l] : children_)
    for (auto& [name, gen] : l->named_generators()) out.emplace_back(n + "." + name, gen);
  // A checkpoint keeps one state per generator.
  return first_of_each(std::move(out));
}

std::vector<std::pair<std::string, Layer*>> Layer::children() const {
  return children_;
}

void Layer::train(bool on) {
  training_ = on;
  for (auto& [n, l] : children_) l->train(on);
}

void Layer::set_random_stream(uint64_t stream) {
  for (auto& [n, l] : children_) l->set_random_stream(stream);
}

namespace {
// Puts `replacement`'s data under the handle `t` (same shape), so that whoever holds `t` (an
// optimizer, a DataParallel bucket) sees the new data.
void swap_data(const Tensor& t, const Tensor& replacement) {
  detail::TensorImpl* impl = t.impl();
  impl->storage = replacement.impl()->storage;
  impl->offset = replacement.impl()->offset;
  impl->strides = replacement.impl()->strides;
  impl->dtype = replacement.dtype();
}
}  // namespace

void Layer::to(Device device) {
  detail::parameters_changed();  // autocast's converted copies are on the old device
  for (auto& [name, t] : named_state()) {
    if (t.device() == device) continue;
    swap_data(t, t.detach().to(device));
    detail::TensorImpl* impl = t.impl();
    if (impl->grad) impl->grad = Tensor(impl->grad).to(device).impl_ptr();
  }
}

void Layer::to(DType dtype) {
  GALLEY_CHECK(is_floating_point(dtype), repr(), ": to(", dtype_name(dtype),
               "): layers convert to float32, bfloat16 or float16 only");
  detail::parameters_changed();  // autocast's converted copies are of the old values
  for (auto& [name, t] : named_state()) {
    if (t.dtype() == dtype || !is_floating_point(t.dtype()) || keeps_dtype(t)) continue;
    swap_data(t, t.detach().to(dtype));
    detail::TensorImpl* impl = t.impl();
    if (impl->grad) impl->grad = Tensor(impl->grad).to(dtype).impl_ptr();
  }
}

std::map<std::string, Tensor> Layer::state_dict() const {
  std::map<std::string, Tensor> out;
  for (auto& [n, t] : named_state()) out[n] = t.detach().clone();
  return out;
}

namespace {

// "2 missing entries 'a', 'b'": how many names of a kind, and at most ten of them ("" for none).
std::string entries(const std::vector<std::string>& names, const char* kind) {
  if (names.empty()) return "";
  constexpr size_t kShown = 10;
  std::string out =
      std::to_string(names.size()) + " " + kind + (names.size() == 1 ? " entry " : " entries ");
  for (size_t i = 0; i < names.size() && i < kShown; ++i) out += (i ? ", '" : "'") + names[i] + "'";
  if (names.size() > kShown) out += " and " + std::to_string(names.size() - kShown) + " more";
  return out;
}

}  // namespace

Layer::LoadResult Layer::load_state_dict(const std::map<std::string, Tensor>& state, bool strict) {
  auto mine = named_state();
  LoadResult result;
  std::set<std::string> known;
  for (auto& [n, t] : mine) {
    known.insert(n);
    if (!state.count(n)) result.missing_keys.push_back(n);
  }
  for (auto& [n, t] : state)
    if (!known.count(n)) result.unexpected_keys.push_back(n);
  std::sort(result.missing_keys.begin(), result.missing_keys.end());
  if (strict && (!result.missing_keys.empty() || !result.unexpected_keys.empty())) {
    const std::string missing = entries(result.missing_keys, "missing"),
                      unexpected = entries(result.unexpected_keys, "unexpected");
    GALLEY_CHECK(false, repr(), ": load_state_dict: ", missing,
                 missing.empty() || unexpected.empty() ? "" : "; ", unexpected,
                 " (strict = false loads the entries that match)");
  }
  // Check everything before writing anything, so a bad state leaves the layer untouched.
  for (auto& [n, t] : mine) {
    auto it = state.find(n);
    if (it == state.end()) continue;
    GALLEY_CHECK(it->second.defined(), repr(), ": load_state_dict: entry '", n,
                 "' is an undefined tensor");
    GALLEY_CHECK(it->second.shape() == t.shape() &&
                     (it->second.dtype() == t.dtype() || is_float_dtype(it->second.dtype())) &&
                     is_float_dtype(t.dtype()) == is_float_dtype(it->second.dtype()),
                 repr(), ": load_state_dict: '", n, "' has shape ", shape_str(it->second.shape()),
                 " ", dtype_name(it->second.dtype()), ", the layer expects ", shape_str(t.shape()),
                 " ", dtype_name(t.dtype()));
  }
  // Every entry converted to its parameter's dtype before any is written: a conversion that
  // runs out of memory leaves the layer as it was (it left the entries before it loaded).
  // Half-precision files load into float32 parameters (rounded values widen exactly).
  std::vector<std::pair<Tensor, Tensor>> writes;
  for (auto& [n, t] : mine) {
    auto it = state.find(n);
    if (it != state.end()) writes.emplace_back(t, it->second.to(t.dtype()));
  }
  NoGradGuard no_grad;  // (copy_ counts a write: autocast's converted copies are stale)
  for (auto& [to, from] : writes) to.copy_(from);
  return result;
}

void Layer::zero_grad() {
  for (auto& t : parameters()) Tensor(t).set_grad(Tensor());
}

}  // namespace galley::nn
