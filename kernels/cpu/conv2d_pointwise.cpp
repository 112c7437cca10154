#include "kernels/cpu/conv2d_pointwise.h"

#include <algorithm>
#include <type_traits>
#include <vector>

#include "galley/error.h"
#include "kernels/convert.h"
#include "kernels/cpu/conv2d_block.h"
#include "kernels/cpu/conv2d_direct.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/staged.h"
#include "kernels/cpu/strided_rows.h"
#include "kernels/cpu/vector_lanes.h"
#include "kernels/gemm.h"

namespace galley::kernels::cpu {

#if defined(GALLEY_VECTOR_LANES)
namespace {
using namespace conv_block;

// The weight gradient's block: kGradRows output channels x up to kGradVectors vectors of input
// channels, kept in 12 of AVX2's 16 registers (6 x 2) and 16 of AVX-512's 32 (8 x 2); output
// channel counts that the block's rows do not divide take blocks of 4 rows where 4 divides them.
#if defined(__AVX512F__)
constexpr int kGradRows = 8;
#else
constexpr int kGradRows = 6;
#endif
constexpr int kGradVectors = 2;

void check_geometry(const Conv2dGeometry& g) {
  GALLEY_CHECK(g.kh == 1 && g.kw == 1 && g.pad == 0 && g.groups == 1 && g.stride >= 1,
               "conv2d: the pointwise path takes an unpadded 1x1 kernel of one group, not ", g.kh,
               "x", g.kw, " with padding ", g.pad, " and ", g.groups, " groups");
}

// Outputs of an image and the pitch of the buffers' rows of them (whole vectors).
int64_t positions(const Conv2dGeometry& g) {
  return g.oh * g.ow;
}
int64_t pitch(const Conv2dGeometry& g) {
  return round_up(positions(g), L);
}

// dst[j] = src[j * s] for j < n, widened to float32. `readable` elements from src may be read
// (to the end of the tensor: whole vectors run on past short rows, into the next ones); the
// stores may run up to L - 1 floats past dst[n - 1] (the rows of a buffer are filled in order and
// the buffer has L floats of slack, so what they write there is overwritten or never read).
template <typename T>
void sample_row(const T* src, int64_t s, int64_t n, int64_t readable, float* dst) {
  if constexpr (std::is_same_v<T, float>) {
    if (s == 2) {
      for (int64_t j = 0; j < n; j += L) {
        const int64_t left = readable - 2 * j;
        V a, b, even, odd;
        if (left >= 2 * L) {
          a = load(src + 2 * j), b = load(src + 2 * j + L);
        } else {
          a = load_lanes(src + 2 * j, first_lanes(left));
          b = load_lanes(src + 2 * j + L, lane_range(0, left - L));
        }
        deinterleave(a, b, even, odd);
        store(dst + j, even);
      }
      return;
    }
    if (s == 1) {
      for (int64_t j = 0; j < n; j += L)
        store(dst + j, readable - j >= L ? load(src + j) : load_lanes(src + j, first_lanes(n - j)));
      return;
    }
  }
#if defined(__AVX512BW__)
  if constexpr (std::is_same_v<T, bfloat16>) {
    if (s == 2) {
      // 16 outputs from 32 values: the even ones in the low halves of the 32-bit words.
      for (int64_t j = 0; j < n; j += L) {
        const __mmask32 m = lanes32(readable - 2 * j);
        store(dst + j,
              _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_maskz_loadu_epi16(m, src + 2 * j), 16)));
      }
      return;
    }
    if (s == 1) {
      for (int64_t j = 0; j < n; j += L) store(dst + j, load_bf16(src + j, lanes(n - j)));
      return;
    }
  }
#endif
  (void)readable;
  gather_strided(src, dst, n, s);
}

// The strided samples of image n's channels into rows of `ld` floats.
template <typename T>
void sample_image(const Conv2dGeometry& g, const T* x, int64_t n, int64_t ld, float* rows) {
  const int64_t image = g.c * g.h * g.w, end = g.n * image;
  for (int64_t c = 0; c < g.c; ++c)
    for (int64_t i = 0; i < g.oh; ++i) {
      const int64_t at = n * image + (c * g.h + i * g.stride) * g.w;
      sample_row(x + at, g.stride, g.ow, end - at, rows + c * ld + i * g.ow);
    }
}

// dst[j * s] = src[j] for the n values of src, rounded to T, in a zeroed row of w (at stride 2
// whole vectors of values and zeros interleaved). Reads src up to a whole vector past n (a
// buffer's row with slack).
template <typename T>
void spread_row(const float* src, int64_t n, int64_t s, int64_t w, T* dst) {
  if constexpr (std::is_same_v<T, float>) {
    if (s == 2) {
      // Value j lands at 2j; the lanes past n land at 2n or later, past the row (w <= 2n).
      for (int64_t j = 0; 2 * j < w; j += L) {
        V first, second;
        interleave(load(src + j), V{}, first, second);
        store_first(dst + 2 * j, first, w - 2 * j);
        if (2 * j + L < w) store_first(dst + 2 * j + L, second, w - 2 * j - L);
      }
      return;
    }
  }
#if defined(__AVX512BW__)
  if constexpr (std::is_same_v<T, bfloat16>) {
    if (s == 2) {
      // A 32-bit word of the rounded value's bits and a zero above them is the pair (value, 0).
      for (int64_t j = 0; 2 * j < w; j += L) {
        const __mmask32 m = lanes32(w - 2 * j);
        _mm512_mask_storeu_epi16(dst + 2 * j, m, bf16_bits(load(src + j)));
      }
      return;
    }
  }
#endif
  for (int64_t j = 0; j < n; ++j) dst[j * s] = T(src[j]);
}

// One input channel's gradient from its row of sums over the outputs: every stride-th row and
// column, zero between: the plane zeroed in one pass (one call, not one a row), then the rows
// that take values written over.
template <typename T>
void spread_plane(const Conv2dGeometry& g, const float* src, T* dst) {
  std::fill_n(dst, g.h * g.w, T(0.f));
  for (int64_t i = 0; i < g.oh; ++i)
    spread_row(src + i * g.ow, g.ow, g.stride, g.w, dst + i * g.stride * g.w);
}

// n floats of src into dst, rounded to T.
template <typename T>
void put_row(const float* src, T* dst, int64_t n) {
  if constexpr (std::is_same_v<T, float>)
    std::copy_n(src, n, dst);
  else
    from_float(src, dst, n);
}

// out[r][p] = sum over j < k of wb[j][r] * in[j * ld_in + p], for OB rows r and the positions of
// an image (P of them, `ld_in` apart in rows of the input, `ld_out` in out): whole vectors
// straight into out, the last partial one through `tail` (OB x L floats), whose first lanes are
// copied. `in` is readable a whole vector past every row.
void block_rows(const float* in, int64_t ld_in, int64_t k, const float* wb, int64_t P, float* out,
                int64_t ld_out, float* tail) {
  const int64_t whole = P / L;
  correlate_vectors(in, ld_in, k, &kNoShift, 1, wb, out, ld_out, whole);
  if (const int64_t left = P - whole * L; left > 0) {
    correlate_block<1>(in + whole * L, ld_in, k, &kNoShift, 1, wb, tail, L);
    for (int64_t r = 0; r < OB; ++r) std::copy_n(tail + r * L, left, out + r * ld_out + whole * L);
  }
}

template <typename T>
void forward(const Conv2dGeometry& g, const T* x, const float* w, const float* b, T* y) {
  const int64_t P = positions(g), ld = pitch(g);
  const int64_t k = g.c + (b ? 1 : 0);  // rows of the samples: the bias's row of ones last
  // The weights, with the bias as one more input channel.
  const std::vector<float> packed = pack_block_weights(
      g.o, k, [&](int64_t o, int64_t c) { return c < g.c ? w[o * g.c + c] : b[o]; });
  parallel_chunks(g.n, conv2d_image_grain(g), [&](int64_t n0, int64_t n1, bool) {
    float* rows = thread_scratch(0, size_t(k * ld + L));
    float* out = thread_scratch(1, size_t(OB * P));
    float* tail = thread_scratch(2, size_t(OB * L));
    for (int64_t n = n0; n < n1; ++n) {
      sample_image(g, x, n, ld, rows);
      if (b) std::fill_n(rows + g.c * ld, ld, 1.f);  // (after the samples, whose stores spill)
      T* yn = y + n * g.o * P;
      for (int64_t o0 = 0; o0 < g.o; o0 += OB) {
        const float* wblk = packed.data() + (o0 / OB) * k * OB;
        const int64_t count = std::min(OB, g.o - o0);
        if constexpr (std::is_same_v<T, float>) {
          if (count == OB) {
            block_rows(rows, ld, k, wblk, P, yn + o0 * P, P, tail);
            continue;
          }
        }
        block_rows(rows, ld, k, wblk, P, out, P, tail);
        for (int64_t r = 0; r < count; ++r) put_row(out + r * P, yn + (o0 + r) * P, P);
      }
    }
  });
}

// NR rows of the weight gradient over one image: part[o][c] += sum over p < P of gy_rows[o][p] *
// samples[p * ld_samples + c], for the cp input channels (whole vectors; part's rows cp floats
// apart), kGradVectors vectors at a time.
template <int NR>
void weight_grad_rows(const float* const* gy_rows, const float* samples, int64_t ld_samples,
                      int64_t P, int64_t cp, float* part) {
  int64_t c0 = 0;
  for (; c0 + kGradVectors * L <= cp; c0 += kGradVectors * L)
    broadcast_block<kGradVectors, NR, 1, true>(samples + c0, ld_samples, P, gy_rows, part + c0, cp);
  for (; c0 < cp; c0 += L)
    broadcast_block<1, NR, 1, true>(samples + c0, ld_samples, P, gy_rows, part + c0, cp);
}

template <typename T>
void backward(const Conv2dGeometry& g, const T* x, const float* w, const T* gy, T* gx, float* gw) {
  constexpr bool wide = std::is_same_v<T, float>;
  const int64_t P = positions(g), ld = pitch(g), HW = g.h * g.w;
  const int64_t cp = round_up(g.c, L);  // input channels across the lanes, whole vectors
  // The input gradient's weights: w transposed, input channels in the block's rows.
  const std::vector<float> packed =
      gx ? pack_block_weights(g.c, g.o, [&](int64_t c, int64_t o) { return w[o * g.c + c]; })
         : std::vector<float>();
  // The weight gradient's rows of output channels: a block that divides them where one does.
  const int grad_rows = g.o % kGradRows == 0 || g.o % 4 != 0 ? kGradRows : 4;
  const int64_t op = round_up(g.o, grad_rows);
  const int64_t chunk = balanced_chunk(g.n, conv2d_image_grain(g));
  const ChunkSums sums(gw ? g.n : 0, chunk, op * cp);
  parallel_chunks(g.n, chunk, [&](int64_t n0, int64_t n1, bool) {
    // The output gradient as float32 rows (16-bit types widened); a row of zeros for the weight
    // gradient's rows past the output channels.
    float* gy_wide = wide ? nullptr : thread_scratch(0, size_t(g.o * P));
    float* zeros = gw && op > g.o ? thread_scratch(5, size_t(P)) : nullptr;
    if (zeros) std::fill_n(zeros, P, 0.f);
    float* samples = gw ? thread_scratch(1, size_t(g.c * ld + L)) : nullptr;
    float* samples_t = gw ? thread_scratch(2, size_t(ld * cp)) : nullptr;
    float* sums_in = gx ? thread_scratch(3, size_t(OB * ld + L)) : nullptr;
    float* gy_tail = gx ? thread_scratch(4, size_t(g.o * L)) : nullptr;
    float* part = gw ? sums.start(n0) : nullptr;
    std::vector<const float*> gy_rows(static_cast<size_t>(op));
    for (int64_t n = n0; n < n1; ++n) {
      const T* gyn = gy + n * g.o * P;
      const float* gyf = as_float(gyn, g.o * P, gy_wide);
      if (gw) {
        sample_image(g, x, n, ld, samples);
        to_channels_last(samples, g.c, 1, ld, cp, samples_t, 0);
        for (int64_t o = 0; o < op; ++o) gy_rows[size_t(o)] = o < g.o ? gyf + o * P : zeros;
        for (int64_t o0 = 0; o0 < op; o0 += grad_rows) {
          const float* const* rows = gy_rows.data() + o0;
          if (grad_rows == kGradRows)
            weight_grad_rows<kGradRows>(rows, samples_t, cp, P, cp, part + o0 * cp);
          else
            weight_grad_rows<4>(rows, samples_t, cp, P, cp, part + o0 * cp);
        }
      }
      if (gx) {
        // The last partial vector of every row of gy, zero-padded, so that no read passes gy's
        // end; the whole vectors are read in place.
        const int64_t whole = P / L, left = P - whole * L;
        if (left > 0)
          for (int64_t o = 0; o < g.o; ++o) {
            float* t = gy_tail + o * L;
            std::copy_n(gyf + o * P + whole * L, left, t);
            std::fill(t + left, t + L, 0.f);
          }
        for (int64_t c0 = 0; c0 < g.c; c0 += OB) {
          const float* wblk = packed.data() + (c0 / OB) * g.o * OB;
          correlate_vectors(gyf, P, g.o, &kNoShift, 1, wblk, sums_in, ld, whole);
          if (left > 0)
            correlate_block<1>(gy_tail, L, g.o, &kNoShift, 1, wblk, sums_in + whole * L, ld);
          for (int64_t r = 0; r < OB && c0 + r < g.c; ++r)
            spread_plane(g, sums_in + r * ld, gx + (n * g.c + c0 + r) * HW);
        }
      }
    }
  });
  if (gw) {
    const float* total = sums.total();
    for (int64_t o = 0; o < g.o; ++o) std::copy_n(total + o * cp, g.c, gw + o * g.c);
  }
}

}  // namespace
#endif  // GALLEY_VECTOR_LANES

bool conv2d_pointwise_applies(const Conv2dGeometry& g, DType dtype) {
#if defined(GALLEY_VECTOR_LANES)
  const bool fits = g.kh == 1 && g.kw == 1 && g.pad == 0 && g.groups == 1 && g.stride >= 2;
  // bfloat16 widened too, but where the tiles' GEMM multiplies it as it is (unmeasured there):
  // against the dot products' GEMM (AMD Zen 4, two threads, batch 64) resnet's 16->32 and 32->64
  // 1x1/2 layers ran 1.0-1.4x forward, 1.15-1.3x backward.
  const bool widened = dtype != DType::BFloat16 || bf16_kernels() != Bf16Kernels::Tiles;
  return fits && widened;
#else
  (void)g, (void)dtype;
  return false;
#endif
}

void conv2d_pointwise_forward(const Conv2dGeometry& g, const void* x, const float* w,
                              const float* b, void* y, DType dtype) {
#if defined(GALLEY_VECTOR_LANES)
  check_geometry(g);
  dispatch_floating(dtype, "conv2d", [&](auto tag) {
    using T = typename decltype(tag)::type;
    forward(g, static_cast<const T*>(x), w, b, static_cast<T*>(y));
  });
#else
  (void)g, (void)x, (void)w, (void)b, (void)y, (void)dtype;
  GALLEY_CHECK(false, "conv2d: the pointwise path needs AVX2 with FMA, or AVX-512, in the build");
#endif
}

void conv2d_pointwise_backward(const Conv2dGeometry& g, const void* x, const float* w,
                               const void* gy, void* gx, float* gw, DType dtype) {
#if defined(GALLEY_VECTOR_LANES)
  check_geometry(g);
  if (!gx && !gw) return;
  dispatch_floating(dtype, "conv2d_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    backward(g, static_cast<const T*>(x), w, static_cast<const T*>(gy), static_cast<T*>(gx), gw);
  });
#else
  (void)g, (void)x, (void)w, (void)gy, (void)gx, (void)gw, (void)dtype;
  GALLEY_CHECK(false, "conv2d: the pointwise path needs AVX2 with FMA, or AVX-512, in the build");
#endif
}

}  // namespace galley::kernels::cpu
