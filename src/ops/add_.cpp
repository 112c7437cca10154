// add_: a += b in place (b broadcast to a's shape). When autograd records it, a's history is
// moved onto a node of its own and a becomes the output of the add; the checks below make sure
// nothing that could observe the old value or the old history still refers to a.
#include <memory>

#include "galley/autograd.h"
#include "galley/ops.h"
#include "galley/profiler.h"
#include "src/ops/autocast.h"
#include "src/ops/binary.h"
#include "src/ops/copy.h"
#include "src/ops/dispatch.h"

namespace galley {

Tensor add_(const Tensor& a, const Tensor& b) {
  // Under autocast a b of another floating dtype (a float32 shortcut into a bfloat16 sum) is
  // added in float32 and the sum rounded once into a, as PyTorch's promotion does.
  std::unique_ptr<detail::AutocastPause> pause;
  if (detail::autocast_on()) pause = std::make_unique<detail::AutocastPause>();
  const bool mixed = pause && a.defined() && b.defined() && is_floating_point(a.dtype()) &&
                     is_floating_point(b.dtype()) && a.dtype() != b.dtype();
  profiler::OpScope prof("add_", {&a, &b});
  if (mixed)
    GALLEY_CHECK(a.device() == b.device(), "add_: inputs on different devices (", a.device().str(),
                 " and ", b.device().str(), ")");
  else
    detail::check_floating_pair("add_", a, b);
  GALLEY_CHECK(detail::broadcast_shapes(a.shape(), b.shape(), "add_") == a.shape(),
               "add_: ", shape_str(b.shape()), " does not broadcast to the shape ",
               shape_str(a.shape()), " of the tensor written in place");
  const bool record = autograd::needs_grad({&a, &b});
  if (record) {
    GALLEY_CHECK(!(a.is_leaf() && a.requires_grad()), "add_: the tensor written (",
                 dtype_name(a.dtype()), " ", shape_str(a.shape()),
                 ") is a leaf that requires a gradient, which cannot be modified in place (as in "
                 "PyTorch); update it under a NoGradGuard, or use add(a, b)");
    GALLEY_CHECK(a.impl_ptr().use_count() == 1 && a.impl()->storage.use_count() == 1,
                 "add_: the tensor written (", dtype_name(a.dtype()), " ", shape_str(a.shape()),
                 ") is referred to from elsewhere (another handle, an op that read it, a view of "
                 "its data, or a copy kept for a backward), which would see the sum and its new "
                 "history; use add(a, b)");
  }
  // Anomaly detection checks the sum once it is written (autograd::record): a's values are kept
  // to be put back when it refuses the sum, so a refused add_ leaves a as it was. (Without
  // recording no check runs.)
  Tensor before_values;
  if (record && is_anomaly_enabled()) before_values = a.detach().clone();
  a.bump_version();
  const bool same_data = b.impl()->storage == a.impl()->storage;
  const bool exact_alias = same_data && b.impl()->offset == a.impl()->offset &&
                           b.strides() == a.strides() && b.shape() == a.shape();
  if (mixed) {
    detail::copy_strided(detail::rounded(detail::binary(kernels::BinaryOp::Add, detail::widened(a),
                                                        detail::widened(b)),
                                         a.dtype()),
                         a);
  } else if (a.is_contiguous() && b.shape() == a.shape() && (!same_data || exact_alias)) {
    Tensor acc = a;
    detail::add_inplace(acc, b);
  } else {
    // A broadcast, a strided destination, or b overlapping a: the sum first, then written back.
    detail::copy_strided(detail::binary(kernels::BinaryOp::Add, a, b), a);
  }
  if (!record) return a;
  // The old history: a handle that holds a's previous node (and no data: nothing reads it).
  auto before = std::make_shared<detail::TensorImpl>();
  before->shape = a.shape();
  before->strides = a.strides();
  before->dtype = a.dtype();
  before->grad_fn = std::move(a.impl()->grad_fn);
  Tensor old(std::move(before));
  const Shape sb = b.shape();
  const DType db = b.dtype();
  // a.add_(a): b was a's old value, so both inputs are the old history (b itself is now the
  // node's output, and an input of its own node would drop its gradient).
  const Tensor addend = b.is_same(a) ? old : b;
  try {
    return autograd::record(a, "add_", {old, addend},
                            [sb, db](const Tensor& g, std::vector<Tensor>& gi) {
                              gi[0] = g;
                              gi[1] = detail::sum_to(g, sb);
                              if (gi[1].dtype() != db)
                                gi[1] = gi[1].to(db);  // b's gradient in b's dtype (autocast)
                            });
  } catch (...) {  // (anomaly detection's check of the sum): a keeps its values and history
    if (before_values.defined()) {
      NoGradGuard no_grad;
      detail::copy_strided(before_values, a);
    }
    a.impl()->grad_fn = std::move(old.impl()->grad_fn);
    throw;
  }
}

Tensor& Tensor::add_(const Tensor& other) {
  galley::add_(*this, other);
  return *this;
}

}  // namespace galley
