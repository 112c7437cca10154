// Elementwise binary ops with NumPy broadcasting, sum_to (their backward) and in-place
// accumulation in float32, bfloat16 or float16 (computed in float32), and the float32 broadcasts
// that seed a GEMM or a convolution with its bias: the GPU side of kernels/cpu/binary.cpp.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "galley/error.h"
#include "kernels/binary.h"
#include "kernels/cuda/map.cuh"
#include "kernels/reduce.h"

namespace galley::kernels::cuda {

// ----------------------------------------------------------------------------------------------
// kernels

namespace {

constexpr int kMaxDims = 12;  // broadcast dimensions left after merging neighbours

struct AddOp {
  __device__ float operator()(float x, float y) const { return x + y; }
};
struct SubOp {
  __device__ float operator()(float x, float y) const { return x - y; }
};
struct MulOp {
  __device__ float operator()(float x, float y) const { return x * y; }
};
struct DivOp {
  __device__ float operator()(float x, float y) const { return x / y; }
};

// The output viewed as `rank` merged dimensions; sa/sb are a's and b's element strides in
// each (0 where that side is broadcast).
struct BroadcastLayout {
  int rank;
  int64_t size[kMaxDims];
  int64_t sa[kMaxDims];
  int64_t sb[kMaxDims];
};

// Same shapes take zip_kernel (map.cuh).

// One side is a single element (read on the device: it may be the result of another kernel).
// kVec (float only): float4 at a time.
template <typename T, typename F, bool kVec, bool kScalarIsB>
__global__ void scalar_kernel(const T* full, const T* scalar, T* out, int64_t n, F f) {
  static_assert(!kVec || std::is_same_v<T, float>, "scalar_kernel: only float is vectorised");
  const float s = to_float(*scalar);
  const int64_t stride = int64_t(blockDim.x) * gridDim.x;
  const int64_t start = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  auto op = [&](float v) { return kScalarIsB ? f(v, s) : f(s, v); };
  int64_t tail = 0;
  if constexpr (kVec) {
    const int64_t n4 = n / 4;
    const float4* f4 = reinterpret_cast<const float4*>(full);
    float4* o4 = reinterpret_cast<float4*>(out);
    for (int64_t i = start; i < n4; i += stride) {
      const float4 v = f4[i];
      o4[i] = make_float4(op(v.x), op(v.y), op(v.z), op(v.w));
    }
    tail = n4 * 4;
  }
  for (int64_t i = tail + start; i < n; i += stride) out[i] = from_float<T>(op(to_float(full[i])));
}

// General broadcast: each output index is decomposed over the merged dimensions. Index is
// uint32_t when everything fits (32-bit division is several times cheaper than 64-bit).
template <typename T, typename F, typename Index>
__global__ void broadcast_kernel(const T* a, const T* b, T* out, Index n, BroadcastLayout l, F f) {
  const Index stride = Index(blockDim.x) * gridDim.x;
  for (Index i = Index(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    Index rem = i, oa = 0, ob = 0;
    for (int k = l.rank - 1; k > 0; --k) {
      const Index s = Index(l.size[k]);
      const Index idx = rem % s;
      rem /= s;
      oa += idx * Index(l.sa[k]);
      ob += idx * Index(l.sb[k]);
    }
    oa += rem * Index(l.sa[0]);  // the outermost dimension needs no modulo
    ob += rem * Index(l.sb[0]);
    out[i] = from_float<T>(f(to_float(a[oa]), to_float(b[ob])));
  }
}

// sum_to's dimensions of g, merged into runs that are all kept or all summed over (sizes of 1
// dropped), outermost first; strides are g's, in elements.
struct SumDims {
  int n;
  int64_t size[kMaxDims];
  int64_t stride[kMaxDims];
};

// Element offset in g of flat index `index` over d.
__device__ __forceinline__ int64_t offset_of(const SumDims& d, int64_t index) {
  int64_t offset = 0;
  for (int k = d.n - 1; k > 0; --k) {
    offset += (index % d.size[k]) * d.stride[k];
    index /= d.size[k];
  }
  return d.n > 0 ? offset + index * d.stride[0] : 0;  // the outermost dimension needs no modulo
}

// sum_to for the 16-bit types (float32 takes reduce.cu's): every output is summed in double,
// rounded to float32 and then to T, as the host does. Block (tx, ty): tx neighbouring outputs, ty
// threads splitting each one's sum, then a fixed tree over ty in shared memory, so the same input
// gives the same bits at every run. Tiles of tx outputs are walked grid-stride.
template <typename T>
__global__ void sum_to_kernel(const T* __restrict__ g, SumDims kept, SumDims summed, int64_t n_out,
                              int64_t n_summed, T* __restrict__ out) {
  __shared__ double tile[kThreads];
  const int64_t tx = blockDim.x, ty = blockDim.y, x = threadIdx.x, y = threadIdx.y;
  const int64_t tiles = (n_out + tx - 1) / tx;
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int64_t o = t * tx + x;
    double acc = 0.0;  // (in double, as the host sums: a long run in float lost a percent)
    if (o < n_out) {
      const T* base = g + offset_of(kept, o);
      for (int64_t j = y; j < n_summed; j += ty) acc += to_float(base[offset_of(summed, j)]);
    }
    tile[y * tx + x] = acc;
    __syncthreads();
    for (int64_t s = ty / 2; s > 0; s /= 2) {
      if (y < s) tile[y * tx + x] += tile[(y + s) * tx + x];
      __syncthreads();
    }
    if (y == 0 && o < n_out) out[o] = from_float<T>(static_cast<float>(tile[x]));
    __syncthreads();
  }
}

// y[r, j] = bias[j] over a rows x n matrix, in units V (float4 when n % 4 == 0 and aligned).
template <typename V, typename Index>
__global__ void broadcast_rows_kernel(const V* __restrict__ bias, Index n_units, Index total,
                                      V* __restrict__ out) {
  const Index stride = Index(blockDim.x) * gridDim.x;
  for (Index i = Index(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride)
    out[i] = bias[i % n_units];
}

__device__ __forceinline__ void splat(float v, float* out) {
  *out = v;
}
__device__ __forceinline__ void splat(float v, float4* out) {
  *out = make_float4(v, v, v, v);
}

// y[b, c, q] = bias[c] over [N, O, P], in units V of the P axis.
template <typename V, typename Index>
__global__ void broadcast_channels_kernel(const float* __restrict__ bias, Index o, Index p_units,
                                          Index total, V* __restrict__ out) {
  const Index stride = Index(blockDim.x) * gridDim.x;
  for (Index i = Index(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride)
    splat(__ldg(bias + (i / p_units) % o), out + i);
}

}  // namespace

// ----------------------------------------------------------------------------------------------
// launchers

namespace {

template <bool kScalarIsB, typename T, typename F>
void launch_scalar(const T* full, const T* scalar, T* out, int64_t n, F f, cudaStream_t st) {
  if constexpr (std::is_same_v<T, float>) {
    if (aligned16(full) && aligned16(out)) {
      scalar_kernel<T, F, true, kScalarIsB>
          <<<blocks_for((n + 3) / 4), kThreads, 0, st>>>(full, scalar, out, n, f);
      return;
    }
  }
  scalar_kernel<T, F, false, kScalarIsB>
      <<<blocks_for(n), kThreads, 0, st>>>(full, scalar, out, n, f);
}

template <typename T, typename F>
void run_binary(const T* a, const int64_t* a_shape, const T* b, const int64_t* b_shape, T* out,
                const int64_t* out_shape, int rank, F f, cudaStream_t st) {
  // Merge neighbouring dimensions in which a and b are each either broadcast or not in both:
  // [N, C, H, W] + [1, C, 1, 1] becomes three dimensions, [N, C] + [C] two, equal shapes one.
  BroadcastLayout l{};
  bool a_bcast[kMaxDims] = {}, b_bcast[kMaxDims] = {};
  int64_t n = 1;
  for (int d = 0; d < rank; ++d) {
    const int64_t s = out_shape[d];
    n *= s;
    if (s == 1) continue;
    const bool ba = a_shape[d] == 1, bb = b_shape[d] == 1;
    if (l.rank > 0 && a_bcast[l.rank - 1] == ba && b_bcast[l.rank - 1] == bb) {
      l.size[l.rank - 1] *= s;
      continue;
    }
    GALLEY_CHECK(l.rank < kMaxDims,
                 "binary: the broadcast of these shapes alternates in more than ", kMaxDims,
                 " dimensions (rank ", rank, ")");
    l.size[l.rank] = s;
    a_bcast[l.rank] = ba;
    b_bcast[l.rank] = bb;
    ++l.rank;
  }
  if (n == 0) return;
  bool a_full = true, b_full = true, a_scalar = true, b_scalar = true;
  int64_t acc_a = 1, acc_b = 1;
  for (int k = l.rank - 1; k >= 0; --k) {
    l.sa[k] = a_bcast[k] ? 0 : acc_a;
    l.sb[k] = b_bcast[k] ? 0 : acc_b;
    if (!a_bcast[k]) acc_a *= l.size[k];
    if (!b_bcast[k]) acc_b *= l.size[k];
    a_full &= !a_bcast[k];
    b_full &= !b_bcast[k];
    a_scalar &= a_bcast[k];
    b_scalar &= b_bcast[k];
  }
  if (a_full && b_full) return launch_zip(a, b, out, n, f, st);
  if (a_full && b_scalar) return launch_scalar<true>(a, b, out, n, f, st);
  if (a_scalar && b_full) return launch_scalar<false>(b, a, out, n, f, st);
  if (n <= INT32_MAX)
    broadcast_kernel<T, F, uint32_t>
        <<<blocks_for(n), kThreads, 0, st>>>(a, b, out, static_cast<uint32_t>(n), l, f);
  else
    broadcast_kernel<T, F, int64_t><<<blocks_for(n), kThreads, 0, st>>>(a, b, out, n, l, f);
}

int64_t pow2_ceil(int64_t v) {
  int64_t p = 1;
  while (p < v) p *= 2;
  return p;
}

// Appends a dimension of g (size, stride) to `d`, merged into its innermost run when `merge`.
void add_sum_dim(SumDims& d, int64_t size, int64_t stride, bool merge) {
  if (merge) {
    d.size[d.n - 1] *= size;
    d.stride[d.n - 1] = stride;
    return;
  }
  GALLEY_CHECK(d.n < kMaxDims, "sum_to: the summed and kept dimensions alternate more than ",
               kMaxDims, " times");
  d.size[d.n] = size;
  d.stride[d.n] = stride;
  ++d.n;
}

// sum_to for the 16-bit types; shapes aligned as the launcher's.
template <typename T>
void run_sum_to(const T* g, const int64_t* g_shape, T* out, const int64_t* shape, int rank,
                cudaStream_t st) {
  std::vector<int64_t> strides(size_t(std::max(rank, 0)));
  int64_t stride = 1;
  for (int d = rank - 1; d >= 0; --d) {
    strides[d] = stride;
    stride *= g_shape[d];
  }
  SumDims kept{}, summed{};
  int64_t n_out = 1, n_summed = 1;
  int previous = -1;  // the kind of the last dimension added: 0 kept, 1 summed, -1 none yet
  for (int d = 0; d < rank; ++d) {
    if (g_shape[d] == 1) continue;
    const int kind = shape[d] == 1 ? 1 : 0;
    add_sum_dim(kind ? summed : kept, g_shape[d], strides[d], kind == previous);
    (kind ? n_summed : n_out) *= g_shape[d];
    previous = kind;
  }
  if (n_out == 0) return;
  // Neighbouring threads read neighbouring elements of g: along one sum when g's innermost
  // dimension is summed, across neighbouring outputs when it is kept.
  const bool inner_summed = previous == 1;
  const int64_t ty =
      std::min<int64_t>(pow2_ceil(n_summed), inner_summed ? kThreads : kThreads / 32);
  const int64_t tx = kThreads / ty;
  const dim3 block(static_cast<unsigned>(tx), static_cast<unsigned>(ty));
  sum_to_kernel<T><<<blocks_for(n_out, tx), block, 0, st>>>(g, kept, summed, n_out, n_summed, out);
}

}  // namespace

void binary(BinaryOp op, DType dtype, const void* a, const int64_t* a_shape, const void* b,
            const int64_t* b_shape, void* out, const int64_t* out_shape, int rank, void* stream) {
  static const char* names[] = {"add", "sub", "mul", "div"};
  const cudaStream_t st = static_cast<cudaStream_t>(stream);
  with_floating_type(dtype, names[int(op)], [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* x = static_cast<const T*>(a);
    const T* y = static_cast<const T*>(b);
    T* o = static_cast<T*>(out);
    switch (op) {
      case BinaryOp::Add:
        return run_binary(x, a_shape, y, b_shape, o, out_shape, rank, AddOp{}, st);
      case BinaryOp::Sub:
        return run_binary(x, a_shape, y, b_shape, o, out_shape, rank, SubOp{}, st);
      case BinaryOp::Mul:
        return run_binary(x, a_shape, y, b_shape, o, out_shape, rank, MulOp{}, st);
      case BinaryOp::Div:
        return run_binary(x, a_shape, y, b_shape, o, out_shape, rank, DivOp{}, st);
    }
  });
}

void sum_to(DType dtype, const void* g, const int64_t* g_shape, void* out, const int64_t* shape,
            int rank, void* stream) {
  const cudaStream_t st = static_cast<cudaStream_t>(stream);
  with_floating_type(dtype, "sum_to", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_same_v<T, float>)
      sum_to_float32(static_cast<const float*>(g), g_shape, static_cast<float*>(out), shape, rank,
                     stream);
    else
      run_sum_to(static_cast<const T*>(g), g_shape, static_cast<T*>(out), shape, rank, st);
  });
}

void add_inplace(DType dtype, void* acc, const void* g, int64_t n, void* stream) {
  with_floating_type(dtype, "add_inplace", [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* a = static_cast<T*>(acc);
    launch_zip(a, static_cast<const T*>(g), a, n, AddOp{}, static_cast<cudaStream_t>(stream));
  });
}

void broadcast_rows(const float* bias, int64_t rows, int64_t n, float* out, void* stream) {
  const int64_t total = rows * n;
  if (total <= 0) return;
  const cudaStream_t st = static_cast<cudaStream_t>(stream);
  if (n % 4 == 0 && aligned16(bias) && aligned16(out)) {
    const int64_t t4 = total / 4, n4 = n / 4;
    const float4* b4 = reinterpret_cast<const float4*>(bias);
    float4* o4 = reinterpret_cast<float4*>(out);
    if (t4 <= INT32_MAX)
      broadcast_rows_kernel<float4, uint32_t>
          <<<blocks_for(t4), kThreads, 0, st>>>(b4, uint32_t(n4), uint32_t(t4), o4);
    else
      broadcast_rows_kernel<float4, int64_t><<<blocks_for(t4), kThreads, 0, st>>>(b4, n4, t4, o4);
  } else if (total <= INT32_MAX) {
    broadcast_rows_kernel<float, uint32_t>
        <<<blocks_for(total), kThreads, 0, st>>>(bias, uint32_t(n), uint32_t(total), out);
  } else {
    broadcast_rows_kernel<float, int64_t>
        <<<blocks_for(total), kThreads, 0, st>>>(bias, n, total, out);
  }
}

void broadcast_channels(const float* bias, int64_t n, int64_t o, int64_t p, float* out,
                        void* stream) {
  const int64_t total = n * o * p;
  if (total <= 0) return;
  const cudaStream_t st = static_cast<cudaStream_t>(stream);
  if (p % 4 == 0 && aligned16(out)) {
    const int64_t t4 = total / 4, p4 = p / 4;
    float4* o4 = reinterpret_cast<float4*>(out);
    if (t4 <= INT32_MAX)
      broadcast_channels_kernel<float4, uint32_t>
          <<<blocks_for(t4), kThreads, 0, st>>>(bias, uint32_t(o), uint32_t(p4), uint32_t(t4), o4);
    else
      broadcast_channels_kernel<float4, int64_t>
          <<<blocks_for(t4), kThreads, 0, st>>>(bias, o, p4, t4, o4);
  } else if (total <= INT32_MAX) {
    broadcast_channels_kernel<float, uint32_t><<<blocks_for(total), kThreads, 0, st>>>(
        bias, uint32_t(o), uint32_t(p), uint32_t(total), out);
  } else {
    broadcast_channels_kernel<float, int64_t>
        <<<blocks_for(total), kThreads, 0, st>>>(bias, o, p, total, out);
  }
}

}  // namespace galley::kernels::cuda
