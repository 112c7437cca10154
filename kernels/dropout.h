#pragma once
// Inverted dropout in float32, bfloat16 or float16 (computed in float32): y = x * (m * scale),
// with m = 1 for a kept element and 0 for a dropped one, and the mask m written as one uint8 per
// element for backward (a quarter of a float32 input's bytes, half a 16-bit one's).
//
// The mask is counter-based: element i is kept when word i % 4 of Philox-4x32-10 at counter
// i / 4 under the 64-bit key is below `keep_threshold` (round((1 - p) * 2^32)). It is a pure
// function of (key, i), so the host and the GPU draw the same mask for the same key, and the
// split over threads or blocks does not change it. As in PyTorch the product is a
// multiplication, so a NaN or infinity stays one where it is dropped. The CUDA launchers take
// device pointers and the cudaStream_t to run on.
#include <cstdint>

#include "galley/dtype.h"
#include "galley/half.h"

namespace galley::kernels {

// Philox-4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11): four
// 32-bit words from a 128-bit counter (here: the 64-bit block index, then zeros) and a 64-bit
// key, bit for bit as the Random123 reference and cuRAND's Philox.
struct Philox4 {
  uint32_t v[4];
};

GALLEY_HOST_DEVICE inline Philox4 philox4x32_10(uint64_t counter, uint64_t key) {
  uint32_t c0 = uint32_t(counter), c1 = uint32_t(counter >> 32), c2 = 0, c3 = 0;
  uint32_t k0 = uint32_t(key), k1 = uint32_t(key >> 32);
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = uint64_t(0xD2511F53u) * c0, p1 = uint64_t(0xCD9E8D57u) * c2;
    const uint32_t n0 = uint32_t(p1 >> 32) ^ c1 ^ k0, n2 = uint32_t(p0 >> 32) ^ c3 ^ k1;
    c1 = uint32_t(p1), c3 = uint32_t(p0);
    c0 = n0, c2 = n2;
    k0 += 0x9E3779B9u, k1 += 0xBB67AE85u;
  }
  return {{c0, c1, c2, c3}};
}

// Kept when the element's word is below this (p in [0, 1]): 2^32 keeps all, 0 drops all.
GALLEY_HOST_DEVICE inline uint64_t dropout_keep_threshold(double p) {
  const double t = (1.0 - p) * 4294967296.0 + 0.5;
  return t <= 0.0 ? 0 : t >= 4294967296.0 ? (uint64_t(1) << 32) : uint64_t(t);
}

// One dropout call: the key, the threshold and the scale (1 / (1 - p); 0 when p == 1).
struct DropoutParams {
  uint64_t key;
  uint64_t keep_threshold;
  float scale;
};

namespace cpu {

// y = x * (m * scale) and mask = m for n elements of `dtype`.
void dropout_forward(const DropoutParams& d, DType dtype, const void* x, void* y, uint8_t* mask,
                     int64_t n);
// gx = gy * (mask * scale).
void dropout_backward(DType dtype, const void* gy, const uint8_t* mask, float scale, void* gx,
                      int64_t n);

}  // namespace cpu

namespace cuda {

void dropout_forward(const DropoutParams& d, DType dtype, const void* x, void* y, uint8_t* mask,
                     int64_t n, void* stream);
void dropout_backward(DType dtype, const void* gy, const uint8_t* mask, float scale, void* gx,
                      int64_t n, void* stream);

}  // namespace cuda
}  // namespace galley::kernels
