#pragma once
// What the batch normalisation layers need of the op beyond its public form.
#include "galley/tensor.h"

namespace galley::detail {

// Adds 1 to an int64 scalar counter where it lives (num_batches_tracked), without waiting for
// the device.
void count_batch(const Tensor& counter);

}  // namespace galley::detail
