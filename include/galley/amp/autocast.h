#pragma once
/// \file Automatic mixed precision: a scope inside which the matrix products and convolutions run
/// in bfloat16 or float16 while the numerically sensitive ops stay in float32.
///
///     galley::optim::Adam optimizer(model.parameters(), {.learning_rate = 1e-3});
///     for (auto& [x, y] : loader) {
///       Tensor loss;
///       {
///         galley::amp::Autocast autocast(galley::DType::BFloat16);
///         loss = loss_fn(model(x), y);  // conv2d, linear in bfloat16; the loss in float32
///       }
///       loss.backward();                // gradients arrive in the parameters' float32
///       optimizer.step();
///       optimizer.clear_grad();
///     }
#include "galley/dtype.h"

namespace galley::amp {

/// While alive (and `enabled`), the ops called on this thread cast their floating inputs at
/// entry, once, as PyTorch's autocast does, on every device:
/// - Low precision (to `dtype`): matmul, linear, conv2d. A float32 parameter (a leaf that
///   requires a gradient) is converted once per scope and the copy reused by every op that
///   reads it (the cache); the conversion is recorded, so its gradient arrives in float32.
/// - Float32 (16-bit inputs widened): softmax, log_softmax, cross_entropy, sum, mean, exp, log,
///   pow; these return float32. batch_norm keeps its statistics in float32 in any case and
///   returns its input's dtype.
/// - Widest dtype (a mix of dtypes is promoted, float32 over 16-bit; a 0-dim tensor takes the
///   dtype of the others, as in PyTorch): add, sub, mul, div, cat, stack. Without autocast a mix
///   of dtypes there is an error.
/// - The written tensor's dtype: add_ adds a second input of another dtype in float32 and
///   rounds the sum once into the first (as PyTorch); bias_relu converts its bias to the input's
///   dtype, batch_norm_add its residual to the input's.
/// Every other op runs in its input's dtype.
///
/// Parameters stay float32 (master weights) and the optimizer updates them in float32. Run
/// backward and the optimizer step after the scope ends (as in PyTorch); an optimizer step or a
/// load_state_dict inside a scope makes the cached copies be converted again.
///
/// Scopes nest: an inner one (another dtype, or `enabled = false` to run a region in float32)
/// holds until it ends, and the outer setting returns. The state is per thread; DataParallel
/// runs each replica's forward under its caller's state. The cache is emptied when the outermost
/// scope of a thread ends.
class Autocast {
 public:
  /// `dtype`: bfloat16 or float16 (anything else is an error naming it).
  explicit Autocast(DType dtype = DType::BFloat16, bool enabled = true);
  ~Autocast();
  Autocast(const Autocast&) = delete;
  Autocast& operator=(const Autocast&) = delete;

 private:
  bool previous_enabled_;
  DType previous_dtype_;
};

/// True while an enabled Autocast scope is alive on this thread.
bool is_autocast_enabled();
/// The low-precision dtype of this thread's innermost scope (bfloat16 outside any scope).
DType autocast_dtype();
/// Empties this thread's cache of converted parameters (the outermost scope's end does it).
void clear_autocast_cache();

}  // namespace galley::amp
