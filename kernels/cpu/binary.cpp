#include "kernels/cpu/binary.h"

#include "kernels/cpu/convert.h"
#include "kernels/cpu/parallel.h"

namespace galley::kernels::cpu {

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    GALLEY_CHECK(da == db || da == 1 || db == 1, op, ": shapes ", shape_str(a), " and ",
                 shape_str(b), " cannot be broadcast together (dimension ", i, ": ", da, " vs ", db,
                 ")");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

namespace {

// Strides of `s` laid out row-major, aligned to `out`'s rank, 0 where `s` is broadcast.
Shape broadcast_strides(const Shape& s, const Shape& out) {
  Shape st(out.size(), 0);
  int64_t acc = 1;
  for (size_t i = s.size(); i-- > 0;) {
    size_t j = i + out.size() - s.size();
    st[j] = s[i] == 1 ? 0 : acc;
    acc *= s[i];
  }
  return st;
}

template <typename T, typename F>
void run(const Tensor& ta, const Tensor& tb, Tensor& to, F f) {
  const T* a = ta.data<T>();
  const T* b = tb.data<T>();
  T* o = to.data<T>();
  const Shape& out = to.shape();
  int64_t n = to.numel();
  if (ta.shape() == tb.shape()) {
    parallel_for(n, kElementwiseGrain,
                 [&](int64_t s, int64_t e) { zip_n(a + s, 1, b + s, 1, o + s, e - s, f); });
    return;
  }
  if (tb.numel() == 1 && ta.numel() == n) {
    parallel_for(n, kElementwiseGrain,
                 [&](int64_t s, int64_t e) { zip_n(a + s, 1, b, 0, o + s, e - s, f); });
    return;
  }
  // General case: walk rows of the innermost dimension, each side with stride 0 or 1 in it.
  Shape sa = broadcast_strides(ta.shape(), out), sb = broadcast_strides(tb.shape(), out);
  int64_t d = static_cast<int64_t>(out.size());
  int64_t inner = d ? out[d - 1] : 1, rows = inner ? n / inner : 0;
  int64_t ia = d ? sa[d - 1] : 0, ib = d ? sb[d - 1] : 0;
  parallel_for(rows, std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(inner, 1)),
               [&](int64_t r0, int64_t r1) {
                 for (int64_t r = r0; r < r1; ++r) {
                   int64_t oa = 0, ob = 0, rem = r;
                   for (int64_t k = d - 2; k >= 0; --k) {
                     int64_t idx = rem % out[k];
                     rem /= out[k];
                     oa += idx * sa[k];
                     ob += idx * sb[k];
                   }
                   zip_n(a + oa, ia, b + ob, ib, o + r * inner, inner, f);
                 }
               });
}

}  // namespace

Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b) {
  static const char* names[] = {"add", "sub", "mul", "div"};
  const char* name = names[int(op)];
  Shape out_shape = broadcast_shapes(a.shape(), b.shape(), name);
  Tensor ca = a.contiguous(), cb = b.contiguous();
  Tensor out = Tensor::empty(out_shape, a.dtype(), a.device());
  dispatch_floating(a.dtype(), name, [&](auto tag) {
    using T = typename decltype(tag)::type;
    switch (op) {
      case BinaryOp::Add:
        run<T>(ca, cb, out, [](float x, float y) { return x + y; });
        break;
      case BinaryOp::Sub:
        run<T>(ca, cb, out, [](float x, float y) { return x - y; });
        break;
      case BinaryOp::Mul:
        run<T>(ca, cb, out, [](float x, float y) { return x * y; });
        break;
      case BinaryOp::Div:
        run<T>(ca, cb, out, [](float x, float y) { return x / y; });
        break;
    }
  });
  return out;
}

Tensor sum_to(const Tensor& g, const Shape& shape) {
  if (g.shape() == shape) return g;
  // The 16-bit types are summed in float32 and rounded once.
  if (g.dtype() != DType::Float32)
    return converted(sum_to(converted(g, DType::Float32), shape), g.dtype());
  Tensor cg = g.contiguous();
  Tensor out = zeros(shape, DType::Float32, g.device());
  const Shape& gs = cg.shape();
  Shape so = broadcast_strides(shape, gs);
  int64_t d = static_cast<int64_t>(gs.size());
  int64_t inner = d ? gs[d - 1] : 1, n = cg.numel(), rows = inner ? n / inner : 0;
  int64_t io = d ? so[d - 1] : 0;
  const float* pg = cg.data<float>();
  float* po = out.data<float>();
  // Serial: many rows may add into the same output element.
  for (int64_t r = 0; r < rows; ++r) {
    int64_t oo = 0, rem = r;
    for (int64_t k = d - 2; k >= 0; --k) {
      oo += (rem % gs[k]) * so[k];
      rem /= gs[k];
    }
    const float* row = pg + r * inner;
    if (io) {
#pragma omp simd
      for (int64_t i = 0; i < inner; ++i) po[oo + i] += row[i];
    } else {
      float s = 0.f;
#pragma omp simd reduction(+ : s)
      for (int64_t i = 0; i < inner; ++i) s += row[i];
      po[oo] += s;
    }
  }
  return out;
}

Tensor add_same_shape(const Tensor& a, const Tensor& b) {
  return binary(BinaryOp::Add, a, b);
}

void add_inplace(Tensor& acc, const Tensor& g) {
  GALLEY_CHECK(acc.shape() == g.shape(), "add_inplace: ", shape_str(acc.shape()), " vs ",
               shape_str(g.shape()));
  Tensor cg = g.contiguous();
  dispatch_floating(acc.dtype(), "add_inplace", [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* o = acc.data<T>();
    const T* p = cg.data<T>();
    parallel_for(acc.numel(), kElementwiseGrain, [&](int64_t s, int64_t e) {
      zip_n(o + s, 1, p + s, 1, o + s, e - s, [](float x, float y) { return x + y; });
    });
  });
}

}  // namespace galley::kernels::cpu
