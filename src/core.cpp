// Errors, dtypes, devices and the thread setting: the small pieces everything else uses.
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <new>

#include "galley/device.h"
#include "galley/dtype.h"
#include "galley/error.h"
#include "galley/ops.h"
#include "thread_budget.h"
#include "whole_number.h"

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
bool host_out_of_memory() {
  try {
    throw;
  } catch (const std::bad_array_new_length&) {
    return false;
  } catch (const std::bad_alloc&) {
    return true;
  } catch (...) {
    return false;
  }
}

void raise_nested(const std::string& message) {
  try {
    throw;
  } catch (const Error& e) {
    e.raise_nested(message);
  } catch (...) {
    if (host_out_of_memory()) std::throw_with_nested(OutOfMemoryError(message));
    std::throw_with_nested(Error(message));
  }
}

std::string current_what() {
  try {
    throw;
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an exception that is not a std::exception";
  }
}

void rethrow_with_message(const std::exception& e, const std::string& message) {
  if (const auto* g = dynamic_cast<const Error*>(&e)) {
    // A cause nested in e stays nested in the new message's error (it was dropped).
    const auto* n = dynamic_cast<const std::nested_exception*>(&e);
    if (n && n->nested_ptr()) {
      try {
        std::rethrow_exception(n->nested_ptr());
      } catch (...) {
        g->raise_nested(message);
      }
    }
    g->with_message(message)->raise();
  }
  throw Error(message);
}

void rethrow_with_prefix(const std::string& prefix) {
  try {
    throw;
  } catch (const Error& e) {
    rethrow_with_message(e, prefix + e.what());
  } catch (const std::exception& e) {  // a standard library error (a thread not started)
    if (host_out_of_memory())
      std::throw_with_nested(
          OutOfMemoryError(prefix + "host allocation failed (" + e.what() + ")"));
    std::throw_with_nested(Error(prefix + e.what()));
  }
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

namespace detail {
int cpus_available() {
  // The cores this process may run on: its affinity mask (taskset, a launcher's pinning, a
  // container's cpuset), not every core of the machine.
  // The process's mask (its main thread's, which taskset and launchers set), not the calling
  // thread's: the count is taken once for the process, by whichever thread first asks, and a
  // thread pinned to one core made every later op single-threaded.
  cpu_set_t mask;
  CPU_ZERO(&mask);
  int cpus = sched_getaffinity(::getpid(), sizeof(mask), &mask) == 0 ? CPU_COUNT(&mask) : 0;
  if (cpus <= 0) cpus = static_cast<int>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));
  // A CPU quota (cgroup v2 cpu.max, as `docker --cpus` sets) caps it further.
  if (std::FILE* f = std::fopen("/sys/fs/cgroup/cpu.max", "r")) {
    char quota[32] = {0};
    long period = 0;
    if (std::fscanf(f, "%31s %ld", quota, &period) == 2 && std::strcmp(quota, "max") != 0 &&
        period > 0) {
      const long q = std::atol(quota);
      if (q > 0)
        cpus = std::min<int>(cpus, static_cast<int>(std::max(1L, (q + period - 1) / period)));
    }
    std::fclose(f);
  }
  return cpus;
}
}  // namespace detail

namespace {
int initial_threads() {
  // A count in [1, 4096]; anything else (a typo, 0, empty) is said once on stderr and the cores
  // available taken, since this runs inside whatever call first asks for the thread count.
  if (const char* env = std::getenv("GALLEY_NUM_THREADS"); env && *env) {
    if (const auto n = detail::whole_number(env, 1, 4096)) return int(*n);
    std::fprintf(stderr,
                 "galley: GALLEY_NUM_THREADS='%s' is not a thread count in [1, 4096]; using the "
                 "%d CPUs available\n",
                 env, detail::cpus_available());
  }
  return detail::cpus_available();
}
std::once_flag threads_once;
std::atomic<int> threads_setting{0};  // (set from any thread while others run ops)
}  // namespace

void set_num_threads(int n) {
  GALLEY_CHECK(n > 0, "set_num_threads: need at least one thread, got ", n);
  std::call_once(threads_once, [] {});
  threads_setting.store(n, std::memory_order_relaxed);
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
    if (threads_setting.load(std::memory_order_relaxed) == 0)
      threads_setting.store(initial_threads(), std::memory_order_relaxed);
  });
  return threads_setting.load(std::memory_order_relaxed);
}

}  // namespace galley
