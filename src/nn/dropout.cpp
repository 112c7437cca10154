// The dropout layer: a generator of its own, restarted per random stream.
#include "galley/nn/dropout.h"

namespace galley::nn {

namespace {
// A seed for (seed, stream), stream 0 giving the seed itself (splitmix64's finaliser of the
// stream, so that nearby streams give unrelated generators).
uint64_t stream_seed(uint64_t seed, uint64_t stream) {
  if (stream == 0) return seed;
  uint64_t z = stream * 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return seed ^ z ^ (z >> 31);
}
}  // namespace

Dropout::Dropout(float p) : Dropout(p, next_seed(default_generator())) {}

Dropout::Dropout(float p, uint64_t seed) : p_(p), seed_(seed), gen_(seed) {
  GALLEY_CHECK(p >= 0.f && p <= 1.f, "Dropout: probability ", p, " is not in [0, 1]");
}

Tensor Dropout::forward(const Tensor& x) {
  try {
    return dropout(x, p_, is_training(), gen_);
  } catch (const Error& e) {
    detail::rethrow_with_message(e, repr() + ": " + e.what());
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
