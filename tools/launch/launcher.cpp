#include "launcher.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "gpu_monitor.h"
#include "machine.h"
#include "process.h"
#include "scheduler.h"

namespace galley::launch {
namespace {

using Clock = std::chrono::steady_clock;
using Json = nlohmann::ordered_json;

// The signals that stop the launcher: each stops every job (the first with the grace period,
// the next at once). SIGHUP and SIGQUIT come from a closed terminal or Ctrl-\, and their default
// action would end the launcher without its summary and leave the jobs, which run in process
// groups of their own, to run on unseen.
constexpr int kStopSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};

// Signal handlers only write the signal's number here; the main loop polls the read end and
// handles every stop signal it reads, in order (a single "last signal" slot had counted two
// that came together as one). A SIGCHLD is written only when none is waiting to be read, so
// that many children ending at once cannot fill the pipe and crowd out a stop signal.
int g_signal_pipe[2] = {-1, -1};
std::atomic<bool> g_child_pending{false};
static_assert(std::atomic<bool>::is_always_lock_free, "used in a signal handler");
// The launcher's pid: a child between fork and exec still runs this handler, in the launcher's
// process group until it leaves it, and a Ctrl-C to that group (or Slurm signalling every
// process) would otherwise be counted twice: "a second signal, kill every job now".
pid_t g_launcher_pid = 0;

void on_signal(int sig) {
  const int saved = errno;
  if (getpid() != g_launcher_pid) return;  // a forked child's copy of the handler
  if (sig != SIGCHLD || !g_child_pending.exchange(true)) {
    const char byte = char(sig);
    [[maybe_unused]] ssize_t n = write(g_signal_pipe[1], &byte, 1);
  }
  errno = saved;
}

// Whether any process the launcher may signal is left in process group `group`. One it may not
// signal (a set-user-ID program) is beyond its reach, as a process in another group is.
bool group_alive(pid_t group) {
  return kill(-group, 0) == 0;
}

// How long the launcher waits for SIGKILLed processes to be gone: they die at once unless stuck
// in the kernel (a hung file system or driver), which no signal can hurry.
constexpr auto kKilledWait = std::chrono::seconds(2);

double seconds(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

double rounded(double x) {
  return std::round(x * 1000.0) / 1000.0;
}

// Local wall-clock time with milliseconds and UTC offset: 2024-05-01T10:00:00.123+0200.
std::string timestamp() {
  const auto now = std::chrono::system_clock::now();
  const time_t t = std::chrono::system_clock::to_time_t(now);
  const int ms = int(
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000);
  struct tm tm {};
  localtime_r(&t, &tm);
  char date[32], zone[8];
  strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%S", &tm);
  strftime(zone, sizeof zone, "%z", &tm);
  char out[48];
  snprintf(out, sizeof out, "%s.%03d%s", date, ms, zone);
  return out;
}

std::string join(const std::vector<int>& ids, const char* sep = ",") {
  std::string s;
  for (std::size_t i = 0; i < ids.size(); ++i) s += (i ? sep : "") + std::to_string(ids[i]);
  return s;
}

std::string format_number(double x) {
  std::ostringstream out;
  out << x;
  return out.str();
}

std::string format_duration(double s) {
  char buf[32];
  if (s < 60) {
    snprintf(buf, sizeof buf, "%.1fs", s);
  } else if (s < 3600) {
    snprintf(buf, sizeof buf, "%dm%02ds", int(s) / 60, int(s) % 60);
  } else {
    snprintf(buf, sizeof buf, "%dh%02dm", int(s) / 3600, (int(s) / 60) % 60);
  }
  return buf;
}

namespace fs = std::filesystem;

// JSON as text. Bytes that are not UTF-8 (a command-line argument, a path) are written as
// U+FFFD: nlohmann's default throws on them, which would stop the launcher with its jobs.
std::string to_text(const Json& json, int indent = -1) {
  return json.dump(indent, ' ', false, Json::error_handler_t::replace);
}

// Why `path` could not be written, or "" when it can, found without creating or changing
// anything (so that --check can say it, and a bad path is found before any file is truncated):
// an existing file must be writable and not a directory; otherwise the nearest existing
// directory above it must let the launcher create what is missing.
std::string why_not_writable(const fs::path& path) {
  if (path.empty()) return "the path is empty";
  if (!path.has_filename()) return "it names a directory";
  std::error_code ec;
  const auto status = fs::status(path, ec);
  // (A missing file is not_found; a name too long or a loop of links cannot be looked at.)
  if (status.type() == fs::file_type::none) return ec.message();
  if (fs::exists(status)) {
    if (fs::is_directory(status)) return "it is a directory";
    if (access(path.c_str(), W_OK) != 0) return strerror(errno);
    return "";
  }
  for (fs::path dir = path.parent_path();; dir = dir.parent_path()) {
    if (dir.empty()) dir = ".";
    const auto dir_status = fs::status(dir, ec);
    if (dir_status.type() == fs::file_type::none) return "'" + dir.string() + "': " + ec.message();
    if (fs::exists(dir_status)) {
      if (!fs::is_directory(dir_status)) return "'" + dir.string() + "' is not a directory";
      if (access(dir.c_str(), W_OK | X_OK) != 0)
        return "cannot create files in '" + dir.string() + "': " + strerror(errno);
      return "";
    }
    if (dir == dir.parent_path() || dir == ".")
      return "'" + dir.string() + "' does not exist";  // a vanished working directory
  }
}

// `path` with the symbolic links of its last component followed as far as they lead, also to a
// file that does not exist yet (which fopen would create there): the file writing `path` writes.
// (weakly_canonical resolves links that lead to existing files only.)
fs::path followed(fs::path path) {
  std::error_code ec;
  for (int hops = 0; hops < 40 && fs::is_symlink(fs::symlink_status(path, ec)); ++hops) {
    const fs::path target = fs::read_symlink(path, ec);
    if (ec) break;
    path = target.is_absolute() ? target : path.parent_path() / target;
  }
  return path;
}

void make_parent_dirs(const std::string& path, const std::string& what) {
  const auto parent = followed(path).parent_path();
  if (parent.empty()) return;
  std::error_code ec;
  fs::create_directories(parent, ec);
  if (ec)
    throw LaunchError("cannot create the directory '" + parent.string() + "' of " + what + " '" +
                      path + "': " + ec.message());
}

// Opens `path` for writing, truncated ("w") or appended to ("a").
std::FILE* open_for_writing(const std::string& path, const std::string& what, const char* mode) {
  make_parent_dirs(path, what);
  // Opened without blocking: a named pipe that no process reads is an error here, not a launcher
  // waiting for ever before its first job (blocking writes from then on).
  const bool append = mode[0] == 'a';
  const int fd =
      ::open(path.c_str(),
             O_WRONLY | O_CREAT | O_CLOEXEC | O_NONBLOCK | (append ? O_APPEND : O_TRUNC), 0644);
  if (fd < 0)
    throw LaunchError("cannot write " + what + " '" + path + "': " +
                      (errno == ENXIO ? std::string("it is a named pipe that no process reads")
                                      : std::string(strerror(errno))));
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  std::FILE* f = ::fdopen(fd, mode);
  if (!f) {
    const int err = errno;
    ::close(fd);
    throw LaunchError("cannot write " + what + " '" + path + "': " + strerror(err));
  }
  return f;
}

// One file the launcher writes, and what it is for ("the summary", "the log of job 'a'").
struct Output {
  std::string path;
  std::string what;
};

enum class Phase { kQueued, kRunning, kStopping, kBackoff, kDone };

const char* phase_name(Phase p) {
  switch (p) {
    case Phase::kQueued:
      return "queued";
    case Phase::kRunning:
      return "running";
    case Phase::kStopping:
      return "stopping";
    case Phase::kBackoff:
      return "backoff";
    case Phase::kDone:
      return "done";
  }
  return "?";
}

struct JobState {
  JobSpec spec;
  std::size_t id = 0;  // scheduler id
  std::string log_path;
  std::FILE* log = nullptr;  // open from the job's first start until it is done
  bool log_lost = false;     // a write to the log failed: said once, not reopened
  Phase phase = Phase::kQueued;
  pid_t pid = -1;
  int out_fd = -1, err_fd = -1;
  std::string out_buf, err_buf;
  std::string last_line;
  int attempts = 0, restarts = 0;
  std::vector<int> gpus;  // scheduler ids (indexes into the allocation's GPUs when restricted)
  std::string visible;    // the CUDA_VISIBLE_DEVICES they map to
  double share = 0;
  std::vector<int> cpus;  // the CPUs the job is pinned to
  double cpu_s = 0;       // user + system time of all attempts, with waited-for descendants
  Clock::time_point attempt_start, first_start, end, last_output, kill_at, restart_at, killed_at;
  bool started = false, hung = false, killed = false;
  // A job being stopped whose main process has ended while other processes of its group live
  // on: how the main process ended, kept until the group is empty or killed (see reap).
  std::optional<std::pair<int, rusage>> main_ended;
  double run_s = 0;
  std::string status = "queued";
  std::optional<int> exit_code;
  int term_signal = 0;
  std::string message;
};

// One GPU the scheduler hands out: its scheduler id, how a child's CUDA_VISIBLE_DEVICES names
// it, and its NVML index when NVML knows it.
struct GpuSlot {
  int id = 0;
  std::string visible;
  std::optional<int> nvml_index;
};

struct GpuStats {
  double util_sum = 0, mem_sum = 0;
  long mem_max = 0;
  long samples = 0;
};

}  // namespace

struct Launcher::Impl {
  LauncherOptions options;
  std::vector<JobState> jobs;
  std::unique_ptr<Scheduler> scheduler;
  GpuMonitor monitor;
  bool fake_inventory = false;
  MachineProbe probe;
  Allocation allocation;
  bool fake_cpus = false;
  std::vector<GpuSlot> slots;
  std::vector<std::string> gpu_notes;
  std::vector<int> sample_ids;  // NVML indexes
  std::string sampling_note;
  std::map<int, GpuStats> gpu_stats;

  std::FILE* event_log = nullptr;
  // The soft limit on open files jobs get, where the launcher raised its own.
  std::optional<rlim_t> job_open_files;
  Clock::time_point t0;
  bool shutting_down = false;
  std::vector<pid_t> ended_groups;  // process groups of ended attempts, killed at their end
  int stop_signal = 0;
  bool table = false;
  int table_lines = 0;
  std::vector<std::string> pending_lines;
  Clock::time_point next_sample, next_draw;

  ~Impl() {
    if (event_log) std::fclose(event_log);
    for (auto& job : jobs)
      if (job.log) std::fclose(job.log);
  }

  // --- events --------------------------------------------------------------------------------

  void say(const std::string& line) {
    if (table) {
      pending_lines.push_back(line);
    } else {
      std::cout << line << '\n' << std::flush;
    }
  }

  void emit(const std::string& event, const JobState* job, Json extra, const std::string& human) {
    const double elapsed = seconds(Clock::now() - t0);
    Json record;
    record["time"] = timestamp();
    record["elapsed_s"] = rounded(elapsed);
    record["event"] = event;
    if (job) record["job"] = job->spec.name;
    for (auto& [key, value] : extra.items()) record[key] = value;
    if (event_log) {
      std::fputs((to_text(record) + "\n").c_str(), event_log);
      if (std::fflush(event_log) != 0 || std::ferror(event_log))
        lost(event_log, "the event log", options.event_log_path(), errno);
    }
    char prefix[32];
    snprintf(prefix, sizeof prefix, "[%8.2fs] ", elapsed);
    say(prefix + human);
  }

  void log_line(JobState& job, const char* tag, const std::string& line) {
    if (!job.log) return;
    // The line's bytes as they came, NUL bytes included (%s would stop at the first).
    std::fprintf(job.log, "%s [%s] ", timestamp().c_str(), tag);
    std::fwrite(line.data(), 1, line.size(), job.log);
    std::fputc('\n', job.log);
    if (std::ferror(job.log)) lose_log(job, errno);
  }

  // A file that could not be written (a full disk; `err` the failed write's errno): said once,
  // then closed and written no more; the jobs go on.
  void lost(std::FILE*& f, const std::string& what, const std::string& path, int err) {
    std::fclose(f);
    f = nullptr;
    std::cerr << "galley-launch: writing " << what << " '" << path << "' failed ("
              << std::strerror(err) << "); its later lines are lost\n";
  }

  void lose_log(JobState& job, int err) {
    lost(job.log, log_what(job), job.log_path, err);
    job.log_lost = true;
  }
  // Writes out what the job's log holds buffered; a failure loses the log (lose_log).
  void flush_log(JobState& job) {
    if (job.log && (std::fflush(job.log) != 0 || std::ferror(job.log))) lose_log(job, errno);
  }

  std::string log_what(const JobState& job) const {
    return "the log of job '" + job.spec.name + "'";
  }

  // Every file the launcher writes.
  std::vector<Output> outputs() const {
    std::vector<Output> list{{options.event_log_path(), "the event log"},
                             {options.summary_path(), "the summary"}};
    for (const auto& job : jobs) list.push_back({job.log_path, log_what(job)});
    return list;
  }

  // Refuses, before anything is created or truncated, an output that cannot be written and two
  // outputs that are one file (each was opened on its own and truncated the other's lines).
  // Paths are compared after resolving symbolic links (also one to a file not there yet) and
  // "..", and existing files also by device and inode (hard links). Anything but a regular file
  // (/dev/null, a pipe such as /dev/stderr under `| tee`) may be shared: writing to it truncates
  // nothing.
  void check_outputs() const {
    std::map<std::string, const Output*> by_path;
    std::map<std::pair<dev_t, ino_t>, const Output*> by_inode;
    const auto list = outputs();
    // The job files (by device and inode): an output there would replace the jobs with a log.
    std::map<std::pair<dev_t, ino_t>, std::string> job_files;
    for (const auto& job : jobs)
      if (struct stat st{}; !job.spec.file.empty() && ::stat(job.spec.file.c_str(), &st) == 0)
        job_files.emplace(std::pair(st.st_dev, st.st_ino), job.spec.file);
    for (const auto& out : list) {
      const fs::path real = followed(out.path);  // what writing out.path writes
      if (const std::string why = why_not_writable(real); !why.empty())
        throw LaunchError("cannot write " + out.what + " '" + out.path + "': " + why);
      struct stat st {};
      const bool exists = ::stat(real.c_str(), &st) == 0;
      if (exists && !S_ISREG(st.st_mode)) continue;  // a device or a pipe: nothing truncated
      if (auto it = job_files.find(std::pair(st.st_dev, st.st_ino));
          exists && it != job_files.end())
        throw LaunchError(out.what + " '" + out.path + "' is the job file '" + it->second +
                          "'; give it a path of its own");
      std::error_code ec;
      fs::path key = fs::weakly_canonical(real, ec);
      if (ec) key = fs::absolute(real, ec).lexically_normal();
      const Output* other = nullptr;
      if (auto [it, added] = by_path.emplace(key.string(), &out); !added) other = it->second;
      if (exists && !other)
        if (auto [it, added] = by_inode.emplace(std::pair(st.st_dev, st.st_ino), &out); !added)
          other = it->second;
      if (other)
        throw LaunchError(other->what + " and " + out.what + " are the same file ('" + other->path +
                          "' and '" + out.path + "'); give each its own");
    }
  }

  // --- setup ---------------------------------------------------------------------------------

  // The GPUs to schedule: NVML's (or the declared ones), restricted to those the allocation
  // names. Restricted, scheduler ids are indexes into the allocation's list.
  void build_inventory(std::vector<GpuInfo>& gpus) {
    std::vector<GpuInfo> base;
    if (options.gpus_available) {
      fake_inventory = true;
      for (int id : *options.gpus_available) base.push_back(GpuInfo{id, options.gpu_memory_mb});
    } else if (const char* fake = std::getenv("GALLEY_LAUNCH_FAKE_GPUS"); fake && *fake) {
      fake_inventory = true;
      std::string text(fake);
      if (text.find(',') == std::string::npos && text != "none") {
        char* end = nullptr;
        const long count = std::strtol(text.c_str(), &end, 10);
        if (*end != '\0' || count < 0 || count > 4096)
          throw LaunchError("GALLEY_LAUNCH_FAKE_GPUS: expected a GPU count such as 2, got \"" +
                            text + "\"");
        for (int i = 0; i < count; ++i) base.push_back(GpuInfo{i, options.gpu_memory_mb});
      } else {
        for (int id : parse_gpu_ids(text, "GALLEY_LAUNCH_FAKE_GPUS"))
          base.push_back(GpuInfo{id, options.gpu_memory_mb});
      }
    } else {
      base = monitor.devices();
    }
    std::vector<GpuInfo> real;
    if (monitor.available()) real = monitor.devices();
    auto nvml_knows = [&](int id) {
      return std::any_of(real.begin(), real.end(), [&](const GpuInfo& r) { return r.id == id; });
    };
    if (!allocation.gpus) {
      for (const auto& gpu : base) {
        gpus.push_back(gpu);
        slots.push_back(GpuSlot{gpu.id, std::to_string(gpu.id),
                                nvml_knows(gpu.id) ? std::optional<int>(gpu.id) : std::nullopt});
      }
    } else {
      for (const auto& entry : *allocation.gpus) {
        const int index = int(gpus.size());
        if (entry.rfind("GPU-", 0) == 0 || entry.rfind("MIG-", 0) == 0) {
          // A UUID: passed on as written; its memory and NVML index are not looked up.
          if (base.empty()) {
            gpu_notes.push_back(allocation.gpu_source + " names " + entry +
                                " but no GPU was found: left out");
            continue;
          }
          gpus.push_back(GpuInfo{index, 0});
          slots.push_back(GpuSlot{index, entry, std::nullopt});
          continue;
        }
        const int id = std::stoi(entry);
        auto it =
            std::find_if(base.begin(), base.end(), [&](const GpuInfo& g) { return g.id == id; });
        if (it == base.end()) {
          gpu_notes.push_back(
              allocation.gpu_source + " names GPU " + entry + ", which " +
              (fake_inventory ? "the declared GPUs do not include" : "NVML does not report") +
              ": left out");
          continue;
        }
        gpus.push_back(GpuInfo{index, it->memory_mb});
        slots.push_back(
            GpuSlot{index, entry, nvml_knows(id) ? std::optional<int>(id) : std::nullopt});
      }
    }
    if (!monitor.available()) {
      sampling_note = "not sampled: " + monitor.unavailable_reason();
      return;
    }
    for (const auto& slot : slots)
      if (slot.nvml_index) sample_ids.push_back(*slot.nvml_index);
    if (sample_ids.empty())
      sampling_note = "not sampled: NVML sees none of the scheduled GPUs";
    else
      sampling_note =
          "sampled through NVML every " + format_number(options.sample_interval_s) + "s";
  }

  // The CPUs to schedule: the allocation's, or the declared ones.
  std::vector<CpuInfo> cpu_inventory() {
    if (!options.cpus_available) return allocation.cpus;
    fake_cpus = true;
    const auto& topology = probe.topology;
    std::vector<CpuInfo> cpus;
    int next_core = 1 << 30;
    for (int id : *options.cpus_available) {
      auto known = std::find_if(topology.begin(), topology.end(),
                                [&](const CpuInfo& c) { return c.id == id; });
      cpus.push_back(known != topology.end() ? *known : CpuInfo{id, next_core++, 0});
    }
    return cpus;
  }

  const GpuSlot* slot(int id) const {
    for (const auto& s : slots)
      if (s.id == id) return &s;
    return nullptr;
  }

  std::string visible_devices(const std::vector<int>& ids) const {
    std::string text;
    for (std::size_t i = 0; i < ids.size(); ++i) {
      const GpuSlot* s = slot(ids[i]);
      text += (i ? "," : "") + (s ? s->visible : std::to_string(ids[i]));
    }
    return text;
  }

  std::string allocation_line() const {
    std::string text = describe_allocation(allocation);
    if (fake_cpus)
      text += "; scheduling on the declared CPUs " + format_cpu_list(*options.cpus_available);
    std::vector<int> ids;
    for (const auto& s : slots) ids.push_back(s.id);
    if (allocation.gpus) {
      text += slots.empty() ? std::string("; no GPU usable")
                            : "; job GPU ids " + join(ids) + " are devices " + visible_devices(ids);
    } else if (slots.empty()) {
      text += fake_inventory        ? std::string("; no GPU declared")
              : monitor.available() ? std::string("; no GPU (NVML reports none)")
                                    : "; no GPU (" + monitor.unavailable_reason() + ")";
    } else {
      text += "; GPUs " + join(ids) + (fake_inventory ? " (declared)" : " (NVML)");
    }
    for (const auto& note : allocation.notes) text += "; " + note;
    for (const auto& note : gpu_notes) text += "; " + note;
    return text;
  }

  Json allocation_json() const {
    std::vector<int> cpu_ids;
    for (const auto& cpu : scheduler->cpus()) cpu_ids.push_back(cpu.id);
    std::vector<int> gpu_ids;
    for (const auto& s : slots) gpu_ids.push_back(s.id);
    Json j{{"cpus", cpu_ids}, {"cpu_source", allocation.cpu_source}, {"gpus", gpu_ids}};
    if (fake_cpus) j["cpus_declared"] = true;
    if (allocation.gpus) {
      j["gpu_source"] = allocation.gpu_source;
      Json visible = Json::array();
      for (const auto& s : slots) visible.push_back(s.visible);
      j["gpus_visible"] = visible;
    }
    Json notes = Json::array();
    for (const auto& note : allocation.notes) notes.push_back(note);
    for (const auto& note : gpu_notes) notes.push_back(note);
    if (!notes.empty()) j["notes"] = notes;
    return j;
  }

  // --- starting ------------------------------------------------------------------------------

  void start_attempt(JobState& job, const Assignment& assignment) {
    const auto now = Clock::now();
    job.attempts += 1;
    job.gpus = assignment.gpu_ids;
    job.visible = visible_devices(job.gpus);
    job.share = assignment.share;
    job.cpus = assignment.cpus;
    job.hung = job.killed = false;
    job.out_buf.clear(), job.err_buf.clear();

    std::vector<std::pair<std::string, std::string>> env(job.spec.env.begin(), job.spec.env.end());
    // Placement wins over anything the job's own env says about devices.
    env.emplace_back("CUDA_DEVICE_ORDER", "PCI_BUS_ID");
    env.emplace_back("CUDA_VISIBLE_DEVICES", job.visible);
    // The thread count follows the CPUs, unless the job's own env says otherwise.
    if (!job.cpus.empty())
      for (const char* name : {"GALLEY_NUM_THREADS", "OMP_NUM_THREADS"})
        if (!job.spec.env.count(name)) env.emplace_back(name, std::to_string(job.cpus.size()));
    if (job.spec.memory_fraction)
      env.emplace_back("GALLEY_GPU_MEMORY_FRACTION", format_number(*job.spec.memory_fraction));
    if (job.spec.memory_limit_mb)
      env.emplace_back("GALLEY_GPU_MEMORY_LIMIT_MB", std::to_string(*job.spec.memory_limit_mb));
    env.emplace_back("GALLEY_LAUNCH_JOB", job.spec.name);
    env.emplace_back("GALLEY_LAUNCH_ATTEMPT", std::to_string(job.attempts));

    if (!job.log && !job.log_lost) {
      // Opened at the first start, not all at once at launch, so that a file of thousands of
      // jobs does not hold thousands of files open; run() has created and emptied it.
      try {
        job.log = open_for_writing(job.log_path, log_what(job), "a");
      } catch (const LaunchError& e) {
        fail_to_start(job, e.what(), now);
        return;
      }
    }
    if (job.attempts > 1) {
      log_line(job, "launcher",
               "restart " + std::to_string(job.restarts) + " (attempt " +
                   std::to_string(job.attempts) + ")");
    }
    Child child;
    try {
      child = spawn_child(SpawnRequest{job.spec.command, job.spec.working_dir,
                                       merged_environment(env), job.cpus, job_open_files});
    } catch (const LaunchError& e) {
      fail_to_start(job, e.what(), now);
      return;
    }
    job.pid = child.pid;
    job.out_fd = child.out_fd;
    job.err_fd = child.err_fd;
    job.phase = Phase::kRunning;
    job.status = "running";
    job.attempt_start = job.last_output = now;
    if (!job.started) job.first_start = now;
    job.started = true;
    if (job.attempts > 1)
      emit("restarted", &job,
           Json{{"restart", job.restarts}, {"max_restarts", job.spec.max_restarts}},
           job.spec.name + " restarted (" + std::to_string(job.restarts) + "/" +
               std::to_string(job.spec.max_restarts) + ")");
    Json extra{{"attempt", job.attempts}, {"pid", job.pid}, {"gpus", job.gpus}};
    if (!job.gpus.empty()) extra["share"] = rounded(job.share);
    if (allocation.gpus) extra["cuda_visible_devices"] = job.visible;
    extra["cpus"] = job.cpus;
    if (job.spec.memory_fraction) extra["memory_fraction"] = *job.spec.memory_fraction;
    if (job.spec.memory_limit_mb) extra["memory_limit_mb"] = *job.spec.memory_limit_mb;
    emit("started", &job, extra,
         "started " + job.spec.name + " (pid " + std::to_string(job.pid) + ", " +
             (job.gpus.empty() ? std::string("no GPU") : "GPU " + join(job.gpus)) +
             (allocation.gpus && !job.gpus.empty() ? " = device " + job.visible : "") +
             (job.cpus.empty() ? std::string() : ", CPUs " + format_cpu_list(job.cpus)) + ")");
  }

  void fail_to_start(JobState& job, const std::string& message, Clock::time_point now) {
    scheduler->release(job.id);
    job.message = message;
    log_line(job, "launcher", job.message);
    job.phase = Phase::kDone;
    job.status = "failed_to_start";
    job.end = now;
    if (!job.started) job.first_start = now;
    job.started = true;
    emit("failed_to_start", &job, Json{{"attempt", job.attempts}, {"message", job.message}},
         job.spec.name + ": " + job.message);
    finish(job);
  }

  void start_ready() {
    // A job that fails to start gives its share back at once: scheduled again until every
    // assignment has started, so the next queued job takes the share now, not a loop turn later.
    for (bool again = true; again;) {
      again = false;
      for (const auto& assignment : scheduler->schedule())
        for (auto& job : jobs)
          if (job.id == assignment.job) {
            start_attempt(job, assignment);
            again = again || job.phase == Phase::kDone;
          }
    }
  }

  // --- output --------------------------------------------------------------------------------

  void consume(JobState& job, std::string& buf, const char* tag, bool flush_partial) {
    std::size_t begin = 0;
    for (std::size_t nl; (nl = buf.find('\n', begin)) != std::string::npos; begin = nl + 1) {
      std::string line = buf.substr(begin, nl - begin);
      if (!line.empty() && line.back() == '\r') line.pop_back();
      log_line(job, tag, line);
      if (!line.empty()) job.last_line = line;
    }
    buf.erase(0, begin);
    if (flush_partial && !buf.empty()) {
      log_line(job, tag, buf);
      job.last_line = buf;
      buf.clear();
    }
  }

  // The most bytes read from one pipe per wake-up of the loop. A job that writes without pause
  // (`yes`) keeps its pipe full: reading it until it is empty never ended, and signals, other
  // jobs' exits and timers waited for ever. One pipe's worth keeps the turns short (a 64 KiB
  // chunk of 2-byte lines is 32,768 time-stamped log lines) at one poll per 64 KiB.
  static constexpr std::size_t kReadBudget = std::size_t(64) << 10;

  // Reads what is available, up to `budget` bytes; returns false at end of file.
  bool read_stream(JobState& job, int& fd, bool is_err, std::size_t budget = kReadBudget) {
    char chunk[65536];
    std::string& buf = is_err ? job.err_buf : job.out_buf;
    bool open = true;
    for (std::size_t got = 0; got < budget;) {
      const ssize_t n = read(fd, chunk, std::min(sizeof chunk, budget - got));
      if (n > 0) {
        got += std::size_t(n);
        buf.append(chunk, std::size_t(n));
        job.last_output = Clock::now();
        // A line longer than 1 MiB is written in pieces rather than held.
        consume(job, buf, is_err ? "err" : "out", buf.size() > (1u << 20));
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      open = false;  // EOF or error
      break;
    }
    flush_log(job);
    if (!open) {
      consume(job, buf, is_err ? "err" : "out", true);
      close(fd);
      fd = -1;
    }
    return open;
  }

  // --- ending --------------------------------------------------------------------------------

  void finish(JobState& job) {
    flush_log(job);
    if (job.log) std::fclose(job.log), job.log = nullptr;
    Json extra{{"status", job.status}, {"attempts", job.attempts}, {"restarts", job.restarts}};
    if (job.exit_code) extra["exit_code"] = *job.exit_code;
    if (job.term_signal) extra["signal"] = signal_name(job.term_signal);
    emit("finished", &job, extra, job.spec.name + " " + job.status);
  }

  void on_exit(JobState& job, int wait_status, const rusage& usage) {
    const auto now = Clock::now();
    job.main_ended.reset();
    for (int* fd : {&job.out_fd, &job.err_fd})
      if (*fd >= 0) {
        // Whatever the job wrote before exiting is in the pipe: that much is read, not until the
        // pipe is empty, which a leftover of its group still writing would put off for ever (they
        // are killed just below). Should FIONREAD fail, 1 MiB is the most an unprivileged
        // process can make a pipe hold.
        int pending = 0;
        if (ioctl(*fd, FIONREAD, &pending) != 0) pending = 1 << 20;
        read_stream(job, *fd, fd == &job.err_fd, std::size_t(std::max(pending, 0)));
        if (*fd >= 0) {
          consume(job, fd == &job.err_fd ? job.err_buf : job.out_buf,
                  fd == &job.err_fd ? "err" : "out", true);
          close(*fd);
          *fd = -1;
        }
      }
    // A job that ended on its own leaves nothing behind: what is left of its process group is
    // killed now, and the launcher waits for it before it exits (drain_groups). A job being
    // stopped gets here only once its group is empty or was killed at its deadline (reap).
    if (group_alive(job.pid)) {
      kill(-job.pid, SIGKILL);
      ended_groups.push_back(job.pid);
    }
    scheduler->release(job.id);
    job.end = now;
    job.run_s += seconds(now - job.attempt_start);
    job.cpu_s += double(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
                 1e-6 * double(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec);
    const pid_t pid = job.pid;
    job.pid = -1;
    job.exit_code.reset();
    job.term_signal = 0;
    if (WIFEXITED(wait_status)) {
      job.exit_code = WEXITSTATUS(wait_status);
      log_line(job, "launcher", "exited with code " + std::to_string(*job.exit_code));
      emit("exited", &job,
           Json{{"attempt", job.attempts},
                {"pid", pid},
                {"code", *job.exit_code},
                {"run_s", rounded(seconds(now - job.attempt_start))}},
           job.spec.name + " exited with code " + std::to_string(*job.exit_code));
    } else {
      job.term_signal = WTERMSIG(wait_status);
      log_line(job, "launcher", "killed by " + signal_name(job.term_signal));
      emit("signalled", &job,
           Json{{"attempt", job.attempts},
                {"pid", pid},
                {"signal", signal_name(job.term_signal)},
                {"signal_number", job.term_signal},
                {"run_s", rounded(seconds(now - job.attempt_start))}},
           job.spec.name + " killed by " + signal_name(job.term_signal));
    }
    flush_log(job);
    const bool ok = job.exit_code && *job.exit_code == 0 && !job.hung;
    if (ok) {
      job.phase = Phase::kDone;
      job.status = "succeeded";
    } else if (shutting_down) {
      job.phase = Phase::kDone;
      job.status = "stopped";
    } else if (job.exit_code && *job.exit_code == kPreemptedExitCode && !job.hung) {
      // The job saved a checkpoint and asked to be run again: not a failure, no restart spent.
      // At once, unless the attempt lasted under a second: then after the first backoff, so
      // that a job exiting 75 as it starts is not restarted hundreds of times a second.
      const double ran_s = seconds(now - job.attempt_start);
      const double delay = ran_s < 1.0 ? options.backoff_initial_s : 0.0;
      job.phase = Phase::kBackoff;
      job.status = "backoff";
      job.restart_at = now + clock_duration(delay);
      emit("preempted", &job,
           Json{{"attempt", job.attempts}, {"code", *job.exit_code}, {"delay_s", rounded(delay)}},
           job.spec.name + " was preempted (exit " + std::to_string(*job.exit_code) +
               "): restarting" + (delay > 0 ? " in " + format_number(rounded(delay)) + "s" : "") +
               " without counting a restart");
      return;
    } else if (job.restarts < job.spec.max_restarts) {
      job.restarts += 1;
      const double delay = std::min(options.backoff_max_s,
                                    options.backoff_initial_s * std::pow(2.0, job.restarts - 1));
      job.phase = Phase::kBackoff;
      job.status = "backoff";
      job.restart_at = now + clock_duration(delay);
      emit("backoff", &job, Json{{"restart", job.restarts}, {"delay_s", rounded(delay)}},
           job.spec.name + " restarts in " + format_number(rounded(delay)) + "s (" +
               std::to_string(job.restarts) + "/" + std::to_string(job.spec.max_restarts) + ")");
      return;
    } else {
      job.phase = Phase::kDone;
      job.status = job.hung ? "hung" : "failed";
    }
    finish(job);
  }

  void reap() {
    while (true) {
      int status = 0;
      rusage usage{};
      const pid_t pid = wait4(-1, &status, WNOHANG, &usage);
      if (pid <= 0) break;
      // Other pids are descendants of jobs handed to us as subreaper: reaping them is all.
      for (auto& job : jobs) {
        if (job.pid != pid || job.main_ended) continue;
        if (job.phase == Phase::kStopping && group_alive(pid)) {
          // A job being stopped keeps its grace period for the whole group: a wrapper (a shell
          // that runs the program) dies of SIGTERM at once, while the program still saves its
          // checkpoint. The job ends when its group is empty, or is killed at its deadline.
          job.main_ended.emplace(status, usage);
          log_line(job, "launcher",
                   "main process ended; waiting for the rest of its process group to end");
        } else if (job.phase == Phase::kRunning || job.phase == Phase::kStopping) {
          on_exit(job, status, usage);
        }
      }
    }
    // A killed group that is not gone in kKilledWait is left to drain_groups, as a job's that
    // ended on its own, rather than holding the job (and the launcher) for ever.
    const auto now = Clock::now();
    for (auto& job : jobs)
      if (job.main_ended &&
          (!group_alive(job.pid) || (job.killed && now - job.killed_at >= kKilledWait))) {
        const auto [status, usage] = *job.main_ended;  // on_exit clears it
        on_exit(job, status, usage);
      }
    // Forget the process groups of ended attempts once they are empty.
    ended_groups.erase(std::remove_if(ended_groups.begin(), ended_groups.end(),
                                      [](pid_t g) { return !group_alive(g); }),
                       ended_groups.end());
  }

  void stop(JobState& job, const std::string& why) {
    kill(-job.pid, SIGTERM);
    job.phase = Phase::kStopping;
    job.status = "stopping";
    job.kill_at = Clock::now() + clock_duration(options.grace_period_s);
    log_line(job, "launcher", "sent SIGTERM (" + why + ")");
  }

  void begin_shutdown(int sig) {
    if (shutting_down) {
      emit("kill", nullptr, Json{{"signal", signal_name(sig)}},
           "second " + signal_name(sig) + ": killing every job now");
      for (auto& job : jobs)
        if (job.phase == Phase::kRunning || job.phase == Phase::kStopping) {
          kill(-job.pid, SIGKILL);
          job.killed = true;
          job.killed_at = Clock::now();
        }
      return;
    }
    shutting_down = true;
    stop_signal = sig;
    emit("stopping", nullptr,
         Json{{"signal", signal_name(sig)}, {"grace_period_s", options.grace_period_s}},
         "received " + signal_name(sig) + ": stopping every job (grace period " +
             format_number(options.grace_period_s) + "s)");
    for (auto& job : jobs) {
      if (job.phase == Phase::kQueued || job.phase == Phase::kBackoff) {
        scheduler->cancel(job.id);
        job.phase = Phase::kDone;
        job.status = "cancelled";
        finish(job);
      } else if (job.phase == Phase::kRunning) {
        stop(job, "launcher stopping");
      }
    }
  }

  // --- timers --------------------------------------------------------------------------------

  void check_timers() {
    const auto now = Clock::now();
    for (auto& job : jobs) {
      if (job.phase == Phase::kRunning && job.spec.heartbeat_timeout_s > 0 &&
          now - job.last_output >= clock_duration(job.spec.heartbeat_timeout_s)) {
        job.hung = true;
        const double silent = seconds(now - job.last_output);
        emit("hung", &job,
             Json{{"attempt", job.attempts}, {"pid", job.pid}, {"silent_s", rounded(silent)}},
             job.spec.name + " hung: no output for " + format_number(rounded(silent)) + "s");
        stop(job, "no output for " + format_number(rounded(silent)) + "s");
      }
      if (job.phase == Phase::kStopping && !job.killed && now >= job.kill_at) {
        kill(-job.pid, SIGKILL);
        job.killed = true;
        job.killed_at = now;
        emit("killed", &job, Json{{"pid", job.pid}},
             job.spec.name + " did not stop within the grace period: SIGKILL");
      }
      if (job.phase == Phase::kBackoff && now >= job.restart_at) {
        job.phase = Phase::kQueued;
        job.status = "queued";
        scheduler->requeue(job.id);
      }
    }
    if (!sample_ids.empty() && now >= next_sample) {
      next_sample = now + clock_duration(options.sample_interval_s);
      bool any_running = false;
      for (const auto& job : jobs) any_running |= job.phase == Phase::kRunning;
      if (any_running)
        for (const auto& s : monitor.sample(sample_ids)) {
          auto& stats = gpu_stats[s.id];
          stats.util_sum += s.utilization_percent;
          stats.mem_sum += double(s.memory_used_mb);
          stats.mem_max = std::max(stats.mem_max, s.memory_used_mb);
          stats.samples += 1;
        }
    }
  }

  Clock::time_point next_deadline() const {
    auto deadline = Clock::now() + std::chrono::seconds(1);
    for (const auto& job : jobs) {
      if (job.phase == Phase::kRunning && job.spec.heartbeat_timeout_s > 0)
        deadline =
            std::min(deadline, job.last_output + clock_duration(job.spec.heartbeat_timeout_s));
      if (job.phase == Phase::kStopping && !job.killed) deadline = std::min(deadline, job.kill_at);
      if (job.phase == Phase::kBackoff) deadline = std::min(deadline, job.restart_at);
    }
    if (!sample_ids.empty()) deadline = std::min(deadline, next_sample);
    if (table) deadline = std::min(deadline, next_draw);
    return deadline;
  }

  // --- status table --------------------------------------------------------------------------

  void draw_table(bool final_draw) {
    std::ostringstream out;
    if (table_lines > 0) out << "\x1b[" << table_lines << "A\x1b[J";
    for (const auto& line : pending_lines) out << line << '\n';
    pending_lines.clear();
    int counts[5] = {0, 0, 0, 0, 0};
    for (const auto& job : jobs) counts[int(job.phase)] += 1;
    const auto now = Clock::now();
    char line[512];
    snprintf(line, sizeof line,
             "galley-launch %s  running %d  queued %d  backoff %d  done %d/%zu%s\n",
             format_duration(seconds(now - t0)).c_str(), counts[1] + counts[2], counts[0],
             counts[3], counts[4], jobs.size(), shutting_down ? "  (stopping)" : "");
    std::string text = line;
    snprintf(line, sizeof line, "  %-20s %-16s %-8s %-10s %-8s %-9s %-8s %s\n", "JOB", "STATE",
             "GPUS", "CPUS", "PID", "RESTARTS", "TIME", "LAST OUTPUT");
    text += line;
    for (const auto& job : jobs) {
      const double t = job.phase == Phase::kRunning || job.phase == Phase::kStopping
                           ? job.run_s + seconds(now - job.attempt_start)
                           : job.run_s;
      std::string last = job.last_line.substr(0, 40);
      for (char& c : last)
        if (static_cast<unsigned char>(c) < 32) c = ' ';
      // A long CPU list ends in "+" where it is cut.
      std::string cpus = job.cpus.empty() ? "-" : format_cpu_list(job.cpus);
      if (cpus.size() > 10) cpus = cpus.substr(0, 9) + "+";
      snprintf(
          line, sizeof line, "  %-20.20s %-16.16s %-8.8s %-10s %-8s %-9s %-8s %s\n",
          job.spec.name.c_str(),
          (job.phase == Phase::kDone ? job.status : std::string(phase_name(job.phase))).c_str(),
          job.gpus.empty() ? "-" : join(job.gpus).c_str(), cpus.c_str(),
          job.pid > 0 ? std::to_string(job.pid).c_str() : "-",
          (std::to_string(job.restarts) + "/" + std::to_string(job.spec.max_restarts)).c_str(),
          format_duration(t).c_str(), last.c_str());
      text += line;
    }
    out << text;
    table_lines = final_draw ? 0 : int(std::count(text.begin(), text.end(), '\n'));
    std::cout << out.str() << std::flush;
    next_draw = now + std::chrono::milliseconds(500);
  }

  // --- summary -------------------------------------------------------------------------------

  // The serial time of a job: its measured time alone when given, else its CPU time spread
  // over every CPU of the allocation (what it would have had alone), at most its run time.
  std::pair<double, bool> serial_time(const JobState& job) const {
    if (job.spec.serial_time_s) return {*job.spec.serial_time_s, true};
    const double cpus = double(std::max<std::size_t>(1, scheduler->cpus().size()));
    return {std::min(job.run_s, job.cpu_s / cpus), false};
  }

  Json summary() const {
    Json root;
    std::optional<Clock::time_point> first, last;
    double sum = 0, serial = 0;
    int measured = 0, estimated = 0;
    Json job_list = Json::array();
    for (const auto& job : jobs) {
      Json j;
      j["name"] = job.spec.name;
      j["status"] = job.status;
      j["exit_code"] = job.exit_code ? Json(*job.exit_code) : Json(nullptr);
      j["signal"] = job.term_signal ? Json(signal_name(job.term_signal)) : Json(nullptr);
      j["attempts"] = job.attempts;
      j["restarts"] = job.restarts;
      j["wall_s"] = job.started ? rounded(seconds(job.end - job.first_start)) : 0.0;
      j["run_s"] = rounded(job.run_s);
      j["cpu_s"] = rounded(job.cpu_s);
      j["gpus"] = job.gpus;
      if (allocation.gpus) j["cuda_visible_devices"] = job.visible;
      j["cpus"] = job.cpus;
      if (job.spec.cpus) j["cpus_requested"] = *job.spec.cpus;
      if (job.spec.memory_fraction) j["memory_fraction"] = *job.spec.memory_fraction;
      if (job.spec.memory_limit_mb) j["memory_limit_mb"] = *job.spec.memory_limit_mb;
      j["priority"] = job.spec.priority;
      j["log"] = job.log_path;
      if (!job.message.empty()) j["message"] = job.message;
      if (job.started) {
        if (!first || job.first_start < *first) first = job.first_start;
        if (!last || job.end > *last) last = job.end;
        sum += job.run_s;
        const auto [t, is_measured] = serial_time(job);
        serial += t;
        (is_measured ? measured : estimated) += 1;
        j["serial_s"] = rounded(t);
        j["serial_method"] = is_measured ? "measured" : "estimated";
      }
      job_list.push_back(j);
    }
    const double makespan = first ? seconds(*last - *first) : 0.0;
    root["makespan_s"] = rounded(makespan);
    root["sum_of_job_times_s"] = rounded(sum);
    root["serial_estimate_s"] = rounded(serial);
    root["serial_estimate_method"] = measured && estimated ? "mixed"
                                     : measured            ? "measured"
                                     : estimated           ? "estimated"
                                                           : "none";
    root["serial_estimator"] =
        "per job: its serial_time when given (measured), else its CPU time over the " +
        std::to_string(scheduler->cpus().size()) +
        " CPU(s) of the allocation, at most its run time (estimated)";
    root["packing_speedup"] = makespan > 0 ? rounded(serial / makespan) : 0.0;
    root["stopped_by_signal"] = stop_signal ? Json(signal_name(stop_signal)) : Json(nullptr);
    root["allocation"] = allocation_json();
    root["jobs"] = job_list;
    Json gpus;
    gpus["sampled"] = !gpu_stats.empty();
    gpus["note"] = sampling_note;
    gpus["fake_inventory"] = fake_inventory;
    Json devices = Json::array();
    for (const auto& gpu : slots) {
      Json d{{"id", gpu.id}};
      if (allocation.gpus) d["visible_as"] = gpu.visible;
      auto it = gpu.nvml_index ? gpu_stats.find(*gpu.nvml_index) : gpu_stats.end();
      if (it != gpu_stats.end() && it->second.samples > 0) {
        const auto& s = it->second;
        d["mean_utilization_percent"] = rounded(s.util_sum / double(s.samples));
        d["mean_memory_used_mb"] = rounded(s.mem_sum / double(s.samples));
        d["max_memory_used_mb"] = s.mem_max;
        d["samples"] = s.samples;
      } else {
        d["mean_utilization_percent"] = nullptr;
      }
      devices.push_back(d);
    }
    gpus["devices"] = devices;
    root["gpus"] = gpus;
    return root;
  }

  void print_summary(const Json& s, const std::string& path) const {
    std::ostringstream out;
    char line[512];
    out << "\nsummary\n";
    snprintf(line, sizeof line, "  %-20s %-16s %-8s %-9s %-9s %-9s\n", "JOB", "STATUS", "EXIT",
             "RESTARTS", "WALL", "RUN");
    out << line;
    for (const auto& j : s["jobs"]) {
      std::string exit = j["exit_code"].is_null()
                             ? (j["signal"].is_null() ? "-" : j["signal"].get<std::string>())
                             : std::to_string(j["exit_code"].get<int>());
      snprintf(line, sizeof line, "  %-20.20s %-16.16s %-8s %-9d %-9s %-9s\n",
               j["name"].get<std::string>().c_str(), j["status"].get<std::string>().c_str(),
               exit.c_str(), j["restarts"].get<int>(),
               format_duration(j["wall_s"].get<double>()).c_str(),
               format_duration(j["run_s"].get<double>()).c_str());
      out << line;
    }
    const auto& gpus = s["gpus"];
    if (gpus["sampled"].get<bool>()) {
      for (const auto& d : gpus["devices"]) {
        if (d["mean_utilization_percent"].is_null()) continue;
        snprintf(line, sizeof line,
                 "  GPU %d: mean utilisation %.1f%%, mean memory %.0f MiB, "
                 "max %ld MiB (%ld samples)\n",
                 d["id"].get<int>(), d["mean_utilization_percent"].get<double>(),
                 d["mean_memory_used_mb"].get<double>(), d["max_memory_used_mb"].get<long>(),
                 d["samples"].get<long>());
        out << line;
      }
    } else {
      out << "  GPU utilisation " << gpus["note"].get<std::string>() << "\n";
    }
    const std::string method = s["serial_estimate_method"];
    snprintf(line, sizeof line,
             "  makespan %.2fs; serial time %.2fs (%s) -> packing speedup %.2fx; "
             "sum of job times %.2fs\n",
             s["makespan_s"].get<double>(), s["serial_estimate_s"].get<double>(),
             method == "estimated" ? "estimated from CPU time"
             : method == "mixed"   ? "measured for some jobs, estimated from CPU time for others"
                                   : method.c_str(),
             s["packing_speedup"].get<double>(), s["sum_of_job_times_s"].get<double>());
    out << line;
    if (method == "estimated" || method == "mixed")
      out << "  (the estimate spreads each job's CPU time over every CPU: low for jobs that wait "
             "on a GPU or I/O,\n   high for jobs that spin; give each job's measured "
             "serial_time to compare against that)\n";
    out << "  summary written to " << path << "\n";
    std::cout << out.str() << std::flush;
  }

  // --- main loop -----------------------------------------------------------------------------

  void handle_signals() {
    char bytes[64];
    for (ssize_t n; (n = read(g_signal_pipe[0], bytes, sizeof bytes)) > 0;)
      for (ssize_t i = 0; i < n; ++i)
        if (bytes[i] != SIGCHLD) begin_shutdown(bytes[i]);
    // Cleared after the pipe is drained (a SIGCHLD during the drain would otherwise leave it set
    // over an empty pipe, and the next one would wake nothing): one from here on writes a byte of
    // its own, and one before is seen by the reap that follows.
    g_child_pending = false;
  }

  // Waits (up to kKilledWait) until the process groups of every ended attempt are gone, reaping
  // what the kills left behind (we are their subreaper): a SIGKILLed process lives on for a moment,
  // and none of a job's processes should outlive the launcher. Only killed groups are left by
  // now: the group of a job being stopped is waited for by the loop, up to its kill deadline.
  void drain_groups() {
    const auto deadline = Clock::now() + kKilledWait;
    while (true) {
      reap();
      if (ended_groups.empty() || Clock::now() >= deadline) return;
      const timespec pause{0, 5'000'000};
      nanosleep(&pause, nullptr);
    }
  }

  bool all_done() const {
    return std::all_of(jobs.begin(), jobs.end(),
                       [](const JobState& j) { return j.phase == Phase::kDone; });
  }

  void loop() {
    std::vector<pollfd> fds;
    std::vector<std::pair<JobState*, bool>> owners;  // job and is-stderr, per fd after the first
    while (true) {
      // Ended jobs first: the shares they give back go to the queued jobs in this same turn (the
      // other order left them idle until the next wake-up, up to a second).
      reap();
      if (!shutting_down) start_ready();
      if (all_done()) break;
      if (table && Clock::now() >= next_draw) draw_table(false);
      fds.assign(1, pollfd{g_signal_pipe[0], POLLIN, 0});
      owners.clear();
      for (auto& job : jobs) {
        if (job.out_fd >= 0)
          fds.push_back({job.out_fd, POLLIN, 0}), owners.emplace_back(&job, false);
        if (job.err_fd >= 0)
          fds.push_back({job.err_fd, POLLIN, 0}), owners.emplace_back(&job, true);
      }
      const auto wait = next_deadline() - Clock::now();
      const int timeout_ms = int(std::clamp<long long>(
          std::chrono::duration_cast<std::chrono::milliseconds>(wait).count() + 1, 0, 1000));
      const int ready = poll(fds.data(), fds.size(), timeout_ms);
      if (ready < 0 && errno != EINTR)
        throw LaunchError(std::string("poll failed: ") + strerror(errno));
      for (std::size_t i = 1; ready > 0 && i < fds.size(); ++i) {
        if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        auto [job, is_err] = owners[i - 1];
        int& fd = is_err ? job->err_fd : job->out_fd;
        if (fd >= 0) read_stream(*job, fd, is_err);
      }
      handle_signals();  // the pipe is non-blocking: reading it costs little when it is empty
      check_timers();
    }
  }

  void install_signals() {
    g_launcher_pid = getpid();
    if (pipe2(g_signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0)
      throw LaunchError(std::string("cannot create the signal pipe: ") + strerror(errno));
    struct sigaction action {};
    action.sa_handler = on_signal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    for (int sig : kStopSignals) sigaction(sig, &action, nullptr);
    action.sa_flags = SA_RESTART | SA_NOCLDSTOP;
    sigaction(SIGCHLD, &action, nullptr);
    signal(SIGPIPE, SIG_IGN);
    // Descendants that outlive their job's main process become ours to reap and to kill.
    prctl(PR_SET_CHILD_SUBREAPER, 1);
  }

  // Jobs running at once that the hard limit on open files can hold: each holds its two pipes and
  // its log (kFilesPerJob), beside what the launcher has open now and a reserve for the event log,
  // the summary, the signal pipe, NVML and a start's two passing pipe ends. Where that is fewer
  // than max_parallel allows (or than there are jobs, unlimited), the launcher runs that many at
  // once, says so in the allocation's notes, and the rest wait: past the limit they failed to
  // start.
  int open_file_parallel(int max_parallel, std::size_t job_count) {
    constexpr long kFilesPerJob = 3, kReserve = 32;
    rlimit limit{};
    if (getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_max == RLIM_INFINITY)
      return max_parallel;
    long open_now = 0;
    std::error_code ec;
    for (std::filesystem::directory_iterator it("/proc/self/fd", ec), end; !ec && it != end;
         it.increment(ec))
      ++open_now;
    const long room =
        (long(std::min<rlim_t>(limit.rlim_max, 1L << 30)) - open_now - kReserve) / kFilesPerJob;
    const long cap = std::max<long>(1, room);
    const long wanted = max_parallel > 0 ? max_parallel : long(job_count);
    if (cap >= wanted) return max_parallel;
    allocation.notes.push_back("at most " + std::to_string(cap) +
                               " jobs at once: the hard limit on open files (" +
                               std::to_string(limit.rlim_max) + ") holds " +
                               std::to_string(kFilesPerJob) + " a running job");
    return int(cap);
  }

  // Each running job holds its two pipes and its log open, so the launcher's soft limit on open
  // files (often 1024) would cap how many jobs run at once: it is raised to the hard limit. The
  // jobs get the soft limit the launcher was given, since programs that use select() cannot
  // handle descriptors past 1024.
  void raise_open_file_limit() {
    rlimit limit{};
    if (getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur >= limit.rlim_max) return;
    rlimit raised = limit;
    raised.rlim_cur = limit.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &raised) == 0) job_open_files = limit.rlim_cur;
  }

  void restore_open_file_limit() {
    rlimit limit{};
    if (!job_open_files || getrlimit(RLIMIT_NOFILE, &limit) != 0) return;
    limit.rlim_cur = *job_open_files;
    setrlimit(RLIMIT_NOFILE, &limit);
    job_open_files.reset();
  }

  void restore_signals() {
    for (int sig : kStopSignals) signal(sig, SIG_DFL);
    signal(SIGCHLD, SIG_DFL);
    for (int& fd : g_signal_pipe)
      if (fd >= 0) close(fd), fd = -1;
  }
};

Launcher::Launcher(std::vector<JobSpec> jobs, LauncherOptions options)
    : impl_(std::make_unique<Impl>()) {
  auto& m = *impl_;
  m.options = std::move(options);
  // The command line and the job file check these too; a LauncherOptions built in code is
  // held to the same rule, since a time past kMaxSeconds would overflow the clock's deadlines.
  struct Time {
    const char* name;
    double value;
    bool zero_ok;
  };
  for (const Time& t : {Time{"backoff_initial", m.options.backoff_initial_s, true},
                        Time{"backoff_max", m.options.backoff_max_s, true},
                        Time{"grace_period", m.options.grace_period_s, true},
                        Time{"sample_interval", m.options.sample_interval_s, false}})
    if (!(t.value >= 0 && t.value <= kMaxSeconds) || (t.value == 0 && !t.zero_ok))
      throw LaunchError(std::string(t.name) + " must be " +
                        (t.zero_ok ? "0 or a positive" : "a positive") +
                        " number of seconds, at most 1e9; got " + format_number(t.value));
  if (jobs.empty()) throw LaunchError("no jobs to run");
  m.probe = probe_machine();
  m.allocation = detect_allocation(m.probe);
  std::vector<GpuInfo> gpus;
  m.build_inventory(gpus);
  const int parallel = m.open_file_parallel(m.options.max_parallel, jobs.size());
  m.scheduler = std::make_unique<Scheduler>(gpus, m.cpu_inventory(),
                                            SchedulerOptions{parallel, m.options.strict_order});
  for (auto& spec : jobs) {
    validate_job(spec);
    for (const auto& other : m.jobs)
      if (other.spec.name == spec.name)
        throw LaunchError("two jobs are named '" + spec.name + "'; names must be unique");
    JobState state;
    try {
      state.id = m.scheduler->submit(JobRequest{.gpu_count = spec.gpu_count,
                                                .gpu_ids = spec.gpu_ids,
                                                .memory_fraction = spec.memory_fraction,
                                                .memory_limit_mb = spec.memory_limit_mb,
                                                .priority = spec.priority,
                                                .cpus = spec.cpus});
    } catch (const LaunchError& e) {
      std::string where;
      if (spec.cpus && *spec.cpus > int(m.scheduler->cpus().size()))
        where = m.fake_cpus ? " [declared with cpus_available]"
                            : " [the allocation: " + m.allocation.cpu_source + "]";
      else if (m.allocation.gpus && (spec.gpu_count > 0 || !spec.gpu_ids.empty()))
        where = " [GPUs restricted by " + m.allocation.gpu_source +
                "; job GPU ids index the GPUs it names]";
      throw LaunchError((spec.origin.empty() ? "" : spec.origin + ": ") + "job '" + spec.name +
                        "': " + e.what() + where);
    }
    state.log_path =
        spec.log_file.empty() ? m.options.log_dir + "/" + spec.name + ".log" : spec.log_file;
    state.spec = std::move(spec);
    m.jobs.push_back(std::move(state));
  }
  m.check_outputs();
}

Launcher::~Launcher() = default;

std::string Launcher::allocation() const {
  return impl_->allocation_line();
}

RunResult Launcher::run() {
  auto& m = *impl_;
  // The outputs were checked when the launcher was made; their directories are all created
  // before any file is truncated, and the summary's too, so that a directory that cannot be made
  // stops the launcher before anything ran rather than after every job. Each job's log is emptied
  // now (a cancelled job keeps no log of an earlier run) but held open only while the job runs.
  const auto outputs = m.outputs();
  for (const auto& out : outputs) make_parent_dirs(out.path, out.what);
  m.event_log = open_for_writing(m.options.event_log_path(), "the event log", "w");
  for (auto& job : m.jobs) std::fclose(open_for_writing(job.log_path, m.log_what(job), "w"));
  m.raise_open_file_limit();
  m.table = m.options.status_table == StatusTable::kOn ||
            (m.options.status_table == StatusTable::kAuto && isatty(STDOUT_FILENO));
  m.install_signals();
  m.t0 = Clock::now();
  m.next_sample = m.next_draw = m.t0;
  m.emit("allocation", nullptr, m.allocation_json(), "allocation: " + m.allocation_line());
  for (const auto& job : m.jobs) {
    Json extra{{"priority", job.spec.priority}, {"command", job.spec.command}};
    if (job.spec.cpus) extra["cpus"] = *job.spec.cpus;
    if (job.spec.serial_time_s) extra["serial_time_s"] = *job.spec.serial_time_s;
    if (!job.spec.gpu_ids.empty())
      extra["gpu_ids"] = job.spec.gpu_ids;
    else
      extra["gpus"] = job.spec.gpu_count;
    if (job.spec.memory_fraction) extra["memory_fraction"] = *job.spec.memory_fraction;
    if (job.spec.memory_limit_mb) extra["memory_limit_mb"] = *job.spec.memory_limit_mb;
    extra["log"] = job.log_path;
    m.emit("queued", &job, extra,
           "queued " + job.spec.name + " (priority " + std::to_string(job.spec.priority) + ")");
  }
  try {
    m.loop();
  } catch (...) {
    // Never leave jobs behind, whatever went wrong in the launcher itself.
    for (auto& job : m.jobs)
      if (job.pid > 0) kill(-job.pid, SIGKILL);
    m.restore_signals();
    m.restore_open_file_limit();
    throw;
  }
  m.drain_groups();
  if (m.table) m.draw_table(true);
  m.table = false;  // from here on, plain lines
  m.restore_signals();
  m.restore_open_file_limit();
  const Json s = m.summary();
  m.emit("summary", nullptr,
         Json{{"makespan_s", s["makespan_s"]},
              {"sum_of_job_times_s", s["sum_of_job_times_s"]},
              {"serial_estimate_s", s["serial_estimate_s"]},
              {"serial_estimate_method", s["serial_estimate_method"]},
              {"packing_speedup", s["packing_speedup"]}},
         "all jobs ended");
  const std::string path = m.options.summary_path();
  std::FILE* f = open_for_writing(path, "the summary", "w");
  const bool written = std::fputs((to_text(s, 2) + "\n").c_str(), f) >= 0 && std::fflush(f) == 0;
  const int err = errno;
  if (std::fclose(f) != 0 || !written)
    throw LaunchError("writing the summary '" + path +
                      "' failed: " + std::strerror(written ? errno : err));
  m.print_summary(s, path);

  RunResult result;
  if (m.stop_signal) {
    result.exit_code = 128 + m.stop_signal;
  } else {
    for (const auto& job : m.jobs)
      if (job.status != "succeeded") result.exit_code = 1;
  }
  return result;
}

}  // namespace galley::launch
