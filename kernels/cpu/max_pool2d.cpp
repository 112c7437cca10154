#include "kernels/cpu/max_pool2d.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/cpu/parallel.h"

namespace galley::kernels::cpu {

void max_pool2d_forward(const Pool2dGeometry& g, const float* x, float* y, int32_t* idx) {
  const int64_t in_plane = g.h * g.w, out_plane = g.oh * g.ow;
  const bool fast2 = g.k == 2 && g.stride == 2 && g.pad == 0;
  parallel_for(g.planes, std::max<int64_t>(1, 4096 / std::max<int64_t>(out_plane, 1)),
               [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      const float* xp = x + p * in_plane;
      float* yp = y + p * out_plane;
      int32_t* ip = idx + p * out_plane;
      if (fast2) {  // the common 2x2/2 window: branch-free selects that vectorise
        for (int64_t oh = 0; oh < g.oh; ++oh) {
          const float* r0 = xp + 2 * oh * g.w;
          const float* r1 = r0 + g.w;
          float* yr = yp + oh * g.ow;
          int32_t* ir = ip + oh * g.ow;
          const int32_t base = static_cast<int32_t>(2 * oh * g.w), w = static_cast<int32_t>(g.w);
#pragma omp simd
          for (int64_t ow = 0; ow < g.ow; ++ow) {
            const int32_t j = static_cast<int32_t>(2 * ow);
            const float a = r0[j], b = r0[j + 1], c = r1[j], d = r1[j + 1];
            // `b > a || b != b` lets a NaN win, so NaNs propagate as in PyTorch.
            const bool tb = b > a || b != b;
            const float ab = tb ? b : a;
            const int32_t iab = tb ? j + 1 : j;
            const bool td = d > c || d != d;
            const float cd = td ? d : c;
            const int32_t icd = td ? w + j + 1 : w + j;
            const bool tcd = (cd > ab || cd != cd) && !(ab != ab);
            yr[ow] = tcd ? cd : ab;
            ir[ow] = base + (tcd ? icd : iab);
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
