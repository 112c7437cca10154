// Elementwise binary ops with broadcasting, sum_to and in-place accumulation on the host.
#include "kernels/binary.h"

#include <algorithm>
#include <vector>

#include "galley/half.h"
#include "kernels/convert.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/staged.h"
#include "kernels/reduce.h"

namespace galley::kernels::cpu {
namespace {

int64_t count(const int64_t* shape, int rank) {
  int64_t n = 1;
  for (int i = 0; i < rank; ++i) n *= shape[i];
  return n;
}

// Row-major strides of `s`, 0 where `s` is broadcast against `out`.
std::vector<int64_t> broadcast_strides(const int64_t* s, int rank) {
  std::vector<int64_t> st(rank, 0);
  int64_t acc = 1;
  for (int i = rank; i-- > 0;) {
    st[i] = s[i] == 1 ? 0 : acc;
    acc *= s[i];
  }
  return st;
}

template <typename T, typename F>
void run(const T* a, const int64_t* as, const T* b, const int64_t* bs, T* o, const int64_t* os,
         int d, F f) {
  const int64_t n = count(os, d), na = count(as, d), nb = count(bs, d);
  if (std::equal(as, as + d, bs)) {
    parallel_balanced(n, kElementwiseGrain,
                      [&](int64_t s, int64_t e) { zip_n(a + s, 1, b + s, 1, o + s, e - s, f); });
    return;
  }
  if (nb == 1 && na == n) {
    parallel_balanced(n, kElementwiseGrain,
                      [&](int64_t s, int64_t e) { zip_n(a + s, 1, b, 0, o + s, e - s, f); });
    return;
  }
  // General case: walk rows of the innermost dimension, each side with stride 0 or 1 in it.
  const std::vector<int64_t> sa = broadcast_strides(as, d), sb = broadcast_strides(bs, d);
  const int64_t inner = d ? os[d - 1] : 1, rows = inner ? n / inner : 0;
  const int64_t ia = d ? sa[d - 1] : 0, ib = d ? sb[d - 1] : 0;
  parallel_balanced(rows, std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(inner, 1)),
                    [&](int64_t r0, int64_t r1) {
                      for (int64_t r = r0; r < r1; ++r) {
                        int64_t oa = 0, ob = 0, rem = r;
                        for (int k = d - 2; k >= 0; --k) {
                          const int64_t idx = rem % os[k];
                          rem /= os[k];
                          oa += idx * sa[k];
                          ob += idx * sb[k];
                        }
                        zip_n(a + oa, ia, b + ob, ib, o + r * inner, inner, f);
                      }
                    });
}

void sum_to_float32(const float* g, const int64_t* gs, float* out, const int64_t* shape, int d) {
  const int64_t n = count(gs, d), inner = d ? gs[d - 1] : 1, rows = inner ? n / inner : 0;
  const int64_t n_out = count(shape, d);
  const std::vector<int64_t> so = broadcast_strides(shape, d);
  const int64_t io = d ? so[d - 1] : 0;
  // Serial: many rows may add into the same output element. The sums are kept in double (a
  // bias broadcast over ten million rows lost a tenth of its gradient in a float32 sum).
  std::vector<double> acc(size_t(n_out), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    int64_t oo = 0, rem = r;
    for (int k = d - 2; k >= 0; --k) {
      oo += (rem % gs[k]) * so[k];
      rem /= gs[k];
    }
    const float* row = g + r * inner;
    if (io) {
      double* a = acc.data() + oo;
#pragma omp simd
      for (int64_t i = 0; i < inner; ++i) a[i] += double(row[i]);
    } else {
      acc[size_t(oo)] += sum_all(row, inner);
    }
  }
  for (int64_t i = 0; i < n_out; ++i) out[i] = static_cast<float>(acc[size_t(i)]);
}

}  // namespace

void binary(BinaryOp op, DType dtype, const void* a, const int64_t* a_shape, const void* b,
            const int64_t* b_shape, void* out, const int64_t* out_shape, int rank) {
  static const char* names[] = {"add", "sub", "mul", "div"};
  dispatch_floating(dtype, names[int(op)], [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* x = static_cast<const T*>(a);
    const T* y = static_cast<const T*>(b);
    T* o = static_cast<T*>(out);
    switch (op) {
      case BinaryOp::Add:
        return run(x, a_shape, y, b_shape, o, out_shape, rank,
                   [](auto p, auto q) { return p + q; });
      case BinaryOp::Sub:
        return run(x, a_shape, y, b_shape, o, out_shape, rank,
                   [](auto p, auto q) { return p - q; });
      case BinaryOp::Mul:
        return run(x, a_shape, y, b_shape, o, out_shape, rank,
                   [](auto p, auto q) { return p * q; });
      case BinaryOp::Div:
        return run(x, a_shape, y, b_shape, o, out_shape, rank,
                   [](auto p, auto q) { return p / q; });
    }
  });
}

void sum_to(DType dtype, const void* g, const int64_t* g_shape, void* out, const int64_t* shape,
            int rank) {
  dispatch_floating(dtype, "sum_to", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_same_v<T, float>) {
      sum_to_float32(static_cast<const float*>(g), g_shape, static_cast<float*>(out), shape, rank);
    } else {
      // The 16-bit types are summed in float32 and rounded once.
      std::vector<float> wide(count(g_shape, rank)), sums(count(shape, rank));
      to_float(static_cast<const T*>(g), wide.data(), int64_t(wide.size()));
      sum_to_float32(wide.data(), g_shape, sums.data(), shape, rank);
      from_float(sums.data(), static_cast<T*>(out), int64_t(sums.size()));
    }
  });
}

void add_inplace(DType dtype, void* acc, const void* g, int64_t n) {
  dispatch_floating(dtype, "add_inplace", [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* o = static_cast<T*>(acc);
    const T* p = static_cast<const T*>(g);
    parallel_balanced(n, kElementwiseGrain, [&](int64_t s, int64_t e) {
      zip_n(o + s, 1, p + s, 1, o + s, e - s, [](auto x, auto y) { return x + y; });
    });
  });
}

void broadcast_rows(const float* bias, int64_t rows, int64_t n, float* out) {
  for (int64_t r = 0; r < rows; ++r) std::copy_n(bias, n, out + r * n);
}

}  // namespace galley::kernels::cpu
