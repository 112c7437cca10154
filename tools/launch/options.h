#pragma once
/// \file
/// Settings of the launcher itself (as opposed to those of one job).

#include <chrono>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace galley::launch {

/// The longest time in seconds any option or job-file key may give (about 31 years): longer than
/// any real timeout, and short enough that a deadline of now plus it fits the steady clock's
/// 64-bit nanoseconds with room to spare.
inline constexpr double kMaxSeconds = 1e9;

/// `seconds` as a steady_clock duration, saturated: a negative or NaN time gives zero, and a
/// time beyond a quarter of the clock's range (about 73 years) gives that quarter, so that
/// neither the conversion nor a deadline of now plus the result can overflow.
std::chrono::steady_clock::duration clock_duration(double seconds);

/// When to draw the live status table.
enum class StatusTable { kAuto, kOn, kOff };

/// How the launcher runs: where it writes, how it restarts, how it stops.
struct LauncherOptions {
  /// Directory of the default job logs, the event log and the summary.
  std::string log_dir = "galley-launch-logs";
  /// JSON-lines event log; empty means `<log_dir>/events.jsonl`.
  std::string event_log;
  /// JSON summary written at the end; empty means `<log_dir>/summary.json`.
  std::string summary_file;
  /// GPUs to schedule on instead of those NVML reports: a dry-run and testing aid (the
  /// launcher does not check that they exist). Also set by GALLEY_LAUNCH_FAKE_GPUS.
  std::optional<std::vector<int>> gpus_available;
  /// Memory of each declared GPU in MiB (0: unknown, memory limits then take a GPU alone).
  long gpu_memory_mb = 0;
  /// CPUs to schedule on instead of those of the allocation the launcher runs in: a dry-run and
  /// testing aid (each id not in the machine's topology counts as a core of its own on NUMA
  /// node 0; pinning a job to a CPU the launcher may not use makes its start fail).
  std::optional<std::vector<int>> cpus_available;
  /// Delay before the first restart; doubled for each further one.
  double backoff_initial_s = 1.0;
  /// Longest delay between restarts.
  double backoff_max_s = 60.0;
  /// Time between SIGTERM and SIGKILL when stopping a job.
  double grace_period_s = 10.0;
  /// Most jobs at once (0: no limit).
  int max_parallel = 0;
  /// A job that does not fit blocks every job queued behind it (no backfill).
  bool strict_order = false;
  /// Live table on a terminal, plain event lines otherwise.
  StatusTable status_table = StatusTable::kAuto;
  /// Seconds between GPU utilisation samples.
  double sample_interval_s = 1.0;

  /// Event log path after defaults are applied.
  std::string event_log_path() const {
    return event_log.empty() ? log_dir + "/events.jsonl" : event_log;
  }
  /// Summary path after defaults are applied.
  std::string summary_path() const {
    return summary_file.empty() ? log_dir + "/summary.json" : summary_file;
  }
};

/// Parses a GPU id list such as "0,1,3" ("none" or "" is the empty list); throws LaunchError
/// naming `what` on anything else.
std::vector<int> parse_gpu_ids(const std::string& text, const std::string& what);

/// `text` without leading and trailing white space.
std::string trim(std::string_view text);
/// True for 1 to 9 decimal digits and nothing else (fits an int).
bool all_digits(const std::string& text);

/// Parses a Linux CPU list such as "0-3,8,10-11" (sysfs, cpusets, taskset -c) into ascending,
/// unique ids; surrounding white space is ignored and "" is the empty list. Throws LaunchError
/// naming `what` on anything else.
std::vector<int> parse_cpu_list(std::string_view text, const std::string& what);

/// Writes ids as a compact CPU list: {0, 1, 2, 3, 8} is "0-3,8"; {} is "".
std::string format_cpu_list(std::vector<int> ids);

}  // namespace galley::launch
