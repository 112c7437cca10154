// The dropout layer: a generator of its own, restarted per random stream (stream_seed).
#include "galley/nn/dropout.h"

namespace galley::nn {

Dropout::Dropout(float p) : Dropout(p, next_seed(default_generator())) {}

Dropout::Dropout(float p, uint64_t seed) : p_(p), seed_(seed), gen_(seed) {
  GALLEY_CHECK(p >= 0.f && p <= 1.f, "Dropout: probability ", p, " is not in [0, 1]");
  register_generator("generator", gen_);
}

Tensor Dropout::forward(const Tensor& x) {
  try {
    return dropout(x, p_, is_training(), gen_);
  } catch (...) {
    detail::rethrow_with_prefix(repr() + ": ");
  }
}

std::string Dropout::repr() const {
  return detail::str_cat("Dropout(p=", p_, ")");
}

void Dropout::set_random_stream(uint64_t stream) {
  gen_.manual_seed(stream_seed(seed_, stream));
  Layer::set_random_stream(stream);
}

}  // namespace galley::nn
