// 2-D max pooling (NCHW, float32) with the winner's offset in its plane kept for backward: the
// GPU side of kernels/cpu/max_pool2d.cpp, with the same winners (a NaN wins, the first of equal
// maxima wins, padding never wins).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/launch.cuh"
#include "kernels/max_pool2d.h"

namespace galley::kernels::cuda {

// ----------------------------------------------------------------------------------------------
// kernels

namespace {

struct Geometry {
  int64_t planes, h, w, k, stride, pad, oh, ow;
};

// The common 2x2/2 window, one output per thread, written as the CPU's selects. kPairs: w is
// even and x 8-byte aligned, so each window row is one float2 load.
template <typename Index, bool kPairs>
__global__ void pool_2x2_kernel(const float* __restrict__ x, Geometry g, float* __restrict__ y,
                                int32_t* __restrict__ idx) {
  const Index oh = Index(g.oh), ow = Index(g.ow), w = Index(g.w);
  const Index out_plane = oh * ow, in_plane = Index(g.h) * w;
  const Index total = Index(g.planes) * out_plane;
  const Index stride = Index(blockDim.x) * gridDim.x;
  for (Index k = Index(blockIdx.x) * blockDim.x + threadIdx.x; k < total; k += stride) {
    const Index p = k / out_plane, rem = k - p * out_plane;
    const Index r = rem / ow, col = rem - r * ow;
    const Index base = 2 * r * w, j = 2 * col;
    const float* r0 = x + p * in_plane + base;
    const float* r1 = r0 + w;
    float a, b, c, d;
    if constexpr (kPairs) {
      const float2 top = __ldg(reinterpret_cast<const float2*>(r0 + j));
      const float2 bottom = __ldg(reinterpret_cast<const float2*>(r1 + j));
      a = top.x, b = top.y, c = bottom.x, d = bottom.y;
    } else {
      a = __ldg(r0 + j), b = __ldg(r0 + j + 1), c = __ldg(r1 + j), d = __ldg(r1 + j + 1);
    }
    const bool tb = b > a || b != b;
    const float ab = tb ? b : a;
    const bool td = d > c || d != d;
    const float cd = td ? d : c;
    const bool t = (cd > ab || cd != cd) && ab == ab;
    y[k] = t ? cd : ab;
    idx[k] = static_cast<int32_t>(base + (t ? (td ? w + j + 1 : w + j) : (tb ? j + 1 : j)));
  }
}

// Any window, stride and padding: the CPU's scan of the clipped window, row by row.
template <typename Index>
__global__ void pool_generic_kernel(const float* __restrict__ x, Geometry g, float* __restrict__ y,
                                    int32_t* __restrict__ idx) {
  const Index out_plane = Index(g.oh * g.ow), in_plane = Index(g.h * g.w);
  const Index total = Index(g.planes) * out_plane;
  const Index stride = Index(blockDim.x) * gridDim.x;
  for (Index k = Index(blockIdx.x) * blockDim.x + threadIdx.x; k < total; k += stride) {
    const Index p = k / out_plane, rem = k - p * out_plane;
    const int64_t oh = int64_t(rem / Index(g.ow)), ow = int64_t(rem % Index(g.ow));
    const int64_t h0 = oh * g.stride - g.pad, w0 = ow * g.stride - g.pad;
    const int64_t hs = max(h0, int64_t(0)), he = min(h0 + g.k, g.h);
    const int64_t ws = max(w0, int64_t(0)), we = min(w0 + g.k, g.w);
    const float* xp = x + p * in_plane;
    float best = -INFINITY;
    int64_t bi = hs * g.w + ws;
    for (int64_t ih = hs; ih < he; ++ih)
      for (int64_t iw = ws; iw < we; ++iw) {
        const float v = __ldg(xp + ih * g.w + iw);
        if (v > best || v != v) {
          best = v;
          bi = ih * g.w + iw;
          if (v != v) ih = he, iw = we;  // a NaN wins; stop looking
        }
      }
    y[k] = best;
    idx[k] = static_cast<int32_t>(bi);
  }
}

// One thread per input element gathers the gradient of every window that chose it, in the
// order of the output index, as the CPU's scatter adds them: deterministic, no atomics and no
// separate zeroing pass. In the tiled 2x2/2 case the CPU stores (not adds) the single value;
// starting the sum at -0 gives the same bits (v + -0 == v for every v, signed zeros included).
template <typename Index>
__global__ void pool_backward_kernel(const float* __restrict__ gy, const int32_t* __restrict__ idx,
                                     Geometry g, bool tiled, float* __restrict__ gx) {
  const Index in_plane = Index(g.h * g.w), out_plane = Index(g.oh * g.ow);
  const Index total = Index(g.planes) * in_plane;
  const Index stride = Index(blockDim.x) * gridDim.x;
  for (Index k = Index(blockIdx.x) * blockDim.x + threadIdx.x; k < total; k += stride) {
    const Index p = k / in_plane, me = k - p * in_plane;
    const int64_t ih = int64_t(me / Index(g.w)), iw = int64_t(me % Index(g.w));
    // Windows oh with oh * stride - pad <= ih < oh * stride - pad + k.
    const int64_t ah = ih + g.pad - g.k + 1, aw = iw + g.pad - g.k + 1;
    const int64_t oh_lo = ah > 0 ? (ah + g.stride - 1) / g.stride : 0;
    const int64_t ow_lo = aw > 0 ? (aw + g.stride - 1) / g.stride : 0;
    const int64_t oh_hi = min((ih + g.pad) / g.stride, g.oh - 1);
    const int64_t ow_hi = min((iw + g.pad) / g.stride, g.ow - 1);
    const float* gyp = gy + p * out_plane;
    const int32_t* ip = idx + p * out_plane;
    float acc = tiled ? -0.f : 0.f;
    bool any = false;
    for (int64_t oh = oh_lo; oh <= oh_hi; ++oh)
      for (int64_t ow = ow_lo; ow <= ow_hi; ++ow) {
        const int64_t o = oh * g.ow + ow;
        if (__ldg(ip + o) == int32_t(me)) {
          acc += __ldg(gyp + o);
          any = true;
        }
      }
    gx[k] = any ? acc : 0.f;
  }
}

}  // namespace

// ----------------------------------------------------------------------------------------------
// launchers

namespace {

Geometry geometry(const Pool2dGeometry& g) {
  return {g.planes, g.h, g.w, g.k, g.stride, g.pad, g.oh, g.ow};
}

}  // namespace

void max_pool2d_forward(const Pool2dGeometry& pg, const float* x, float* y, int32_t* idx,
                        void* stream) {
  const Geometry g = geometry(pg);
  const int64_t total = g.planes * g.oh * g.ow;
  if (total <= 0) return;
  const cudaStream_t st = static_cast<cudaStream_t>(stream);
  const bool small = g.planes * g.h * g.w <= INT32_MAX;
  if (g.k == 2 && g.stride == 2 && g.pad == 0) {
    const bool pairs = g.w % 2 == 0 && (reinterpret_cast<uintptr_t>(x) & 7) == 0;
    if (small && pairs)
      pool_2x2_kernel<uint32_t, true><<<blocks_for(total), kThreads, 0, st>>>(x, g, y, idx);
    else if (small)
      pool_2x2_kernel<uint32_t, false><<<blocks_for(total), kThreads, 0, st>>>(x, g, y, idx);
    else if (pairs)
      pool_2x2_kernel<int64_t, true><<<blocks_for(total), kThreads, 0, st>>>(x, g, y, idx);
    else
      pool_2x2_kernel<int64_t, false><<<blocks_for(total), kThreads, 0, st>>>(x, g, y, idx);
  } else if (small && total <= INT32_MAX) {
    pool_generic_kernel<uint32_t><<<blocks_for(total), kThreads, 0, st>>>(x, g, y, idx);
  } else {
    pool_generic_kernel<int64_t><<<blocks_for(total), kThreads, 0, st>>>(x, g, y, idx);
  }
}

void max_pool2d_backward(const Pool2dGeometry& pg, const float* gy, const int32_t* idx, float* gx,
                         void* stream) {
  const Geometry g = geometry(pg);
  const int64_t total = g.planes * g.h * g.w;
  if (total <= 0) return;
  const cudaStream_t st = static_cast<cudaStream_t>(stream);
  const bool tiled = g.k == 2 && g.stride == 2 && g.pad == 0;
  if (total <= INT32_MAX && g.planes * g.oh * g.ow <= INT32_MAX)
    pool_backward_kernel<uint32_t><<<blocks_for(total), kThreads, 0, st>>>(gy, idx, g, tiled, gx);
  else
    pool_backward_kernel<int64_t><<<blocks_for(total), kThreads, 0, st>>>(gy, idx, g, tiled, gx);
}

}  // namespace galley::kernels::cuda
