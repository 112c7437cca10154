#pragma once
/// \file
/// The command line of galley-launch.

#include <optional>
#include <set>
#include <string>
#include <vector>

#include "job.h"
#include "options.h"

namespace galley::launch {

/// What the command line asked for.
struct CommandLine {
  /// Job file to read, if one was given.
  std::optional<std::string> job_file;
  /// Launcher settings given on the command line (job file settings fill in the rest).
  LauncherOptions options;
  /// Job-file keys of the settings given on the command line, which the job file must not
  /// override.
  std::set<std::string> set_keys;
  /// The job after `--`, if any.
  std::optional<JobSpec> job;
  /// Its name was given with --name (else it is the command's base name, which collect_jobs
  /// suffixes where a job of the file has it).
  bool name_given = false;
  /// Only validate the jobs against the machine and print the plan.
  bool check = false;
  /// Print the usage and stop.
  bool help = false;
  /// Print the version and stop.
  bool version = false;
};

/// Parses argv; throws LaunchError naming the option at fault.
CommandLine parse_command_line(const std::vector<std::string>& args);

/// Jobs of the job file followed by the command-line job; applies the job file's [launcher]
/// settings to `command_line.options`. Throws LaunchError.
std::vector<JobSpec> collect_jobs(CommandLine& command_line);

/// The --help text.
std::string usage();

}  // namespace galley::launch
