#pragma once
/// \file A metrics log: one JSON object per line (JSON Lines) for each logged step or epoch.
///
///     galley::MetricsLogger metrics({.path = "run.jsonl", .memory_devices = {device}});
///     metrics.log({.step = step, .loss = loss, .learning_rate = optimizer.learning_rate(),
///                  .values = {{"grad_norm", norm}, {"phase", "warmup"}}});
///     metrics.log({.event = "epoch", .step = step, .epoch = epoch, .accuracy = test_accuracy});
///
/// writes lines such as
///
///     {"time":"2025-06-01T10:11:12.345Z","elapsed_s":12.5,"event":"step","step":300,
///      "loss":0.41,"learning_rate":0.001,"host_rss_bytes":412319744,"grad_norm":1.7,
///      "phase":"warmup"}
///
/// (one line in the file). Every line has `time` (ISO 8601, UTC, milliseconds), `elapsed_s`
/// (seconds since the logger was made, on a steady clock) and `event`; then the fields of the
/// record that are set, the memory in use, and the user values in the order given.
///
/// JSON has no NaN or infinity. A value that is not finite is written as `null`, and the line
/// gains `"nonfinite": {"<key>": "NaN" | "Infinity" | "-Infinity"}` naming each such key, so
/// the line stays valid JSON for every parser and the value is not lost (Python's
/// `float("Infinity")` reads the spelling back).
///
/// scripts/plot-metrics.py LOG.jsonl OUT.png draws loss, accuracy and throughput curves from it.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "galley/device.h"

namespace galley {

/// A user value in a metrics line: a number, a whole number, a truth value or a string.
/// Converts implicitly, so `{"grad_norm", 1.7}`, `{"tokens", n}`, `{"phase", "warmup"}` all
/// work in MetricsRecord::values.
class MetricValue {
 public:
  /// What the value holds.
  enum class Kind { Number, Integer, Unsigned, Boolean, String };

  /// A number (written as a JSON number; `null` plus a `nonfinite` entry when not finite).
  MetricValue(double v) : kind_(Kind::Number), number_(v) {}
  /// A number from a float.
  MetricValue(float v) : MetricValue(static_cast<double>(v)) {}
  /// A whole number: Kind::Integer, or Kind::Unsigned for an unsigned value above INT64_MAX
  /// (written exactly, as JSON numbers have no range).
  template <typename T,
            std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool>, int> = 0>
  MetricValue(T v) {
    if constexpr (std::is_unsigned_v<T>) {
      if (static_cast<uint64_t>(v) > static_cast<uint64_t>(INT64_MAX)) {
        kind_ = Kind::Unsigned;
        unsigned_ = static_cast<uint64_t>(v);
        return;
      }
    }
    kind_ = Kind::Integer;
    integer_ = static_cast<int64_t>(v);
  }
  /// A truth value.
  MetricValue(bool v) : kind_(Kind::Boolean), boolean_(v) {}
  /// A string.
  MetricValue(const char* v) : kind_(Kind::String), string_(v) {}
  /// A string.
  MetricValue(std::string v) : kind_(Kind::String), string_(std::move(v)) {}

  /// What the value holds.
  Kind kind() const { return kind_; }
  /// The number (Kind::Number).
  double number() const { return number_; }
  /// The whole number (Kind::Integer).
  int64_t integer() const { return integer_; }
  /// The whole number above INT64_MAX (Kind::Unsigned).
  uint64_t unsigned_integer() const { return unsigned_; }
  /// The truth value (Kind::Boolean).
  bool boolean() const { return boolean_; }
  /// The string (Kind::String).
  const std::string& string() const { return string_; }

 private:
  Kind kind_ = Kind::Integer;
  double number_ = 0;
  int64_t integer_ = 0;
  uint64_t unsigned_ = 0;
  bool boolean_ = false;
  std::string string_;
};

/// One line of a metrics log. Fields left unset are left out of the line.
struct MetricsRecord {
  /// What the line describes: "step" (the default), "epoch", or any name the program uses
  /// (e.g. "eval"); not empty.
  std::string event = "step";
  /// Optimizer steps taken so far.
  std::optional<int64_t> step{};
  /// The epoch (counted as the program counts it).
  std::optional<int64_t> epoch{};
  /// A loss (e.g. the mean training loss since the last line).
  std::optional<double> loss{};
  /// An accuracy in [0, 1]; which one (training, test) is the program's to say, through
  /// `event` or its documentation.
  std::optional<double> accuracy{};
  /// The learning rate in force.
  std::optional<double> learning_rate{};
  /// Training throughput in examples per second.
  std::optional<double> samples_per_s{};
  /// The share of the time the training loop waited for data (LoaderStats::starvation()).
  std::optional<double> starvation{};
  /// Anything else, written as top-level keys in this order. Keys must be non-empty, distinct,
  /// and not one of the logger's own keys (time, elapsed_s, event, step, epoch, loss, accuracy,
  /// learning_rate, samples_per_s, starvation, host_rss_bytes, gpu_memory, nonfinite).
  std::vector<std::pair<std::string, MetricValue>> values{};
};

/// Options of MetricsLogger.
struct MetricsLoggerOptions {
  /// The file to write (required). Its directory must exist.
  std::string path{};
  /// Add to the end of an existing file (a resumed run continues its log); false starts the
  /// file afresh.
  bool append = true;
  /// Devices whose allocator statistics (galley::memory_stats) go into every line as
  /// `"gpu_memory": {"cuda:0": {"allocated": B, "reserved": B, "peak_allocated": B}}`, in
  /// bytes. CPU devices are skipped, so a program can pass its training device whatever it is;
  /// a GPU that does not exist is an error.
  std::vector<Device> memory_devices{};
  /// Record the process's resident memory as `host_rss_bytes` (read from /proc/self/statm;
  /// left out where that file does not exist).
  bool host_memory = true;
};

/// Writes a metrics log: one JSON object per log() call, one line each (see the file comment
/// for the format).
///
/// Each line is built in memory and handed to the operating system with a single write() on a
/// file opened for appending, before log() returns: a crash of the program loses at most the
/// line being written, and several loggers (threads or processes) appending to one file do not
/// mix their lines. There is no fsync, so log() costs microseconds and never waits for the
/// disk. A file that ends in a torn line (a crash mid-write) gets a newline first, so the next
/// line starts clean. log() is safe to call from several threads.
///
/// Errors (the file cannot be opened, a write fails, a record is malformed) raise galley::Error
/// naming the file; catch it around log() to keep training when the log is not essential.
/// The logger is move-only; a moved-from logger may only be destroyed or assigned to.
class MetricsLogger {
 public:
  /// Validates the options (a path; GPUs that exist) and opens the file, creating it if
  /// needed.
  explicit MetricsLogger(MetricsLoggerOptions options);
  ~MetricsLogger();
  MetricsLogger(MetricsLogger&&) noexcept;
  MetricsLogger& operator=(MetricsLogger&&) noexcept;
  MetricsLogger(const MetricsLogger&) = delete;
  MetricsLogger& operator=(const MetricsLogger&) = delete;

  /// Writes one line for `record`, with the time stamps and memory figures added.
  void log(const MetricsRecord& record);

  /// The file written.
  const std::string& path() const;
  /// Lines this logger has written.
  size_t lines_written() const;
  /// The options in force.
  const MetricsLoggerOptions& options() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace galley
