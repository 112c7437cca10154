#pragma once
/// \file A per-op profiler: what ran, on which thread, for how long, inside which layer.
///
///   galley::profiler::Profiler prof({.record_shapes = true});
///   train_step();
///   prof.stop();
///   prof.export_chrome_trace("trace.json");    // Perfetto / chrome://tracing
///   std::cout << prof.key_averages().table();  // like torch.profiler's key_averages()
///
/// While a profiler records, every op (forward, and the backward of every recorded op), the
/// DataLoader's waits for a batch and DataParallel's all-reduce of each gradient bucket become
/// events with their thread and CPU start/end time; with record_shapes also the inputs' shapes
/// and dtypes. Ops on a GPU also get a pair of CUDA events on the compute stream, resolved into
/// GPU durations when the events are read. When no profiler records, the cost is one relaxed
/// atomic load per op.
#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "galley/tensor.h"

namespace galley::detail {
/// True while a Profiler records (read with one relaxed load on every op).
extern std::atomic<bool> profiler_active;
}  // namespace galley::detail

namespace galley::profiler {

/// True while a Profiler is recording, on any thread.
inline bool is_recording() {
  return detail::profiler_active.load(std::memory_order_relaxed);
}

/// What an event is.
enum class EventKind {
  Op,          ///< an op's forward (src/ops)
  Backward,    ///< the backward closure of a recorded op ("conv2d_backward")
  LoaderWait,  ///< the DataLoader's consumer waiting for (or, without workers, loading) a batch
  AllReduce,   ///< DataParallel's collective for one gradient bucket, on its reducer thread
  User,        ///< a RecordScope opened by the caller
};

/// Options of a Profiler.
struct ProfilerOptions {
  /// Keep every op's input shapes and dtypes.
  bool record_shapes = false;
  /// Time ops on a GPU with CUDA events too (ignored on the CPU).
  bool cuda_events = true;
  /// Start recording in the constructor; otherwise call start().
  bool start = true;
};

/// One finished event, times in microseconds since the profiler was constructed.
struct Event {
  std::string name{};  ///< the op's name, "<op>_backward" for a backward
  EventKind kind = EventKind::Op;
  std::string layer_path{};         ///< "features.3" (the op's forward layer for a backward), or ""
  std::vector<Shape> shapes{};      ///< input shapes (record_shapes)
  std::vector<DType> dtypes{};      ///< input dtypes (record_shapes)
  uint64_t thread = 0;              ///< the OS thread id
  double start_us = 0, end_us = 0;  ///< CPU wall time
  double self_us = 0;               ///< end - start less the events nested inside it
  int64_t bytes = -1;               ///< bytes moved (an all-reduce bucket), or -1
  int device = -1;                  ///< the CUDA device it was timed on, or -1
  double cuda_start_us = -1, cuda_us = -1;  ///< GPU start (aligned to CPU time) and duration
};

/// Statistics of every event with one name (torch.profiler's FunctionEventAvg).
struct KeyAverage {
  std::string name{};
  int64_t calls = 0;
  double cpu_total_us = 0;  ///< sum of durations, nested events included
  double self_cpu_us = 0;   ///< sum of durations, nested events excluded
  double cpu_min_us = 0, cpu_max_us = 0;
  double cuda_total_us = 0;  ///< sum of GPU durations (0 on the CPU)
  /// Average CPU time per call.
  double cpu_avg_us() const { return calls ? cpu_total_us / calls : 0.0; }
};

/// The per-name table of a profile, sorted by total CPU time (largest first).
class KeyAverages {
 public:
  KeyAverages() = default;
  explicit KeyAverages(std::vector<KeyAverage> rows, double self_sum_us);
  /// The rows, largest total CPU time first.
  const std::vector<KeyAverage>& rows() const { return rows_; }
  /// Sum of every event's self time (the time covered by events, counted once).
  double self_sum_us() const { return self_sum_us_; }
  /// A fixed-width table of the first `row_limit` rows (0: all): name, self CPU %, self CPU,
  /// CPU total %, CPU total, CPU avg, min, max, CUDA total, calls.
  std::string table(size_t row_limit = 0) const;
  /// table() with every row.
  std::string str() const { return table(); }

 private:
  std::vector<KeyAverage> rows_;
  double self_sum_us_ = 0;
};

/// Records events while alive (from construction unless options.start is false) or between
/// start() and stop(). One profiler records at a time in a process; starting a second one while
/// another records is an error.
class Profiler {
 public:
  explicit Profiler(ProfilerOptions options = {});
  ~Profiler();
  Profiler(const Profiler&) = delete;
  Profiler& operator=(const Profiler&) = delete;

  /// Starts (or resumes) recording; events accumulate across start/stop pairs.
  void start();
  /// Stops recording. Ops still running on other threads finish their events.
  void stop();
  /// True between start() and stop().
  bool recording() const;

  /// Every finished event so far, in start order per thread (waits for the GPU when some
  /// CUDA events are still pending).
  std::vector<Event> events() const;
  /// Writes the events as Chrome trace-event JSON ("ph":"X" events, ts/dur in microseconds,
  /// thread names as "M" events; GPU durations on a track per device). Opens in Perfetto.
  void export_chrome_trace(const std::string& path) const;
  /// The events grouped by name.
  KeyAverages key_averages() const;

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

/// Names the calling thread in traces ("loader worker 0"); a thread without a name is shown as
/// "thread <id>" (the one that constructed the profiler as "main").
void set_thread_name(const std::string& name);

/// While alive, one event with `name` on this thread (while a profiler records). The ops open
/// one at their entry; a caller may open its own (EventKind::User) to mark a region. `name` must
/// outlive the profiler (a string literal); `inputs` give the shapes with record_shapes.
class RecordScope {
 public:
  explicit RecordScope(const char* name, std::initializer_list<const Tensor*> inputs = {},
                       EventKind kind = EventKind::User, const std::string* layer_path = nullptr,
                       int64_t bytes = -1) {
    if (is_recording()) begin(name, inputs, kind, layer_path, bytes);
  }
  ~RecordScope() {
    if (slot_ >= 0) end();
  }
  RecordScope(const RecordScope&) = delete;
  RecordScope& operator=(const RecordScope&) = delete;

 private:
  void begin(const char* name, std::initializer_list<const Tensor*> inputs, EventKind kind,
             const std::string* layer_path, int64_t bytes);
  void end() noexcept;
  void* buffer_ = nullptr;
  int64_t slot_ = -1;
};

/// The scope each op opens at its entry: `profiler::OpScope prof("conv2d", {&x, &w, &b});`.
class OpScope : public RecordScope {
 public:
  explicit OpScope(const char* name, std::initializer_list<const Tensor*> inputs = {})
      : RecordScope(name, inputs, EventKind::Op) {}
};

}  // namespace galley::profiler
