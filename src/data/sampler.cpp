// Sequential, random and distributed samplers.
#include "galley/data/sampler.h"

#include <numeric>

#include "galley/error.h"
#include "galley/tensor.h"

namespace galley::data {

void shuffled_indices(size_t n, uint64_t seed, uint64_t epoch, std::vector<size_t>& out) {
  out.resize(n);
  std::iota(out.begin(), out.end(), size_t(0));
  // Fisher-Yates from a generator seeded by (seed, epoch), exactly as BatchIterator shuffles.
  Generator gen(seed * 0x9e3779b97f4a7c15ULL + epoch);
  for (size_t i = n; i > 1; --i) std::swap(out[i - 1], out[gen.next_u64() % i]);
}

void SequentialSampler::indices(uint64_t, std::vector<size_t>& out) const {
  out.resize(n_);
  std::iota(out.begin(), out.end(), size_t(0));
}

void RandomSampler::indices(uint64_t epoch, std::vector<size_t>& out) const {
  shuffled_indices(n_, seed_, epoch, out);
}

DistributedSampler::DistributedSampler(size_t n, DistributedSamplerOptions options)
    : n_(n), opt_(options) {
  GALLEY_CHECK(opt_.world_size > 0, "DistributedSampler: world_size ", opt_.world_size,
               " must be positive");
  GALLEY_CHECK(opt_.rank >= 0 && opt_.rank < opt_.world_size, "DistributedSampler: rank ",
               opt_.rank, " is outside [0, ", opt_.world_size, ")");
  const size_t w = static_cast<size_t>(opt_.world_size);
  total_ = opt_.drop_last ? n_ / w * w : (n_ + w - 1) / w * w;
}

size_t DistributedSampler::size() const {
  return total_ / static_cast<size_t>(opt_.world_size);
}

void DistributedSampler::indices(uint64_t epoch, std::vector<size_t>& out) const {
  if (opt_.shuffle)
    shuffled_indices(n_, opt_.seed, epoch, out);
  else {
    out.resize(n_);
    std::iota(out.begin(), out.end(), size_t(0));
  }
  // Pad by repeating from the start (several times round when n < world_size), or cut the tail.
  out.resize(total_);
  for (size_t i = n_; i < total_; ++i) out[i] = out[i - n_];
  // Compact this rank's share in place: share position k reads position rank + k * world_size,
  // which is >= k, so nothing is read after it has been overwritten.
  const size_t w = static_cast<size_t>(opt_.world_size), r = static_cast<size_t>(opt_.rank);
  const size_t share = size();
  for (size_t k = 0; k < share; ++k) out[k] = out[r + k * w];
  out.resize(share);
}

}  // namespace galley::data
