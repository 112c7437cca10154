#include "kernels/nonfinite.h"

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "galley/half.h"
#include "kernels/cpu/parallel.h"

namespace galley::kernels::cpu {

namespace {
// Blocks scanned with a vector OR of "exponent all ones" before any element is looked at alone.
constexpr int64_t kBlock = 4096;

// An element's bits as an unsigned integer of its width, and the mask of its exponent: an
// element is NaN or infinite exactly when its exponent bits are all ones.
template <typename T>
struct ExponentBits {
  using Bits = uint16_t;
  static constexpr Bits kMask = std::is_same_v<T, bfloat16> ? 0x7f80u : 0x7c00u;
};
template <>
struct ExponentBits<float> {
  using Bits = uint32_t;
  static constexpr Bits kMask = 0x7f800000u;
};

template <typename T>
int64_t first_in(const T* x, int64_t b, int64_t e) {
  using Bits = typename ExponentBits<T>::Bits;
  constexpr Bits kMask = ExponentBits<T>::kMask;
  static_assert(sizeof(Bits) == sizeof(T), "an element's bits have its width");
  for (int64_t s = b; s < e; s += kBlock) {
    const int64_t t = std::min(e, s + kBlock);
    uint32_t bad = 0;
#pragma omp simd reduction(| : bad)
    for (int64_t i = s; i < t; ++i) {
      Bits bits;
      std::memcpy(&bits, x + i, sizeof(Bits));
      bad |= uint32_t((bits & kMask) == kMask);
    }
    if (!bad) continue;
    for (int64_t i = s; i < t; ++i) {
      Bits bits;
      std::memcpy(&bits, x + i, sizeof(Bits));
      if ((bits & kMask) == kMask) return i;
    }
  }
  return -1;
}

template <typename T>
int64_t first_nonfinite_typed(const T* x, int64_t n) {
  if (n <= kElementwiseGrain) return first_in(x, 0, n);
  // Pieces of kElementwiseGrain elements spread over the threads; the first piece with a hit
  // holds the answer.
  const int64_t pieces = (n + kElementwiseGrain - 1) / kElementwiseGrain;
  std::vector<int64_t> hits(size_t(pieces), -1);
  parallel_balanced(pieces, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p)
      hits[size_t(p)] =
          first_in(x, p * kElementwiseGrain, std::min(n, (p + 1) * kElementwiseGrain));
  });
  for (int64_t h : hits)
    if (h >= 0) return h;
  return -1;
}
}  // namespace

int64_t first_nonfinite(const void* x, DType dtype, int64_t n) {
  return dispatch_floating(dtype, "first_nonfinite", [&](auto tag) {
    using T = typename decltype(tag)::type;
    return first_nonfinite_typed(static_cast<const T*>(x), n);
  });
}

}  // namespace galley::kernels::cpu
