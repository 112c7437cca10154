#include "cli.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>

#include "job_file.h"

namespace galley::launch {
namespace {

constexpr long kLongMax = std::numeric_limits<long>::max();

double to_number(const std::string& option, const std::string& text) {
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || errno != 0 || !std::isfinite(v))
    throw LaunchError("option " + option + ": expected a number, got \"" + text + "\"");
  return v;
}

// An integer in [min, max]: the ranges are those the job file allows for the same setting, so
// that a value too large for an int is refused rather than cut to its low bits.
long to_integer(const std::string& option, const std::string& text, long min, long max) {
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || (errno != 0 && errno != ERANGE))
    throw LaunchError("option " + option + ": expected an integer, got \"" + text + "\"");
  if (errno == ERANGE || v < min || v > max)
    throw LaunchError("option " + option + ": " + text + " is out of range [" +
                      std::to_string(min) + ", " + std::to_string(max) + "]");
  return v;
}

int to_int(const std::string& option, const std::string& text, int min, int max) {
  return int(to_integer(option, text, min, max));
}

// A time in seconds, from 0 (or from just above 0 unless `zero_ok`) to kMaxSeconds.
double to_seconds(const std::string& option, const std::string& text, bool zero_ok) {
  const double v = to_number(option, text);
  if (v < 0 || (v == 0 && !zero_ok))
    throw LaunchError("option " + option + ": must be " +
                      (zero_ok ? "0 or a positive" : "a positive") + " number of seconds, got " +
                      text);
  if (v > kMaxSeconds)
    throw LaunchError("option " + option + ": " + text +
                      " s is longer than the longest time allowed, 1e9 s");
  return v;
}

std::string default_name(const std::vector<std::string>& command) {
  std::string base = command.empty() ? "job" : command[0];
  if (auto slash = base.rfind('/'); slash != std::string::npos) base = base.substr(slash + 1);
  for (char& c : base)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.')) c = '_';
  return base.empty() ? "job" : base;
}

}  // namespace

std::string usage() {
  return R"(usage: galley-launch [options] JOBFILE.toml
       galley-launch [options] [job options] -- COMMAND [ARGS...]
       galley-launch [options] JOBFILE.toml [job options] -- COMMAND [ARGS...]

Packs independent jobs onto the GPUs and CPU cores this machine (or the Slurm job, cgroup or
affinity mask it runs in) gives it, each with its own GPU share, cores, log file, priority and
restarts. See docs/launch.md for the job file format.

job options (for the command after --):
  --name NAME               job name (default: the command's base name, with -2, -3...
                            added where a job of the job file has it)
  --gpus N                  number of GPUs (0: none visible; default 0)
  --gpu-ids 0,1             explicit GPU ids instead of a count
  --cpus N                  N CPUs held alone, pinned; sets GALLEY_NUM_THREADS and
                            OMP_NUM_THREADS to N (default: an even share of the CPUs no
                            job with --cpus holds)
  --memory-fraction F       share of each GPU's memory, (0, 1]; sets GALLEY_GPU_MEMORY_FRACTION
  --memory-limit-mb M       memory cap per GPU in MiB; sets GALLEY_GPU_MEMORY_LIMIT_MB
  --priority P              larger starts first (default 0)
  --max-restarts N          restarts after a failure or a hang (default 0)
  --heartbeat-timeout S     no output for S seconds counts as hung (default 0: off)
  --workdir DIR             working directory
  --env NAME=VALUE          extra environment variable (repeatable)
  --log FILE                log file (default LOG_DIR/NAME.log)
  --serial-time S           the job's measured wall time alone, for the packing speedup

launcher options:
  --log-dir DIR             default job logs, events.jsonl, summary.json (galley-launch-logs)
  --event-log FILE          JSON-lines event log (default LOG_DIR/events.jsonl)
  --summary FILE            JSON summary (default LOG_DIR/summary.json)
  --backoff-initial S       first restart delay, doubled each time (default 1)
  --backoff-max S           longest restart delay (default 60)
  --grace-period S          SIGTERM to SIGKILL delay when stopping jobs (default 10)
  --max-parallel N          most jobs at once (default 0: no limit)
  --strict-order            a job that does not fit blocks those behind it (no backfill)
  --status-table auto|on|off  live table (auto: when stdout is a terminal)
  --sample-interval S       GPU utilisation sampling period (default 1)
  --check                   validate the jobs against the machine and exit
  -h, --help                this text
  --version                 print the version

testing and dry runs:
  --gpus-available 0,1      schedule on these GPU ids instead of those NVML reports
                            ("none" for no GPU); the launcher does not check they exist
  --gpu-memory-mb M         memory of each declared GPU (turns memory limits into shares)
  --cpus-available 0-3      schedule on these CPU ids instead of the allocation's
  GALLEY_LAUNCH_FAKE_GPUS=N environment variable: N declared GPUs 0..N-1 (or a list "0,2")

exit status: 0 all jobs succeeded, 1 some failed, 2 usage or job file error,
128+N stopped by signal N.
)";
}

CommandLine parse_command_line(const std::vector<std::string>& args) {
  CommandLine cl;
  JobSpec job;
  bool job_options = false;
  std::size_t i = 0;
  auto value = [&](const std::string& option, std::optional<std::string>& inline_value) {
    if (inline_value) return *inline_value;
    if (i + 1 >= args.size()) throw LaunchError("option " + option + " needs a value");
    return args[++i];
  };
  for (; i < args.size(); ++i) {
    std::string arg = args[i];
    if (arg == "--") {
      job.command.assign(args.begin() + long(i) + 1, args.end());
      if (job.command.empty()) throw LaunchError("no command after --");
      break;
    }
    std::optional<std::string> inline_value;
    if (arg.rfind("--", 0) == 0)
      if (auto eq = arg.find('='); eq != std::string::npos)
        inline_value = arg.substr(eq + 1), arg = arg.substr(0, eq);
    auto& o = cl.options;
    if (arg == "-h" || arg == "--help") {
      cl.help = true;
    } else if (arg == "--version") {
      cl.version = true;
    } else if (arg == "--check") {
      cl.check = true;
    } else if (arg == "--name") {
      job.name = value(arg, inline_value), job_options = true, cl.name_given = true;
    } else if (arg == "--gpus") {
      job.gpu_count = to_int(arg, value(arg, inline_value), 0, 4096), job_options = true;
    } else if (arg == "--gpu-ids") {
      job.gpu_ids = parse_gpu_ids(value(arg, inline_value), "option --gpu-ids");
      job.gpu_count = int(job.gpu_ids.size()), job_options = true;
    } else if (arg == "--cpus") {
      job.cpus = to_int(arg, value(arg, inline_value), 1, 1 << 20), job_options = true;
    } else if (arg == "--serial-time") {
      job.serial_time_s = to_seconds(arg, value(arg, inline_value), false), job_options = true;
    } else if (arg == "--memory-fraction") {
      job.memory_fraction = to_number(arg, value(arg, inline_value)), job_options = true;
    } else if (arg == "--memory-limit-mb") {
      job.memory_limit_mb = to_integer(arg, value(arg, inline_value), 1, kLongMax);
      job_options = true;
    } else if (arg == "--priority") {
      job.priority = to_int(arg, value(arg, inline_value), -1000000, 1000000), job_options = true;
    } else if (arg == "--max-restarts") {
      job.max_restarts = to_int(arg, value(arg, inline_value), 0, 1000000), job_options = true;
    } else if (arg == "--heartbeat-timeout") {
      job.heartbeat_timeout_s = to_seconds(arg, value(arg, inline_value), true), job_options = true;
    } else if (arg == "--workdir") {
      job.working_dir = value(arg, inline_value), job_options = true;
    } else if (arg == "--env") {
      const std::string kv = value(arg, inline_value);
      const auto eq = kv.find('=');
      if (eq == std::string::npos || eq == 0)
        throw LaunchError("option --env: expected NAME=VALUE, got \"" + kv + "\"");
      job.env[kv.substr(0, eq)] = kv.substr(eq + 1), job_options = true;
    } else if (arg == "--log") {
      job.log_file = value(arg, inline_value), job_options = true;
    } else if (arg == "--log-dir") {
      o.log_dir = value(arg, inline_value), cl.set_keys.insert("log_dir");
    } else if (arg == "--event-log") {
      o.event_log = value(arg, inline_value), cl.set_keys.insert("event_log");
    } else if (arg == "--summary") {
      o.summary_file = value(arg, inline_value), cl.set_keys.insert("summary");
    } else if (arg == "--gpus-available") {
      o.gpus_available = parse_gpu_ids(value(arg, inline_value), "option --gpus-available");
      cl.set_keys.insert("gpus_available");
    } else if (arg == "--cpus-available") {
      o.cpus_available = parse_cpu_list(value(arg, inline_value), "option --cpus-available");
      if (o.cpus_available->empty())
        throw LaunchError("option --cpus-available: the CPU list is empty");
      cl.set_keys.insert("cpus_available");
    } else if (arg == "--gpu-memory-mb") {
      o.gpu_memory_mb = to_integer(arg, value(arg, inline_value), 0, kLongMax);
      cl.set_keys.insert("gpu_memory_mb");
    } else if (arg == "--backoff-initial") {
      o.backoff_initial_s = to_seconds(arg, value(arg, inline_value), true);
      cl.set_keys.insert("backoff_initial");
    } else if (arg == "--backoff-max") {
      o.backoff_max_s = to_seconds(arg, value(arg, inline_value), true);
      cl.set_keys.insert("backoff_max");
    } else if (arg == "--grace-period") {
      o.grace_period_s = to_seconds(arg, value(arg, inline_value), true);
      cl.set_keys.insert("grace_period");
    } else if (arg == "--max-parallel") {
      o.max_parallel = to_int(arg, value(arg, inline_value), 0, 1000000);
      cl.set_keys.insert("max_parallel");
    } else if (arg == "--strict-order") {
      o.strict_order = true, cl.set_keys.insert("strict_order");
    } else if (arg == "--sample-interval") {
      o.sample_interval_s = to_seconds(arg, value(arg, inline_value), false);
      cl.set_keys.insert("sample_interval");
    } else if (arg == "--status-table") {
      const std::string v = value(arg, inline_value);
      if (v == "auto")
        o.status_table = StatusTable::kAuto;
      else if (v == "on")
        o.status_table = StatusTable::kOn;
      else if (v == "off")
        o.status_table = StatusTable::kOff;
      else
        throw LaunchError("option --status-table: expected auto, on or off, got \"" + v + "\"");
    } else if (arg.size() > 1 && arg[0] == '-') {
      throw LaunchError("unknown option " + arg + " (see galley-launch --help)");
    } else {
      if (cl.job_file)
        throw LaunchError("more than one job file given (\"" + *cl.job_file + "\" and \"" + arg +
                          "\"); a command to run goes after --");
      cl.job_file = arg;
    }
    if (inline_value && (arg == "--strict-order" || arg == "--check" || arg == "--help"))
      throw LaunchError("option " + arg + " takes no value");
  }
  if (cl.help || cl.version) return cl;
  if (!job.command.empty()) {
    if (job.name.empty()) job.name = default_name(job.command);
    cl.job = job;
  } else if (job_options) {
    throw LaunchError(
        "job options such as --gpus, --cpus or --memory-fraction apply to a command given "
        "after --, and there is none");
  }
  if (!cl.job && !cl.job_file)
    throw LaunchError(
        "nothing to run: give a job file or a command after -- "
        "(see galley-launch --help)");
  return cl;
}

std::vector<JobSpec> collect_jobs(CommandLine& cl) {
  std::vector<JobSpec> jobs;
  if (cl.job_file) jobs = load_job_file(*cl.job_file, cl.options, cl.set_keys);
  if (cl.job) {
    JobSpec job = *cl.job;
    // A name taken from the command is made unique with a suffix (a second `train` becomes
    // train-2); a name given with --name is the user's and a clash is an error, since events,
    // the summary and the default log would otherwise go under a name nobody asked for.
    const auto taken = [&](const std::string& name) {
      return std::find_if(jobs.begin(), jobs.end(),
                          [&](const JobSpec& other) { return other.name == name; });
    };
    if (auto other = taken(job.name); cl.name_given && other != jobs.end())
      throw LaunchError("option --name: job name '" + job.name + "' is already taken by a job of " +
                        (other->origin.empty() ? "the job file" : other->origin));
    const std::string base = job.name;
    for (int n = 2; taken(job.name) != jobs.end(); ++n) job.name = base + "-" + std::to_string(n);
    jobs.push_back(std::move(job));
  }
  return jobs;
}

}  // namespace galley::launch
