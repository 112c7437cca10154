#pragma once
/// \file The Tensor value: shape, strides, shared storage, device, and its autograd state.
#include <atomic>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "galley/device.h"
#include "galley/dtype.h"
#include "galley/error.h"
#include "galley/half.h"

namespace galley {

/// Sizes of a tensor's dimensions, outermost first.
using Shape = std::vector<int64_t>;

/// "[2, 3, 4]".
std::string shape_str(const Shape& s);
/// Product of the sizes (1 for a scalar).
int64_t shape_numel(const Shape& s);

/// A block of device memory that several tensors (views) may share.
class Storage {
 public:
  /// Allocates `bytes` on `device` (uninitialised). `pinned` asks for page-locked host memory
  /// (host devices only; ordinary memory when the process has no CUDA device).
  Storage(size_t bytes, Device device, bool pinned = false);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  /// Start of the block.
  void* data() const { return data_; }
  /// Size in bytes.
  size_t bytes() const { return bytes_; }
  /// Where the block lives.
  Device device() const { return device_; }
  /// True for page-locked host memory.
  bool pinned() const { return pinned_; }
  /// The number of in-place writes the block has had (PyTorch's `_version`, shared by every
  /// view of the block). Autograd notes it for each tensor an op saves for its backward, and
  /// backward refuses to run from data written since.
  uint64_t version() const { return version_.load(std::memory_order_relaxed); }
  /// Counts one in-place write.
  void bump_version() { version_.fetch_add(1, std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> version_{0};
  void* data_ = nullptr;
  size_t bytes_ = 0;
  size_t capacity_ = 0;
  Device device_;
  bool pinned_ = false;
};

class Tensor;
namespace autograd {
struct Node;
}

namespace detail {
/// The shared state behind a Tensor handle.
struct TensorImpl {
  std::shared_ptr<Storage> storage{};
  int64_t offset = 0;  // in elements
  Shape shape{};
  Shape strides{};
  DType dtype = DType::Float32;
  bool requires_grad = false;                                  // leaf flag
  std::shared_ptr<TensorImpl> grad;                            // accumulated gradient of a leaf
  std::shared_ptr<autograd::Node> grad_fn;                     // the op that produced a non-leaf
  std::vector<std::function<void(const Tensor&)>> grad_hooks;  // called after each accumulation
};
}  // namespace detail

/// Source of random numbers; pass one explicitly for reproducible results.
class Generator {
 public:
  /// A generator seeded with `seed`.
  explicit Generator(uint64_t seed = 0x9e3779b97f4a7c15ULL);
  /// Re-seeds.
  void manual_seed(uint64_t seed);
  /// Next 64 random bits.
  uint64_t next_u64();
  /// Uniform in [0, 1).
  float next_float();
  /// Standard normal.
  float next_normal();
  /// The complete state as text, for checkpoints.
  std::string state() const;
  /// Restores a state returned by state().
  void set_state(const std::string& state);

 private:
  uint64_t state_[4];
  bool has_spare_ = false;
  float spare_ = 0.f;
};

/// The generator that random draws take when none is given: the process-wide one (guarded by a
/// mutex inside the factories), or, on a thread inside a GeneratorScope, that scope's.
Generator& default_generator();
/// Seeds the process-wide default generator (not a GeneratorScope's).
void manual_seed(uint64_t seed);
/// The process-wide default generator's state (not a GeneratorScope's), read under its mutex:
/// what checkpoints keep ("rng.default"), whatever other threads draw meanwhile.
std::string default_generator_state();
/// Restores the process-wide default generator (not a GeneratorScope's) under its mutex.
void set_default_generator_state(const Generator& from);

/// While alive, default_generator() on this thread is `gen` (scopes nest). DataParallel runs
/// each replica's forward in one over the replica's own generator, so that functional dropout
/// and the other draws that take the default draw a stream of their own per replica and
/// process, in the same order on every run, rather than racing for the process's.
class GeneratorScope {
 public:
  explicit GeneratorScope(Generator& gen);
  ~GeneratorScope();
  GeneratorScope(const GeneratorScope&) = delete;
  GeneratorScope& operator=(const GeneratorScope&) = delete;

 private:
  Generator* previous_;
};

/// The next 64 bits of `gen` under the lock the random factories take, so that ops drawing a
/// seed (dropout) may share a generator, the default one included, across threads.
uint64_t next_seed(Generator& gen);
/// A seed for stream `stream` of `seed` (stream 0 gives the seed itself; nearby streams give
/// unrelated generators): the per-replica and per-process streams of DataParallel.
uint64_t stream_seed(uint64_t seed, uint64_t stream);

/// A handle to an n-dimensional array. Copies share the same data and autograd state
/// (like libtorch's at::Tensor); use clone() for a deep copy.
class Tensor {
 public:
  /// An undefined tensor.
  Tensor() = default;
  explicit Tensor(std::shared_ptr<detail::TensorImpl> impl) : impl_(std::move(impl)) {}

  /// Uninitialised contiguous tensor.
  static Tensor empty(const Shape& shape, DType dtype = DType::Float32,
                      Device device = Device::cpu());
  /// Uninitialised contiguous host tensor in page-locked memory, from which copies to a GPU run
  /// asynchronously (ordinary host memory when the process has no CUDA device).
  static Tensor empty_pinned(const Shape& shape, DType dtype = DType::Float32);
  /// Copies `values` (row-major) into a new tensor of `shape`.
  static Tensor from_vector(const std::vector<float>& values, const Shape& shape,
                            Device device = Device::cpu());
  /// Copies a brace list of floats: Tensor::from_vector({1.f, 2.f}, {2}).
  static Tensor from_vector(std::initializer_list<float> values, const Shape& shape,
                            Device device = Device::cpu()) {
    return from_vector(std::vector<float>(values), shape, device);
  }
  /// Copies int64 `values` (e.g. labels) into a new tensor of `shape`.
  static Tensor from_vector(const std::vector<int64_t>& values, const Shape& shape,
                            Device device = Device::cpu());
  /// Copies `bytes` of host memory laid out row-major as `shape` x `dtype`.
  static Tensor from_host(const void* data, const Shape& shape, DType dtype = DType::Float32,
                          Device device = Device::cpu());

  /// False for a default-constructed handle.
  bool defined() const { return impl_ != nullptr; }
  /// Sizes of every dimension.
  const Shape& shape() const;
  /// Elements between neighbours along each dimension.
  const Shape& strides() const;
  /// Number of dimensions.
  int64_t dim() const { return static_cast<int64_t>(shape().size()); }
  /// Size of dimension `d` (negative counts from the end).
  int64_t size(int64_t d) const;
  /// Total number of elements.
  int64_t numel() const;
  /// Element type.
  DType dtype() const;
  /// Where the data lives.
  Device device() const;
  /// True when the elements lie row-major dense (the stride of a dimension of size 1 does not
  /// matter, and an empty tensor is contiguous, as in PyTorch).
  bool is_contiguous() const;
  /// True when the data is in page-locked host memory.
  bool is_pinned() const;
  /// A copy in page-locked host memory (this tensor if it already is); from a host tensor.
  Tensor pin_memory() const;
  /// True when `other` is a handle to the same tensor.
  bool is_same(const Tensor& other) const { return impl_ == other.impl_; }
  /// True when the two may share elements: views of one storage whose element ranges overlap.
  bool shares_memory_with(const Tensor& other) const;

  /// Typed pointer to the first element, for host code: checks the dtype, and that the data is
  /// in host memory (a GPU tensor is read after `.to(Device::cpu())`).
  template <typename T>
  T* data() const;
  /// Typed pointer to the first element wherever it lives (a device pointer for a GPU tensor, to
  /// hand to a kernel); checks the dtype.
  template <typename T>
  T* data_ptr() const;
  /// Untyped pointer to the first element wherever it lives.
  void* raw_data() const;
  /// How many in-place writes the data has had (shared by all views of it; PyTorch's
  /// `_version`): copy_, fill_, copy_from_host, add_, optimizer steps, running statistics and
  /// loads each count one. A backward whose op saved this data at an older version is refused
  /// (see autograd::record). Writes through data() or raw_data() are not counted: call
  /// bump_version() after them (PyTorch's torch.autograd.graph.increment_version).
  uint64_t version() const;
  /// Counts one in-place write of the data (a no-op on a tensor without data).
  void bump_version() const;
  /// The value of a one-element tensor, as float.
  float item() const;
  /// Copies the elements (row-major) to a host vector.
  template <typename T = float>
  std::vector<T> to_vector() const;
  /// Copies the elements (row-major) into `dst`, which must hold numel() elements.
  void copy_to_host(void* dst) const;
  /// Overwrites the elements from host memory holding numel() elements of dtype(), row-major
  /// (into a view too: through its strides). Like copy_ and fill_, not recorded by autograd:
  /// refused on an op's output that is part of a graph while gradients are recorded (the write
  /// would change that graph's gradients silently); a leaf, such as a parameter, may be written.
  /// Each counts a write (version()): a backward that reads the old values is then refused.
  void copy_from_host(const void* src);
  /// Overwrites this tensor's elements with `src`'s (same shape and dtype, any devices: host to
  /// GPU, GPU to host, between GPUs); no autograd. Either may be a view: the elements go through
  /// both strides, and a source that shares memory with the destination is read as it was
  /// before the copy. A copy onto a GPU is queued on its compute stream and returns once `src`
  /// may be reused; one to the host returns when it is done.
  void copy_(const Tensor& src);
  /// Sets every element to `value` (of a view too: the elements it shows); no autograd. An
  /// int64 or uint8 tensor takes a value between the dtype's lowest and largest (0 and 255 for
  /// uint8), a fraction truncated toward zero; another (NaN, an infinity, 255.5 or -0.5 for
  /// uint8) is an error and nothing is written, as in PyTorch.
  void fill_(float value);
  /// Sets every element to zero; no autograd.
  void zero_() { fill_(0.f); }

  /// Same data with a new shape; one size may be -1. Copies only if not contiguous.
  Tensor reshape(const Shape& shape) const;
  /// Same data with a new shape; the tensor must be contiguous.
  Tensor view(const Shape& shape) const;
  /// Merges dimensions start..end (inclusive, negative from the end) into one.
  Tensor flatten(int64_t start_axis = 0, int64_t end_axis = -1) const;
  /// This tensor if contiguous, else a dense copy (any strides, any dtype, on the tensor's device).
  Tensor contiguous() const;
  /// galley::narrow(*this, dim, start, length): a view of a slice of one dimension.
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  /// galley::select(*this, dim, index): a view of one index of `dim`, without that dimension.
  Tensor select(int64_t dim, int64_t index) const;
  /// galley::transpose(*this, dim0, dim1): a view with two dimensions swapped.
  Tensor transpose(int64_t dim0, int64_t dim1) const;
  /// galley::permute(*this, dims): a view with the dimensions reordered.
  Tensor permute(const std::vector<int64_t>& dims) const;
  /// galley::add_(*this, other): adds `other` (broadcast) into this tensor in place. Returns *this.
  Tensor& add_(const Tensor& other);
  /// A deep copy (recorded by autograd).
  Tensor clone() const;
  /// Same data, cut from the graph.
  Tensor detach() const;
  /// A copy on `device` (this tensor if already there).
  Tensor to(Device device) const;
  /// A copy converted to `dtype` on the same device (this tensor if it already has it):
  /// between float32, bfloat16 and float16 with round to nearest even, bit for bit as PyTorch's
  /// `.to()` (vectorised on the CPU, a kernel on a GPU), recorded by autograd (the gradient
  /// comes back in this tensor's dtype); between int64 or uint8 and float32, not recorded: to an
  /// integer truncated toward zero and saturated (NaN gives 0, a value past the range its end,
  /// as PyTorch's CUDA conversion; on its CPU those are undefined), from one as C++ converts.
  /// Another pair is an error naming both dtypes.
  Tensor to(DType dtype) const;
  /// A copy on `device` in `dtype`; converts on whichever side has fewer bytes to move.
  Tensor to(Device device, DType dtype) const;

  /// True for a leaf that wants gradients or any tensor produced from one.
  bool requires_grad() const;
  /// Marks a leaf as wanting a gradient. Returns *this.
  Tensor& set_requires_grad(bool on = true);
  /// True when no op produced this tensor.
  bool is_leaf() const;
  /// The accumulated gradient (undefined until a backward pass reaches it).
  Tensor grad() const;
  /// Replaces the accumulated gradient (undefined to clear): of this tensor's shape, dtype and
  /// device (for a host tensor, any CPU device). A gradient that is not contiguous is stored as
  /// a contiguous copy.
  void set_grad(const Tensor& g);
  /// Calls `hook(grad)` each time a gradient has been accumulated into this leaf.
  void register_grad_hook(std::function<void(const Tensor&)> hook);
  /// Back-propagates from this tensor: a scalar, or any shape with an explicit `gradient` (on this
  /// tensor's device; converted to its dtype, as PyTorch does).
  void backward(const Tensor& gradient = Tensor()) const;
  /// Name of the op that produced this tensor, or "" for a leaf.
  std::string grad_fn_name() const;

  /// Readable multi-line text: values (abbreviated when large), shape, dtype, device.
  std::string to_string() const;

  /// Internal state, for galley's own ops.
  detail::TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<detail::TensorImpl>& impl_ptr() const { return impl_; }

 private:
  std::shared_ptr<detail::TensorImpl> impl_;
};

/// Writes Tensor::to_string().
std::ostream& operator<<(std::ostream& os, const Tensor& t);

/// Tensor of zeros.
Tensor zeros(const Shape& shape, DType dtype = DType::Float32, Device device = Device::cpu());
/// Tensor of ones.
Tensor ones(const Shape& shape, DType dtype = DType::Float32, Device device = Device::cpu());
/// Tensor filled with `value` (for int64 and uint8, a value between the dtype's lowest and
/// largest, a fraction truncated toward zero; another is an error: Tensor::fill_).
Tensor full(const Shape& shape, float value, DType dtype = DType::Float32,
            Device device = Device::cpu());
/// start, start + step, ... below `end` (1-D, float32 or int64; for int64, as PyTorch, start and
/// step are cast to integers first and the count taken from the real bounds).
Tensor arange(double start, double end, double step = 1.0, DType dtype = DType::Float32);
/// Uniform in [0, 1).
Tensor rand(const Shape& shape, Generator& gen = default_generator());
/// Standard normal.
Tensor randn(const Shape& shape, Generator& gen = default_generator());
/// Uniform in [low, high): low <= high, both finite and high - low too, else an error.
Tensor uniform(const Shape& shape, float low, float high, Generator& gen = default_generator());

/// The dtype and device a factory makes its tensor with: `randn({64, 10}, {.dtype =
/// DType::BFloat16, .device = Device::cuda(0)})`.
struct TensorOptions {
  DType dtype = DType::Float32;
  Device device = Device::cpu();
};
/// The factories with options. The random ones draw on the host from `gen` (the same values
/// whatever the device, so a seed means one thing everywhere). randn draws float32 values and
/// rounds them to the dtype once; rand and uniform in bfloat16 or float16 draw on the dtype's own
/// grid, as PyTorch's uniform_ does (k / 2^8 in bfloat16, k / 2^11 in float16, scaled into
/// [low, high)), so that rounding cannot reach high: their values differ from a float32 draw
/// rounded.
Tensor empty(const Shape& shape, const TensorOptions& options);
Tensor zeros(const Shape& shape, const TensorOptions& options);
Tensor ones(const Shape& shape, const TensorOptions& options);
Tensor full(const Shape& shape, float value, const TensorOptions& options);
Tensor rand(const Shape& shape, const TensorOptions& options, Generator& gen = default_generator());
Tensor randn(const Shape& shape, const TensorOptions& options,
             Generator& gen = default_generator());
Tensor uniform(const Shape& shape, float low, float high, const TensorOptions& options,
               Generator& gen = default_generator());
/// Integers drawn uniformly from [low, high): int64 on the host, or as `options` says. A
/// floating dtype must hold every integer of the range exactly: low and high - 1 within
/// +-2^24 for float32, +-2^11 for float16, +-2^8 for bfloat16 (past that, values would round,
/// some to high; PyTorch warns there).
Tensor randint(int64_t low, int64_t high, const Shape& shape, Generator& gen = default_generator());
Tensor randint(int64_t low, int64_t high, const Shape& shape, const TensorOptions& options,
               Generator& gen = default_generator());
/// A new tensor of `like`'s shape, dtype and device.
Tensor empty_like(const Tensor& like);
Tensor zeros_like(const Tensor& like);
Tensor ones_like(const Tensor& like);
Tensor full_like(const Tensor& like, float value);
Tensor rand_like(const Tensor& like, Generator& gen = default_generator());
Tensor randn_like(const Tensor& like, Generator& gen = default_generator());

/// Disables graph recording on this thread while alive (inference, optimizer updates).
class NoGradGuard {
 public:
  NoGradGuard();
  ~NoGradGuard();
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool prev_;
};

/// True unless a NoGradGuard is alive on this thread.
bool grad_enabled();

}  // namespace galley
