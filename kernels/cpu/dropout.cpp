// Inverted dropout on the host: blocks of 256 elements, each drawing its mask from 64 Philox
// calls (a loop the compiler vectorises), then one staged pass over the block.
#include "kernels/dropout.h"

#include <algorithm>
#include <type_traits>

#include "kernels/cpu/parallel.h"
#include "kernels/cpu/staged.h"

namespace galley::kernels::cpu {
namespace {

static_assert(kStageBlock % 4 == 0, "a stage block holds whole Philox blocks");

// mask[j] for elements first .. first + m of the call (first a multiple of 4).
void draw_mask(const DropoutParams& d, int64_t first, int64_t m, uint8_t* mask) {
  uint32_t words[kStageBlock];
  const int64_t blocks = (m + 3) / 4;
  const uint64_t block0 = uint64_t(first / 4);
#pragma omp simd
  for (int64_t b = 0; b < blocks; ++b) {
    const Philox4 r = philox4x32_10(block0 + uint64_t(b), d.key);
    words[4 * b] = r.v[0], words[4 * b + 1] = r.v[1];
    words[4 * b + 2] = r.v[2], words[4 * b + 3] = r.v[3];
  }
  for (int64_t j = 0; j < m; ++j) mask[j] = uint64_t(words[j]) < d.keep_threshold;
}

}  // namespace

void dropout_forward(const DropoutParams& d, DType dtype, const void* x, void* y, uint8_t* mask,
                     int64_t n) {
  dispatch_floating(dtype, "dropout", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* px = static_cast<const T*>(x);
    T* py = static_cast<T*>(y);
    const int64_t blocks = (n + kStageBlock - 1) / kStageBlock;
    parallel_balanced(blocks, kElementwiseGrain / kStageBlock, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        const int64_t s = b * kStageBlock, m = std::min(kStageBlock, n - s);
        uint8_t* mk = mask + s;
        draw_mask(d, s, m, mk);
        const float scale = d.scale;
        if constexpr (std::is_same_v<T, float>) {
#pragma omp simd
          for (int64_t j = 0; j < m; ++j) py[s + j] = px[s + j] * (float(mk[j]) * scale);
        } else {
          float buf[kStageBlock];
          to_float(px + s, buf, m);
#pragma omp simd
          for (int64_t j = 0; j < m; ++j) buf[j] *= float(mk[j]) * scale;
          from_float(buf, py + s, m);
        }
      }
    });
  });
}

void dropout_backward(DType dtype, const void* gy, const uint8_t* mask, float scale, void* gx,
                      int64_t n) {
  dispatch_floating(dtype, "dropout_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* pg = static_cast<const T*>(gy);
    T* po = static_cast<T*>(gx);
    parallel_balanced(n, kElementwiseGrain, [&](int64_t s, int64_t e) {
      if constexpr (std::is_same_v<T, float>) {
#pragma omp simd
        for (int64_t i = s; i < e; ++i) po[i] = pg[i] * (float(mask[i]) * scale);
      } else {
        float buf[kStageBlock];
        for (int64_t i = s; i < e; i += kStageBlock) {
          const int64_t m = std::min(kStageBlock, e - i);
          to_float(pg + i, buf, m);
#pragma omp simd
          for (int64_t j = 0; j < m; ++j) buf[j] *= float(mask[i + j]) * scale;
          from_float(buf, po + i, m);
        }
      }
    });
  });
}

}  // namespace galley::kernels::cpu
