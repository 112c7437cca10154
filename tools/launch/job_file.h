#pragma once
/// \file
/// Reading jobs (and launcher settings) from a TOML job file.

#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "job.h"
#include "options.h"

namespace galley::launch {

/// Parses a job file's text. `source` names it in errors ("jobs.toml:7:1: key 'gpus' ...").
/// Launcher settings from its [launcher] table go into `options` except for the keys in
/// `keep` (those set on the command line win). Throws LaunchError.
std::vector<JobSpec> parse_job_file_text(std::string_view text, const std::string& source,
                                         LauncherOptions& options,
                                         const std::set<std::string>& keep = {});

/// Reads and parses the job file at `path`; see parse_job_file_text.
std::vector<JobSpec> load_job_file(const std::string& path, LauncherOptions& options,
                                   const std::set<std::string>& keep = {});

}  // namespace galley::launch
