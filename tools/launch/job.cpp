#include "job.h"

#include <cctype>
#include <cmath>

#include "options.h"

namespace galley::launch {

void validate_job(const JobSpec& job) {
  const std::string who = "job '" + job.name + "': ";
  if (job.name.empty()) throw LaunchError("a job has no name");
  for (char c : job.name)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.'))
      throw LaunchError(who + "name may only hold letters, digits, '-', '_' and '.'");
  if (job.command.empty() || job.command[0].empty()) throw LaunchError(who + "command is empty");
  if (job.gpu_count < 0) throw LaunchError(who + "gpus must be 0 or more");
  if (!job.gpu_ids.empty() && job.gpu_count != int(job.gpu_ids.size()))
    throw LaunchError(who + "gpu count and the number of explicit GPU ids disagree");
  for (int id : job.gpu_ids)
    if (id < 0) throw LaunchError(who + "GPU ids must be 0 or more");
  if (job.memory_fraction && !(*job.memory_fraction > 0 && *job.memory_fraction <= 1))
    throw LaunchError(who + "memory_fraction must be in (0, 1], got " +
                      std::to_string(*job.memory_fraction));
  if (job.memory_limit_mb && *job.memory_limit_mb <= 0)
    throw LaunchError(who + "memory_limit_mb must be a positive number of MiB");
  if (job.max_restarts < 0) throw LaunchError(who + "max_restarts must be 0 or more");
  if (job.heartbeat_timeout_s < 0 || !std::isfinite(job.heartbeat_timeout_s))
    throw LaunchError(who + "heartbeat_timeout must be 0 (off) or a positive number of seconds");
  for (const auto& [key, value] : job.env)
    if (key.empty() || key.find('=') != std::string::npos)
      throw LaunchError(who + "environment variable name '" + key + "' is not valid");
}

std::vector<int> parse_gpu_ids(const std::string& text, const std::string& what) {
  std::vector<int> ids;
  if (text.empty() || text == "none") return ids;
  auto bad = [&]() {
    return LaunchError(what +
                       ": expected a comma-separated list of GPU ids such as \"0,1\" "
                       "(or \"none\"), got \"" +
                       text + "\"");
  };
  std::size_t pos = 0;
  while (pos <= text.size()) {
    std::size_t end = text.find(',', pos);
    if (end == std::string::npos) end = text.size();
    const std::string item = text.substr(pos, end - pos);
    if (item.empty() || item.size() > 6) throw bad();
    for (char c : item)
      if (!std::isdigit(static_cast<unsigned char>(c))) throw bad();
    ids.push_back(std::stoi(item));
    pos = end + 1;
  }
  return ids;
}

}  // namespace galley::launch
