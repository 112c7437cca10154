// cuBLAS matrix products and cuDNN convolutions; and cuDNN's batch normalisation, the reference
// that galley's own kernels (batch_norm.cu) are checked and timed against.
//
// Handles. A cuBLAS or cuDNN handle holds its stream (and cuBLAS its workspace) as state, so
// threads sharing one race between SetStream and the call. Each thread therefore leases its own
// handles per device from a pool, and cuBLAS gets a workspace per (handle, stream): a workspace
// is only ever used on one stream, so a handle that changes hands can never have two streams
// writing the same scratch.
//
// Convolution algorithms come from cuDNN's heuristics (cudnnGet*_v7), ranked fastest first, not
// from cudnnFind*: Find without Ex cudaMallocs its own scratch outside the allocator and its
// cap, FindEx needs the largest workspace up front, and both run and time every algorithm with
// device synchronisations, which a CUDA graph capture forbids (a shape's first call may be
// captured) and which other jobs on a shared GPU would make noisy. The ranking is cached per
// shape; the choice within it is made per call, as what the memory cap leaves changes.
//
// 16-bit operands. bfloat16 and float16 products run on tensor cores with float32 sums: GEMMs
// through cublasGemmEx into a float32 C (the op layer rounds once, as on the host's tiles), and
// convolutions with every tensor in the 16-bit dtype and a float32 compute type (cuDNN's
// "pseudo" configurations, PyTorch's choice too). TF32 concerns float32 alone.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "galley/error.h"
#include "kernels/batch_norm.h"
#include "kernels/conv2d.h"
#include "kernels/gemm.h"
#include "kernels/math_mode.h"

namespace galley::kernels::cuda {

namespace {

using galley::detail::str_cat;

// One generic checker; the macros add the failed expression.
void check_status(bool ok, const char* lib, const char* expr, const char* file, int line,
                  const std::string& detail) {
  if (!ok) galley::detail::throw_error(file, line, expr, std::string(lib) + " error: " + detail);
}

// cuDNN's status and, where it has one, its own account of this thread's last error.
std::string cudnn_message(cudnnStatus_t s) {
  char last[512] = {0};
  cudnnGetLastErrorString(last, sizeof last);
  std::string out = cudnnGetErrorString(s);
  if (last[0]) out += std::string(" (cuDNN: ") + last + ")";
  return out;
}

// Reads cuDNN's message of the last error away, so that a later error does not show it.
void forget_cudnn_message() {
  char discard[512];
  cudnnGetLastErrorString(discard, sizeof discard);
}

#define CUDA_CHECK(call)                                                                        \
  do {                                                                                          \
    cudaError_t s_ = (call);                                                                    \
    if (s_ != cudaSuccess) (void)cudaGetLastError();                                            \
    check_status(s_ == cudaSuccess, "CUDA", #call, __FILE__, __LINE__, cudaGetErrorString(s_)); \
  } while (0)
#define CUBLAS_CHECK(call)                                                         \
  do {                                                                             \
    cublasStatus_t s_ = (call);                                                    \
    check_status(s_ == CUBLAS_STATUS_SUCCESS, "cuBLAS", #call, __FILE__, __LINE__, \
                 cublasGetStatusString(s_));                                       \
  } while (0)
#define CUDNN_CHECK(call)                                                         \
  do {                                                                            \
    cudnnStatus_t s_ = (call);                                                    \
    if (s_ != CUDNN_STATUS_SUCCESS)                                               \
      check_status(false, "cuDNN", #call, __FILE__, __LINE__, cudnn_message(s_)); \
  } while (0)

cudaStream_t as_stream(void* s) {
  return static_cast<cudaStream_t>(s);
}

// alpha and beta of cuDNN's blends (float for every dtype here: the compute type is float32):
// the result overwrites the destination, or (beta kOne) is added to it.
const float kOne = 1.f, kZero = 0.f;

std::string mib(size_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f MiB", double(bytes) / double(1 << 20));
  return buf;
}

// Makes `device` current for the scope and restores the caller's afterwards; does nothing when
// it already is current (a needless cudaSetDevice would make a context on the thread's default).
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    int now = -1;
    CUDA_CHECK(cudaGetDevice(&now));
    if (now == device) return;
    CUDA_CHECK(cudaSetDevice(device));
    prev_ = now;
  }
  ~DeviceGuard() {
    if (prev_ >= 0 && cudaSetDevice(prev_) != cudaSuccess) (void)cudaGetLastError();
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = -1;
};

// ----------------------------------------------------------------------------------------------
// Handles

// cuBLAS's workspace per (handle, stream): allocated once, so that no product allocates during
// a CUDA graph capture (cublasSetStream would otherwise fall back to the library's own pool).
// 32 MiB is what NVIDIA recommends for Hopper. It comes from cudaMalloc, outside galley's cap.
constexpr size_t kBlasWorkspace = size_t(32) << 20;

// n, c, h, w, o, kh, kw, stride, pad, dilation, groups and the dtype: what a convolution's shape
// is.
using ConvShape = std::array<int64_t, 12>;

ConvShape shape_of(const Conv2dGeometry& g, DType dtype) {
  return {g.n,  g.c,      g.h,   g.w,        g.o,      g.kh,
          g.kw, g.stride, g.pad, g.dilation, g.groups, int64_t(dtype)};
}

bool is_16bit(DType d) {
  return d == DType::BFloat16 || d == DType::Float16;
}

cudnnDataType_t cudnn_type(DType d) {
  switch (d) {
    case DType::Float32:
      return CUDNN_DATA_FLOAT;
    case DType::BFloat16:
      return CUDNN_DATA_BFLOAT16;
    case DType::Float16:
      return CUDNN_DATA_HALF;
    default:
      break;
  }
  GALLEY_CHECK(false, "conv2d: cuDNN takes float32, bfloat16 or float16, got ", dtype_name(d));
  return CUDNN_DATA_FLOAT;
}

cudaDataType_t cuda_type(DType d) {
  GALLEY_CHECK(is_16bit(d), "gemm_16bit: expected bfloat16 or float16 operands, got ",
               dtype_name(d));
  return d == DType::BFloat16 ? CUDA_R_16BF : CUDA_R_16F;
}

std::string describe(const Conv2dGeometry& g) {
  return str_cat(g.n, "x", g.c, "x", g.h, "x", g.w, " by ", g.o, "x", g.c / g.groups, "x", g.kh,
                 "x", g.kw, " (stride ", g.stride, ", padding ", g.pad, ", dilation ", g.dilation,
                 ", groups ", g.groups, ")");
}

std::string describe(const Conv2dGeometry& g, DType dtype) {
  return str_cat(describe(g), " in ", dtype_name(dtype));
}

// The descriptors of one convolution shape. The math type is set before every call (it belongs
// to the algorithm chosen), which is why they are one handle's, never shared between threads.
struct ConvDescs {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr, b = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;

  ConvDescs() = default;
  ConvDescs(const ConvDescs&) = delete;
  ConvDescs& operator=(const ConvDescs&) = delete;
  // Reached only when init fails: descriptors otherwise live as long as their handles.
  ~ConvDescs() {
    if (x) (void)cudnnDestroyTensorDescriptor(x);
    if (y) (void)cudnnDestroyTensorDescriptor(y);
    if (b) (void)cudnnDestroyTensorDescriptor(b);
    if (w) (void)cudnnDestroyFilterDescriptor(w);
    if (conv) (void)cudnnDestroyConvolutionDescriptor(conv);
  }

  // x, w and y in `dtype`, the bias in float32 (only float32 convolutions add one), sums in
  // float32.
  void init(const Conv2dGeometry& g, DType dtype) {
    const cudnnDataType_t t = cudnn_type(dtype);
    CUDNN_CHECK(cudnnCreateTensorDescriptor(&x));
    CUDNN_CHECK(cudnnCreateTensorDescriptor(&y));
    CUDNN_CHECK(cudnnCreateTensorDescriptor(&b));
    CUDNN_CHECK(cudnnCreateFilterDescriptor(&w));
    CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&conv));
    CUDNN_CHECK(cudnnSetTensor4dDescriptor(x, CUDNN_TENSOR_NCHW, t, int(g.n), int(g.c), int(g.h),
                                           int(g.w)));
    CUDNN_CHECK(cudnnSetTensor4dDescriptor(y, CUDNN_TENSOR_NCHW, t, int(g.n), int(g.o), int(g.oh),
                                           int(g.ow)));
    CUDNN_CHECK(
        cudnnSetTensor4dDescriptor(b, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, int(g.o), 1, 1));
    CUDNN_CHECK(cudnnSetFilter4dDescriptor(w, t, CUDNN_TENSOR_NCHW, int(g.o), int(g.c / g.groups),
                                           int(g.kh), int(g.kw)));
    CUDNN_CHECK(cudnnSetConvolution2dDescriptor(conv, int(g.pad), int(g.pad), int(g.stride),
                                                int(g.stride), int(g.dilation), int(g.dilation),
                                                CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    CUDNN_CHECK(cudnnSetConvolutionGroupCount(conv, int(g.groups)));
  }
};

// One thread's handles on one device, with what belongs to them. Only the thread holding it
// touches it.
struct Handles {
  int device = 0;
  cublasHandle_t blas = nullptr;
  cudnnHandle_t dnn = nullptr;
  // By the stream's unique id (a destroyed stream's address may come back for a new one, whose
  // products would share the workspace with the old one's still running), else its address.
  std::vector<std::pair<unsigned long long, void*>> blas_workspaces;
  std::map<ConvShape, std::unique_ptr<ConvDescs>> convs;
  // cuDNN's batch normalisation: the data and the per-channel arrays, set for each call.
  cudnnTensorDescriptor_t bn_data = nullptr, bn_channels = nullptr;
};

std::unique_ptr<Handles> make_handles(int device) {
  DeviceGuard on(device);  // both libraries bind a handle to the current device
  auto h = std::make_unique<Handles>();
  h->device = device;
  CUBLAS_CHECK(cublasCreate(&h->blas));
  const cudnnStatus_t s = cudnnCreate(&h->dnn);
  if (s != CUDNN_STATUS_SUCCESS) {
    const std::string why = cudnn_message(s);
    (void)cublasDestroy(h->blas);
    check_status(false, "cuDNN", "cudnnCreate", __FILE__, __LINE__, why);
  }
  return h;
}

// Handles no thread holds, per device.
struct HandlePool {
  std::mutex mu;
  std::vector<std::vector<Handles*>> idle;
};

HandlePool& handle_pool() {
  static auto* pool = new HandlePool();  // never destroyed: see ThreadHandles
  return *pool;
}

// This thread's lease. When the thread ends its handles go back to the pool for the next thread
// (cudnnCreate alone takes tens of milliseconds), and nothing is destroyed: destroying a handle
// synchronises the device, which would break a graph capture running on another thread, and a
// thread that ends during process exit could reach the CUDA runtime after its teardown. The pool
// is leaked at exit for the same reason; the driver reclaims it with the process.
struct ThreadHandles {
  std::vector<Handles*> by_device;
  ~ThreadHandles() {
    try {
      HandlePool& pool = handle_pool();
      std::lock_guard<std::mutex> lock(pool.mu);
      for (size_t d = 0; d < by_device.size(); ++d) {
        if (!by_device[d]) continue;
        if (pool.idle.size() <= d) pool.idle.resize(d + 1);
        pool.idle[d].push_back(by_device[d]);
      }
    } catch (...) {
      // Out of host memory at thread exit: the handles leak, which is harmless.
    }
  }
};

Handles& handles(int device) {
  GALLEY_CHECK(device >= 0, "cuda:", device, " is not a device");
  thread_local ThreadHandles mine;
  if (mine.by_device.size() <= size_t(device)) mine.by_device.resize(device + 1, nullptr);
  Handles*& h = mine.by_device[device];
  if (h) return *h;
  {
    HandlePool& pool = handle_pool();
    std::lock_guard<std::mutex> lock(pool.mu);
    if (pool.idle.size() > size_t(device) && !pool.idle[device].empty()) {
      h = pool.idle[device].back();
      pool.idle[device].pop_back();
      return *h;
    }
  }
  h = make_handles(device).release();
  return *h;
}

// The workspace `h` uses on `stream`; null (cuBLAS's own pool) while the device has no room.
// Kept for the handle's life: galley's products run on a few long-lived streams (the compute
// streams), and freeing one would synchronise the device.
void* blas_workspace(Handles& h, cudaStream_t stream) {
  unsigned long long key = 0;
  if (cudaStreamGetId(stream, &key) != cudaSuccess) {
    (void)cudaGetLastError();
    key = reinterpret_cast<uintptr_t>(stream);
  }
  for (const auto& [s, p] : h.blas_workspaces)
    if (s == key) return p;
  DeviceGuard on(h.device);
  // Allowed for this one call inside a capture of this thread: cudaMalloc touches no stream.
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  cudaThreadExchangeStreamCaptureMode(&mode);
  void* p = nullptr;
  const cudaError_t rc = cudaMalloc(&p, kBlasWorkspace);
  cudaThreadExchangeStreamCaptureMode(&mode);
  if (rc != cudaSuccess) {
    (void)cudaGetLastError();
    return nullptr;  // tried again next time
  }
  h.blas_workspaces.emplace_back(key, p);
  return p;
}

// ----------------------------------------------------------------------------------------------
// Convolution algorithms

enum Direction : int { kForward = 0, kBackwardData = 1, kBackwardFilter = 2 };

const char* direction_name(Direction d) {
  static const char* names[] = {"forward", "backward data", "backward filter"};
  return names[d];
}

const char* algo_name(Direction d, int algo) {
  static const char* fwd[] = {
      "IMPLICIT_GEMM", "IMPLICIT_PRECOMP_GEMM", "GEMM", "DIRECT", "FFT", "FFT_TILING",
      "WINOGRAD",      "WINOGRAD_NONFUSED"};
  static const char* data[] = {"ALGO_0",     "ALGO_1",   "FFT",
                               "FFT_TILING", "WINOGRAD", "WINOGRAD_NONFUSED"};
  static const char* filter[] = {
      "ALGO_0", "ALGO_1", "FFT", "ALGO_3", "WINOGRAD", "WINOGRAD_NONFUSED", "FFT_TILING"};
  const char* const* names[] = {fwd, data, filter};
  const int counts[] = {8, 6, 7};
  return algo >= 0 && algo < counts[d] ? names[d][algo] : "unknown";
}

const char* math_name(cudnnMathType_t m) {
  switch (m) {
    case CUDNN_DEFAULT_MATH:
      return "default math";
    case CUDNN_TENSOR_OP_MATH:
      return "tensor cores";
    case CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION:
      return "tensor cores with conversion";
    case CUDNN_FMA_MATH:
      return "FMA";
  }
  return "unknown math";
}

// One entry of a ranking: the algorithm, the math type it runs with and its workspace.
struct Candidate {
  int algo;
  cudnnMathType_t math;
  size_t workspace;
};

// The rankings of one shape and dtype under one setting of TF32 and determinism, fastest first.
struct Plan {
  bool deterministic = false;
  std::array<std::vector<Candidate>, 3> ranked;
};

// The math type to run a ranked entry with, or false where it would break the TF32 setting.
// `tensor_ops`: tensor cores are allowed (16-bit operands always; float32 with TF32 allowed).
// CUDNN_DEFAULT_MATH lets cuDNN use TF32 on Ampere and later, so without TF32 it becomes FMA.
// ALLOW_CONVERSION may round float32 down to half precision, which even TF32 does not permit;
// 16-bit operands have nothing left to round.
bool usable_math(cudnnMathType_t m, bool tensor_ops, bool low_precision, cudnnMathType_t* out) {
  switch (m) {
    case CUDNN_FMA_MATH:
      *out = m;
      return true;
    case CUDNN_DEFAULT_MATH:
      *out = tensor_ops ? m : CUDNN_FMA_MATH;
      return true;
    case CUDNN_TENSOR_OP_MATH:
      *out = m;
      return tensor_ops;
    case CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION:
      *out = m;
      return low_precision;
  }
  return false;
}

// Algorithms that run every shape, appended after the heuristics' entries in case those all
// fail or need more workspace than there is: implicit GEMM forward and ALGO_0 backward need none.
struct Fallback {
  int algo;
  bool deterministic;
};

// cuDNN's heuristic entries that may run under the settings, in its order, each with the
// workspace its math type needs (asked again: perf.memory is not reliably filled by Get_v7).
template <typename Perf, typename SizeOf>
std::vector<Candidate> rank(const std::vector<Perf>& perf, int found,
                            cudnnConvolutionDescriptor_t conv, bool tensor_ops, bool low_precision,
                            bool det, std::initializer_list<Fallback> fallbacks, SizeOf size_of) {
  std::vector<Candidate> out;
  auto add = [&](int algo, cudnnMathType_t math) {
    for (const Candidate& c : out)
      if (c.algo == algo && c.math == math) return;
    size_t bytes = 0;
    if (cudnnSetConvolutionMathType(conv, math) != CUDNN_STATUS_SUCCESS) return;
    if (size_of(algo, &bytes) != CUDNN_STATUS_SUCCESS) return;
    out.push_back({algo, math, bytes});
  };
  for (int i = 0; i < found; ++i) {
    const Perf& p = perf[i];
    cudnnMathType_t math = CUDNN_FMA_MATH;
    if (p.status != CUDNN_STATUS_SUCCESS) continue;
    if (det && p.determinism != CUDNN_DETERMINISTIC) continue;
    if (!usable_math(p.mathType, tensor_ops, low_precision, &math)) continue;
    add(int(p.algo), math);
  }
  // 16-bit fallbacks keep cuDNN's default math: not every algorithm runs them on FMA units.
  const cudnnMathType_t fallback_math = low_precision ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH;
  for (const Fallback& f : fallbacks)
    if (!det || f.deterministic) add(f.algo, fallback_math);
  forget_cudnn_message();  // the refusals above were expected
  return out;
}

Plan make_plan(cudnnHandle_t h, const ConvDescs& d, bool allow_tf32, bool low_precision, bool det) {
  Plan plan;
  plan.deterministic = det;
  // The heuristics answer for the descriptor's math type: FMA keeps TF32 kernels out of float32.
  const bool tensor_ops = allow_tf32 || low_precision;
  const cudnnMathType_t query = tensor_ops ? CUDNN_TENSOR_OP_MATH : CUDNN_FMA_MATH;
  int max = 0, found = 0;

  CUDNN_CHECK(cudnnSetConvolutionMathType(d.conv, query));
  CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithmMaxCount(h, &max));
  std::vector<cudnnConvolutionFwdAlgoPerf_t> fwd(std::max(max, 1));
  CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(h, d.x, d.w, d.conv, d.y, int(fwd.size()),
                                                     &found, fwd.data()));
  plan.ranked[kForward] =
      rank(fwd, found, d.conv, tensor_ops, low_precision, det,
           {{CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, true},
            {CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, true}},
           [&](int algo, size_t* bytes) {
             return cudnnGetConvolutionForwardWorkspaceSize(h, d.x, d.w, d.conv, d.y,
                                                            cudnnConvolutionFwdAlgo_t(algo), bytes);
           });

  CUDNN_CHECK(cudnnSetConvolutionMathType(d.conv, query));
  CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithmMaxCount(h, &max));
  std::vector<cudnnConvolutionBwdDataAlgoPerf_t> data(std::max(max, 1));
  CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(h, d.w, d.y, d.conv, d.x,
                                                          int(data.size()), &found, data.data()));
  plan.ranked[kBackwardData] =
      rank(data, found, d.conv, tensor_ops, low_precision, det,
           {{CUDNN_CONVOLUTION_BWD_DATA_ALGO_1, true}, {CUDNN_CONVOLUTION_BWD_DATA_ALGO_0, false}},
           [&](int algo, size_t* bytes) {
             return cudnnGetConvolutionBackwardDataWorkspaceSize(
                 h, d.w, d.y, d.conv, d.x, cudnnConvolutionBwdDataAlgo_t(algo), bytes);
           });

  CUDNN_CHECK(cudnnSetConvolutionMathType(d.conv, query));
  CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(h, &max));
  std::vector<cudnnConvolutionBwdFilterAlgoPerf_t> filter(std::max(max, 1));
  CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
      h, d.x, d.y, d.conv, d.w, int(filter.size()), &found, filter.data()));
  plan.ranked[kBackwardFilter] = rank(
      filter, found, d.conv, tensor_ops, low_precision, det,
      {{CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1, true}, {CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0, false}},
      [&](int algo, size_t* bytes) {
        return cudnnGetConvolutionBackwardFilterWorkspaceSize(
            h, d.x, d.y, d.conv, d.w, cudnnConvolutionBwdFilterAlgo_t(algo), bytes);
      });
  return plan;
}

// Everything that changes the ranking: the device (its architecture), the shape and dtype, TF32
// and determinism.
using PlanKey = std::tuple<int, ConvShape, bool, bool>;

struct PlanCache {
  std::mutex mu;
  std::map<PlanKey, Plan> plans;  // never erased: references to entries stay valid
};

const Plan& plan_for(Handles& hs, const ConvDescs& d, const ConvShape& shape, DType dtype) {
  static auto* cache = new PlanCache();  // lives to exit, like the handles that fill it
  const bool allow = kernels::allow_tf32(), det = kernels::deterministic();
  const PlanKey key{hs.device, shape, allow, det};
  {
    std::lock_guard<std::mutex> lock(cache->mu);
    auto it = cache->plans.find(key);
    if (it != cache->plans.end()) return it->second;
  }
  // Ranked outside the lock, so that other threads' convolutions do not wait for it; a thread
  // ranking the same shape meanwhile gets the same answer, and the first one stored stays.
  Plan plan = make_plan(hs.dnn, d, allow, is_16bit(dtype), det);
  std::lock_guard<std::mutex> lock(cache->mu);
  return cache->plans.emplace(key, std::move(plan)).first->second;
}

struct Conv {
  Handles& h;
  ConvDescs& d;
  const Plan& plan;
};

Conv conv_for(int device, const Conv2dGeometry& g, DType dtype) {
  Handles& h = handles(device);
  const ConvShape shape = shape_of(g, dtype);
  auto it = h.convs.find(shape);
  if (it == h.convs.end()) {
    auto d = std::make_unique<ConvDescs>();
    d->init(g, dtype);
    it = h.convs.emplace(shape, std::move(d)).first;
  }
  return {h, *it->second, plan_for(h, *it->second, shape, dtype)};
}

// Statuses that belong to the algorithm rather than to the call: another may run. (A view into
// a tensor need not be 16-byte aligned, which some kernels require; implicit GEMM does not. An
// algorithm that the legacy API lists for a shape may still refuse its data type or layout as a
// bad parameter; a call that is wrong itself is refused by every algorithm, and the error then
// names the first refusal.)
bool worth_another_algorithm(cudnnStatus_t s) {
  const int category = CUDNN_STATUS_CATEGORY(int(s));
  return category == int(CUDNN_STATUS_BAD_PARAM) || category == int(CUDNN_STATUS_NOT_SUPPORTED) ||
         category == int(CUDNN_STATUS_INTERNAL_ERROR) ||
         category == int(CUDNN_STATUS_EXECUTION_FAILED);
}

// Runs `launch(algo, workspace, bytes)` with the first candidate whose workspace fits ws.limit
// and can be allocated. An allocation that fails (the cap, or the device, is fuller than the
// limit suggested) moves on to candidates with smaller workspaces; an algorithm cuDNN refuses
// for this shape moves on to the next.
template <typename Launch>
void run_fastest(const Conv& c, Direction dir, const Workspace& ws, int device,
                 const Conv2dGeometry& g, DType dtype, Launch&& launch) {
  size_t limit = ws.limit;
  size_t refused = SIZE_MAX;  // the smallest workspace that did not fit
  std::string oom, failure;
  for (const Candidate& k : c.plan.ranked[dir]) {
    if (k.workspace > limit || (k.workspace > 0 && !ws.allocate)) {
      refused = std::min(refused, k.workspace);
      continue;
    }
    void* work = nullptr;
    if (k.workspace > 0) {
      try {
        work = ws.allocate(k.workspace);
      } catch (const OutOfMemoryError& e) {
        limit = k.workspace - 1;
        refused = std::min(refused, k.workspace);
        oom = e.what();
        continue;
      }
    }
    CUDNN_CHECK(cudnnSetConvolutionMathType(c.d.conv, k.math));
    const cudnnStatus_t s = launch(k.algo, work, k.workspace);
    if (s == CUDNN_STATUS_SUCCESS) return;
    const std::string why = str_cat(algo_name(dir, k.algo), " (", math_name(k.math), ", ",
                                    mib(k.workspace), "): ", cudnn_message(s));
    (void)cudaGetLastError();
    // A fault of the device itself (an illegal address earlier in the stream) also surfaces as
    // an execution failure: report it as what it is rather than trying other algorithms.
    const cudaError_t sticky = cudaPeekAtLastError();
    if (sticky != cudaSuccess && sticky != cudaErrorNotReady)
      check_status(false, "CUDA", direction_name(dir), __FILE__, __LINE__,
                   str_cat(why, " after a device error: ", cudaGetErrorString(sticky)));
    if (!worth_another_algorithm(s))
      check_status(false, "cuDNN", direction_name(dir), __FILE__, __LINE__, why);
    if (failure.empty()) failure = why;  // the first refusal: the likeliest to name a bad call
  }
  const std::string what =
      str_cat("conv2d ", direction_name(dir), " on cuda:", device, " of ", describe(g, dtype));
  if (refused != SIZE_MAX)
    throw OutOfMemoryError(str_cat(
        what, ": every cuDNN algorithm", c.plan.deterministic ? " (deterministic ones only)" : "",
        " that can run it needs more workspace than there is (", mib(ws.limit),
        " allowed by the memory cap and the per-call limit; the smallest needs ", mib(refused), ")",
        oom.empty() ? "" : "; the allocator: " + oom,
        failure.empty() ? "" : "; cuDNN refused, first, " + failure));
  if (!failure.empty())
    throw Error(str_cat(what, ": cuDNN refused every algorithm, the first ", failure));
  throw Error(str_cat(what, ": cuDNN offers no ",
                      c.plan.deterministic
                          ? "deterministic algorithm (galley::cuda::set_deterministic(false) "
                            "allows the others)"
                          : "algorithm"));
}

}  // namespace

// ----------------------------------------------------------------------------------------------
// launchers

void prepare(int device) {
  (void)handles(device);
}

namespace {

// This thread's cuBLAS handle for `device`, bound to `stream` with its workspace there and the
// math mode of the TF32 setting (which 16-bit products ignore: they take tensor cores anyway).
cublasHandle_t blas_on(int device, cudaStream_t stream) {
  Handles& hs = handles(device);
  cublasHandle_t h = hs.blas;
  CUBLAS_CHECK(cublasSetStream(h, stream));
  // cublasSetStream has just put the handle back on cuBLAS's default workspace.
  if (void* ws = blas_workspace(hs, stream))
    CUBLAS_CHECK(cublasSetWorkspace(h, ws, kBlasWorkspace));
  CUBLAS_CHECK(cublasSetMathMode(
      h, kernels::allow_tf32() ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
  return h;
}

// cuBLAS wants leading dimensions of at least 1 even where an operand is empty (k == 0).
int ld(int64_t v) {
  return int(std::max<int64_t>(v, 1));
}

// cuBLAS takes sizes and leading dimensions as int: a product past that is an error naming it,
// where the casts would wrap (2^31 rows turn negative, 2^32 + 5 rows compute 5).
void check_int_sizes(const char* what, int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb,
                     int64_t ldc) {
  const int64_t most = std::numeric_limits<int>::max();
  GALLEY_CHECK(m <= most && n <= most && k <= most && lda <= most && ldb <= most && ldc <= most,
               what, ": a product of [", m, " x ", k, "] and [", k, " x ", n,
               "] (leading dimensions ", lda, ", ", ldb, ", ", ldc,
               ") has a size past the 32-bit sizes cuBLAS takes (", most, ")");
}

// C = beta * C for a product without terms (k == 0), as the host's gemm: beta 0 overwrites C
// (NaNs included), 1 leaves it. Not left to cuBLAS, whose handling of k == 0 is not documented.
void scale_only(cublasHandle_t h, int64_t m, int64_t n, float beta, float* c, int64_t ldc,
                cudaStream_t stream) {
  if (beta == 1.f) return;
  if (beta == 0.f) {
    CUDA_CHECK(cudaMemset2DAsync(c, size_t(ldc) * sizeof(float), 0, size_t(n) * sizeof(float),
                                 size_t(m), stream));
    return;
  }
  const float zero = 0.f;
  // Row-major m x n is column-major n x m; in place, as geam allows with C = A and lda = ldc.
  CUBLAS_CHECK(cublasSgeam(h, CUBLAS_OP_N, CUBLAS_OP_N, int(n), int(m), &beta, c, ld(ldc), &zero, c,
                           ld(ldc), c, ld(ldc)));
}

cublasOperation_t cublas_op(bool trans) {
  return trans ? CUBLAS_OP_T : CUBLAS_OP_N;
}

}  // namespace

void gemm(int device, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
          const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
          int64_t ldc, void* stream) {
  if (m == 0 || n == 0) return;
  check_int_sizes("a GPU matrix product (matmul, linear)", m, n, k, lda, ldb, ldc);
  cublasHandle_t h = blas_on(device, as_stream(stream));
  if (k == 0) return scale_only(h, m, n, beta, c, ldc, as_stream(stream));
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: swap the operands.
  CUBLAS_CHECK(cublasSgemm(h, cublas_op(trans_b), cublas_op(trans_a), int(n), int(m), int(k),
                           &alpha, b, ld(ldb), a, ld(lda), &beta, c, ld(ldc)));
}

void gemm_16bit(int device, DType dtype, bool trans_a, bool trans_b, int64_t m, int64_t n,
                int64_t k, const void* a, int64_t lda, const void* b, int64_t ldb, bool accumulate,
                float* c, int64_t ldc, void* stream) {
  const cudaDataType_t t = cuda_type(dtype);
  if (m == 0 || n == 0) return;
  check_int_sizes("a GPU matrix product (matmul, linear)", m, n, k, lda, ldb, ldc);
  cublasHandle_t h = blas_on(device, as_stream(stream));
  const float one = 1.f, beta = accumulate ? 1.f : 0.f;
  if (k == 0) return scale_only(h, m, n, beta, c, ldc, as_stream(stream));
  // As gemm: the operands swapped for column-major. 16-bit A and B with a float32 C under
  // CUBLAS_COMPUTE_32F is one of GemmEx's listed combinations; cuBLAS picks tensor-core kernels
  // for it by itself (and plain ones where an operand is misaligned for them).
  CUBLAS_CHECK(cublasGemmEx(h, cublas_op(trans_b), cublas_op(trans_a), int(n), int(m), int(k), &one,
                            b, t, ld(ldb), a, t, ld(lda), &beta, c, CUDA_R_32F, ld(ldc),
                            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

namespace {

// A bias is added by cuDNN in float32 only; 16-bit convolutions leave theirs to the op layer.
void check_bias(DType dtype, const void* bias, const char* what) {
  GALLEY_CHECK(!bias || dtype == DType::Float32, "conv2d ", what, ": cuDNN adds a float32 bias to ",
               "float32 convolutions only; a ", dtype_name(dtype), " convolution's bias is added ",
               "by the op layer");
}

}  // namespace

void conv2d_forward(int device, const Conv2dGeometry& g, DType dtype, const void* x, const void* w,
                    const float* bias, void* y, const Workspace& ws, void* stream) {
  check_bias(dtype, bias, "forward");
  const Conv c = conv_for(device, g, dtype);
  cudnnHandle_t h = c.h.dnn;
  CUDNN_CHECK(cudnnSetStream(h, as_stream(stream)));
  run_fastest(c, kForward, ws, device, g, dtype, [&](int algo, void* work, size_t bytes) {
    return cudnnConvolutionForward(h, &kOne, c.d.x, x, c.d.w, w, c.d.conv,
                                   cudnnConvolutionFwdAlgo_t(algo), work, bytes, &kZero, c.d.y, y);
  });
  if (bias) CUDNN_CHECK(cudnnAddTensor(h, &kOne, c.d.b, bias, &kOne, c.d.y, y));
}

void conv2d_backward(int device, const Conv2dGeometry& g, DType dtype, const void* x, const void* w,
                     const void* gy, void* gx, void* gw, float* gb, const Workspace& ws,
                     void* stream) {
  check_bias(dtype, gb, "backward");
  const Conv c = conv_for(device, g, dtype);
  cudnnHandle_t h = c.h.dnn;
  CUDNN_CHECK(cudnnSetStream(h, as_stream(stream)));
  if (gx)
    run_fastest(c, kBackwardData, ws, device, g, dtype, [&](int algo, void* work, size_t bytes) {
      return cudnnConvolutionBackwardData(h, &kOne, c.d.w, w, c.d.y, gy, c.d.conv,
                                          cudnnConvolutionBwdDataAlgo_t(algo), work, bytes, &kZero,
                                          c.d.x, gx);
    });
  if (gw)
    run_fastest(c, kBackwardFilter, ws, device, g, dtype, [&](int algo, void* work, size_t bytes) {
      return cudnnConvolutionBackwardFilter(h, &kOne, c.d.x, x, c.d.y, gy, c.d.conv,
                                            cudnnConvolutionBwdFilterAlgo_t(algo), work, bytes,
                                            &kZero, c.d.w, gw);
    });
  if (gb) CUDNN_CHECK(cudnnConvolutionBackwardBias(h, &kOne, c.d.y, gy, &kZero, c.d.b, gb));
}

std::string conv2d_algorithms(int device, const Conv2dGeometry& g, DType dtype, size_t limit) {
  const Conv c = conv_for(device, g, dtype);
  std::string out;
  for (Direction dir : {kForward, kBackwardData, kBackwardFilter}) {
    if (!out.empty()) out += "; ";
    out += std::string(direction_name(dir)) + ": ";
    const auto& ranked = c.plan.ranked[dir];
    auto it = std::find_if(ranked.begin(), ranked.end(),
                           [&](const Candidate& k) { return k.workspace <= limit; });
    if (it == ranked.end())
      out += "none within " + mib(limit);
    else
      out += str_cat(algo_name(dir, it->algo), " (", math_name(it->math), ", ", mib(it->workspace),
                     " of workspace)");
  }
  return out;
}

// ----------------------------------------------------------------------------------------------
// cuDNN's batch normalisation
//
// cudnnBatchNormalizationForwardTraining / Backward in spatial mode (or its persistent variant).
// cuDNN 9 marks them deprecated in favour of its graph API, where batch normalisation is a
// fused operation graph to build and plan per shape; these calls are what PyTorch runs too, and
// they stay a reference here, never on galley's own path.

namespace {

// (CUDNN_DEPRECATED marks these calls only where CUDNN_WARN_DEPRECATED is defined.)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

// Runs call(handle, mode) on `device`'s cuDNN handle, bound to `stream`, with its descriptors
// set: x as N x C x inner x 1 (float32, NCHW) and the per-channel arrays as cuDNN derives them.
template <typename Call>
void with_bn(int device, BatchNormGeometry g, bool persistent, void* stream, Call call) {
  // cuDNN's dimensions and strides are ints: the largest stride is channels * inner.
  GALLEY_CHECK(g.outer > 0 && g.channels > 0 && g.inner > 0 && g.outer <= INT32_MAX &&
                   g.channels <= INT32_MAX / g.inner,
               "batch_norm (cuDNN): shape [", g.outer, ", ", g.channels, ", ", g.inner,
               "] is empty or has a dimension or stride past cuDNN's int range");
  const cudnnBatchNormMode_t mode =
      persistent ? CUDNN_BATCHNORM_SPATIAL_PERSISTENT : CUDNN_BATCHNORM_SPATIAL;
  DeviceGuard on(device);
  Handles& h = handles(device);
  if (!h.bn_data) CUDNN_CHECK(cudnnCreateTensorDescriptor(&h.bn_data));
  if (!h.bn_channels) CUDNN_CHECK(cudnnCreateTensorDescriptor(&h.bn_channels));
  CUDNN_CHECK(cudnnSetTensor4dDescriptor(h.bn_data, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT,
                                         int(g.outer), int(g.channels), int(g.inner), 1));
  CUDNN_CHECK(cudnnDeriveBNTensorDescriptor(h.bn_channels, h.bn_data, mode));
  CUDNN_CHECK(cudnnSetStream(h.dnn, as_stream(stream)));
  call(h, mode);
}

}  // namespace

void batch_norm_cudnn_train_forward(int device, const float* x, BatchNormGeometry g,
                                    BatchNormRunning running, const float* weight,
                                    const float* bias, float eps, float* y, float* save_mean,
                                    float* save_invstd, bool persistent, void* stream) {
  GALLEY_CHECK(weight && bias, "batch_norm (cuDNN): cuDNN needs a weight and a bias");
  GALLEY_CHECK((running.mean == nullptr) == (running.var == nullptr),
               "batch_norm (cuDNN): running mean and variance are updated together");
  with_bn(device, g, persistent, stream, [&](Handles& h, cudnnBatchNormMode_t mode) {
    CUDNN_CHECK(cudnnBatchNormalizationForwardTraining(
        h.dnn, mode, &kOne, &kZero, h.bn_data, x, h.bn_data, y, h.bn_channels, weight, bias,
        double(running.momentum), running.mean, running.var, double(eps), save_mean, save_invstd));
  });
}

void batch_norm_cudnn_backward(int device, const float* gy, const float* x, BatchNormGeometry g,
                               const float* weight, float eps, const float* save_mean,
                               const float* save_invstd, float* gx, float* gweight, float* gbias,
                               bool persistent, void* stream) {
  GALLEY_CHECK(weight && gx && gweight && gbias && save_mean && save_invstd,
               "batch_norm backward (cuDNN): cuDNN needs the weight and the forward's saved mean "
               "and 1 / sqrt(var + eps), and writes gx, gweight and gbias together");
  with_bn(device, g, persistent, stream, [&](Handles& h, cudnnBatchNormMode_t mode) {
    CUDNN_CHECK(cudnnBatchNormalizationBackward(
        h.dnn, mode, &kOne, &kZero, &kOne, &kZero, h.bn_data, x, h.bn_data, gy, h.bn_data, gx,
        h.bn_channels, weight, gweight, gbias, double(eps), save_mean, save_invstd));
  });
}

bool batch_norm_cudnn_overflowed(int device) {
  DeviceGuard on(device);
  Handles& h = handles(device);
  cudnnStatus_t flag = CUDNN_STATUS_SUCCESS;
  CUDNN_CHECK(cudnnQueryRuntimeError(h.dnn, &flag, CUDNN_ERRQUERY_BLOCKING, nullptr));
  return flag != CUDNN_STATUS_SUCCESS;
}

#pragma GCC diagnostic pop

}  // namespace galley::kernels::cuda
