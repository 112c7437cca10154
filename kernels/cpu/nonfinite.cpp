#include "kernels/nonfinite.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/cpu/parallel.h"

namespace galley::kernels::cpu {

namespace {
// Blocks scanned with a vector OR of "exponent all ones" before any element is looked at alone.
constexpr int64_t kBlock = 4096;

int64_t first_in(const float* x, int64_t b, int64_t e) {
  for (int64_t s = b; s < e; s += kBlock) {
    const int64_t t = std::min(e, s + kBlock);
    uint32_t bad = 0;
#pragma omp simd reduction(| : bad)
    for (int64_t i = s; i < t; ++i) {
      uint32_t bits;
      std::memcpy(&bits, x + i, 4);
      bad |= uint32_t((bits & 0x7f800000u) == 0x7f800000u);
    }
    if (!bad) continue;
    for (int64_t i = s; i < t; ++i) {
      uint32_t bits;
      std::memcpy(&bits, x + i, 4);
      if ((bits & 0x7f800000u) == 0x7f800000u) return i;
    }
  }
  return -1;
}
}  // namespace

int64_t first_nonfinite(const float* x, int64_t n) {
  if (n <= kElementwiseGrain) return first_in(x, 0, n);
  // Pieces of kElementwiseGrain elements spread over the threads; the first piece with a hit
  // holds the answer.
  const int64_t pieces = (n + kElementwiseGrain - 1) / kElementwiseGrain;
  std::vector<int64_t> hits(size_t(pieces), -1);
  parallel_for(pieces, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p)
      hits[size_t(p)] =
          first_in(x, p * kElementwiseGrain, std::min(n, (p + 1) * kElementwiseGrain));
  });
  for (int64_t h : hits)
    if (h >= 0) return h;
  return -1;
}

}  // namespace galley::kernels::cpu
