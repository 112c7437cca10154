// Tensor handles: storage, shapes and views, host copies, autograd state and the factories that
// are not random. Dtype conversion is in tensor_convert.cpp, random numbers in tensor_random.cpp,
// printing in tensor_print.cpp.
#include "galley/tensor.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "allocator.h"
#include "galley/autograd.h"
#include "galley/half.h"
#include "runtime/device_memory.h"
#include "src/ops/copy.h"

namespace galley {

std::string shape_str(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

int64_t shape_numel(const Shape& s) {
  for (int64_t d : s)
    if (d == 0) return 0;  // also where the other sizes' product would not fit
  int64_t n = 1;
  for (int64_t d : s)
    GALLEY_CHECK(!__builtin_mul_overflow(n, d, &n), "shape ", shape_str(s),
                 " has more elements than a 64-bit count holds");
  return n;
}

namespace {
Shape contiguous_strides(const Shape& shape) {
  Shape st(shape.size());
  int64_t acc = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    st[i] = acc;
    // Only a tensor without elements can have sizes whose product overflows (shape_numel checks
    // the others), and its strides address nothing: saturated rather than wrapped.
    if (__builtin_mul_overflow(acc, shape[i], &acc)) acc = INT64_MAX;
  }
  return st;
}
}  // namespace

// ---------------------------------------------------------------------------------------------
// Storage

Storage::Storage(size_t bytes, Device device, bool pinned) : bytes_(bytes), device_(device) {
  GALLEY_CHECK(!pinned || device.is_cpu(), "page-locked memory is host memory, not ", device.str());
  if (pinned) data_ = detail::pinned_alloc(bytes);
  if (data_) {
    pinned_ = true;
    capacity_ = bytes;
  } else if (device.is_cpu()) {
    data_ = detail::host_alloc(bytes, &capacity_);
  } else {
    data_ = detail::device_alloc(device, bytes);
    capacity_ = bytes;
  }
}

Storage::~Storage() {
  if (pinned_)
    detail::pinned_free(data_);
  else if (device_.is_cpu())
    detail::host_free(data_, capacity_);
  else
    detail::device_free(device_, data_);
}

// ---------------------------------------------------------------------------------------------
// Construction and metadata

namespace {
// The bytes of a contiguous tensor of `shape` and `dtype`; an OutOfMemoryError where they do not
// fit in size_t (no machine has the memory).
size_t storage_bytes(const Shape& shape, DType dtype, const char* what) {
  size_t bytes = 0;
  if (__builtin_mul_overflow(size_t(shape_numel(shape)), dtype_size(dtype), &bytes))
    throw OutOfMemoryError(detail::str_cat(what, ": ", shape_str(shape), " of ", dtype_name(dtype),
                                           " is more bytes than an address space holds"));
  return bytes;
}
}  // namespace

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  for (int64_t d : shape)
    GALLEY_CHECK(d >= 0, "Tensor::empty: negative size in shape ", shape_str(shape));
  auto impl = std::make_shared<detail::TensorImpl>();
  impl->storage = std::make_shared<Storage>(storage_bytes(shape, dtype, "Tensor::empty"), device);
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

Tensor Tensor::empty_pinned(const Shape& shape, DType dtype) {
  for (int64_t d : shape)
    GALLEY_CHECK(d >= 0, "Tensor::empty_pinned: negative size in shape ", shape_str(shape));
  auto impl = std::make_shared<detail::TensorImpl>();
  impl->storage = std::make_shared<Storage>(storage_bytes(shape, dtype, "Tensor::empty_pinned"),
                                            Device::cpu(), true);
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

bool Tensor::is_pinned() const {
  return defined() && impl_->storage && impl_->storage->pinned();
}

Tensor Tensor::pin_memory() const {
  GALLEY_CHECK(defined(), "pin_memory: the tensor is undefined");
  GALLEY_CHECK(device().is_cpu(), "pin_memory: the tensor is on ", device().str(),
               "; only host tensors can be page-locked");
  if (is_pinned()) return *this;
  Tensor out = empty_pinned(shape(), dtype());
  Tensor c = contiguous();
  std::memcpy(out.raw_data(), c.raw_data(), numel() * dtype_size(dtype()));
  return out;
}

Tensor Tensor::from_host(const void* data, const Shape& shape, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  t.copy_from_host(data);
  return t;
}

Tensor Tensor::from_vector(const std::vector<float>& values, const Shape& shape, Device device) {
  GALLEY_CHECK(static_cast<int64_t>(values.size()) == shape_numel(shape),
               "from_vector: ", values.size(), " values do not fill shape ", shape_str(shape));
  return from_host(values.data(), shape, DType::Float32, device);
}

Tensor Tensor::from_vector(const std::vector<int64_t>& values, const Shape& shape, Device device) {
  GALLEY_CHECK(static_cast<int64_t>(values.size()) == shape_numel(shape),
               "from_vector: ", values.size(), " values do not fill shape ", shape_str(shape));
  return from_host(values.data(), shape, DType::Int64, device);
}

#define GALLEY_CHECK_DEFINED(what) GALLEY_CHECK(impl_, what, ": the tensor is undefined")

const Shape& Tensor::shape() const {
  GALLEY_CHECK_DEFINED("shape");
  return impl_->shape;
}
const Shape& Tensor::strides() const {
  GALLEY_CHECK_DEFINED("strides");
  return impl_->strides;
}
int64_t Tensor::size(int64_t d) const {
  int64_t n = dim();
  GALLEY_CHECK(d >= -n && d < n, "size: dimension ", d, " out of range for shape ",
               shape_str(shape()));
  return impl_->shape[d < 0 ? d + n : d];
}
int64_t Tensor::numel() const {
  return shape_numel(shape());
}
DType Tensor::dtype() const {
  GALLEY_CHECK_DEFINED("dtype");
  return impl_->dtype;
}
Device Tensor::device() const {
  GALLEY_CHECK_DEFINED("device");
  return impl_->storage->device();
}
bool Tensor::is_contiguous() const {
  GALLEY_CHECK_DEFINED("is_contiguous");
  const Shape& shape = impl_->shape;
  if (std::find(shape.begin(), shape.end(), 0) != shape.end()) return true;  // no elements
  int64_t expected = 1;
  for (size_t d = shape.size(); d-- > 0;) {
    if (shape[d] == 1) continue;  // never stepped through: any stride
    if (impl_->strides[d] != expected) return false;
    expected *= shape[d];
  }
  return true;
}

void* Tensor::raw_data() const {
  GALLEY_CHECK_DEFINED("data");
  return static_cast<char*>(impl_->storage->data()) + impl_->offset * dtype_size(impl_->dtype);
}

uint64_t Tensor::version() const {
  GALLEY_CHECK_DEFINED("version");
  return impl_->storage ? impl_->storage->version() : 0;
}

void Tensor::bump_version() const {
  if (impl_ && impl_->storage) impl_->storage->bump_version();
}

template <typename T>
T* Tensor::data_ptr() const {
  GALLEY_CHECK_DEFINED("data");
  GALLEY_CHECK(impl_->dtype == dtype_of<T>::value, "data<", dtype_name(dtype_of<T>::value),
               ">: the tensor holds ", dtype_name(impl_->dtype));
  return static_cast<T*>(raw_data());
}

template <typename T>
T* Tensor::data() const {
  GALLEY_CHECK_DEFINED("data");
  GALLEY_CHECK(impl_->storage->device().is_cpu(), "data<", dtype_name(dtype_of<T>::value),
               ">: the tensor of shape ", shape_str(impl_->shape), " is in ",
               impl_->storage->device().str(),
               " memory, which host code cannot read; copy it with .to(Device::cpu()) first");
  return data_ptr<T>();
}

#define GALLEY_INSTANTIATE_DATA(T)     \
  template T* Tensor::data<T>() const; \
  template T* Tensor::data_ptr<T>() const;
GALLEY_INSTANTIATE_DATA(float)
GALLEY_INSTANTIATE_DATA(int64_t)
GALLEY_INSTANTIATE_DATA(uint8_t)
GALLEY_INSTANTIATE_DATA(bfloat16)
GALLEY_INSTANTIATE_DATA(float16)
#undef GALLEY_INSTANTIATE_DATA

// ---------------------------------------------------------------------------------------------
// Host copies

void Tensor::copy_to_host(void* dst) const {
  GALLEY_CHECK_DEFINED("copy_to_host");
  Tensor c = contiguous();
  detail::copy_bytes(dst, Device::cpu(), c.raw_data(), c.device(),
                     c.numel() * dtype_size(c.dtype()));
}

namespace {
// copy_, fill_ and copy_from_host are not recorded by autograd: writing an op's output that is
// part of a graph would change the gradients its backward computes, silently. Refused while
// recording. A leaf, such as a parameter, may be written: its own gradient does not read its
// value, and an op that saved it refuses its backward afterwards (the write counts a version).
void check_unrecorded_write(const char* op, const detail::TensorImpl& t) {
  GALLEY_CHECK(!(t.grad_fn && grad_enabled()), op, ": the tensor written (", dtype_name(t.dtype),
               " ", shape_str(t.shape),
               ") is the output of an op recorded for backward, and this write is not recorded: "
               "it would change that graph's gradients; compute a new tensor instead, or detach() "
               "it first");
}
}  // namespace

void Tensor::copy_from_host(const void* src) {
  GALLEY_CHECK_DEFINED("copy_from_host");
  check_unrecorded_write("copy_from_host", *impl_);
  GALLEY_CHECK(src || numel() == 0, "copy_from_host (from_host): the source pointer is null for ",
               numel(), " elements of shape ", shape_str(shape()));
  bump_version();
  if (!is_contiguous()) {  // a view: the values first, then through its strides
    Tensor dense = empty(shape(), dtype(), device());
    dense.copy_from_host(src);
    detail::copy_strided(dense, *this);
    return;
  }
  detail::copy_bytes(raw_data(), device(), src, Device::cpu(), numel() * dtype_size(dtype()));
}

template <typename T>
std::vector<T> Tensor::to_vector() const {
  GALLEY_CHECK(dtype() == dtype_of<T>::value, "to_vector<", dtype_name(dtype_of<T>::value),
               ">: the tensor holds ", dtype_name(dtype()));
  std::vector<T> out(numel());
  copy_to_host(out.data());
  return out;
}
template std::vector<float> Tensor::to_vector<float>() const;
template std::vector<int64_t> Tensor::to_vector<int64_t>() const;
template std::vector<uint8_t> Tensor::to_vector<uint8_t>() const;
template std::vector<bfloat16> Tensor::to_vector<bfloat16>() const;
template std::vector<float16> Tensor::to_vector<float16>() const;

float Tensor::item() const {
  GALLEY_CHECK(numel() == 1, "item: the tensor has shape ", shape_str(shape()),
               ", not a single element");
  if (!device().is_cpu()) return to(Device::cpu()).item();
  switch (dtype()) {
    case DType::Float32:
      return *static_cast<const float*>(raw_data());
    case DType::Int64:
      return static_cast<float>(*static_cast<const int64_t*>(raw_data()));
    case DType::UInt8:
      return *static_cast<const uint8_t*>(raw_data());
    case DType::BFloat16:
      return *static_cast<const bfloat16*>(raw_data());
    case DType::Float16:
      return *static_cast<const float16*>(raw_data());
    default:
      GALLEY_CHECK(false, "item: unsupported dtype ", dtype_name(dtype()));
  }
  return 0.f;
}

void Tensor::copy_(const Tensor& src) {
  GALLEY_CHECK_DEFINED("copy_");
  check_unrecorded_write("copy_", *impl_);
  GALLEY_CHECK(src.shape() == shape() && src.dtype() == dtype(), "copy_: source ",
               shape_str(src.shape()), " ", dtype_name(src.dtype()), " does not match destination ",
               shape_str(shape()), " ", dtype_name(dtype()));
  if (numel() == 0) return;
  bump_version();
  if (shares_memory_with(src)) {
    // The source read as it was: copied out first (unless it is this very view).
    if (src.impl()->offset == impl_->offset && src.strides() == strides()) return;
    return copy_(src.detach().clone());
  }
  if (!is_contiguous()) {  // a view: through its strides, from a source on its device
    detail::copy_strided(src.device() == device() ? src : src.detach().to(device()), *this);
    return;
  }
  // By the (source, destination) device pair: a plain copy between host memories, a copy queued
  // on the destination GPU's stream otherwise (see copy_bytes for what waits for what).
  Tensor c = src.contiguous();
  detail::copy_bytes(raw_data(), device(), c.raw_data(), c.device(),
                     size_t(numel()) * dtype_size(dtype()));
}

bool Tensor::shares_memory_with(const Tensor& other) const {
  GALLEY_CHECK_DEFINED("shares_memory_with");
  GALLEY_CHECK(other.defined(), "shares_memory_with: the other tensor is undefined");
  if (impl_->storage != other.impl()->storage || numel() == 0 || other.numel() == 0) return false;
  // The element ranges [first, last] the two views span (a conservative test).
  auto span = [](const detail::TensorImpl& t) {
    int64_t last = t.offset;
    for (size_t d = 0; d < t.shape.size(); ++d) last += (t.shape[d] - 1) * t.strides[d];
    return std::make_pair(t.offset, last);
  };
  const auto [a0, a1] = span(*impl_);
  const auto [b0, b1] = span(*other.impl());
  return a0 <= b1 && b0 <= a1;
}

namespace {
void store_float(void* p, DType t, int64_t i, float v);
}  // namespace

void Tensor::fill_(float value) {
  GALLEY_CHECK_DEFINED("fill_");
  // An integer tensor takes a value between its lowest and largest (a fraction truncated toward
  // zero), as PyTorch checks; the conversion of any other is undefined.
  if (dtype() == DType::Int64)
    GALLEY_CHECK(value >= -0x1p63f && value < 0x1p63f, "fill_: ", value,
                 " cannot be converted to int64 without overflow");
  if (dtype() == DType::UInt8)
    GALLEY_CHECK(value >= 0.f && value <= 255.f, "fill_: ", value,
                 " cannot be converted to uint8 without overflow");
  check_unrecorded_write("fill_", *impl_);
  bump_version();
  if (!is_contiguous()) {  // a view: the value written through its strides
    Tensor dense = empty(shape(), dtype(), device());
    dense.fill_(value);
    detail::copy_strided(dense, *this);
    return;
  }
  if (!device().is_cpu()) {
    // The element's bytes as the host writes them, repeated on the device.
    uint64_t bits = 0;
    store_float(&bits, dtype(), 0, value);
    detail::fill_elements(device(), raw_data(), numel(), bits,
                          static_cast<int>(dtype_size(dtype())));
    return;
  }
  int64_t n = numel();
  switch (dtype()) {
    case DType::Float32:
      std::fill_n(data<float>(), n, value);
      break;
    case DType::Int64:
      std::fill_n(data<int64_t>(), n, static_cast<int64_t>(value));
      break;
    case DType::UInt8:
      std::fill_n(data<uint8_t>(), n, static_cast<uint8_t>(value));
      break;
    case DType::Float16:
    case DType::BFloat16: {
      uint16_t bits = 0;
      store_float(&bits, dtype(), 0, value);
      std::fill_n(static_cast<uint16_t*>(raw_data()), n, bits);
      break;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Views

namespace {
// `shape` with its -1 worked out, for `op` (view or reshape) on `numel` elements of shape `from`.
Shape infer_shape(Shape shape, int64_t numel, const Shape& from, const char* op) {
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      GALLEY_CHECK(infer < 0, op, ": more than one -1 in ", shape_str(shape));
      infer = static_cast<int64_t>(i);
    } else {
      GALLEY_CHECK(shape[i] >= 0, op, ": negative size in ", shape_str(shape));
      // Past the elements there are, the product only has to stay unequal to them.
      known = __builtin_mul_overflow(known, shape[i], &known) ? INT64_MAX : known;
    }
  }
  if (infer >= 0) {
    GALLEY_CHECK(known > 0 && numel % known == 0, op, ": cannot view ", shape_str(from), " as ",
                 shape_str(shape));
    shape[infer] = numel / known;
  }
  GALLEY_CHECK(shape_numel(shape) == numel, op, ": cannot view ", shape_str(from), " (", numel,
               " elements) as ", shape_str(shape));
  return shape;
}
}  // namespace

Tensor Tensor::view(const Shape& new_shape) const {
  GALLEY_CHECK_DEFINED("view");
  GALLEY_CHECK(is_contiguous(), "view: the tensor of shape ", shape_str(shape()),
               " is not contiguous; use reshape()");
  Shape s = infer_shape(new_shape, numel(), shape(), "view");
  auto impl = std::make_shared<detail::TensorImpl>();
  impl->storage = impl_->storage;
  impl->offset = impl_->offset;
  impl->shape = s;
  impl->strides = contiguous_strides(s);
  impl->dtype = impl_->dtype;
  Tensor out(std::move(impl));
  if (!autograd::needs_grad({this})) return out;
  Shape in_shape = shape();
  return autograd::record(
      out, "view", {*this},
      [in_shape](const Tensor& g, std::vector<Tensor>& gi) { gi[0] = g.reshape(in_shape); });
}

Tensor Tensor::reshape(const Shape& new_shape) const {
  GALLEY_CHECK_DEFINED("reshape");
  const Shape s = infer_shape(new_shape, numel(), shape(), "reshape");  // its errors name reshape
  return is_contiguous() ? view(s) : contiguous().view(s);
}

Tensor Tensor::flatten(int64_t start_axis, int64_t end_axis) const {
  int64_t n = dim();
  if (n == 0) {  // a scalar has one axis to name, 0 or -1 (as PyTorch)
    GALLEY_CHECK((start_axis == 0 || start_axis == -1) && (end_axis == 0 || end_axis == -1),
                 "flatten: axes ", start_axis, "..", end_axis,
                 " invalid for a scalar (0 or -1 only)");
    return reshape({1});
  }
  int64_t s = start_axis < 0 ? start_axis + n : start_axis;
  int64_t e = end_axis < 0 ? end_axis + n : end_axis;
  GALLEY_CHECK(s >= 0 && s < n && e >= 0 && e < n && s <= e, "flatten: axes ", start_axis, "..",
               end_axis, " invalid for shape ", shape_str(shape()));
  Shape out;
  for (int64_t i = 0; i < s; ++i) out.push_back(shape()[i]);
  int64_t merged = 1;
  for (int64_t i = s; i <= e; ++i)
    GALLEY_CHECK(!__builtin_mul_overflow(merged, shape()[i], &merged), "flatten: axes ", start_axis,
                 "..", end_axis, " of shape ", shape_str(shape()),
                 " merge into a size past a 64-bit count");
  out.push_back(merged);
  for (int64_t i = e + 1; i < n; ++i) out.push_back(shape()[i]);
  return reshape(out);
}

Tensor Tensor::contiguous() const {
  GALLEY_CHECK_DEFINED("contiguous");
  if (is_contiguous()) return *this;
  Tensor out = empty(shape(), dtype(), device());
  detail::copy_strided(*this, out);
  if (!autograd::needs_grad({this})) return out;
  return autograd::record(out, "contiguous", {*this},
                          [](const Tensor& g, std::vector<Tensor>& gi) { gi[0] = g; });
}

Tensor Tensor::clone() const {
  GALLEY_CHECK_DEFINED("clone");
  Tensor c = contiguous();
  Tensor out = empty(shape(), dtype(), device());
  detail::copy_bytes(out.raw_data(), device(), c.raw_data(), device(),
                     numel() * dtype_size(dtype()));
  if (!autograd::needs_grad({this})) return out;
  return autograd::record(out, "clone", {*this},
                          [](const Tensor& g, std::vector<Tensor>& gi) { gi[0] = g; });
}

Tensor Tensor::detach() const {
  GALLEY_CHECK_DEFINED("detach");
  auto impl = std::make_shared<detail::TensorImpl>();
  impl->storage = impl_->storage;
  impl->offset = impl_->offset;
  impl->shape = impl_->shape;
  impl->strides = impl_->strides;
  impl->dtype = impl_->dtype;
  return Tensor(std::move(impl));
}

Tensor Tensor::to(Device device) const {
  GALLEY_CHECK_DEFINED("to");
  if (device == this->device()) return *this;
  // Two CPU "devices" share the host memory; a copy keeps replicas independent.
  auto impl = std::make_shared<detail::TensorImpl>();
  impl->storage = std::make_shared<Storage>(numel() * dtype_size(dtype()), device);
  impl->shape = shape();
  impl->strides = contiguous_strides(shape());
  impl->dtype = dtype();
  Tensor out(std::move(impl));
  Tensor c = contiguous();
  detail::copy_bytes(out.raw_data(), device, c.raw_data(), c.device(),
                     numel() * dtype_size(dtype()));
  if (!autograd::needs_grad({this})) return out;
  Device from = this->device();
  return autograd::record(out, "to", {*this},
                          [from](const Tensor& g, std::vector<Tensor>& gi) { gi[0] = g.to(from); });
}

namespace {
// `v` stored as one element of dtype `t` at p[i].
void store_float(void* p, DType t, int64_t i, float v) {
  switch (t) {
    case DType::Float32:
      static_cast<float*>(p)[i] = v;
      break;
    case DType::Float16:
      static_cast<float16*>(p)[i] = float16(v);
      break;
    case DType::BFloat16:
      static_cast<bfloat16*>(p)[i] = bfloat16(v);
      break;
    case DType::Int64:
      static_cast<int64_t*>(p)[i] = static_cast<int64_t>(v);
      break;
    case DType::UInt8:
      static_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(v);
      break;
  }
}
}  // namespace

// ---------------------------------------------------------------------------------------------
// Autograd state

bool Tensor::requires_grad() const {
  return impl_ && (impl_->requires_grad || impl_->grad_fn != nullptr);
}

Tensor& Tensor::set_requires_grad(bool on) {
  GALLEY_CHECK_DEFINED("set_requires_grad");
  GALLEY_CHECK(!impl_->grad_fn,
               "set_requires_grad: only leaves can be marked; this tensor was "
               "produced by ",
               impl_->grad_fn->name, " (use detach() first)");
  GALLEY_CHECK(!on || is_floating_point(impl_->dtype),
               "set_requires_grad: only float32, bfloat16 and float16 tensors can have "
               "gradients, this one is ",
               dtype_name(impl_->dtype));
  impl_->requires_grad = on;
  return *this;
}

bool Tensor::is_leaf() const {
  return impl_ && !impl_->grad_fn;
}

Tensor Tensor::grad() const {
  GALLEY_CHECK_DEFINED("grad");
  return impl_->grad ? Tensor(impl_->grad) : Tensor();
}

void Tensor::set_grad(const Tensor& g) {
  GALLEY_CHECK_DEFINED("set_grad");
  if (g.defined()) {
    GALLEY_CHECK(g.shape() == shape(), "set_grad: gradient shape ", shape_str(g.shape()),
                 " does not match tensor shape ", shape_str(shape()));
    GALLEY_CHECK(g.dtype() == dtype(), "set_grad: a ", dtype_name(g.dtype()), " gradient for a ",
                 dtype_name(dtype()), " tensor of shape ", shape_str(shape()),
                 " (a gradient has its tensor's dtype)");
    GALLEY_CHECK(g.device().same_memory(device()), "set_grad: a gradient on ", g.device().str(),
                 " for a tensor on ", device().str(), " of shape ", shape_str(shape()));
  }
  // Accumulation and the data-parallel reductions write gradients as dense arrays.
  impl_->grad =
      g.defined() && !g.is_contiguous() ? g.detach().contiguous().impl_ptr() : g.impl_ptr();
}

void Tensor::register_grad_hook(std::function<void(const Tensor&)> hook) {
  GALLEY_CHECK_DEFINED("register_grad_hook");
  GALLEY_CHECK(is_leaf(), "register_grad_hook: only leaves accumulate gradients");
  GALLEY_CHECK(requires_grad(),
               "register_grad_hook: the tensor does not require a gradient, so "
               "the hook would never run (mark it set_requires_grad first)");
  impl_->grad_hooks.push_back(std::move(hook));
}

void Tensor::backward(const Tensor& gradient) const {
  GALLEY_CHECK_DEFINED("backward");
  GALLEY_CHECK(requires_grad(),
               "backward: the tensor does not require a gradient (no input of "
               "the ops that produced it was a parameter or marked set_requires_grad)");
  Tensor g = gradient;
  const bool from_loss = !g.defined();
  if (from_loss) {
    GALLEY_CHECK(numel() == 1,
                 "backward: a gradient must be given for a non-scalar output of "
                 "shape ",
                 shape_str(shape()));
    g = ones(shape(), dtype(), device());
  }
  GALLEY_CHECK(g.shape() == shape(), "backward: gradient shape ", shape_str(g.shape()),
               " does not match output shape ", shape_str(shape()));
  GALLEY_CHECK(g.device().same_memory(device()), "backward: a gradient on ", g.device().str(),
               " for an output on ", device().str(), " of shape ", shape_str(shape()));
  // The gradient in the output's dtype, as PyTorch casts it: the ops' backward passes take their
  // output's dtype (a bfloat16 gradient for a float32 output computed in bfloat16, or failed).
  if (g.dtype() != dtype()) g = g.detach().to(dtype());
  autograd::run_backward(*this, g, from_loss);
}

std::string Tensor::grad_fn_name() const {
  return impl_ && impl_->grad_fn ? impl_->grad_fn->name : "";
}

// ---------------------------------------------------------------------------------------------
// Factories

Tensor full(const Shape& shape, float value, DType dtype, Device device) {
  Tensor t = Tensor::empty(shape, dtype, device);
  t.fill_(value);
  return t;
}
Tensor zeros(const Shape& shape, DType dtype, Device device) {
  return full(shape, 0.f, dtype, device);
}
Tensor ones(const Shape& shape, DType dtype, Device device) {
  return full(shape, 1.f, dtype, device);
}

Tensor arange(double start, double end, double step, DType dtype) {
  GALLEY_CHECK(dtype == DType::Float32 || dtype == DType::Int64, "arange: unsupported dtype ",
               dtype_name(dtype), " (float32 or int64)");
  GALLEY_CHECK(std::isfinite(start) && std::isfinite(end) && std::isfinite(step),
               "arange: unsupported range ", start, " -> ", end, " by ", step);
  GALLEY_CHECK(step != 0, "arange: step must not be zero");
  GALLEY_CHECK((end - start) / step >= 0, "arange: ", start, " to ", end, " by ", step,
               " is empty in the wrong direction");
  const double count = std::ceil((end - start) / step);
  GALLEY_CHECK(count < 0x1p62, "arange: ", start, " to ", end, " by ", step, " has ", count,
               " elements, more than a tensor can hold");
  int64_t n = static_cast<int64_t>(count);
  Tensor t = Tensor::empty({n}, dtype);
  if (dtype == DType::Int64) {
    // As PyTorch: the count from the real bounds, the values from start and step cast to
    // integers first (0.5 to 5 by 1.5 gives 0, 1, 2), each of which must fit in int64, as must
    // the last value.
    auto fits = [](double v) { return v >= -0x1p63 && v < 0x1p63; };
    GALLEY_CHECK(fits(start) && fits(end) && fits(step), "arange: ", start, " to ", end, " by ",
                 step, " leaves int64");
    const int64_t first = static_cast<int64_t>(start), by = static_cast<int64_t>(step);
    int64_t span = 0, last = first;
    GALLEY_CHECK(n == 0 || (!__builtin_mul_overflow(n - 1, by, &span) &&
                            !__builtin_add_overflow(first, span, &last)),
                 "arange: ", start, " to ", end, " by ", step, " leaves int64");
    for (int64_t i = 0; i < n; ++i) t.data<int64_t>()[i] = first + i * by;
  } else {
    for (int64_t i = 0; i < n; ++i) t.data<float>()[i] = static_cast<float>(start + i * step);
  }
  return t;
}

Tensor empty(const Shape& shape, const TensorOptions& options) {
  return Tensor::empty(shape, options.dtype, options.device);
}
Tensor zeros(const Shape& shape, const TensorOptions& options) {
  return full(shape, 0.f, options.dtype, options.device);
}
Tensor ones(const Shape& shape, const TensorOptions& options) {
  return full(shape, 1.f, options.dtype, options.device);
}
Tensor full(const Shape& shape, float value, const TensorOptions& options) {
  return full(shape, value, options.dtype, options.device);
}

Tensor empty_like(const Tensor& like) {
  return Tensor::empty(like.shape(), like.dtype(), like.device());
}
Tensor zeros_like(const Tensor& like) {
  return zeros(like.shape(), like.dtype(), like.device());
}
Tensor ones_like(const Tensor& like) {
  return ones(like.shape(), like.dtype(), like.device());
}
Tensor full_like(const Tensor& like, float value) {
  return full(like.shape(), value, like.dtype(), like.device());
}

// ---------------------------------------------------------------------------------------------
// Grad mode

namespace {
thread_local bool tls_grad_enabled = true;
}
NoGradGuard::NoGradGuard() : prev_(tls_grad_enabled) {
  tls_grad_enabled = false;
}
NoGradGuard::~NoGradGuard() {
  tls_grad_enabled = prev_;
}
bool grad_enabled() {
  return tls_grad_enabled;
}

}  // namespace galley
