#pragma once
/// \file
/// The launcher: runs jobs as the scheduler places them on the GPUs and CPUs of its allocation,
/// pins them, logs them, restarts them, stops them.

#include <memory>
#include <string>
#include <vector>

#include "job.h"
#include "options.h"

namespace galley::launch {

/// How a run ended.
struct RunResult {
  /// Suggested exit status of the launcher: 0 all jobs succeeded, 1 some failed,
  /// 128 + signal when stopped by SIGINT, SIGTERM, SIGHUP or SIGQUIT.
  int exit_code = 0;
};

/// Runs a set of jobs to completion. One per process: it installs SIGINT, SIGTERM, SIGHUP,
/// SIGQUIT and SIGCHLD handlers, raises its soft limit on open files, and makes itself the
/// subreaper of its jobs' descendants.
class Launcher {
 public:
  /// Detects the allocation and validates the jobs against it (or against the declared GPU and
  /// CPU inventories); throws LaunchError for a job that could never run, before anything
  /// starts.
  Launcher(std::vector<JobSpec> jobs, LauncherOptions options);
  ~Launcher();
  Launcher(const Launcher&) = delete;
  Launcher& operator=(const Launcher&) = delete;

  /// Runs every job, prints the summary and writes it as JSON; returns when all have ended.
  RunResult run();

  /// One line saying which CPUs and GPUs the launcher packs onto and where they came from (its
  /// affinity mask, the cgroup cpuset, Slurm's and CUDA's variables).
  std::string allocation() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace galley::launch
