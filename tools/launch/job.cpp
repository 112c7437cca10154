#include "job.h"

#include <algorithm>
#include <cctype>
#include <set>
#include <sstream>

#include "options.h"

namespace galley::launch {

void validate_job(const JobSpec& job) {
  const std::string who = "job '" + job.name + "': ";
  if (job.name.empty()) throw LaunchError("a job has no name");
  for (char c : job.name)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.'))
      throw LaunchError(who + "name may only hold letters, digits, '-', '_' and '.'");
  if (job.command.empty() || job.command[0].empty()) throw LaunchError(who + "command is empty");
  // A NUL byte would cut the argument or value short where it is handed to exec.
  const auto has_nul = [](const std::string& s) { return s.find('\0') != std::string::npos; };
  for (std::size_t i = 0; i < job.command.size(); ++i)
    if (has_nul(job.command[i]))
      throw LaunchError(who + "command argument " + std::to_string(i) + " holds a NUL byte");
  if (has_nul(job.working_dir)) throw LaunchError(who + "workdir holds a NUL byte");
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
  if (job.cpus && *job.cpus < 1) throw LaunchError(who + "cpus must be 1 or more");
  if (job.serial_time_s && !(*job.serial_time_s > 0 && *job.serial_time_s <= kMaxSeconds))
    throw LaunchError(who + "serial_time must be a positive number of seconds, at most 1e9");
  if (job.max_restarts < 0) throw LaunchError(who + "max_restarts must be 0 or more");
  if (!(job.heartbeat_timeout_s >= 0 && job.heartbeat_timeout_s <= kMaxSeconds))
    throw LaunchError(who +
                      "heartbeat_timeout must be 0 (off) or a positive number of seconds, at most "
                      "1e9");
  for (const auto& [key, value] : job.env)
    if (key.empty() || key.find('=') != std::string::npos || has_nul(key) || has_nul(value))
      throw LaunchError(who + "environment variable '" + key.substr(0, key.find('\0')) +
                        "': a name must be non-empty without '=' or NUL, a value without NUL");
}

std::chrono::steady_clock::duration clock_duration(double seconds) {
  using Duration = std::chrono::steady_clock::duration;
  constexpr Duration kLongest = Duration::max() / 4;
  if (!(seconds > 0)) return Duration::zero();
  if (seconds >= std::chrono::duration<double>(kLongest).count()) return kLongest;
  return std::chrono::duration_cast<Duration>(std::chrono::duration<double>(seconds));
}

std::string trim(std::string_view text) {
  std::size_t b = 0, e = text.size();
  while (b < e && std::isspace(static_cast<unsigned char>(text[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(text[e - 1]))) --e;
  return std::string(text.substr(b, e - b));
}

bool all_digits(const std::string& text) {
  return !text.empty() && text.size() <= 9 && std::all_of(text.begin(), text.end(), [](char c) {
    return std::isdigit(static_cast<unsigned char>(c));
  });
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

std::vector<int> parse_cpu_list(std::string_view text, const std::string& what) {
  const std::string all = trim(text);
  std::set<int> ids;
  auto bad = [&]() {
    return LaunchError(what + ": expected a CPU list such as \"0-3,8\", got \"" + all + "\"");
  };
  if (all.empty()) return {};
  std::stringstream in(all);
  for (std::string item; std::getline(in, item, ',');) {
    item = trim(item);
    const auto dash = item.find('-');
    const std::string first = item.substr(0, dash);
    const std::string last = dash == std::string::npos ? first : item.substr(dash + 1);
    if (!all_digits(first) || !all_digits(last)) throw bad();
    const int a = std::stoi(first), b = std::stoi(last);
    if (b < a || b - a > 65536) throw bad();
    for (int id = a; id <= b; ++id) ids.insert(id);
  }
  if (!all.empty() && all.back() == ',') throw bad();
  return std::vector<int>(ids.begin(), ids.end());
}

std::string format_cpu_list(std::vector<int> ids) {
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  std::string out;
  for (std::size_t i = 0; i < ids.size();) {
    std::size_t j = i;
    while (j + 1 < ids.size() && ids[j + 1] == ids[j] + 1) ++j;
    out += (i ? "," : "") + std::to_string(ids[i]);
    if (j > i) out += "-" + std::to_string(ids[j]);
    i = j + 1;
  }
  return out;
}

}  // namespace galley::launch
