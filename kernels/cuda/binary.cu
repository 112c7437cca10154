// Elementwise binary ops with NumPy broadcasting, in-place accumulation, and the broadcasts
// that seed a GEMM or a convolution with its bias: the GPU side of kernels/cpu/binary.cpp.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "galley/error.h"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/map.cuh"

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
template <typename F, bool kVec, bool kScalarIsB>
__global__ void scalar_kernel(const float* full, const float* scalar, float* out, int64_t n, F f) {
  const float s = *scalar;
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
  for (int64_t i = tail + start; i < n; i += stride) out[i] = op(full[i]);
}

// General broadcast: each output index is decomposed over the merged dimensions. Index is
// uint32_t when everything fits (32-bit division is several times cheaper than 64-bit).
template <typename F, typename Index>
__global__ void broadcast_kernel(const float* a, const float* b, float* out, Index n,
                                 BroadcastLayout l, F f) {
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
    out[i] = f(a[oa], b[ob]);
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

template <bool kScalarIsB, typename F>
void launch_scalar(const float* full, const float* scalar, float* out, int64_t n, F f,
                   cudaStream_t st) {
  if (aligned16(full) && aligned16(out))
    scalar_kernel<F, true, kScalarIsB>
        <<<blocks_for((n + 3) / 4), kThreads, 0, st>>>(full, scalar, out, n, f);
  else
    scalar_kernel<F, false, kScalarIsB>
        <<<blocks_for(n), kThreads, 0, st>>>(full, scalar, out, n, f);
}

template <typename F>
void run_binary(const float* a, const int64_t* a_shape, const float* b, const int64_t* b_shape,
                float* out, const int64_t* out_shape, int rank, F f, cudaStream_t st) {
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
    broadcast_kernel<F, uint32_t>
        <<<blocks_for(n), kThreads, 0, st>>>(a, b, out, static_cast<uint32_t>(n), l, f);
  else
    broadcast_kernel<F, int64_t><<<blocks_for(n), kThreads, 0, st>>>(a, b, out, n, l, f);
}

}  // namespace

void binary(Binary op, const float* a, const int64_t* a_shape, const float* b,
            const int64_t* b_shape, float* out, const int64_t* out_shape, int rank, void* stream) {
  const cudaStream_t st = static_cast<cudaStream_t>(stream);
  switch (op) {
    case Binary::Add:
      return run_binary(a, a_shape, b, b_shape, out, out_shape, rank, AddOp{}, st);
    case Binary::Sub:
      return run_binary(a, a_shape, b, b_shape, out, out_shape, rank, SubOp{}, st);
    case Binary::Mul:
      return run_binary(a, a_shape, b, b_shape, out, out_shape, rank, MulOp{}, st);
    case Binary::Div:
      return run_binary(a, a_shape, b, b_shape, out, out_shape, rank, DivOp{}, st);
  }
}

void add_inplace(float* acc, const float* g, int64_t n, void* stream) {
  if (n <= 0) return;
  launch_zip(acc, g, acc, n, AddOp{}, static_cast<cudaStream_t>(stream));
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
