#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <algorithm>
#include <atomic>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "galley/error.h"
#include "kernels/cuda/blas.cuh"

namespace galley::kernels::cuda {

namespace {

// One generic checker; the macros add the failed expression.
void check_status(bool ok, const char* lib, const char* expr, const char* file, int line,
                  const std::string& detail) {
  if (!ok) galley::detail::throw_error(file, line, expr, std::string(lib) + " error: " + detail);
}
#define CUBLAS_CHECK(call)                                                         \
  do {                                                                             \
    cublasStatus_t s_ = (call);                                                    \
    check_status(s_ == CUBLAS_STATUS_SUCCESS, "cuBLAS", #call, __FILE__, __LINE__, \
                 cublasGetStatusString(s_));                                       \
  } while (0)
#define CUDNN_CHECK(call)                                                        \
  do {                                                                           \
    cudnnStatus_t s_ = (call);                                                   \
    check_status(s_ == CUDNN_STATUS_SUCCESS, "cuDNN", #call, __FILE__, __LINE__, \
                 cudnnGetErrorString(s_));                                       \
  } while (0)

std::atomic<bool> tf32{false};

// cuBLAS's own workspace per handle: allocated once, so that no product allocates during a
// CUDA graph capture (cublasSetStream would otherwise fall back to the library's pool).
constexpr size_t kBlasWorkspace = size_t(32) << 20;

struct Handles {
  cublasHandle_t blas = nullptr;
  cudnnHandle_t dnn = nullptr;
  void* blas_workspace = nullptr;
};

// Per-device handles, created on first use and kept for the life of the process.
Handles& handles(int device) {
  static std::mutex mu;
  // A deque: growing it for another device keeps references to existing handles valid.
  static std::deque<Handles>* all = new std::deque<Handles>();
  std::lock_guard<std::mutex> lock(mu);
  if (all->size() <= size_t(device)) all->resize(device + 1);
  Handles& h = (*all)[device];
  if (!h.blas) {
    int prev = 0;
    cudaGetDevice(&prev);
    cudaSetDevice(device);
    CUBLAS_CHECK(cublasCreate(&h.blas));
    CUDNN_CHECK(cudnnCreate(&h.dnn));
    if (cudaMalloc(&h.blas_workspace, kBlasWorkspace) != cudaSuccess) {
      (void)cudaGetLastError();
      h.blas_workspace = nullptr;  // cuBLAS then uses its default pool
    }
    cudaSetDevice(prev);
  }
  return h;
}

// ----------------------------------------------------------------------------------------------
// Convolution descriptors and the algorithm cache

struct ConvDescs {
  cudnnTensorDescriptor_t x, y, b;
  cudnnFilterDescriptor_t w;
  cudnnConvolutionDescriptor_t conv;
  cudnnConvolutionFwdAlgo_t fwd;
  cudnnConvolutionBwdDataAlgo_t bwd_data;
  cudnnConvolutionBwdFilterAlgo_t bwd_filter;
  size_t fwd_ws = 0, bwd_data_ws = 0, bwd_filter_ws = 0;
};

using ConvKey = std::tuple<int, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                           int64_t, int64_t, int64_t, int64_t, bool>;

// The algorithm to use from cuDNN's ranked list.
template <typename Perf>
auto pick(const Perf* perf, int found, const char* direction, const cpu::Conv2dGeometry& g) {
  for (int i = 0; i < found; ++i)
    if (perf[i].status == CUDNN_STATUS_SUCCESS && perf[i].determinism == CUDNN_DETERMINISTIC)
      return perf[i].algo;
  for (int i = 0; i < found; ++i)
    if (perf[i].status == CUDNN_STATUS_SUCCESS) return perf[i].algo;
  throw Error(galley::detail::str_cat(
      "cuDNN offers no ", direction, " algorithm for a convolution of ", g.n, "x", g.c, "x", g.h,
      "x", g.w, " by ", g.o, "x", g.c / g.groups, "x", g.kh, "x", g.kw, " (stride ", g.stride,
      ", padding ", g.pad, ", dilation ", g.dilation, ", groups ", g.groups, ")"));
}

ConvDescs& descs_for(int device, const cpu::Conv2dGeometry& g) {
  static std::mutex mu;
  static auto* cache = new std::map<ConvKey, ConvDescs>();
  const bool allow = tf32.load();
  const ConvKey key{device, g.n,      g.c,   g.h,        g.w,      g.o,  g.kh,
                    g.kw,   g.stride, g.pad, g.dilation, g.groups, allow};
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache->find(key);
  if (it != cache->end()) return it->second;
  ConvDescs d{};
  CUDNN_CHECK(cudnnCreateTensorDescriptor(&d.x));
  CUDNN_CHECK(cudnnCreateTensorDescriptor(&d.y));
  CUDNN_CHECK(cudnnCreateTensorDescriptor(&d.b));
  CUDNN_CHECK(cudnnCreateFilterDescriptor(&d.w));
  CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&d.conv));
  CUDNN_CHECK(cudnnSetTensor4dDescriptor(d.x, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, int(g.n),
                                         int(g.c), int(g.h), int(g.w)));
  CUDNN_CHECK(cudnnSetTensor4dDescriptor(d.y, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, int(g.n),
                                         int(g.o), int(g.oh), int(g.ow)));
  CUDNN_CHECK(
      cudnnSetTensor4dDescriptor(d.b, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, int(g.o), 1, 1));
  CUDNN_CHECK(cudnnSetFilter4dDescriptor(d.w, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, int(g.o),
                                         int(g.c / g.groups), int(g.kh), int(g.kw)));
  CUDNN_CHECK(cudnnSetConvolution2dDescriptor(d.conv, int(g.pad), int(g.pad), int(g.stride),
                                              int(g.stride), int(g.dilation), int(g.dilation),
                                              CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
  CUDNN_CHECK(cudnnSetConvolutionGroupCount(d.conv, int(g.groups)));
  CUDNN_CHECK(cudnnSetConvolutionMathType(d.conv, allow ? CUDNN_TENSOR_OP_MATH : CUDNN_FMA_MATH));
  // Per direction, the heuristics' first deterministic choice (the same bits at every run), else
  // their first working one; chosen once per geometry.
  cudnnHandle_t h = handles(device).dnn;
  int found = 0;
  cudnnConvolutionFwdAlgoPerf_t fp[8];
  CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(h, d.x, d.w, d.conv, d.y, 8, &found, fp));
  d.fwd = pick(fp, found, "forward", g);
  cudnnConvolutionBwdDataAlgoPerf_t dp[8];
  CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(h, d.w, d.y, d.conv, d.x, 8, &found, dp));
  d.bwd_data = pick(dp, found, "backward data", g);
  cudnnConvolutionBwdFilterAlgoPerf_t wp[8];
  CUDNN_CHECK(
      cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, d.x, d.y, d.conv, d.w, 8, &found, wp));
  d.bwd_filter = pick(wp, found, "backward filter", g);
  CUDNN_CHECK(cudnnGetConvolutionForwardWorkspaceSize(h, d.x, d.w, d.conv, d.y, d.fwd, &d.fwd_ws));
  CUDNN_CHECK(cudnnGetConvolutionBackwardDataWorkspaceSize(h, d.w, d.y, d.conv, d.x, d.bwd_data,
                                                           &d.bwd_data_ws));
  CUDNN_CHECK(cudnnGetConvolutionBackwardFilterWorkspaceSize(h, d.x, d.y, d.conv, d.w, d.bwd_filter,
                                                             &d.bwd_filter_ws));
  return cache->emplace(key, d).first->second;
}

}  // namespace

// ----------------------------------------------------------------------------------------------
// launchers

void prepare(int device) {
  (void)handles(device);
}

void set_allow_tf32(bool on) {
  tf32 = on;
}

bool allow_tf32() {
  return tf32.load();
}

void gemm(int device, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
          const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
          int64_t ldc, void* stream) {
  if (m == 0 || n == 0) return;
  Handles& hs = handles(device);
  cublasHandle_t h = hs.blas;
  CUBLAS_CHECK(cublasSetStream(h, static_cast<cudaStream_t>(stream)));
  if (hs.blas_workspace) CUBLAS_CHECK(cublasSetWorkspace(h, hs.blas_workspace, kBlasWorkspace));
  CUBLAS_CHECK(cublasSetMathMode(h, tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: swap the operands.
  // cuBLAS wants leading dimensions of at least 1 even where an operand is empty (k == 0).
  auto ld = [](int64_t v) { return int(std::max<int64_t>(v, 1)); };
  CUBLAS_CHECK(cublasSgemm(h, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                           trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, int(n), int(m), int(k), &alpha, b,
                           ld(ldb), a, ld(lda), &beta, c, ld(ldc)));
}

void conv2d_forward(int device, const cpu::Conv2dGeometry& g, const float* x, const float* w,
                    const float* bias, float* y, const Workspace& ws, void* stream) {
  ConvDescs& d = descs_for(device, g);
  cudnnHandle_t h = handles(device).dnn;
  CUDNN_CHECK(cudnnSetStream(h, static_cast<cudaStream_t>(stream)));
  const float one = 1.f, zero = 0.f;
  void* work = d.fwd_ws ? ws(d.fwd_ws) : nullptr;
  CUDNN_CHECK(cudnnConvolutionForward(h, &one, d.x, x, d.w, w, d.conv, d.fwd, work, d.fwd_ws, &zero,
                                      d.y, y));
  if (bias) CUDNN_CHECK(cudnnAddTensor(h, &one, d.b, bias, &one, d.y, y));
}

void conv2d_backward(int device, const cpu::Conv2dGeometry& g, const float* x, const float* w,
                     const float* gy, float* gx, float* gw, float* gb, const Workspace& ws,
                     void* stream) {
  ConvDescs& d = descs_for(device, g);
  cudnnHandle_t h = handles(device).dnn;
  CUDNN_CHECK(cudnnSetStream(h, static_cast<cudaStream_t>(stream)));
  const float one = 1.f, zero = 0.f;
  if (gx) {
    void* work = d.bwd_data_ws ? ws(d.bwd_data_ws) : nullptr;
    CUDNN_CHECK(cudnnConvolutionBackwardData(h, &one, d.w, w, d.y, gy, d.conv, d.bwd_data, work,
                                             d.bwd_data_ws, &zero, d.x, gx));
  }
  if (gw) {
    void* work = d.bwd_filter_ws ? ws(d.bwd_filter_ws) : nullptr;
    CUDNN_CHECK(cudnnConvolutionBackwardFilter(h, &one, d.x, x, d.y, gy, d.conv, d.bwd_filter, work,
                                               d.bwd_filter_ws, &zero, d.w, gw));
  }
  if (gb) CUDNN_CHECK(cudnnConvolutionBackwardBias(h, &one, d.y, gy, &zero, d.b, gb));
}

}  // namespace galley::kernels::cuda
