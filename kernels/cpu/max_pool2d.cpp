#include "kernels/cpu/max_pool2d.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/cpu/parallel.h"

namespace galley::kernels::cpu {

namespace {
constexpr int64_t kMaxRow = 4096;  // widest input row the 2x2 fast path buffers on the stack
}

void max_pool2d_forward(const Pool2dGeometry& g, const float* x, float* y, int32_t* idx) {
  const int64_t in_plane = g.h * g.w, out_plane = g.oh * g.ow;
  const bool fast2 = g.k == 2 && g.stride == 2 && g.pad == 0 && 2 * g.ow <= kMaxRow;
  parallel_for(g.planes, std::max<int64_t>(1, 4096 / std::max<int64_t>(out_plane, 1)),
               [&](int64_t p0, int64_t p1) {
                 for (int64_t p = p0; p < p1; ++p) {
                   const float* xp = x + p * in_plane;
                   float* yp = y + p * out_plane;
                   int32_t* ip = idx + p * out_plane;
                   if (fast2) {
                     // The common 2x2/2 window, branch-free (a data-dependent branch per comparison
                     // mispredicts half the time): first the max of each column pair of two rows,
                     // which vectorises, then the max of neighbouring columns. `v > best || v != v`
                     // lets a NaN win, so NaNs propagate as in PyTorch.
                     float vm[kMaxRow];
                     int32_t vi[kMaxRow];
                     const int64_t w2 = 2 * g.ow;
                     for (int64_t oh = 0; oh < g.oh; ++oh) {
                       const float* __restrict r0 = xp + 2 * oh * g.w;
                       const float* __restrict r1 = r0 + g.w;
                       const int32_t base = static_cast<int32_t>(2 * oh * g.w),
                                     w = static_cast<int32_t>(g.w);
#pragma omp simd
                       for (int64_t j = 0; j < w2; ++j) {
                         const float a = r0[j], b = r1[j];
                         const bool t = b > a || b != b;
                         vm[j] = t ? b : a;
                         vi[j] = base + static_cast<int32_t>(j) + (t ? w : 0);
                       }
                       float* __restrict yr = yp + oh * g.ow;
                       int32_t* __restrict ir = ip + oh * g.ow;
                       for (int64_t ow = 0; ow < g.ow; ++ow) {
                         const float a = vm[2 * ow], b = vm[2 * ow + 1];
                         const bool t = (b > a || b != b) && a == a;
                         yr[ow] = t ? b : a;
                         ir[ow] = t ? vi[2 * ow + 1] : vi[2 * ow];
                       }
                     }
                     continue;
                   }
                   for (int64_t oh = 0; oh < g.oh; ++oh) {
                     const int64_t h0 = oh * g.stride - g.pad;
                     const int64_t hs = std::max<int64_t>(h0, 0), he = std::min(h0 + g.k, g.h);
                     for (int64_t ow = 0; ow < g.ow; ++ow) {
                       const int64_t w0 = ow * g.stride - g.pad;
                       const int64_t ws = std::max<int64_t>(w0, 0), we = std::min(w0 + g.k, g.w);
                       float best = -std::numeric_limits<float>::infinity();
                       int64_t bi = hs * g.w + ws;
                       for (int64_t ih = hs; ih < he; ++ih)
                         for (int64_t iw = ws; iw < we; ++iw) {
                           float v = xp[ih * g.w + iw];
                           if (v > best || std::isnan(v)) {
                             best = v;
                             bi = ih * g.w + iw;
                             if (std::isnan(v)) ih = he, iw = we;  // NaN wins; stop looking
                           }
                         }
                       yp[oh * g.ow + ow] = best;
                       ip[oh * g.ow + ow] = static_cast<int32_t>(bi);
                     }
                   }
                 }
               });
}

void max_pool2d_backward(const Pool2dGeometry& g, const float* gy, const int32_t* idx, float* gx) {
  const int64_t in_plane = g.h * g.w, out_plane = g.oh * g.ow;
  parallel_for(g.planes, std::max<int64_t>(1, 4096 / std::max<int64_t>(out_plane, 1)),
               [&](int64_t p0, int64_t p1) {
                 for (int64_t p = p0; p < p1; ++p) {
                   float* gp = gx + p * in_plane;
                   std::fill_n(gp, in_plane, 0.f);
                   const float* gyp = gy + p * out_plane;
                   const int32_t* ip = idx + p * out_plane;
                   for (int64_t i = 0; i < out_plane; ++i) gp[ip[i]] += gyp[i];
                 }
               });
}

}  // namespace galley::kernels::cpu
