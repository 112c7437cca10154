// CUDA graph capture and replay of a step queued on a device's compute stream.
#include "galley/runtime/graph.h"

#include <atomic>

#include "galley/error.h"
#include "galley/runtime/cuda.h"
#include "kernels/gemm.h"
#include "kernels/math_mode.h"
#include "src/runtime/device_memory.h"

#ifdef GALLEY_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace galley {

namespace cuda {

void set_allow_tf32(bool on) {
  kernels::set_allow_tf32(on);
}
bool allow_tf32() {
  return kernels::allow_tf32();
}
void set_deterministic(bool on) {
  kernels::set_deterministic(on);
}
bool deterministic() {
  return kernels::deterministic();
}

struct Graph::Impl {
  Device device = Device::cuda(0);
  uintptr_t pool = 0;
#ifdef GALLEY_HAVE_CUDA
  cudaGraphExec_t exec = nullptr;
#endif
  ~Impl() {
#ifdef GALLEY_HAVE_CUDA
    if (!exec) return;
    {
      detail::CurrentDevice current(device);
      // Replays still queued read the pool: let them finish before its memory can be reused.
      try {
        if (cudaStreamSynchronize(static_cast<cudaStream_t>(detail::compute_stream(device))) !=
            cudaSuccess)
          (void)cudaGetLastError();
      } catch (...) {
        // No compute stream means nothing was ever queued on it.
      }
      if (cudaGraphExecDestroy(exec) != cudaSuccess) (void)cudaGetLastError();
    }
    detail::release_pool(device, pool);
#endif
  }
};

Graph::Graph() : impl_(std::make_unique<Impl>()) {}
Graph::~Graph() = default;
Graph::Graph(Graph&&) noexcept = default;
Graph& Graph::operator=(Graph&&) noexcept = default;

bool Graph::captured() const {
#ifdef GALLEY_HAVE_CUDA
  return impl_ && impl_->exec != nullptr;
#else
  return false;
#endif
}

Device Graph::device() const {
  GALLEY_CHECK(impl_, "cuda::Graph: moved from");
  return impl_->device;
}

#ifdef GALLEY_HAVE_CUDA
namespace {
// Pool keys are odd, so they never equal a stream's address (the keys of eager blocks).
uintptr_t next_pool() {
  static std::atomic<uintptr_t> n{0};
  return (++n << 1) | 1;
}

void check(cudaError_t rc, const char* what, Device device, const char* hint = "") {
  if (rc == cudaSuccess) return;
  (void)cudaGetLastError();
  throw Error(detail::str_cat("cuda::Graph: ", what, " on ", device.str(),
                              " failed: ", cudaGetErrorString(rc), hint));
}
}  // namespace

void Graph::capture(Device device, const std::function<void()>& step) {
  GALLEY_CHECK(impl_, "cuda::Graph: moved from");
  GALLEY_CHECK(device.is_cuda(), "cuda::Graph::capture: ", device.str(),
               " is not a GPU; only GPU work can be captured");
  GALLEY_CHECK(device.index() < cuda_device_count(), "cuda::Graph::capture: ", device.str(),
               " does not exist: this machine has ", cuda_device_count(), " CUDA device(s)");
  GALLEY_CHECK(!captured(), "cuda::Graph::capture: this graph already holds a capture on ",
               impl_->device.str(), "; use a new Graph");
  detail::make_current(device);
  cudaStream_t stream = static_cast<cudaStream_t>(detail::compute_stream(device));
  // Eager work queued before must not end up in the graph, and any error it hit is raised now.
  check(cudaStreamSynchronize(stream), "finishing the work queued before the capture", device);
  detail::check_deferred_errors(device);
  // Library handles and their workspaces are created on first use, which a capture forbids:
  // make sure this device's exist.
  kernels::cuda::prepare(device.index());
  (void)detail::error_slot(device);  // page-locked, made on first use: not inside the capture
  const uintptr_t pool = next_pool();
  detail::open_pool(device, pool);
  // Until the graph is instantiated and owned by impl_, every way out gives the pool back.
  struct PoolGuard {
    Device device;
    uintptr_t pool;
    bool keep = false;
    ~PoolGuard() {
      if (!keep) detail::release_pool(device, pool);
    }
  } guard{device, pool};
  cudaGraph_t graph = nullptr;
  {
    detail::CaptureAllocations allocations(device, pool);
    // Thread-local mode: loader threads and other devices' threads keep working meanwhile.
    check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "beginning a capture",
          device);
    try {
      step();
    } catch (...) {
      cudaGraph_t partial = nullptr;
      (void)cudaStreamEndCapture(stream, &partial);
      (void)cudaGetLastError();
      if (partial) cudaGraphDestroy(partial);
      throw;
    }
    const cudaError_t rc = cudaStreamEndCapture(stream, &graph);
    if (rc != cudaSuccess || !graph) {
      if (graph) cudaGraphDestroy(graph);
      check(rc == cudaSuccess ? cudaErrorStreamCaptureInvalidated : rc, "capturing the step",
            device,
            " (something in the step synchronised with the device or used another stream: run "
            "the step eagerly once before capturing, and keep host copies out of it)");
    }
  }
  cudaGraphExec_t exec = nullptr;
  const cudaError_t rc = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  check(rc, "instantiating the captured graph", device);
  guard.keep = true;
  impl_->device = device;
  impl_->pool = pool;
  impl_->exec = exec;
}

void Graph::replay() {
  GALLEY_CHECK(captured(), "cuda::Graph::replay: nothing has been captured");
  detail::make_current(impl_->device);
  check(cudaGraphLaunch(impl_->exec,
                        static_cast<cudaStream_t>(detail::compute_stream(impl_->device))),
        "replay", impl_->device);
}
#else
void Graph::capture(Device device, const std::function<void()>&) {
  // The same first check as a CUDA build's, so that misuse reads the same in every build.
  GALLEY_CHECK(device.is_cuda(), "cuda::Graph::capture: ", device.str(),
               " is not a GPU; only GPU work can be captured");
  throw Error(detail::str_cat("cuda::Graph::capture on ", device.str(),
                              ": this build of galley has no CUDA backend"));
}
void Graph::replay() {
  GALLEY_CHECK(false, "cuda::Graph::replay: nothing has been captured");
}
#endif

}  // namespace cuda
}  // namespace galley
