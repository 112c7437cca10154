#include "kernels/cpu/conv2d_winograd.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <type_traits>
#include <vector>

#include "galley/error.h"
#include "galley/half.h"
#include "kernels/cpu/conv2d_direct.h"
#include "kernels/cpu/parallel.h"

#include "kernels/cpu/bf16_avx512.h"
#include "kernels/cpu/conv2d_block.h"
#include "kernels/cpu/vector_lanes.h"

namespace galley::kernels::cpu {

namespace {

// Planes narrower than this take the channel-last form: with AVX-512, 14 wide or less (at most 7
// tiles a row, under half of a vector's 16 lanes busy in the tiled form's transforms; on AMD
// Zen 4, two threads, batch 64, resnet's 32->32 14x14 layer ran 1.2x (float32) and 1.32x
// (bfloat16 pairs) forward and 1.08x and 1.1x backward on it, while 16x16 planes of vgg's 64->64
// layer, 8 tiles a row, were even and 28x28 ones 0.85-0.93x; with two tile rows a vector,
// TileRowPairs, the 14x14 layer's forward pass still ran 0.75-0.86x and its backward 0.9-0.95x
// the narrow form's); with AVX2, 12 wide or less (at most 6 tiles a row of 8 lanes).
constexpr int64_t kNarrowPlane = conv_block::L == 16 ? 15 : 13;

// A 16-bit convolution computed in float32 here, as the float32 one, with its bits: any but a
// bfloat16 one on the host's bfloat16 kernels.
bool float32_sums(DType dtype) {
  return dtype == DType::Float32 || dtype == DType::Float16 ||
         (dtype == DType::BFloat16 && bf16_kernels() == Bf16Kernels::Widened);
}

bool winograd_geometry(const Conv2dGeometry& g) {
  return g.kh == 3 && g.kw == 3 && g.stride == 1 && g.pad == 1 && g.dilation == 1 &&
         g.groups == 1 && g.c >= 16 && g.o >= 16;
}

}  // namespace

bool conv2d_winograd_applies(const Conv2dGeometry& g, DType dtype) {
#if defined(GALLEY_VECTOR_LANES)
  // A bfloat16 convolution on the dot products takes the path with its products on pairs, its
  // transformed inputs rounded to bfloat16 as made. On AMD Zen 4 (two threads, batch 64, against
  // the direct path's dot products) the tiled form ran resnet's 16->16 28x28 layer 1.18x forward
  // and 1.04x backward, its 32->32 14x14 one 1.08x and 1.0x (the narrow form, which 14x14 planes
  // take since, about 1.3x and 1.1x more), vgg's 32->32 32x32 and 64->64 16x16 ones 1.6x and 1.44x
  // forward; the narrow form resnet's 64->64 7x7 layer 1.6x forward and 1.36x backward, vgg's
  // 64->128 8x8 one 1.6x forward.
  return winograd_geometry(g) && (float32_sums(dtype) || on_dot_products(dtype));
#else
  (void)g, (void)dtype;
  return false;
#endif
}

bool conv2d_winograd_weight_grad_applies(const Conv2dGeometry& g, DType dtype) {
  // With 16 channels each way the transforms cost more than the products save on an Intel Xeon
  // (AVX-512); on AMD Zen 3 (AVX2) the path is 1.2-1.3x the direct weight gradient there. A
  // bfloat16 one on the dot products, its products on pairs of tiles, from 64 channels each way:
  // on AMD Zen 4 vgg's 64->64 16x16 and 64->128 8x8 backward passes ran 1.13x and 1.2x with it;
  // with 32 channels the transforms outweigh the halved products (vgg's 32->32 32x32: 0.91x).
  const int64_t least = conv_block::L == 16 ? 32 : 16;
  return conv2d_winograd_applies(g, dtype) &&
         ((float32_sums(dtype) && g.c >= least && g.o >= least) ||
          (on_dot_products(dtype) && g.c >= 64 && g.o >= 64));
}

namespace {

void check_geometry(const Conv2dGeometry& g, const char* what) {
  GALLEY_CHECK(g.kh == 3 && g.kw == 3 && g.stride == 1 && g.pad == 1 && g.dilation == 1 &&
                   g.groups == 1 && g.oh == g.h && g.ow == g.w,
               what,
               ": the Winograd path takes 3x3 kernels with stride 1, padding 1, dilation 1 "
               "and one group; got ",
               g.kh, "x", g.kw, " stride ", g.stride, " padding ", g.pad, " dilation ", g.dilation,
               " groups ", g.groups);
#if !defined(GALLEY_VECTOR_LANES)
  GALLEY_CHECK(false, what,
               ": the Winograd path needs a build for AVX-512 or AVX2 (with FMA) hosts");
#endif
}

#if defined(GALLEY_VECTOR_LANES)
using namespace conv_block;  // 16 lanes and blocks of 8 output channels (AVX2: 8 and 4)

// The distance between the 16 positions' planes of transformed values (or of products) of
// `floats` each: one vector more. A whole number of 4 KiB pages apart (vgg's 32 channels of 256
// tiles: eight), the 16 stores of a tile's transform would all fall in one set of the L1 cache.
inline int64_t position_stride(int64_t floats) {
  return floats + L;
}

// conv2d_winograd_whole_vector_rows_for_tests' setting: -1 the host's choice, else 0 or 1.
std::atomic<int> whole_rows_setting{-1};

// Whether the tiled form lays out its tile rows in whole vectors (Plan::pitch): with AVX-512, on
// Intel's cores, where it was measured (a Xeon, family 6 model 207: resnet's 16->16 28x28 layer
// 1.29x forward and input gradient). AMD's cores keep the dense rows they were tuned with: Zen 4
// issues a 64-byte store as two halves, and at half the Xeon's multiply-adds a cycle the padded
// lanes' products weigh twice as much there.
inline bool whole_vector_rows() {
  const int set = whole_rows_setting.load(std::memory_order_relaxed);
  return set < 0 ? intel_avx512_cores() : L == 16 && set == 1;
}

// One correlation: `cin` planes of h x w against 3x3 kernels at padding 1, giving `cout` planes
// of h x w, computed on 2x2 output tiles (the last row and column of tiles hang over an odd
// edge; what falls outside is not written).
struct Plan {
  int64_t cin, h, w, cout;
  int64_t th() const { return (h + 1) / 2; }  // rows of tiles
  int64_t tw() const { return (w + 1) / 2; }  // tiles a row
  int64_t tiles() const { return th() * tw(); }
  // The tiled form's tiles a row as laid out in its transformed planes and products: whole
  // vectors where whole_vector_rows() and a row's last vector would be more than half full
  // (28-wide planes' 14 tiles in 16 lanes, 14% more products; 17 tiles in 32 lanes would be
  // 88%), so that each tile row's transform is whole vectors stored on cache lines, not vectors
  // straddling two lines at every row's start; and the tiles of a plane so laid out. The lanes
  // past a row hold the transforms of tiles past the plane (finite: the columns they read past it
  // are zeros), which no output reads.
  int64_t pitch() const {
    return whole_vector_rows() && tw() % L > L / 2 ? round_up(tw(), L) : tw();
  }
  int64_t laid_tiles() const { return th() * pitch(); }
  int64_t coutp() const { return round_up(cout, OB); }
  // Images a chunk transforms and multiplies together: at least 96 tiles (two register blocks
  // of three vectors), so that few are padding past the last tile.
  int64_t images(int64_t n) const {
    return std::min(n, std::max<int64_t>(1, (96 + tiles() - 1) / tiles()));
  }
};

// Where a correlation's 3x3 kernels lie: tap t (row-major) of output co and input ci at
// w[co * co_stride + ci * ci_stride + (flipped ? 8 - t : t)].
struct Kernels {
  const float* w;
  int64_t co_stride, ci_stride;
  bool flipped;
};

// The 16 values of G g G^T for 16 kernels g (taps row-major, a kernel a lane), position
// k = 4 r + c, with G = [1 0 0; 1/2 1/2 1/2; 1/2 -1/2 1/2; 0 0 1].
void transform_kernels(const V g[9], V u[16]) {
  V gg[4][3];
  for (int c = 0; c < 3; ++c) {
    gg[0][c] = g[c];
    gg[1][c] = splat(0.5f) * (g[c] + g[3 + c] + g[6 + c]);
    gg[2][c] = splat(0.5f) * (g[c] - g[3 + c] + g[6 + c]);
    gg[3][c] = g[6 + c];
  }
  for (int r = 0; r < 4; ++r) {
    u[4 * r] = gg[r][0];
    u[4 * r + 1] = splat(0.5f) * (gg[r][0] + gg[r][1] + gg[r][2]);
    u[4 * r + 2] = splat(0.5f) * (gg[r][0] - gg[r][1] + gg[r][2]);
    u[4 * r + 3] = gg[r][2];
  }
}

// The transformed kernels of `cout` x `cin`, each position k of output co and input ci stored at
// u[index(k, co, ci)] of a zeroed array of n floats; index must run consecutively over each
// aligned block of OB output channels. L output channels at a time, a kernel a lane, each
// position stored a block of OB channels at a time.
template <typename Index>
void transform_weights(int64_t cout, int64_t cin, const Kernels& ks, size_t n, Index index,
                       aligned_vector<float>& u) {
  u.assign(n, 0.f);
  auto lanes_of = [&](int64_t ci, int64_t co) {  // output channels co .. co + L - 1 of input ci
    const int64_t m = std::min(L, cout - co);
    const float* base = ks.w + co * ks.co_stride + ci * ks.ci_stride;
    alignas(64) float taps[9][L] = {};
    for (int k = 0; k < 9; ++k)
      for (int64_t i = 0; i < m; ++i)
        taps[k][i] = base[i * ks.co_stride + (ks.flipped ? 8 - k : k)];
    V g[9], t[16];
    for (int k = 0; k < 9; ++k) g[k] = load(taps[k]);
    transform_kernels(g, t);
    for (int k = 0; k < 16; ++k) {
      alignas(64) float out[L];
      store(out, t[k]);
      for (int64_t b = 0; b < m; b += OB) {
        float* dst = &u[index(k, co + b, ci)];
        if (m - b >= OB)
          std::memcpy(dst, out + b, OB * sizeof(float));  // one vector move
        else
          std::memcpy(dst, out + b, size_t(m - b) * sizeof(float));
      }
    }
  };
  parallel_for(cin, std::max<int64_t>(1, 256 / std::max<int64_t>(cout, 1)),
               [&](int64_t c0, int64_t c1) {
                 for (int64_t ci = c0; ci < c1; ++ci)
                   for (int64_t co = 0; co < cout; co += L) lanes_of(ci, co);
               });
}

// U[k][block][ci][OB] for the tiled path: output channel block * OB + o (zero past cout).
void transform_weights(const Plan& p, const Kernels& ks, aligned_vector<float>& u) {
  const int64_t blocks = p.coutp() / OB;
  transform_weights(
      p.cout, p.cin, ks, size_t(16 * blocks * p.cin * OB),
      [&](int k, int64_t co, int64_t ci) {
        return size_t(((k * blocks + co / OB) * p.cin + ci) * OB + co % OB);
      },
      u);
}

// The lanes of L consecutive floats from x + o that fall inside [0, n).
inline Mask inside(int64_t o, int64_t n) {
  return lane_range(-o, n - o);
}
#if defined(__AVX512BW__)
// The 2L (32) values from x + o that fall inside [0, n).
inline __mmask32 inside32(int64_t o, int64_t n) {
  return __mmask32(inside(o + L, n)) << L | inside(o, n);
}
#endif

// AVX2 builds copy each plane into a bordered float buffer first (rows of this many floats: two
// zero columns to the left, the row, and zeros past it for the last pair of loads), so that
// transform_input's loads need no masks, and store whole vectors of tiles except on the last
// tile row: AMD Zen 3 spent a third of the transform on the masks' tests and partial stores.
// AVX-512's masked loads and stores cost no more than plain ones.
constexpr bool kBorderedRows = L == 8;
inline int64_t bordered_row(const Plan& p) {
  return round_up(2 * p.tw() + 2 * L + 2, L);
}

// A row's four columns d0 .. d3 (of L tiles) through B^T.
inline void through_bt(V d0, V d1, V d2, V d3, V t[4]) {
  t[0] = d0 - d2;
  t[1] = d1 + d2;
  t[2] = d2 - d1;
  t[3] = d1 - d3;
}

// The transform's four rows a, b, c, e (input rows 2i - 1 .. 2i + 2, each through B^T) through
// B: r[k] = position k = 4 r + c of the tile row.
inline void through_b(const V a[4], const V b[4], const V c[4], const V e[4], V r[16]) {
  for (int q = 0; q < 4; ++q) {
    r[0 + q] = a[q] - c[q];
    r[4 + q] = b[q] + c[q];
    r[8 + q] = c[q] - b[q];
    r[12 + q] = b[q] - e[q];
  }
}

// B^T d B, B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1], for L tiles of one input plane, a
// tile row at a time: the tiles at columns j0 .. j0 + L - 1 of every row. Tile (i, j) reads rows
// 2i - 1 .. 2i + 2 and columns 2j - 1 .. 2j + 2, zero outside the plane. Its four columns come
// from the input straight (AVX-512, the edges masked) or from its bordered copy in `rows`
// (kBorderedRows: h rows of bordered_row(p) floats, zero outside the plane's columns):
//  - bfloat16 on AVX-512: three loads of 32 values (at 2j - 2, 2j and 2j + 2), whose 32-bit words
//    hold an even column in the low half and an odd one in the high, each half widened where it
//    lies (a shift or a mask; no permute);
//  - float32 on AVX-512: the even and odd lanes of one pair of vector loads (columns 2j and
//    2j + 1), the columns 2j - 1 and 2j + 2 those shifted by a lane with the one value past
//    either end;
//  - else: the odd and even lanes of three pairs of vector loads (at 2j - 2, 2j and 2j + 2).
// The same values every way. Tile rows i and i + 1 share two input rows (2i + 1 and 2i + 2): each
// is read and transformed once.
template <typename T>
class InputTiles {
 public:
  InputTiles(const Plan& p, const T* x, const float* rows, int64_t j0)
      : p_(p), x_(x), rows_(rows), o_(2 * j0) {
    m_[0] = inside(o_ - 2, p.w), m_[1] = inside(o_ - 2 + L, p.w), m_[2] = inside(o_, p.w);
    m_[3] = inside(o_ + L, p.w), m_[4] = inside(o_ + 2, p.w), m_[5] = inside(o_ + 2 + L, p.w);
#if defined(__AVX512BW__)
    for (int q = 0; q < 3; ++q) w_[q] = inside32(o_ - 2 + 2 * q, p.w);
    before_ = o_ >= 1 && o_ - 1 < p.w, after_ = o_ + 2 * L < p.w;
#endif
    row(-1, c_);
    row(0, e_);
  }

  // r[k] = position k = 4 r + c of tile row i's transform; rows are taken in order from 0.
  void next(int64_t i, V r[16]) {
    V a[4], b[4];
    for (int q = 0; q < 4; ++q) a[q] = c_[q], b[q] = e_[q];
    row(2 * i + 1, c_);
    row(2 * i + 2, e_);
    through_b(a, b, c_, e_, r);
  }

 private:
  // Row r's columns 2j - 1 .. 2j + 2 for the L tiles, through B^T (zero outside the plane).
  void row(int64_t r, V t[4]) {
    if (r < 0 || r >= p_.h) {
      t[0] = t[1] = t[2] = t[3] = V{};
      return;
    }
    V d0, d1, d2, d3, unused;
#if defined(__AVX512BW__)
    if constexpr (std::is_same_v<T, bfloat16>) {
      const uint16_t* s = reinterpret_cast<const uint16_t*>(x_) + r * p_.w + o_;
      const __m512i odd = _mm512_set1_epi32(int32_t(0xffff0000u));
      const __m512i left = _mm512_maskz_loadu_epi16(w_[0], s - 2);
      const __m512i mid = _mm512_maskz_loadu_epi16(w_[1], s);
      const __m512i right = _mm512_maskz_loadu_epi16(w_[2], s + 2);
      d0 = as_v(_mm512_castsi512_ps(_mm512_and_si512(left, odd)));
      d1 = as_v(_mm512_castsi512_ps(_mm512_slli_epi32(mid, 16)));
      d2 = as_v(_mm512_castsi512_ps(_mm512_and_si512(mid, odd)));
      d3 = as_v(_mm512_castsi512_ps(_mm512_slli_epi32(right, 16)));
      return through_bt(d0, d1, d2, d3, t);
    } else if constexpr (std::is_same_v<T, float>) {
      const float* s = x_ + r * p_.w + o_;
      deinterleave(load_lanes(s, m_[2]), load_lanes(s + L, m_[3]), d1, d2);
      const M first = _mm512_set1_ps(before_ ? s[-1] : 0.f);
      const M last = _mm512_set1_ps(after_ ? s[2 * L] : 0.f);
      d0 = as_v(_mm512_castsi512_ps(
          _mm512_alignr_epi32(_mm512_castps_si512(as_m(d2)), _mm512_castps_si512(first), L - 1)));
      d3 = as_v(_mm512_castsi512_ps(
          _mm512_alignr_epi32(_mm512_castps_si512(last), _mm512_castps_si512(as_m(d1)), 1)));
      return through_bt(d0, d1, d2, d3, t);
    }
#endif
    if constexpr (kBorderedRows) {
      const float* s = rows_ + r * bordered_row(p_) + 2 + o_;
      deinterleave(load(s - 2), load(s - 2 + L), unused, d0);
      deinterleave(load(s), load(s + L), d1, d2);
      deinterleave(load(s + 2), load(s + 2 + L), d3, unused);
    } else {
      const T* s = x_ + r * p_.w + o_;
      deinterleave(load_lanes(s - 2, m_[0]), load_lanes(s - 2 + L, m_[1]), unused, d0);
      deinterleave(load_lanes(s, m_[2]), load_lanes(s + L, m_[3]), d1, d2);
      deinterleave(load_lanes(s + 2, m_[4]), load_lanes(s + 2 + L, m_[5]), d3, unused);
    }
    through_bt(d0, d1, d2, d3, t);
  }

  const Plan& p_;
  const T* x_;
  const float* rows_;
  int64_t o_;  // the first tile's column 2 j0
  Mask m_[6];  // the loads' lanes inside the row, for the pairs at columns 2j - 2, 2j and 2j + 2
#if defined(__AVX512BW__)
  __mmask32 w_[3];       // bfloat16: the 32 values inside the row, from columns 2j - 2, 2j, 2j + 2
  bool before_, after_;  // float32: whether columns 2 j0 - 1 and 2 j0 + 2L lie inside the row
#endif
  V c_[4], e_[4];  // input rows 2i - 1 and 2i through B^T, for the next tile row i
};

#if defined(__AVX512BW__) && defined(__AVX512VL__)
// The lanes of tile rows i and i + 1 in one vector, for planes of tw <= L / 2 tiles a row (8 or
// fewer), which would fill at most half of InputTiles' lanes: row i in lanes 0 .. tw - 1 and row
// i + 1 in lanes tw .. 2 tw - 1, which is how the transformed planes and the products lay them
// out (tiles row-major). `first` / `past`: the lanes where each row's tiles start and end.
struct PairedLanes {
  int64_t tw;
  __mmask16 all, first, last;  // the 2 tw lanes; lanes 0 and tw; lanes tw - 1 and 2 tw - 1
  explicit PairedLanes(int64_t tiles_a_row)
      : tw(tiles_a_row),
        all(lanes(2 * tw)),
        first(__mmask16(1u | 1u << tw)),
        last(__mmask16(1u << (tw - 1) | 1u << (2 * tw - 1))) {}
  // The index vector taking lane j of a for lanes j < tw and lane j - tw of b for lanes tw ..
  // 2 tw - 1, where a lane is stride * j + offset of its row's operand (permutex2var's form: b
  // from 16).
  __m512i gather(int64_t stride, int64_t offset) const {
    alignas(64) int32_t idx[16] = {};
    for (int64_t j = 0; j < 2 * tw; ++j)
      idx[j] = int32_t(j < tw ? stride * j + offset : 16 + stride * (j - tw) + offset);
    return _mm512_load_si512(idx);
  }
};

// Tile rows i and i + 1 through B^T d B in one vector (PairedLanes), so each vector of the
// transform does the work of two. Each of the four input rows the pair reads holds input row r
// for row i's lanes and r + 2 for row i + 1's (tile row i + 1 reads the rows two below row i's):
// loaded whole (w <= 16), the columns 2j and 2j + 1 gathered into the pair's lanes, 2j - 1 and
// 2j + 2 a lane's shift of those with the lane past either row's end zero. The same values, in
// the same order, as InputTiles'.
template <typename T>
class TileRowPairs {
 public:
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, bfloat16>);

  TileRowPairs(const Plan& p, const T* x)
      : p_(p),
        x_(x),
        lanes_(p.tw()),
        m_(lanes(p.w)),
        even_(lanes_.gather(2, 0)),
        odd_(lanes_.gather(2, 1)),
        words_(lanes_.gather(1, 0)) {}

  // r[k] = position k of tile rows i and i + 1 (past the last tile row, row i + 1's lanes hold
  // what no store keeps).
  void next(int64_t i, V r[16]) {
    V a[4], b[4], c[4], e[4];
    row(2 * i - 1, a);
    row(2 * i, b);
    row(2 * i + 1, c);
    row(2 * i + 2, e);
    through_b(a, b, c, e, r);
  }

 private:
  // Rows r (row i's lanes) and r + 2 (row i + 1's), columns 2j - 1 .. 2j + 2, through B^T.
  void row(int64_t r, V t[4]) {
    const __mmask16 after_first = lanes_.all & ~lanes_.first;
    const __mmask16 before_last = lanes_.all & ~lanes_.last;
    const __m512i zero = _mm512_setzero_si512();
    V d0, d1, d2, d3;
    if constexpr (std::is_same_v<T, bfloat16>) {
      // 32-bit words j: columns 2j (low 16 bits) and 2j + 1 (high)
      const __m512i mid =
          _mm512_maskz_permutex2var_epi32(lanes_.all, load16(r), words_, load16(r + 2));
      const __m512i odd = _mm512_set1_epi32(int32_t(0xffff0000u));
      const __m512i left = _mm512_maskz_alignr_epi32(after_first, mid, zero, 15);  // 2j - 2, -1
      const __m512i right = _mm512_maskz_alignr_epi32(before_last, zero, mid, 1);  // 2j + 2, +3
      d0 = as_v(_mm512_castsi512_ps(_mm512_and_si512(left, odd)));
      d1 = as_v(_mm512_castsi512_ps(_mm512_slli_epi32(mid, 16)));
      d2 = as_v(_mm512_castsi512_ps(_mm512_and_si512(mid, odd)));
      d3 = as_v(_mm512_castsi512_ps(_mm512_slli_epi32(right, 16)));
    } else {
      const M a = load32(r), b = load32(r + 2);
      d1 = as_v(_mm512_maskz_permutex2var_ps(lanes_.all, a, even_, b));
      d2 = as_v(_mm512_maskz_permutex2var_ps(lanes_.all, a, odd_, b));
      d0 = as_v(_mm512_castsi512_ps(
          _mm512_maskz_alignr_epi32(after_first, _mm512_castps_si512(as_m(d2)), zero, 15)));
      d3 = as_v(_mm512_castsi512_ps(
          _mm512_maskz_alignr_epi32(before_last, zero, _mm512_castps_si512(as_m(d1)), 1)));
    }
    through_bt(d0, d1, d2, d3, t);
  }
  bool inside(int64_t r) const { return r >= 0 && r < p_.h; }
  // Row r's bfloat16 bits in the low half (zero outside the plane, and past its w columns).
  __m512i load16(int64_t r) const {
    return inside(r) ? _mm512_castsi256_si512(_mm256_maskz_loadu_epi16(
                           m_, reinterpret_cast<const uint16_t*>(x_) + r * p_.w))
                     : _mm512_setzero_si512();
  }
  // Row r's floats (likewise).
  M load32(int64_t r) const {
    return inside(r) ? _mm512_maskz_loadu_ps(m_, reinterpret_cast<const float*>(x_) + r * p_.w)
                     : _mm512_setzero_ps();
  }

  const Plan& p_;
  const T* x_;
  PairedLanes lanes_;
  __mmask16 m_;                 // the row's columns
  __m512i even_, odd_, words_;  // float32: columns 2j and 2j + 1; bfloat16: words j
};

// Whether T's planes of p go through TileRowPairs.
template <typename T>
bool tile_row_pairs(const Plan& p) {
  constexpr bool kLoads = std::is_same_v<T, float> || std::is_same_v<T, bfloat16>;
  return kLoads && 2 * p.tw() <= L;
}
#else
template <typename T>
bool tile_row_pairs(const Plan&) {
  return false;
}
#endif

// v[k * ldk + t0 + i * pitch + j] = position k of B^T d B for tile (i, j) of one input plane
// (Plan::pitch); `rows` as InputTiles takes it.
template <typename T>
void transform_input(const Plan& p, const T* x, float* v, int64_t ldk, int64_t t0, float* rows) {
  const int64_t tw = p.tw(), pitch = p.pitch(), bw = bordered_row(p);
  if constexpr (kBorderedRows)
    for (int64_t r = 0; r < p.h; ++r)
      for (int64_t j = 0; j < p.w; j += L)
        store(rows + r * bw + 2 + j, load_lanes(x + r * p.w + j, first_lanes(p.w - j)));
#if defined(__AVX512BW__) && defined(__AVX512VL__)
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, bfloat16>) {
    if (tile_row_pairs<T>(p)) {
      TileRowPairs<T> pairs(p, x);
      for (int64_t i = 0; i < p.th(); i += 2) {
        V r[16];
        pairs.next(i, r);
        const int64_t n = std::min<int64_t>(2, p.th() - i) * tw;
        for (int k = 0; k < 16; ++k) store_first(v + k * ldk + t0 + i * tw, r[k], n);
      }
      return;
    }
  }
#endif
  // With whole-vector stores the vectors of a tile row go last to first: the last one's lanes past
  // the row land on the next row's first tiles (tw >= 7 here: kNarrowPlane), written after it.
  const int64_t vectors = (tw + L - 1) / L;
  for (int64_t jv = 0; jv < vectors; ++jv) {
    const int64_t j0 = (kBorderedRows ? vectors - 1 - jv : jv) * L;
    InputTiles<T> tiles(p, x, rows, j0);
    for (int64_t i = 0; i < p.th(); ++i) {
      V r[16];
      tiles.next(i, r);
      const int64_t n = pitch > tw || (kBorderedRows && i + 1 < p.th()) ? L : tw - j0;
      for (int k = 0; k < 16; ++k) store_first(v + k * ldk + t0 + i * pitch + j0, r[k], n);
    }
  }
}

// m[k][co][t] = sum over ci of u[k][co][ci] * v[k][ci][t] for the 16 positions k: tp tiles (whole
// vectors), output channels padded to whole blocks; on the correlation block as one tap
// (kNoShift).
void multiply(const Plan& p, const float* u, const float* v, int64_t tp, float* m) {
  const int64_t blocks = p.coutp() / OB, nvec = tp / L;
  for (int k = 0; k < 16; ++k) {
    const float* vk = v + k * position_stride(p.cin * tp);
    float* mk = m + k * position_stride(p.coutp() * tp);
    for (int64_t cb = 0; cb < blocks; ++cb) {
      const float* ub = u + (k * blocks + cb) * p.cin * OB;
      correlate_vectors(vk, tp, p.cin, &kNoShift, 1, ub, mk + cb * OB * tp, tp, nvec);
    }
  }
}

// y[co][2i + a][2j + b] (+ bias[co]) = A^T m A, A^T = [1 1 1 0; 0 1 -1 -1], for the tiles of one
// image, the first at t0 of m's tp; the two columns of each tile interleaved into the output row.
template <typename T>
void transform_output(const Plan& p, const float* m, int64_t tp, int64_t t0, const float* bias,
                      T* y) {
  const int64_t tw = p.tw(), pitch = p.pitch(), ldk = position_stride(p.coutp() * tp);
  // Where tw is at most half a vector, a vector holds tile rows i and i + 1 (PairedLanes), each
  // interleaved into its own output rows.
  bool paired = false;
#if defined(__AVX512BW__) && defined(__AVX512VL__)
  paired = 2 * tw <= L;
  // columns 2j + b of row i: lane j of y_b, and of row i + 1: lane tw + j
  alignas(64) int32_t ii[16] = {};
  for (int64_t j = 0; j < 2 * tw && paired; ++j) ii[j] = int32_t((j % 2) * 16 + j / 2);
  const __m512i row_i = _mm512_load_si512(ii),
                row_next = _mm512_add_epi32(row_i, _mm512_set1_epi32(int32_t(tw)));
#endif
  for (int64_t co = 0; co < p.cout; ++co) {
    const V vb = splat(bias ? bias[co] : 0.f);
    const float* mc = m + co * tp + t0;
    T* yc = y + co * p.h * p.w;
    for (int64_t i = 0; i < p.th(); i += paired ? 2 : 1)
      for (int64_t j0 = 0; j0 < tw; j0 += L) {
        const float* src = mc + i * pitch + j0;
        V s[4][2];
        for (int a = 0; a < 4; ++a) {
          const V m0 = load(src + (4 * a) * ldk), m1 = load(src + (4 * a + 1) * ldk),
                  m2 = load(src + (4 * a + 2) * ldk), m3 = load(src + (4 * a + 3) * ldk);
          s[a][0] = m0 + m1 + m2;
          s[a][1] = m1 - m2 - m3;
        }
        const int64_t left = p.w - 2 * j0;
        for (int a = 0; a < 2 && 2 * i + a < p.h; ++a) {
          const V y0 = (a == 0 ? s[0][0] + s[1][0] + s[2][0] : s[1][0] - s[2][0] - s[3][0]) + vb;
          const V y1 = (a == 0 ? s[0][1] + s[1][1] + s[2][1] : s[1][1] - s[2][1] - s[3][1]) + vb;
          T* dst = yc + (2 * i + a) * p.w + 2 * j0;
#if defined(__AVX512BW__) && defined(__AVX512VL__)
          if (paired) {
            store_first(dst, as_v(_mm512_permutex2var_ps(as_m(y0), row_i, as_m(y1))), left);
            if (2 * i + 2 + a < p.h)
              store_first(dst + 2 * p.w, as_v(_mm512_permutex2var_ps(as_m(y0), row_next, as_m(y1))),
                          left);
            continue;
          }
#endif
          V first, second;
          interleave(y0, y1, first, second);
          store_first(dst, first, left);
          if (left > L) store_first(dst + L, second, left - L);
        }
      }
  }
}

// Narrow planes (under kNarrowPlane wide: 7 tiles a row or fewer) with the lanes across channels
// instead of tiles, which would leave most lanes of the transforms idle: each image is copied
// channel-last into a bordered buffer (L x L transposes), the input transform takes a vector of L
// channels of one tile at a time, the products broadcast a tile's transformed input channel against
// vectors of L output channels, and the output transform's vectors of output channels are
// transposed back into the planes. The transforms are the tiled path's, in its order, so the
// results have its bits.
struct NarrowPlan : Plan {
  int64_t cp() const { return round_up(cin, L); }  // channels padded to whole vectors
  int64_t op() const { return round_up(cout, L); }
  int64_t bw() const { return 2 * tw() + 2; }  // the bordered buffer's columns ...
  int64_t bordered() const { return (2 * th() + 2) * bw() * cp(); }  // ... and floats
  // Images a chunk takes (in place of Plan's): at least 48 tiles (eight blocks of six), so that
  // few blocks are short.
  int64_t images(int64_t n) const {
    return std::min(n, std::max<int64_t>(1, (48 + tiles() - 1) / tiles()));
  }
};

// The image's planes into the interior of the channel-last bordered buffer xb[row][column][cp]
// (bordered row r + 1 and column j + 1 for input row r and column j; padded channels zero).
template <typename T>
void fill_channels_last(const NarrowPlan& p, const T* x, float* xb) {
  to_channels_last(x, p.cin, p.h, p.w, p.cp(), xb + (p.bw() + 1) * p.cp(), p.bw() * p.cp());
}

// A vector of transformed values stored as float32, or as bfloat16 (vcvtneps2bf16, subnormals
// flushed: operands of float32 sums) for the products on pairs.
inline void put_transformed(float* dst, V v) {
  store(dst, v);
}
#if defined(__AVX512BF16__)
inline void put_transformed(uint16_t* dst, V v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), (__m256i)_mm512_cvtneps_pbh(as_m(v)));
}
#endif

// v[k * ldk + (t0 + t) * cp + c] = position k of B^T d B for tile t of the image in xb, channel c
// (ldk = position_stride(nt * cp)), as float32 or bfloat16 (E).
template <typename E>
void transform_input_narrow(const NarrowPlan& p, const float* xb, E* v, int64_t nt, int64_t t0) {
  const int64_t bw = p.bw(), cp = p.cp(), tw = p.tw(), ldk = position_stride(nt * cp);
  for (int64_t i = 0; i < p.th(); ++i)
    for (int64_t j = 0; j < tw; ++j) {
      const float* src = xb + (2 * i * bw + 2 * j) * cp;
      E* dst = v + (t0 + i * tw + j) * cp;
      for (int64_t c = 0; c < p.cin; c += L) {
        V h[4][4];  // each row of the tile through B^T, as the tiled path's row()
        for (int r = 0; r < 4; ++r) {
          const float* row = src + r * bw * cp + c;
          const V d0 = load(row), d1 = load(row + cp), d2 = load(row + 2 * cp),
                  d3 = load(row + 3 * cp);
          h[r][0] = d0 - d2;
          h[r][1] = d1 + d2;
          h[r][2] = d2 - d1;
          h[r][3] = d1 - d3;
        }
        for (int b = 0; b < 4; ++b) {  // ... and the columns, as its put()
          put_transformed(dst + (0 + b) * ldk + c, h[0][b] - h[2][b]);
          put_transformed(dst + (4 + b) * ldk + c, h[1][b] + h[2][b]);
          put_transformed(dst + (8 + b) * ldk + c, h[2][b] - h[1][b]);
          put_transformed(dst + (12 + b) * ldk + c, h[1][b] - h[3][b]);
        }
      }
    }
}

// m[t][o] = sum over steps s of v[t][s] * u[s][o] for NT tiles (rows cp apart) and OV vectors of
// output channels (u's rows op apart): a step an input channel (E float, W float), or a pair of
// them (E the bfloat16 values, channels 2s and 2s + 1 adjacent; W their kernels' pairs).
template <int NT, int OV, typename E, typename W>
void multiply_narrow_block(const E* v, int64_t cp, int64_t steps, const W* u, int64_t op,
                           float* m) {
  const E* vt[NT];
  for (int t = 0; t < NT; ++t) vt[t] = v + t * cp;
  if constexpr (std::is_same_v<E, float>) {
    broadcast_block<OV, NT, 1, false>(u, op, steps, vt, m, op);
  } else {
#if defined(__AVX512BF16__)
    broadcast_pairs_block<OV, NT, 1, false>(u, op, steps, vt, m, op);
#endif
  }
}

// The narrow products' register block: NT tiles by up to kNarrowVectors vectors of output
// channels, with a register left for the loads and the broadcast. AVX-512's 32 registers hold
// 6 x 4 accumulators, AVX2's 16 hold 4 x 3.
constexpr int kNarrowTiles = L == 16 ? 6 : 4;
constexpr int kNarrowVectors = L == 16 ? 4 : 3;

template <int OV, typename E, typename W>
void multiply_narrow_tiles(int64_t nt, const E* v, int64_t cp, int64_t steps, const W* u,
                           int64_t op, float* m) {
  constexpr int NT = kNarrowTiles;
  int64_t t = 0;
  for (; t + NT <= nt; t += NT)
    multiply_narrow_block<NT, OV>(v + t * cp, cp, steps, u, op, m + t * op);
  switch (nt - t) {
    case 5:
      if constexpr (NT > 5)
        return multiply_narrow_block<5, OV>(v + t * cp, cp, steps, u, op, m + t * op);
      break;
    case 4:
      if constexpr (NT > 4)
        return multiply_narrow_block<4, OV>(v + t * cp, cp, steps, u, op, m + t * op);
      break;
    case 3:
      return multiply_narrow_block<3, OV>(v + t * cp, cp, steps, u, op, m + t * op);
    case 2:
      return multiply_narrow_block<2, OV>(v + t * cp, cp, steps, u, op, m + t * op);
    case 1:
      return multiply_narrow_block<1, OV>(v + t * cp, cp, steps, u, op, m + t * op);
  }
}

// m[k][t][o] = sum over s < steps of v[k][t][s] * u[k][s][o] for the 16 positions k and nt tiles:
// steps = cin on float32 (u [k][cp][op]), the channel pairs on bfloat16 (u [k][cp / 2][op]).
template <typename E, typename W>
void multiply_narrow(const NarrowPlan& p, const W* u, const E* v, int64_t nt, int64_t steps,
                     float* m) {
  const int64_t cp = p.cp(), op = p.op();
  const int64_t ldu = (std::is_same_v<E, float> ? cp : cp / 2) * op;
  for (int k = 0; k < 16; ++k) {
    const E* vk = v + k * position_stride(nt * cp);
    const W* uk = u + k * ldu;
    float* mk = m + k * position_stride(nt * op);
    for (int64_t o0 = 0; o0 < op; o0 += kNarrowVectors * L) {
      switch (std::min<int64_t>(kNarrowVectors, (op - o0) / L)) {
        case 4:
          if constexpr (kNarrowVectors >= 4) {
            multiply_narrow_tiles<4>(nt, vk, cp, steps, uk + o0, op, mk + o0);
            break;
          }
          [[fallthrough]];
        case 3:
          multiply_narrow_tiles<3>(nt, vk, cp, steps, uk + o0, op, mk + o0);
          break;
        case 2:
          multiply_narrow_tiles<2>(nt, vk, cp, steps, uk + o0, op, mk + o0);
          break;
        default:
          multiply_narrow_tiles<1>(nt, vk, cp, steps, uk + o0, op, mk + o0);
          break;
      }
    }
  }
}

// y[co][2i + a][2j + b] (+ bias[co]) = A^T m A for the tiles of one image (the first at t0 of
// m's nt), through the channel-last scratch yb[h][w][op] (what falls past an odd edge is not
// written), transposed back into the planes. `bias` may not be null: zeros without one, so that
// a -0 sum comes out +0 as the tiled form's does.
template <typename T>
void transform_output_narrow(const NarrowPlan& p, const float* m, int64_t nt, int64_t t0,
                             const float* bias, float* yb, T* y) {
  const int64_t op = p.op(), tw = p.tw(), ldk = position_stride(nt * op);
  for (int64_t i = 0; i < p.th(); ++i)
    for (int64_t j = 0; j < tw; ++j) {
      const float* src = m + (t0 + i * tw + j) * op;
      float* dst = yb + (2 * i * p.w + 2 * j) * op;
      const bool right = 2 * j + 1 < p.w, below = 2 * i + 1 < p.h;
      for (int64_t o = 0; o < p.cout; o += L) {
        V s[4][2];
        for (int a = 0; a < 4; ++a) {
          const V m0 = load(src + (4 * a) * ldk + o), m1 = load(src + (4 * a + 1) * ldk + o),
                  m2 = load(src + (4 * a + 2) * ldk + o), m3 = load(src + (4 * a + 3) * ldk + o);
          s[a][0] = m0 + m1 + m2;
          s[a][1] = m1 - m2 - m3;
        }
        store(dst + o, s[0][0] + s[1][0] + s[2][0]);
        if (right) store(dst + op + o, s[0][1] + s[1][1] + s[2][1]);
        if (below) store(dst + p.w * op + o, s[1][0] - s[2][0] - s[3][0]);
        if (right && below) store(dst + (p.w + 1) * op + o, s[1][1] - s[2][1] - s[3][1]);
      }
    }
  from_channels_last(yb, op, p.cout, p.h * p.w, bias, y);
}

// winograd() for narrow planes; kPairs: the products on bfloat16 pairs of input channels (as the
// tiled form's, for bfloat16 data on the dot products).
template <typename T, bool kPairs = false>
void winograd_narrow(const NarrowPlan& p, int64_t n, const T* x, const Kernels& ks,
                     const float* bias, T* y) {
  if (n == 0 || p.tiles() == 0) return;  // an empty output
  const int64_t cp = p.cp(), op = p.op(), tiles = p.tiles();
  aligned_vector<float> u;  // U[k][ci][co], zero past cin and cout
  transform_weights(
      p.cout, p.cin, ks, size_t(16 * cp * op),
      [&](int k, int64_t co, int64_t ci) { return size_t((k * cp + ci) * op + co); }, u);
#if defined(__AVX512BF16__)
  aligned_vector<Pair> up;  // UP[k][ci / 2][co]: input channels 2j and 2j + 1 paired
  if constexpr (kPairs) up = pair_rows(u.data(), 16, cp, op);
#endif
  const std::vector<float> zeros(bias ? 0 : size_t(p.cout));
  parallel_chunks(n, p.images(n), [&](int64_t n0, int64_t n1, bool first) {
    const int64_t nt = (n1 - n0) * tiles;
    float* xb = thread_scratch(0, size_t(p.bordered()));
    float* v = thread_scratch(1, size_t(16 * position_stride(nt * cp)));  // bfloat16: half used
    float* m = thread_scratch(2, size_t(16 * position_stride(nt * op)));
    float* yb = thread_scratch(3, size_t(4 * tiles * op));
    if (first) std::fill_n(xb, p.bordered(), 0.f);  // the border stays zero
    auto transform_all = [&](auto* vt) {
      for (int64_t i = n0; i < n1; ++i) {
        fill_channels_last(p, x + i * p.cin * p.h * p.w, xb);
        transform_input_narrow(p, xb, vt, nt, (i - n0) * tiles);
      }
    };
    if constexpr (kPairs) {
#if defined(__AVX512BF16__)
      uint16_t* vb = reinterpret_cast<uint16_t*>(v);
      transform_all(vb);
      multiply_narrow(p, up.data(), static_cast<const uint16_t*>(vb), nt, (p.cin + 1) / 2, m);
#endif
    } else {
      transform_all(v);
      multiply_narrow(p, u.data(), static_cast<const float*>(v), nt, p.cin, m);
    }
    for (int64_t i = n0; i < n1; ++i)
      transform_output_narrow(p, m, nt, (i - n0) * tiles, bias ? bias : zeros.data(), yb,
                              y + i * p.cout * p.h * p.w);
  });
}

#if defined(__AVX512BF16__)
// The products on bfloat16 pairs, for a bfloat16 convolution on the dot products: position k's
// transformed inputs and kernels rounded to bfloat16 (round to nearest even), input channels 2j
// and 2j + 1 paired (a zero partner past cin), and summed in float32 by vdpbf16ps, which does two
// multiply-adds a lane an instruction. The transforms compute in float32; the inputs' are rounded
// into pairs as they are made (transform_input_pairs), the kernels' once a call.
int64_t channel_pairs(const Plan& p) {
  return (p.cin + 1) / 2;
}

// U[k][block][ci][OB] (transform_weights(p, ...)) as UP[k][block][pair][OB].
aligned_vector<Pair> pair_weights(const Plan& p, const aligned_vector<float>& u) {
  return pair_rows(u.data(), 16 * (p.coutp() / OB), p.cin, OB);
}

// vp[k * ldk + t0 + i * pitch + j] = the pair of position k of B^T d B for tile (i, j) of input
// planes lo and hi (null: zero partners), for every tile of the planes (Plan::pitch): the two
// transforms side by side, rounded to pairs in registers (AVX-512 only).
template <typename T>
void transform_input_pairs(const Plan& p, const T* lo, const T* hi, Pair* vp, int64_t ldk,
                           int64_t t0) {
  const int64_t tw = p.tw(), pitch = p.pitch();
  // Tile row i of both planes (and i + 1, from TileRowPairs), n lanes stored from tile t.
  auto rows = [&](auto& even, auto& odd, int64_t i, int64_t t, __mmask16 n) {
    V a[16], b[16];
    even.next(i, a);
    if (hi) {
      odd.next(i, b);
    } else {
      for (V& z : b) z = V{};
    }
    Pair* dst = vp + t0 + t;
    for (int k = 0; k < 16; ++k)
      _mm512_mask_storeu_epi32(dst + k * ldk, n, bf16_pairs_flushed(as_m(a[k]), as_m(b[k])));
  };
  if constexpr (std::is_same_v<T, bfloat16>) {
    if (tile_row_pairs<T>(p)) {
      TileRowPairs<T> even(p, lo), odd(p, hi ? hi : lo);
      for (int64_t i = 0; i < p.th(); i += 2)
        rows(even, odd, i, i * tw, lanes(std::min<int64_t>(2, p.th() - i) * tw));
      return;
    }
  }
  for (int64_t j0 = 0; j0 < tw; j0 += L) {
    InputTiles<T> even(p, lo, nullptr, j0), odd(p, hi ? hi : lo, nullptr, j0);
    for (int64_t i = 0; i < p.th(); ++i)
      rows(even, odd, i, i * pitch + j0, lanes(std::min(L, pitch - j0)));
  }
}

// multiply() on the pairs.
void multiply_pairs(const Plan& p, const Pair* up, const Pair* vp, int64_t ldp, int64_t tp,
                    float* m) {
  const int64_t blocks = p.coutp() / OB, kp = channel_pairs(p), nvec = tp / L;
  for (int k = 0; k < 16; ++k) {
    float* mk = m + k * position_stride(p.coutp() * tp);
    for (int64_t cb = 0; cb < blocks; ++cb)
      correlate_pairs_vectors(vp + k * ldp, tp, kp, &kNoShift, 1, up + (k * blocks + cb) * kp * OB,
                              mk + cb * OB * tp, tp, nvec);
  }
}
#endif  // __AVX512BF16__

// y[n][cout][h][w] = the correlation of x[n][cin][h][w] with the kernels ks (+ bias), chunks of
// images transformed, multiplied and transformed back on each thread; kPairs: the products on
// bfloat16 pairs (a bfloat16 convolution on the dot products; winograd_any instantiates it so
// for bfloat16 data only, in builds with AVX512-BF16).
template <typename T, bool kPairs = false>
void winograd(const Plan& p, int64_t n, const T* x, const Kernels& ks, const float* bias, T* y) {
  if (n == 0 || p.tiles() == 0) return;  // an empty output
  aligned_vector<float> u;
  transform_weights(p, ks, u);
#if defined(__AVX512BF16__)
  aligned_vector<Pair> up;
  if constexpr (kPairs) up = pair_weights(p, u);
#endif
  const int64_t plane = p.h * p.w, tiles = p.laid_tiles();
  parallel_chunks(n, p.images(n), [&](int64_t n0, int64_t n1, bool first) {
    const int64_t t = (n1 - n0) * tiles, tp = round_up(t, L);
    // The output transform's last vectors read up to a vector past the last row of m.
    float* m = thread_scratch(1, size_t(16 * position_stride(p.coutp() * tp) + L));
    // The transformed inputs' lanes past the chunk's tiles (fewer than a vector a row) are zeros,
    // so that their products stay finite.
    if constexpr (kPairs) {
#if defined(__AVX512BF16__)
      const int64_t kp = channel_pairs(p), ldp = position_stride(kp * tp);
      Pair* vp = reinterpret_cast<Pair*>(thread_scratch(3, size_t(16 * ldp)));
      for (int k = 0; k < 16; ++k)
        for (int64_t j = 0; j < kp; ++j)
          std::fill(vp + k * ldp + j * tp + t, vp + (k * ldp + j * tp + tp), 0u);
      for (int64_t i = n0; i < n1; ++i)
        for (int64_t j = 0; j < kp; ++j) {
          const T* lo = x + (i * p.cin + 2 * j) * plane;
          transform_input_pairs(p, lo, 2 * j + 1 < p.cin ? lo + plane : nullptr, vp + j * tp, ldp,
                                (i - n0) * tiles);
        }
      multiply_pairs(p, up.data(), vp, ldp, tp, m);
#endif
    } else {
      const int64_t ldv = position_stride(p.cin * tp);
      float* v = thread_scratch(0, size_t(16 * ldv));
      for (int k = 0; k < 16; ++k)
        for (int64_t c = 0; c < p.cin; ++c) store_first(v + k * ldv + c * tp + t, V{}, tp - t);
      float* rows = nullptr;
      if constexpr (kBorderedRows) {
        const size_t n_rows = size_t(p.h * bordered_row(p));
        rows = thread_scratch(2, n_rows);
        if (first) std::fill_n(rows, n_rows, 0.f);  // the borders stay zero
      }
      for (int64_t i = n0; i < n1; ++i)
        for (int64_t c = 0; c < p.cin; ++c)
          transform_input(p, x + (i * p.cin + c) * plane, v + c * tp, ldv, (i - n0) * tiles, rows);
      multiply(p, u.data(), v, tp, m);
    }
    for (int64_t i = n0; i < n1; ++i)
      transform_output(p, m, tp, (i - n0) * tiles, bias, y + i * p.cout * plane);
  });
}

// The correlation on the tiled form, or on the narrow one for planes under kNarrowPlane wide, its
// products on pairs where `dtype` is bfloat16 on the dot products.
template <typename T>
void winograd_any(const Plan& p, int64_t n, const T* x, const Kernels& ks, const float* bias, T* y,
                  DType dtype) {
  const bool narrow = p.w < kNarrowPlane;
#if defined(__AVX512BF16__)
  if constexpr (std::is_same_v<T, bfloat16>) {
    if (on_dot_products(dtype))
      return narrow ? winograd_narrow<T, true>(NarrowPlan{p}, n, x, ks, bias, y)
                    : winograd<T, true>(p, n, x, ks, bias, y);
  }
#endif
  (void)dtype;
  if (narrow) return winograd_narrow(NarrowPlan{p}, n, x, ks, bias, y);
  winograd<T>(p, n, x, ks, bias, y);
}

// The weight gradient. The forward's bilinear form, sum of gy . y over a tile = sum over the 16
// positions of (A gy A^T) . (G g G^T) . (B^T d B), A = [1 0; 1 1; 1 -1; 0 -1] (the output
// transform's transpose), gives dL/dg = G^T M G with M = the sum over every tile of every image
// of (A gy A^T) . (B^T d B), for each output channel co and input channel ci. Position k's M is
// a product [out channels x tiles] x [tiles x in channels] whose sums run over all the batch's
// tiles: the inputs transformed channel-last as the narrow forward's (vectors of input channels),
// the output gradients in blocks of OB output channels, each block's tiles in a run
// ([block][tile][OB], broadcast by the register block). 16 products a tile pair instead of the
// direct path's 36.
struct WeightGradPlan : NarrowPlan {
  int64_t cop() const { return round_up(cout, L); }  // output channels in whole vectors
  int64_t gcols() const { return 2 * tw(); }         // the output gradient's copy, [2 th][2 tw]
  int64_t gfloats() const { return 2 * th() * gcols() * cop(); }
  // Images transformed together: their transforms (16 positions of every tile, both channel
  // counts) within 384 KiB, so that the products find them in the L2 cache (512 KiB a core on
  // AMD Zen 3, where 768 KiB made resnet's 32- and 64-channel weight gradients 2-13% slower); at
  // least one.
  int64_t batch() const {
    const int64_t image = 16 * tiles() * (cp() + cop()) * int64_t(sizeof(float));
    return std::max<int64_t>(1, (int64_t(384) << 10) / std::max<int64_t>(image, 1));
  }
};

// wt[k * ldk + ((o / OB) * nt + t0 + t) * OB + o % OB] = position k = 4 r + c of A g A^T for
// tile t of one image's channel-last output gradient gb[2 th][2 tw][cop] (zero past its h x w),
// output channel o; ldk = position_stride(nt * cop). Blocks of OB output channels, each over all
// nt tiles: a product's register block reads one dense run of them, not a few floats of each
// tile's row of cop (with 64 channels those rows, and the inputs', overflowed the L1 cache).
void transform_grad(const WeightGradPlan& p, const float* gb, float* wt, int64_t nt, int64_t t0) {
  const int64_t cop = p.cop(), tw = p.tw(), gc = p.gcols(), ldk = position_stride(nt * cop);
  static_assert(2 * OB == L, "a vector holds two register blocks of output channels");
  // The vector of output channels c .. c + L - 1 at `at`, the start of channel c's block.
  auto put = [nt](float* at, V v) { store_halves(at, at + nt * OB, v); };
  for (int64_t i = 0; i < p.th(); ++i)
    for (int64_t j = 0; j < tw; ++j) {
      const float* src = gb + (2 * i * gc + 2 * j) * cop;
      float* dst = wt + (t0 + i * tw + j) * OB;
      for (int64_t c = 0; c < cop; c += L) {
        V h[2][4];  // each of the tile's two rows through A
        for (int a = 0; a < 2; ++a) {
          const V g0 = load(src + a * gc * cop + c), g1 = load(src + (a * gc + 1) * cop + c);
          h[a][0] = g0;
          h[a][1] = g0 + g1;
          h[a][2] = g0 - g1;
          h[a][3] = -g1;
        }
        float* block = dst + c * nt;   // (c / OB) * nt * OB
        for (int b = 0; b < 4; ++b) {  // ... and the columns
          put(block + (0 + b) * ldk, h[0][b]);
          put(block + (4 + b) * ldk, h[0][b] + h[1][b]);
          put(block + (8 + b) * ldk, h[0][b] - h[1][b]);
          put(block + (12 + b) * ldk, -h[1][b]);
        }
      }
    }
}

// m[k][co][ci] (+)= sum over t < nt of wt[k][co / OB][t][co % OB] * v[k][t][ci] for the 16
// positions k (m's rows cp apart, cop rows a position): kAdd adds, else overwrites (a chunk's
// first batch).
template <bool kAdd>
void multiply_weight_grad(const WeightGradPlan& p, const float* wt, const float* v, int64_t nt,
                          float* m) {
  const int64_t cp = p.cp(), cop = p.cop(), blocks = p.coutp() / OB;
  for (int k = 0; k < 16; ++k) {
    const float* vk = v + k * position_stride(nt * cp);
    const float* wk = wt + k * position_stride(nt * cop);
    float* mk = m + k * cop * cp;
    for (int64_t cb = 0; cb < blocks; ++cb)
      correlate_vectors<kAdd>(vk, cp, nt, &kNoShift, 1, wk + cb * nt * OB, mk + cb * OB * cp, cp,
                              cp / L);
  }
}

#if defined(__AVX512BF16__)
// The products on bfloat16 pairs of tiles, for a bfloat16 weight gradient on the dot products:
// the sums over tiles taken two tiles an instruction (tiles 2j and 2j + 1 paired, a zero partner
// past nt; which tiles are paired does not matter to a sum over all of them), the transforms
// rounded to bfloat16 once made, as the forward's products on pairs do.
int64_t tile_pairs(int64_t nt) {
  return (nt + 1) / 2;
}

// vp[k][j][c] = the pair (v[k][2j][c], v[k][2j + 1][c]) of the channel-last transformed inputs
// (rows cp apart, the positions position_stride(nt * cp) apart; the pairs' positions
// position_stride(tile_pairs(nt) * cp) apart).
void pair_input_tiles(const WeightGradPlan& p, const float* v, int64_t nt, Pair* vp) {
  const int64_t cp = p.cp(), ntp = tile_pairs(nt);
  const int64_t ldv = position_stride(nt * cp), ldp = position_stride(ntp * cp);
  for (int k = 0; k < 16; ++k)
    for (int64_t j = 0; j < ntp; ++j) {
      const float* lo = v + k * ldv + 2 * j * cp;
      const bool partner = 2 * j + 1 < nt;
      Pair* out = vp + k * ldp + j * cp;
      for (int64_t c = 0; c < cp; c += L)
        _mm512_storeu_si512(out + c, bf16_pairs_flushed(_mm512_loadu_ps(lo + c),
                                                        partner ? _mm512_loadu_ps(lo + cp + c)
                                                                : _mm512_setzero_ps()));
    }
}

// wp[k][b][j][o] = the pair (wt[k][b][2j][o], wt[k][b][2j + 1][o]) of the transformed output
// gradients in blocks of OB channels (transform_grad's layout; the pairs' positions
// position_stride(tile_pairs(nt) * cop) apart).
void pair_grad_tiles(const WeightGradPlan& p, const float* wt, int64_t nt, Pair* wp) {
  static_assert(2 * OB == L, "a vector holds one block's two tiles");
  const int64_t cop = p.cop(), blocks = cop / OB, ntp = tile_pairs(nt);
  const int64_t ldw = position_stride(nt * cop), ldp = position_stride(ntp * cop);
  // word 2o + s of a pair of tiles from word 8s + o (tile s's channel o)
  const __m256i order = _mm256_set_epi16(15, 7, 14, 6, 13, 5, 12, 4, 11, 3, 10, 2, 9, 1, 8, 0);
  for (int k = 0; k < 16; ++k)
    for (int64_t b = 0; b < blocks; ++b) {
      const float* src = wt + k * ldw + b * nt * OB;
      Pair* out = wp + k * ldp + b * ntp * OB;
      for (int64_t j = 0; j < ntp; ++j) {
        const __m512 two = _mm512_maskz_loadu_ps(lanes((nt - 2 * j) * OB), src + 2 * j * OB);
        const __m256i words = (__m256i)_mm512_cvtneps_pbh(two);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + j * OB),
                            _mm256_permutexvar_epi16(order, words));
      }
    }
}

// multiply_weight_grad on the pairs.
template <bool kAdd>
void multiply_weight_grad_pairs(const WeightGradPlan& p, const Pair* wp, const Pair* vp, int64_t nt,
                                float* m) {
  const int64_t cp = p.cp(), cop = p.cop(), blocks = p.coutp() / OB, ntp = tile_pairs(nt);
  for (int k = 0; k < 16; ++k) {
    const Pair* vk = vp + k * position_stride(ntp * cp);
    const Pair* wk = wp + k * position_stride(ntp * cop);
    float* mk = m + k * cop * cp;
    for (int64_t cb = 0; cb < blocks; ++cb)
      correlate_pairs_vectors<kAdd>(vk, cp, ntp, &kNoShift, 1, wk + cb * ntp * OB,
                                    mk + cb * OB * cp, cp, cp / L);
  }
}
#endif  // __AVX512BF16__

// gw[co][ci][3 u + v] = (G^T M G)[u][v] for the 16 positions' sums M[k][co][ci], G the kernel
// transform's [1 0 0; 1/2 1/2 1/2; 1/2 -1/2 1/2; 0 0 1]; on vectors of L input channels.
void write_weight_grad(const WeightGradPlan& p, const float* m, float* gw) {
  const int64_t cp = p.cp(), cop = p.cop();
  parallel_for(p.cout, std::max<int64_t>(1, 256 / cp), [&](int64_t o0, int64_t o1) {
    for (int64_t co = o0; co < o1; ++co)
      for (int64_t c0 = 0; c0 < p.cin; c0 += L) {
        V z[4][3];  // M G
        for (int r = 0; r < 4; ++r) {
          const float* row = m + (4 * r * cop + co) * cp + c0;
          const V m0 = load(row), m1 = load(row + cop * cp), m2 = load(row + 2 * cop * cp),
                  m3 = load(row + 3 * cop * cp);
          const V half_sum = splat(0.5f) * (m1 + m2);
          z[r][0] = m0 + half_sum;
          z[r][1] = splat(0.5f) * (m1 - m2);
          z[r][2] = half_sum + m3;
        }
        alignas(64) float taps[9][L];
        for (int v = 0; v < 3; ++v) {  // G^T (M G)
          const V half_sum = splat(0.5f) * (z[1][v] + z[2][v]);
          store(taps[v], z[0][v] + half_sum);
          store(taps[3 + v], splat(0.5f) * (z[1][v] - z[2][v]));
          store(taps[6 + v], half_sum + z[3][v]);
        }
        float* out = gw + (co * p.cin + c0) * 9;
        for (int64_t c = 0; c < L && c0 + c < p.cin; ++c)
          for (int t = 0; t < 9; ++t) out[c * 9 + t] = taps[t][c];
      }
  });
}

// gw[cout][cin][3][3] = the weight gradient of the correlation of x[n][cin][h][w] giving
// gy[n][cout][h][w]: chunks of images (a partial M each, added in chunk order) in batches that
// stay in the L2 cache.
// kPairs: the products on bfloat16 pairs of tiles (a bfloat16 weight gradient on the dot
// products; instantiated so for bfloat16 data only, in builds with AVX512-BF16).
template <typename T, bool kPairs = false>
void winograd_weight_grad(const WeightGradPlan& p, int64_t n, const T* x, const T* gy, float* gw) {
  const int64_t cp = p.cp(), cop = p.cop(), tiles = p.tiles(), batch = p.batch();
  if (n == 0 || tiles == 0) {  // no products: a zero gradient
    std::fill_n(gw, p.cout * p.cin * 9, 0.f);
    return;
  }
  const int64_t chunk = balanced_chunk(n, 1);
  const ChunkSums sums(n, chunk, 16 * cop * cp);
  parallel_chunks(n, chunk, [&](int64_t n0, int64_t n1, bool first) {
    const int64_t most = std::min(batch, n1 - n0) * tiles;
    float* xb = thread_scratch(0, size_t(p.bordered()));
    float* gb = thread_scratch(1, size_t(p.gfloats()));
    float* v = thread_scratch(2, size_t(16 * position_stride(most * cp)));
    float* wt = thread_scratch(3, size_t(16 * position_stride(most * cop)));
    if (first) {  // the borders, and what lies past the planes, stay zero
      std::fill_n(xb, p.bordered(), 0.f);
      std::fill_n(gb, p.gfloats(), 0.f);
    }
    // Written by the first batch, added to by the rest. Rows coutp() to cop() (output channels
    // past cout in the last vector, past the last block of OB) are never written; total() adds
    // whatever they hold, and write_weight_grad reads only rows below cout.
    float* m = sums.at(n0);
    for (int64_t b0 = n0; b0 < n1; b0 += batch) {
      const int64_t b1 = std::min(n1, b0 + batch), nt = (b1 - b0) * tiles;
      for (int64_t i = b0; i < b1; ++i) {
        fill_channels_last(p, x + i * p.cin * p.h * p.w, xb);
        transform_input_narrow(p, xb, v, nt, (i - b0) * tiles);
        to_channels_last(gy + i * p.cout * p.h * p.w, p.cout, p.h, p.w, cop, gb, p.gcols() * cop);
        transform_grad(p, gb, wt, nt, (i - b0) * tiles);
      }
      if constexpr (kPairs) {
#if defined(__AVX512BF16__)
        const int64_t ntp = tile_pairs(most);
        Pair* vp =
            reinterpret_cast<Pair*>(thread_scratch(4, size_t(16 * position_stride(ntp * cp))));
        Pair* wp =
            reinterpret_cast<Pair*>(thread_scratch(5, size_t(16 * position_stride(ntp * cop))));
        pair_input_tiles(p, v, nt, vp);
        pair_grad_tiles(p, wt, nt, wp);
        if (b0 == n0)
          multiply_weight_grad_pairs<false>(p, wp, vp, nt, m);
        else
          multiply_weight_grad_pairs<true>(p, wp, vp, nt, m);
#endif
      } else if (b0 == n0) {
        multiply_weight_grad<false>(p, wt, v, nt, m);
      } else {
        multiply_weight_grad<true>(p, wt, v, nt, m);
      }
    }
  });
  write_weight_grad(p, sums.total(), gw);
}
#endif

}  // namespace

void conv2d_winograd_forward(const Conv2dGeometry& g, const void* x, const float* w, const float* b,
                             void* y, DType dtype) {
  check_geometry(g, "conv2d");
#if defined(GALLEY_VECTOR_LANES)
  dispatch_floating(dtype, "conv2d", [&](auto tag) {
    using T = typename decltype(tag)::type;
    winograd_any(Plan{g.c, g.h, g.w, g.o}, g.n, static_cast<const T*>(x),
                 Kernels{w, g.c * 9, 9, false}, b, static_cast<T*>(y), dtype);
  });
#else
  (void)x, (void)w, (void)b, (void)y, (void)dtype;
#endif
}

void conv2d_winograd_input_grad(const Conv2dGeometry& g, const float* w, const void* gy, void* gx,
                                DType dtype) {
  check_geometry(g, "conv2d_backward");
#if defined(GALLEY_VECTOR_LANES)
  // The output gradient against the kernel flipped in both axes, input and output channels
  // swapped: output channel ci (an input channel of the convolution) from input channel o.
  dispatch_floating(dtype, "conv2d_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    winograd_any(Plan{g.o, g.h, g.w, g.c}, g.n, static_cast<const T*>(gy),
                 Kernels{w, 9, g.c * 9, true}, nullptr, static_cast<T*>(gx), dtype);
  });
#else
  (void)w, (void)gy, (void)gx, (void)dtype;
#endif
}

void conv2d_winograd_weight_grad(const Conv2dGeometry& g, const void* x, const void* gy, float* gw,
                                 DType dtype) {
  check_geometry(g, "conv2d_backward");
#if defined(GALLEY_VECTOR_LANES)
  dispatch_floating(dtype, "conv2d_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const WeightGradPlan p{{{g.c, g.h, g.w, g.o}}};
#if defined(__AVX512BF16__)
    if constexpr (std::is_same_v<T, bfloat16>)
      if (on_dot_products(dtype))
        return winograd_weight_grad<T, true>(p, g.n, static_cast<const T*>(x),
                                             static_cast<const T*>(gy), gw);
#endif
    winograd_weight_grad(p, g.n, static_cast<const T*>(x), static_cast<const T*>(gy), gw);
  });
#else
  (void)x, (void)gy, (void)gw, (void)dtype;
#endif
}

void conv2d_winograd_whole_vector_rows_for_tests(int setting) {
#if defined(GALLEY_VECTOR_LANES)
  whole_rows_setting.store(setting < 0 ? -1 : setting > 0 ? 1 : 0, std::memory_order_relaxed);
#else
  (void)setting;  // no Winograd path in this build
#endif
}

}  // namespace galley::kernels::cpu
