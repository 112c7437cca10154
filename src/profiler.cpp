// The profiler: per-thread event buffers filled by RecordScopes, gathered at export into a Chrome
// trace or a per-name table. CUDA events time GPU ops where a CUDA build runs on a GPU.
#include "galley/profiler.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>
#include <unordered_map>

#include "galley/autograd.h"
#include "galley/error.h"
#include "src/runtime/device_memory.h"

#ifdef __linux__
#include <sys/syscall.h>
#include <unistd.h>
#endif
#ifdef GALLEY_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace galley::detail {
std::atomic<bool> profiler_active{false};
}  // namespace galley::detail

namespace galley::profiler {

namespace {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

uint64_t os_thread_id() {
#ifdef __linux__
  return static_cast<uint64_t>(::syscall(SYS_gettid));
#else
  return std::hash<std::thread::id>()(std::this_thread::get_id());
#endif
}

struct RawEvent {
  const char* name = "";
  EventKind kind = EventKind::Op;
  int64_t start_ns = 0, end_ns = 0, child_ns = 0;
  int64_t parent = -1;  // the event open around this one on the thread
  int64_t bytes = -1;
  std::string layer_path;
  std::vector<Shape> shapes;
  std::vector<DType> dtypes;
  int device = -1;  // CUDA device of ev_start/ev_end
  void* ev_start = nullptr;
  void* ev_end = nullptr;
};

// One thread's events for one profiler. Only its thread appends; readers copy under `mu`.
struct ThreadBuffer {
  std::mutex mu;
  std::vector<RawEvent> events;
  int64_t open = -1;  // innermost unfinished event
  uint64_t tid = 0;
  std::string name;
  bool record_shapes = false, cuda_events = false;
  bool closed = false;  // its profiler is gone (with its CUDA events); a scope still open ends here
  // While scopes are open in it: their count, and the buffer itself, so that it outlives its
  // profiler and the thread's later buffers until the last of them ends.
  int64_t open_scopes = 0;
  std::shared_ptr<ThreadBuffer> hold;
  uint64_t cuda_ref_devices = 0;  // bit d: device d is known to have its reference event
};

thread_local std::string tls_thread_name;
struct ThreadState {
  std::shared_ptr<ThreadBuffer> buffer;
  uint64_t generation = 0;
};
thread_local ThreadState tls;

const char* kind_name(EventKind k) {
  switch (k) {
    case EventKind::Op:
      return "op";
    case EventKind::Backward:
      return "backward";
    case EventKind::LoaderWait:
      return "dataloader";
    case EventKind::AllReduce:
      return "all_reduce";
    case EventKind::User:
      return "user";
  }
  return "?";
}

}  // namespace

struct Profiler::Impl {
  ProfilerOptions options;
  int64_t origin_ns = now_ns();
  uint64_t generation = 0;
  uint64_t main_tid = os_thread_id();
  std::vector<std::shared_ptr<ThreadBuffer>> buffers;  // guarded by registry_mu
  bool recording = false;                              // guarded by registry_mu
  // Per CUDA device: an event recorded and waited for when the device was first timed, and the
  // CPU time it completed at, to place GPU durations on the CPU time line.
  std::mutex cuda_mu;
  std::map<int, std::pair<void*, int64_t>> cuda_refs;

  ~Impl();
};

namespace {

std::mutex registry_mu;
Profiler::Impl* current = nullptr;           // the recording profiler, guarded by registry_mu
std::atomic<uint64_t> active_generation{0};  // current's generation, 0 when none
std::atomic<uint64_t> next_generation{1};

// This thread's buffer for the recording profiler, registered on first use (null when none).
ThreadBuffer* local_buffer() {
  const uint64_t gen = active_generation.load(std::memory_order_acquire);
  if (tls.buffer && tls.generation == gen) return tls.buffer.get();
  std::lock_guard<std::mutex> lock(registry_mu);
  if (!current) return nullptr;
  auto b = std::make_shared<ThreadBuffer>();
  b->tid = os_thread_id();
  b->name = tls_thread_name;
  b->record_shapes = current->options.record_shapes;
  b->cuda_events = current->options.cuda_events;
  b->events.reserve(1024);
  current->buffers.push_back(b);
  tls.buffer = std::move(b);  // a scope still open in an older buffer holds that one itself
  tls.generation = current->generation;
  return tls.buffer.get();
}

#ifdef GALLEY_HAVE_CUDA
// A new CUDA event (each recorded event has its own two, destroyed with its profiler), or null.
void* new_cuda_event() {
  cudaEvent_t e = nullptr;
  if (cudaEventCreate(&e) != cudaSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  return e;
}

// Places device `dev` on the CPU time line once per profiler (see Impl::cuda_refs).
void ensure_cuda_ref(Device dev) {
  std::lock_guard<std::mutex> reg(registry_mu);
  if (!current) return;
  std::lock_guard<std::mutex> lock(current->cuda_mu);
  if (current->cuda_refs.count(dev.index())) return;
  cudaEvent_t e = nullptr;
  if (cudaEventCreate(&e) != cudaSuccess) return (void)cudaGetLastError();
  cudaEventRecord(e, static_cast<cudaStream_t>(detail::compute_stream(dev)));
  cudaEventSynchronize(e);
  current->cuda_refs[dev.index()] = {e, now_ns()};
}
#endif

}  // namespace

Profiler::Impl::~Impl() {
#ifdef GALLEY_HAVE_CUDA
  for (auto& b : buffers) {
    std::lock_guard<std::mutex> lock(b->mu);
    b->closed = true;
    for (RawEvent& e : b->events) {
      if (e.ev_start) cudaEventDestroy(static_cast<cudaEvent_t>(e.ev_start));
      if (e.ev_end) cudaEventDestroy(static_cast<cudaEvent_t>(e.ev_end));
    }
  }
  for (auto& [dev, ref] : cuda_refs) cudaEventDestroy(static_cast<cudaEvent_t>(ref.first));
  (void)cudaGetLastError();
#endif
}

void RecordScope::begin(const char* name, std::initializer_list<const Tensor*> inputs,
                        EventKind kind, const std::string* layer_path, int64_t bytes) {
  ThreadBuffer* b = local_buffer();
  if (!b) return;
  RawEvent e;
  e.name = name;
  e.kind = kind;
  e.bytes = bytes;
  if (layer_path)
    e.layer_path = *layer_path;
  else if (kind == EventKind::Op)
    e.layer_path = autograd::current_layer_path();
  Device gpu = Device::cpu();
  for (const Tensor* t : inputs) {
    if (!t->defined()) continue;
    if (b->record_shapes) {
      e.shapes.push_back(t->shape());
      e.dtypes.push_back(t->dtype());
    }
    if (t->device().is_cuda()) gpu = t->device();
  }
#ifdef GALLEY_HAVE_CUDA
  if (b->cuda_events && gpu.is_cuda() && !detail::capturing(gpu)) {
    detail::CurrentDevice cur(gpu);
    const uint64_t bit = uint64_t{1} << (gpu.index() & 63);
    if (!(b->cuda_ref_devices & bit)) {
      ensure_cuda_ref(gpu);
      b->cuda_ref_devices |= bit;
    }
    e.ev_start = new_cuda_event();
    e.ev_end = new_cuda_event();
    if (e.ev_start && e.ev_end) {
      e.device = gpu.index();
      cudaEventRecord(static_cast<cudaEvent_t>(e.ev_start),
                      static_cast<cudaStream_t>(detail::compute_stream(gpu)));
    }
  }
#endif
  std::lock_guard<std::mutex> lock(b->mu);
#ifdef GALLEY_HAVE_CUDA
  if (b->closed) {  // the profiler ended meanwhile and destroyed its events: these are ours
    if (e.ev_start) cudaEventDestroy(static_cast<cudaEvent_t>(e.ev_start));
    if (e.ev_end) cudaEventDestroy(static_cast<cudaEvent_t>(e.ev_end));
    e.ev_start = e.ev_end = nullptr;
    e.device = -1;
  }
#endif
  if (b->open_scopes++ == 0) b->hold = tls.buffer;  // b itself (local_buffer gave it)
  e.parent = b->open;
  e.start_ns = now_ns();
  slot_ = static_cast<int64_t>(b->events.size());
  b->events.push_back(std::move(e));
  b->open = slot_;
  buffer_ = b;
}

void RecordScope::end() noexcept {
  auto* b = static_cast<ThreadBuffer*>(buffer_);
  const int64_t t = now_ns();
  std::shared_ptr<ThreadBuffer> last;  // the buffer's hold once its last scope ends: released
                                       // after the lock below (it may free the buffer)
  std::lock_guard<std::mutex> lock(b->mu);
  if (--b->open_scopes == 0) last = std::move(b->hold);
  RawEvent& e = b->events[slot_];
  e.end_ns = t;
  b->open = e.parent;
  if (e.parent >= 0) b->events[e.parent].child_ns += t - e.start_ns;
#ifdef GALLEY_HAVE_CUDA
  if (e.device >= 0 && !b->closed) {
    const Device gpu = Device::cuda(e.device);
    detail::CurrentDevice cur(gpu);
    if (cudaEventRecord(static_cast<cudaEvent_t>(e.ev_end),
                        static_cast<cudaStream_t>(detail::compute_stream(gpu))) != cudaSuccess) {
      (void)cudaGetLastError();
      e.device = -1;
    }
  }
#endif
}

void set_thread_name(const std::string& name) {
  tls_thread_name = name;
  if (tls.buffer) {
    std::lock_guard<std::mutex> lock(tls.buffer->mu);
    tls.buffer->name = name;
  }
}

Profiler::Profiler(ProfilerOptions options) : impl_(std::make_shared<Impl>()) {
  impl_->options = options;
  impl_->generation = next_generation.fetch_add(1);
  if (options.start) start();
}

Profiler::~Profiler() {
  stop();
}

void Profiler::start() {
  std::lock_guard<std::mutex> lock(registry_mu);
  GALLEY_CHECK(!current || current == impl_.get(),
               "Profiler: another profiler is recording; stop it before starting this one");
  current = impl_.get();
  impl_->recording = true;
  active_generation.store(impl_->generation, std::memory_order_release);
  detail::profiler_active.store(true, std::memory_order_relaxed);
}

void Profiler::stop() {
  std::lock_guard<std::mutex> lock(registry_mu);
  impl_->recording = false;
  if (current != impl_.get()) return;
  current = nullptr;
  detail::profiler_active.store(false, std::memory_order_relaxed);
  active_generation.store(0, std::memory_order_release);
}

bool Profiler::recording() const {
  std::lock_guard<std::mutex> lock(registry_mu);
  return impl_->recording;
}

std::vector<Event> Profiler::events() const {
  std::vector<std::shared_ptr<ThreadBuffer>> buffers;
  {
    std::lock_guard<std::mutex> lock(registry_mu);
    buffers = impl_->buffers;
  }
  std::map<int, std::pair<void*, int64_t>> refs;
  {
    std::lock_guard<std::mutex> lock(impl_->cuda_mu);
    refs = impl_->cuda_refs;
  }
  const double origin = static_cast<double>(impl_->origin_ns);
  std::vector<Event> out;
  for (auto& b : buffers) {
    std::lock_guard<std::mutex> lock(b->mu);
    for (const RawEvent& r : b->events) {
      if (r.end_ns == 0) continue;  // still running
      Event e;
      e.name = r.kind == EventKind::Backward ? std::string(r.name) + "_backward" : r.name;
      e.kind = r.kind;
      e.layer_path = r.layer_path;
      e.shapes = r.shapes;
      e.dtypes = r.dtypes;
      e.thread = b->tid;
      e.start_us = (r.start_ns - origin) / 1e3;
      e.end_us = (r.end_ns - origin) / 1e3;
      e.self_us = (r.end_ns - r.start_ns - r.child_ns) / 1e3;
      e.bytes = r.bytes;
#ifdef GALLEY_HAVE_CUDA
      auto ref = refs.find(r.device);
      if (r.device >= 0 && ref != refs.end()) {
        float ms = 0.f, from_ref = 0.f;
        auto* s = static_cast<cudaEvent_t>(r.ev_start);
        auto* f = static_cast<cudaEvent_t>(r.ev_end);
        if (cudaEventSynchronize(f) == cudaSuccess &&
            cudaEventElapsedTime(&ms, s, f) == cudaSuccess &&
            cudaEventElapsedTime(&from_ref, static_cast<cudaEvent_t>(ref->second.first), s) ==
                cudaSuccess) {
          e.device = r.device;
          e.cuda_us = ms * 1e3;
          e.cuda_start_us = (ref->second.second - origin) / 1e3 + from_ref * 1e3;
        } else {
          (void)cudaGetLastError();
        }
      }
#else
      (void)refs;
#endif
      out.push_back(std::move(e));
    }
  }
  return out;
}

namespace {

std::string thread_label(const ThreadBuffer& b, uint64_t main_tid, bool reduces) {
  if (!b.name.empty()) return b.name;
  if (b.tid == main_tid) return "main";
  if (reduces) return "DataParallel all-reduce " + std::to_string(b.tid);
  return "thread " + std::to_string(b.tid);
}

}  // namespace

void Profiler::export_chrome_trace(const std::string& path) const {
  using nlohmann::json;
  const std::vector<Event> evs = events();
  json trace = json::array();
  std::map<uint64_t, bool> reduces;  // CPU threads seen, and whether they all-reduce
  std::map<int, bool> gpus;
  for (const Event& e : evs) {
    reduces[e.thread] = reduces[e.thread] || e.kind == EventKind::AllReduce;
    json args = json::object();
    if (!e.layer_path.empty()) args["layer"] = e.layer_path;
    if (!e.shapes.empty()) {
      json shapes = json::array(), dtypes = json::array();
      for (size_t i = 0; i < e.shapes.size(); ++i) {
        shapes.push_back(e.shapes[i]);
        dtypes.push_back(dtype_name(e.dtypes[i]));
      }
      args["input_shapes"] = std::move(shapes);
      args["input_dtypes"] = std::move(dtypes);
    }
    if (e.bytes >= 0) args["bytes"] = e.bytes;
    if (e.cuda_us >= 0) args["cuda_us"] = e.cuda_us;
    trace.push_back({{"name", e.name},
                     {"cat", kind_name(e.kind)},
                     {"ph", "X"},
                     {"ts", e.start_us},
                     {"dur", e.end_us - e.start_us},
                     {"pid", 0},
                     {"tid", e.thread},
                     {"args", std::move(args)}});
    if (e.cuda_us >= 0) {
      gpus[e.device] = true;
      trace.push_back({{"name", e.name},
                       {"cat", "cuda"},
                       {"ph", "X"},
                       {"ts", e.cuda_start_us},
                       {"dur", e.cuda_us},
                       {"pid", 1},
                       {"tid", e.device},
                       {"args", {{"layer", e.layer_path}}}});
    }
  }
  auto meta = [](const char* what, int pid, uint64_t tid, const std::string& name) {
    return json{
        {"name", what}, {"ph", "M"}, {"pid", pid}, {"tid", tid}, {"args", {{"name", name}}}};
  };
  trace.push_back(meta("process_name", 0, 0, "galley CPU"));
  if (!gpus.empty()) trace.push_back(meta("process_name", 1, 0, "galley GPU"));
  {
    std::lock_guard<std::mutex> lock(registry_mu);
    for (auto& b : impl_->buffers) {
      auto it = reduces.find(b->tid);
      if (it == reduces.end()) continue;
      std::lock_guard<std::mutex> block(b->mu);
      trace.push_back(
          meta("thread_name", 0, b->tid, thread_label(*b, impl_->main_tid, it->second)));
    }
  }
  for (auto& [dev, _] : gpus)
    trace.push_back(meta("thread_name", 1, dev, "cuda:" + std::to_string(dev) + " compute stream"));
  // Serialised before the file is opened, so nothing in the events can leave it truncated; a name
  // that is not UTF-8 (a RecordScope's, a thread's) has its bad bytes replaced by U+FFFD.
  const std::string text = json{{"traceEvents", std::move(trace)}, {"displayTimeUnit", "ms"}}.dump(
      -1, ' ', false, json::error_handler_t::replace);
  std::ofstream f(path);
  GALLEY_CHECK(f, "export_chrome_trace: cannot open ", path, " for writing");
  f << text << '\n';
  f.close();  // (a short trace still sits in the stream's buffer until then: /dev/full took it)
  GALLEY_CHECK(!f.fail(), "export_chrome_trace: writing ", path, " failed");
}

KeyAverages Profiler::key_averages() const {
  std::unordered_map<std::string, KeyAverage> by_name;
  double self_sum = 0;
  for (const Event& e : events()) {
    KeyAverage& k = by_name[e.name];
    const double d = e.end_us - e.start_us;
    if (k.calls == 0) {
      k.name = e.name;
      k.cpu_min_us = d;
      k.cpu_max_us = d;
    }
    ++k.calls;
    k.cpu_total_us += d;
    k.self_cpu_us += e.self_us;
    k.cpu_min_us = std::min(k.cpu_min_us, d);
    k.cpu_max_us = std::max(k.cpu_max_us, d);
    if (e.cuda_us > 0) k.cuda_total_us += e.cuda_us;
    self_sum += e.self_us;
  }
  std::vector<KeyAverage> rows;
  rows.reserve(by_name.size());
  for (auto& [_, k] : by_name) rows.push_back(std::move(k));
  std::sort(rows.begin(), rows.end(), [](const KeyAverage& a, const KeyAverage& b) {
    return a.cpu_total_us != b.cpu_total_us ? a.cpu_total_us > b.cpu_total_us : a.name < b.name;
  });
  return KeyAverages(std::move(rows), self_sum);
}

KeyAverages::KeyAverages(std::vector<KeyAverage> rows, double self_sum_us)
    : rows_(std::move(rows)), self_sum_us_(self_sum_us) {}

namespace {
std::string time_str(double us) {
  char buf[32];
  if (us >= 1e6)
    std::snprintf(buf, sizeof buf, "%.3fs", us / 1e6);
  else if (us >= 1e3)
    std::snprintf(buf, sizeof buf, "%.3fms", us / 1e3);
  else
    std::snprintf(buf, sizeof buf, "%.3fus", us);
  return buf;
}
}  // namespace

std::string KeyAverages::table(size_t row_limit) const {
  size_t width = 4;
  const size_t n = row_limit == 0 ? rows_.size() : std::min(row_limit, rows_.size());
  for (size_t i = 0; i < n; ++i) width = std::max(width, rows_[i].name.size());
  width = std::min<size_t>(width, 48);
  const bool cuda = std::any_of(rows_.begin(), rows_.end(),
                                [](const KeyAverage& k) { return k.cuda_total_us > 0; });
  const double sum = self_sum_us_ > 0 ? self_sum_us_ : 1.0;
  std::string out;
  char line[512];
  auto rule = [&] {
    out += std::string(width + (cuda ? 124 : 112), '-');
    out += '\n';
  };
  rule();
  std::snprintf(line, sizeof line, "%-*s  %10s  %12s  %10s  %12s  %12s  %12s  %12s  %s%8s\n",
                int(width), "Name", "Self CPU %", "Self CPU", "CPU tot %", "CPU total", "CPU avg",
                "CPU min", "CPU max", cuda ? "   CUDA total " : "", "Calls");
  out += line;
  rule();
  for (size_t i = 0; i < n; ++i) {
    const KeyAverage& k = rows_[i];
    std::string cuda_col = cuda ? std::string(" ") + time_str(k.cuda_total_us) : "";
    if (cuda)
      cuda_col = std::string(13 - std::min<size_t>(13, cuda_col.size()), ' ') + cuda_col + " ";
    std::snprintf(line, sizeof line,
                  "%-*.*s  %9.2f%%  %12s  %9.2f%%  %12s  %12s  %12s  %12s  %s%8lld\n", int(width),
                  int(width), k.name.c_str(), 100.0 * k.self_cpu_us / sum,
                  time_str(k.self_cpu_us).c_str(), 100.0 * k.cpu_total_us / sum,
                  time_str(k.cpu_total_us).c_str(), time_str(k.cpu_avg_us()).c_str(),
                  time_str(k.cpu_min_us).c_str(), time_str(k.cpu_max_us).c_str(), cuda_col.c_str(),
                  static_cast<long long>(k.calls));
    out += line;
  }
  rule();
  out += "Self CPU time total: " + time_str(self_sum_us_) + "\n";
  return out;
}

}  // namespace galley::profiler
