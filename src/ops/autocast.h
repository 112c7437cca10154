#pragma once
// How the ops apply autocast (include/galley/amp/autocast.h) at their entry:
//
//     if (detail::autocast_on()) {
//       detail::AutocastPause pause;  // the op below runs with autocast off, on cast inputs
//       return linear(pause.low(x), pause.low(weight), pause.low(bias));
//     }
//
// The lists of which op takes which cast live in the public header's comment and in the ops.
#include <initializer_list>
#include <vector>

#include "galley/tensor.h"

namespace galley::detail {

// This thread's autocast setting.
struct AutocastState {
  bool enabled = false;
  DType dtype = DType::BFloat16;
  int depth = 0;  // enabled or disabled Autocast scopes alive on this thread
};
extern thread_local AutocastState autocast_state;

// True while an op must cast its inputs.
inline bool autocast_on() {
  return autocast_state.enabled;
}

// Turns autocast off on this thread while alive (the op runs on inputs already cast) and casts
// inputs by the setting it paused. Undefined and non-floating tensors pass through unchanged.
class AutocastPause {
 public:
  AutocastPause();
  ~AutocastPause();
  AutocastPause(const AutocastPause&) = delete;
  AutocastPause& operator=(const AutocastPause&) = delete;

  // `t` in `dtype`; a float32 parameter's low-precision copy comes from the cache.
  Tensor to(const Tensor& t, DType dtype) const;
  // `t` in the low-precision dtype.
  Tensor low(const Tensor& t) const;
  // `t` in float32.
  Tensor f32(const Tensor& t) const;
  // The widest floating dtype among `inputs` (float32 over the 16-bit ones; bfloat16 with
  // float16 gives float32); float32 when none is floating.
  static DType widest(std::initializer_list<const Tensor*> inputs);
  static DType widest(const std::vector<Tensor>& inputs);
  // Each of `inputs` in widest(inputs).
  std::vector<Tensor> widened(const std::vector<Tensor>& inputs) const;

 private:
  AutocastState paused_;
};

// Lets every parameter's cached copy be converted again: Layer::to calls it, as it gives the
// parameters new data (whose version says nothing of the old). A write in place into a
// parameter's data (an optimizer step, a load) counts a version, which the cache checks itself.
void parameters_changed();

}  // namespace galley::detail
