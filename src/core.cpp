// Errors, dtypes, devices and the thread setting: the small pieces everything else uses.
#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <exception>
#include <mutex>

#include "galley/device.h"
#include "galley/dtype.h"
#include "galley/error.h"
#include "galley/ops.h"
#include "thread_budget.h"

#ifdef GALLEY_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace galley {

std::unique_ptr<Error> Error::with_message(const std::string& message) const {
  return std::make_unique<Error>(message);
}
void Error::raise() const {
  throw *this;
}
void Error::raise_nested(const std::string& message) const {
  std::throw_with_nested(Error(message));
}

namespace detail {
void rethrow_with_message(const std::exception& e, const std::string& message) {
  if (const auto* g = dynamic_cast<const Error*>(&e)) g->with_message(message)->raise();
  throw Error(message);
}

void throw_error(const char* file, int line, const char* expr, const std::string& msg) {
  // Keep only the part of the path inside the project so messages are short and stable.
  std::string f = file;
  for (const char* root : {"/src/", "/kernels/", "/include/"}) {
    auto pos = f.rfind(root);
    if (pos != std::string::npos) {
      f = f.substr(pos + 1);
      break;
    }
  }
  throw Error(str_cat(msg, " [", f, ":", line, ": check failed: ", expr, "]"));
}
}  // namespace detail

size_t dtype_size(DType t) {
  switch (t) {
    case DType::Float32:
      return 4;
    case DType::Float16:
      return 2;
    case DType::BFloat16:
      return 2;
    case DType::Int64:
      return 8;
    case DType::UInt8:
      return 1;
  }
  return 0;
}

std::string dtype_name(DType t) {
  switch (t) {
    case DType::Float32:
      return "float32";
    case DType::Float16:
      return "float16";
    case DType::BFloat16:
      return "bfloat16";
    case DType::Int64:
      return "int64";
    case DType::UInt8:
      return "uint8";
  }
  return "unknown";
}

std::string Device::str() const {
  if (is_cpu()) return index_ == 0 ? "cpu" : "cpu:" + std::to_string(index_);
  return "cuda:" + std::to_string(index_);
}

int cuda_device_count() {
#ifdef GALLEY_HAVE_CUDA
  // No driver or no device is an error code from the runtime, never an abort: report zero.
  static int count = [] {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      (void)cudaGetLastError();
      return 0;
    }
    return n;
  }();
  return count;
#else
  return 0;
#endif
}

std::vector<Device> all_devices() {
  std::vector<Device> out;
  for (int i = 0; i < cuda_device_count(); ++i) out.push_back(Device::cuda(i));
  if (out.empty()) out.push_back(Device::cpu());
  return out;
}

namespace {
int initial_threads() {
  if (const char* env = std::getenv("GALLEY_NUM_THREADS")) {
    int n = std::atoi(env);
    if (n > 0) return n;
  }
  return omp_get_num_procs();
}
std::once_flag threads_once;
int threads_setting = 0;
}  // namespace

void set_num_threads(int n) {
  GALLEY_CHECK(n > 0, "set_num_threads: need at least one thread, got ", n);
  std::call_once(threads_once, [] {});
  threads_setting = n;
  omp_set_num_threads(n);
}

namespace detail {
namespace {
thread_local int tls_thread_budget = 0;
}
ThreadBudget::ThreadBudget(int threads) : prev_(tls_thread_budget) {
  tls_thread_budget = std::max(1, threads);
}
ThreadBudget::~ThreadBudget() {
  tls_thread_budget = prev_;
}
}  // namespace detail

int num_threads() {
  if (detail::tls_thread_budget > 0) return detail::tls_thread_budget;
  std::call_once(threads_once, [] {
    if (threads_setting == 0) {
      threads_setting = initial_threads();
      omp_set_num_threads(threads_setting);
    }
  });
  return threads_setting;
}

}  // namespace galley
