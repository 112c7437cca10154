// The tensor calls every communicator shares, over its pointer calls.
#include "galley/parallel/communicator.h"

#include "galley/half.h"

#include "src/runtime/device_memory.h"

namespace galley::parallel {

namespace {

// Checks what every tensor call needs (all_reduce a floating tensor, the copying collectives
// any); a tensor on another GPU than the communicator's is a misplaced tensor, not something
// to copy between GPUs behind the caller's back.
void check_tensor(const Communicator& c, const Tensor& t, const char* op, bool contiguous,
                  bool floating) {
  GALLEY_CHECK(t.defined() && (!floating || is_floating_point(t.dtype())) &&
                   (!contiguous || t.is_contiguous()),
               c.kind(), " ", op, ": needs a ", contiguous ? "contiguous " : "",
               floating ? "float32, bfloat16 or float16 tensor" : "tensor",
               t.defined() ? detail::str_cat(", got a ", t.is_contiguous() ? "" : "non-contiguous ",
                                             dtype_name(t.dtype()), " one")
                           : std::string());
  GALLEY_CHECK(!(t.device().is_cuda() && c.device().is_cuda() && t.device() != c.device()),
               c.kind(), " ", op, ": the tensor is on ", t.device().str(),
               " but this communicator works on ", c.device().str());
}

// A copy of `t` in the communicator's memory, or `t` itself when it already lives there.
Tensor in_memory_of(const Communicator& c, const Tensor& t) {
  if (t.numel() == 0 || t.device().same_memory(c.device())) return t;
  return t.detach().to(c.device());
}

// Writes the result in `staged` back into `t` when the call went through a copy.
void copy_back(Tensor& t, const Tensor& staged) {
  if (staged.is_same(t)) return;
  detail::copy_bytes(t.raw_data(), t.device(), staged.raw_data(), staged.device(),
                     size_t(t.numel()) * dtype_size(t.dtype()));
}

}  // namespace

void Communicator::check_reducible(DType dtype) const {
  GALLEY_CHECK(is_floating_point(dtype), kind(),
               " all_reduce: expected float32, bfloat16 or float16 data, got ", dtype_name(dtype));
}

void Communicator::all_reduce(Tensor& t, ReduceOp op) {
  check_tensor(*this, t, "all_reduce", /*contiguous=*/true, /*floating=*/true);
  t.bump_version();  // written in place
  Tensor s = in_memory_of(*this, t);
  all_reduce(s.raw_data(), s.numel(), s.dtype(), op);
  copy_back(t, s);
}

void Communicator::broadcast(Tensor& t, int root) {
  check_tensor(*this, t, "broadcast", /*contiguous=*/true, /*floating=*/false);
  t.bump_version();  // written in place
  Tensor s = in_memory_of(*this, t);
  broadcast(s.raw_data(), s.numel(), s.dtype(), root);
  copy_back(t, s);
}

Tensor Communicator::all_gather(const Tensor& t) {
  check_tensor(*this, t, "all_gather", /*contiguous=*/false, /*floating=*/false);
  Tensor c = in_memory_of(*this, t.contiguous());
  Shape shape{size()};
  shape.insert(shape.end(), t.shape().begin(), t.shape().end());
  Tensor out;
  {
    // Inside an op's scope, Tensor::empty would move a cpu:0 tensor to the op's device.
    if (c.device().is_cuda()) detail::make_current(c.device());
    out = Tensor::empty(shape, c.dtype(), c.device());
  }
  all_gather(c.raw_data(), c.numel(), c.dtype(), out.raw_data());
  return out.device() == t.device() ? out : out.to(t.device());
}

}  // namespace galley::parallel
