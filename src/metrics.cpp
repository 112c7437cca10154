// MetricsLogger: JSON lines appended with one write() each.
#include "galley/metrics.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <mutex>
#include <nlohmann/json.hpp>

#include "galley/error.h"
#include "galley/runtime/memory.h"
#include "src/utf8.h"

namespace galley {

namespace {

using Json = nlohmann::ordered_json;

// The keys the logger writes itself; user values may not take them.
constexpr const char* kReservedKeys[] = {
    "time",           "elapsed_s",  "event",         "step",          "epoch",
    "loss",           "accuracy",   "learning_rate", "samples_per_s", "starvation",
    "host_rss_bytes", "gpu_memory", "nonfinite"};

bool is_reserved(const std::string& key) {
  return std::any_of(std::begin(kReservedKeys), std::end(kReservedKeys),
                     [&](const char* k) { return key == k; });
}

// "2025-06-01T10:11:12.345Z"
std::string iso8601_utc(std::chrono::system_clock::time_point t) {
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count();
  const std::time_t secs = static_cast<std::time_t>(ms / 1000);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[64];
  const size_t n = std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  std::snprintf(buf + n, sizeof buf - n, ".%03dZ", static_cast<int>(ms % 1000));
  return buf;
}

// Resident set size of this process in bytes, or -1 where /proc/self/statm is absent.
int64_t host_rss_bytes() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (!f) return -1;
  long long size = 0, resident = 0;
  const int n = std::fscanf(f, "%lld %lld", &size, &resident);
  std::fclose(f);
  if (n != 2) return -1;
  return static_cast<int64_t>(resident) * static_cast<int64_t>(sysconf(_SC_PAGESIZE));
}

const char* nonfinite_name(double v) {
  if (std::isnan(v)) return "NaN";
  return v > 0 ? "Infinity" : "-Infinity";
}

// Adds key: v to `line`, or key: null and an entry in `nonfinite` when v is NaN or infinite.
void put_number(Json& line, Json& nonfinite, const std::string& key, double v) {
  if (std::isfinite(v)) {
    line[key] = v;
  } else {
    line[key] = nullptr;
    nonfinite[key] = nonfinite_name(v);
  }
}

// Writes all of `bytes`, counting in `done` what is out even when it throws.
void write_all(int fd, const std::string& bytes, const std::string& path, size_t& done) {
  const char* p = bytes.data();
  size_t left = bytes.size();
  done = 0;
  while (left > 0) {
    const ssize_t w = ::write(fd, p, left);
    if (w < 0 && errno == EINTR) continue;
    GALLEY_CHECK(w > 0, "MetricsLogger: writing '", path,
                 "' failed: ", w < 0 ? std::strerror(errno) : "nothing was written");
    p += w;
    left -= static_cast<size_t>(w);
    done += static_cast<size_t>(w);
  }
}

}  // namespace

struct MetricsLogger::Impl {
  MetricsLoggerOptions options;
  std::vector<Device> gpus;  // the CUDA devices of options.memory_devices, without repeats
  int fd = -1;
  std::chrono::steady_clock::time_point start;
  size_t lines = 0;
  // A write failed part-way: the next line starts with a newline so that it is whole.
  bool torn = false;
  std::mutex mutex;

  ~Impl() {
    if (fd >= 0) ::close(fd);
  }
};

MetricsLogger::MetricsLogger(MetricsLoggerOptions options) : impl_(std::make_unique<Impl>()) {
  GALLEY_CHECK(!options.path.empty(),
               "MetricsLogger: options.path is empty; name the file to "
               "write the metrics to");
  for (const Device& d : options.memory_devices) {
    if (!d.is_cuda()) continue;
    GALLEY_CHECK(d.index() >= 0 && d.index() < cuda_device_count(), "MetricsLogger: ", d.str(),
                 " in options.memory_devices does not exist (", cuda_device_count(),
                 " CUDA device(s) here)");
    if (std::find(impl_->gpus.begin(), impl_->gpus.end(), d) == impl_->gpus.end())
      impl_->gpus.push_back(d);
  }
  const std::string& path = options.path;
  // Opened without blocking: a named pipe that no process reads is an error, not a constructor
  // that waits for ever (writes block from then on, as to any pipe).
  const int flags =
      O_WRONLY | O_CREAT | O_CLOEXEC | O_NONBLOCK | (options.append ? O_APPEND : O_TRUNC);
  int fd = ::open(path.c_str(), flags, 0644);
  GALLEY_CHECK(fd >= 0, "MetricsLogger: cannot open '", path, "' for ",
               options.append ? "appending" : "writing", ": ",
               errno == ENXIO ? "it is a named pipe that no process reads" : std::strerror(errno));
  if (const int fl = ::fcntl(fd, F_GETFL); fl >= 0) ::fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
  impl_->fd = fd;
  if (!options.append) {
    // O_TRUNC without O_APPEND writes at the start; appending from here on keeps lines of
    // other writers of the same file whole.
    const int fl = ::fcntl(fd, F_GETFL);
    if (fl >= 0) ::fcntl(fd, F_SETFL, fl | O_APPEND);
  }
  struct stat st {};
  GALLEY_CHECK(::fstat(fd, &st) == 0, "MetricsLogger: cannot stat '", path,
               "': ", std::strerror(errno));
  GALLEY_CHECK(!S_ISDIR(st.st_mode), "MetricsLogger: '", path, "' is a directory");
  if (S_ISREG(st.st_mode) && st.st_size > 0) {
    // A line torn by a crash would swallow the first new one: end it first.
    char last = '\n', first = '{';
    const int rfd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (rfd >= 0) {
      if (::pread(rfd, &last, 1, st.st_size - 1) != 1) last = '\n';
      if (::pread(rfd, &first, 1, 0) != 1) first = '{';
      ::close(rfd);
    }
    // Appending to a file of something else (a checkpoint given by mistake) would change it.
    GALLEY_CHECK(!options.append || first == '{', "MetricsLogger: '", path,
                 "' holds something other than JSON lines; appending would change it");
    impl_->torn = last != '\n';
  }
  impl_->options = std::move(options);
  impl_->start = std::chrono::steady_clock::now();
}

MetricsLogger::~MetricsLogger() = default;
MetricsLogger::MetricsLogger(MetricsLogger&&) noexcept = default;
MetricsLogger& MetricsLogger::operator=(MetricsLogger&&) noexcept = default;

void MetricsLogger::log(const MetricsRecord& r) {
  GALLEY_CHECK(impl_, "MetricsLogger::log: the logger was moved from");
  Impl& m = *impl_;
  const std::string& path = m.options.path;
  GALLEY_CHECK(!r.event.empty(), "MetricsLogger: record for '", path, "' has an empty event");
  for (size_t i = 0; i < r.values.size(); ++i) {
    const std::string& key = r.values[i].first;
    GALLEY_CHECK(!key.empty(), "MetricsLogger: user value ", i, " for '", path,
                 "' has an empty key");
    // Refused rather than repaired: two keys that differ in their invalid bytes would repair to
    // one key and a JSON reader would keep only one of the values.
    GALLEY_CHECK(detail::valid_utf8(key), "MetricsLogger: user value ", i, " for '", path,
                 "' has a key that is not valid UTF-8");
    GALLEY_CHECK(!is_reserved(key), "MetricsLogger: user value '", key, "' for '", path,
                 "' takes one of the logger's own keys; set the record's field or rename it");
    for (size_t j = 0; j < i; ++j)
      GALLEY_CHECK(r.values[j].first != key, "MetricsLogger: user value '", key, "' for '", path,
                   "' is given twice");
  }

  // The line is built under the lock from its time on: a logger's lines are in time order
  // whichever threads log.
  std::lock_guard<std::mutex> lock(m.mutex);
  const auto now_wall = std::chrono::system_clock::now();
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - m.start).count();
  Json line = Json::object();
  Json nonfinite = Json::object();
  line["time"] = iso8601_utc(now_wall);
  line["elapsed_s"] = std::round(elapsed * 1e6) / 1e6;
  line["event"] = r.event;
  if (r.step) line["step"] = *r.step;
  if (r.epoch) line["epoch"] = *r.epoch;
  const std::pair<const char*, const std::optional<double>*> numbers[] = {
      {"loss", &r.loss},
      {"accuracy", &r.accuracy},
      {"learning_rate", &r.learning_rate},
      {"samples_per_s", &r.samples_per_s},
      {"starvation", &r.starvation}};
  for (const auto& [key, v] : numbers)
    if (*v) put_number(line, nonfinite, key, **v);
  if (m.options.host_memory) {
    const int64_t rss = host_rss_bytes();
    if (rss >= 0) line["host_rss_bytes"] = rss;
  }
  if (!m.gpus.empty()) {
    Json gpu = Json::object();
    for (const Device& d : m.gpus) {
      const MemoryStats s = memory_stats(d);
      gpu[d.str()] = {{"allocated", s.allocated},
                      {"reserved", s.reserved},
                      {"peak_allocated", s.peak_allocated}};
    }
    line["gpu_memory"] = std::move(gpu);
  }
  for (const auto& [key, v] : r.values) {
    switch (v.kind()) {
      case MetricValue::Kind::Number:
        put_number(line, nonfinite, key, v.number());
        break;
      case MetricValue::Kind::Integer:
        line[key] = v.integer();
        break;
      case MetricValue::Kind::Unsigned:
        line[key] = v.unsigned_integer();
        break;
      case MetricValue::Kind::Boolean:
        line[key] = v.boolean();
        break;
      case MetricValue::Kind::String:
        line[key] = v.string();
        break;
    }
  }
  if (!nonfinite.empty()) line["nonfinite"] = std::move(nonfinite);

  // Invalid UTF-8 in a user string becomes U+FFFD rather than an exception mid-training.
  std::string text = line.dump(-1, ' ', false, Json::error_handler_t::replace);
  text += '\n';
  if (m.torn) text.insert(text.begin(), '\n');
  size_t done = 0;
  try {
    write_all(m.fd, text, path, done);
  } catch (...) {
    if (done > 0) m.torn = text[done - 1] != '\n';
    throw;
  }
  m.torn = false;
  ++m.lines;
}

const std::string& MetricsLogger::path() const {
  return impl_->options.path;
}

size_t MetricsLogger::lines_written() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->lines;
}

const MetricsLoggerOptions& MetricsLogger::options() const {
  return impl_->options;
}

}  // namespace galley
