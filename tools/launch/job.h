#pragma once
/// \file
/// What one job asks for: the command, where and how it runs, and the GPU share and CPUs it
/// wants.

#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace galley::launch {

/// Any error a user can fix: a bad option, a bad job file, a job the machine cannot hold.
class LaunchError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Exit status by which a job says "preempted, checkpoint saved: start me again" (75,
/// EX_TEMPFAIL; galley's io::kPreemptedExitCode). Such a job is restarted at once, however many
/// restarts it has had, and the restart does not count against max_restarts.
inline constexpr int kPreemptedExitCode = 75;

/// One independent job: a command run, logged, and restarted by the launcher.
struct JobSpec {
  /// Unique name; used in events, the status table and the default log file name.
  std::string name;
  /// argv of the job; argv[0] is looked up in PATH.
  std::vector<std::string> command;
  /// Working directory of the job; empty means the launcher's own.
  std::string working_dir;
  /// Variables added to (or replacing those of) the launcher's environment.
  std::map<std::string, std::string> env;
  /// Number of GPUs wanted; 0 runs the job with no GPU visible.
  int gpu_count = 0;
  /// Explicit GPU ids; when set, gpu_count equals their number.
  std::vector<int> gpu_ids;
  /// Share of each GPU's memory the job may use, in (0, 1]; sets GALLEY_GPU_MEMORY_FRACTION.
  std::optional<double> memory_fraction;
  /// Cap on each GPU's memory in MiB; sets GALLEY_GPU_MEMORY_LIMIT_MB.
  std::optional<long> memory_limit_mb;
  /// CPUs (hardware threads) held by the job alone; sets GALLEY_NUM_THREADS and
  /// OMP_NUM_THREADS. Unset: an even share of the CPUs no job with `cpus` holds.
  std::optional<int> cpus;
  /// The job's known wall time when run alone with every CPU of the allocation, in seconds: the
  /// measured serial time the packing speedup is computed against (else it is estimated).
  std::optional<double> serial_time_s;
  /// Larger runs first; ties start in submission order.
  int priority = 0;
  /// How many times a failed or hung job is started again (exits with kPreemptedExitCode are
  /// restarted without counting).
  int max_restarts = 0;
  /// File the job's stdout and stderr go to; empty means `<log dir>/<name>.log`.
  std::string log_file;
  /// Seconds without any output after which the job counts as hung; 0 disables the check.
  double heartbeat_timeout_s = 0;
  /// Where the job was defined ("jobs.toml:12:1"), prefixed to errors about it; may be empty.
  std::string origin;
  /// The job file it was read from, which no output may overwrite; empty for a job given on the
  /// command line.
  std::string file;
};

/// Checks a spec on its own (no machine needed) and throws LaunchError naming the job and field.
void validate_job(const JobSpec& job);

}  // namespace galley::launch
