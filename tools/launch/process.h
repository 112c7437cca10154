#pragma once
/// \file
/// Starting a job's process: its own process group, piped stdout/stderr, an exact environment,
/// pinned to its CPUs.

#include <sys/resource.h>
#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

namespace galley::launch {

/// What to run.
struct SpawnRequest {
  /// argv; argv[0] is looked up in PATH (of the launcher).
  std::vector<std::string> argv;
  /// Directory to run in; empty keeps the launcher's.
  std::string working_dir;
  /// The whole environment, as "NAME=value" entries.
  std::vector<std::string> env;
  /// CPU ids the child is pinned to (sched_setaffinity before exec); empty leaves the
  /// launcher's affinity.
  std::vector<int> cpus;
  /// Soft limit on open files (RLIMIT_NOFILE) for the child; unset keeps the launcher's.
  std::optional<rlim_t> open_files;
};

/// A started child: it leads its own process group (pgid == pid).
struct Child {
  /// Process id (and process group id).
  pid_t pid = -1;
  /// Read end of the child's stdout pipe, non-blocking, close-on-exec.
  int out_fd = -1;
  /// Read end of the child's stderr pipe, non-blocking, close-on-exec.
  int err_fd = -1;
};

/// Starts `request` with fork/exec. The child gets SIGKILL if the launcher dies first
/// (PR_SET_PDEATHSIG). Throws LaunchError, with the reason, if the program cannot be run
/// (not found, not executable, bad working directory, CPUs it may not be pinned to).
Child spawn_child(const SpawnRequest& request);

/// Builds "NAME=value" entries from the launcher's environment with `overrides` applied.
std::vector<std::string> merged_environment(
    const std::vector<std::pair<std::string, std::string>>& overrides);

/// The name of a signal ("SIGTERM"), or "signal N".
std::string signal_name(int signal);

}  // namespace galley::launch
