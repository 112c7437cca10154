#include "job_file.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include <toml++/toml.h>

namespace galley::launch {
namespace {

// Keeps the file name at hand so that every error reads "file:line:col: ...".
class Reader {
 public:
  explicit Reader(std::string source) : source_(std::move(source)) {}

  std::string where(const toml::source_region& region) const {
    std::ostringstream out;
    out << source_;
    if (region.begin.line > 0) out << ":" << region.begin.line << ":" << region.begin.column;
    return out.str();
  }

  [[noreturn]] void fail(const toml::source_region& region, const std::string& message) const {
    throw LaunchError(where(region) + ": " + message);
  }

  static std::string type_name(const toml::node& node) {
    switch (node.type()) {
      case toml::node_type::string:
        return "a string";
      case toml::node_type::integer:
        return "an integer";
      case toml::node_type::floating_point:
        return "a number";
      case toml::node_type::boolean:
        return "a boolean";
      case toml::node_type::array:
        return "an array";
      case toml::node_type::table:
        return "a table";
      default:
        return "a date or time";
    }
  }

  [[noreturn]] void wrong_type(const toml::node& node, const std::string& key,
                               const std::string& context, const std::string& expected) const {
    fail(node.source(),
         "key '" + key + "'" + context + ": expected " + expected + ", got " + type_name(node));
  }

  std::string string(const toml::node& node, const std::string& key,
                     const std::string& context) const {
    if (auto v = node.value<std::string>(); v && node.is_string()) return *v;
    wrong_type(node, key, context, "a string");
  }

  long integer(const toml::node& node, const std::string& key, const std::string& context, long min,
               long max = std::numeric_limits<int>::max()) const {
    if (!node.is_integer()) wrong_type(node, key, context, "an integer");
    const int64_t v = *node.value<int64_t>();
    if (v < min || v > max)
      fail(node.source(), "key '" + key + "'" + context + ": " + std::to_string(v) +
                              " is out of range [" + std::to_string(min) + ", " +
                              std::to_string(max) + "]");
    return long(v);
  }

  double number(const toml::node& node, const std::string& key, const std::string& context) const {
    if (!node.is_number()) wrong_type(node, key, context, "a number");
    return *node.value<double>();
  }

  // A time in seconds: a finite number from 0 (or from just above 0 unless `zero_ok`) to
  // kMaxSeconds. TOML writes nan and inf as numbers, and a huge time would overflow the clock's
  // deadlines, so both are refused here, where the key and its line are known. `rule` says what
  // the key takes, for the error.
  double seconds(const toml::node& node, const std::string& key, const std::string& context,
                 bool zero_ok, const std::string& rule) const {
    const double v = number(node, key, context);
    const std::string at = "key '" + key + "'" + context + ": ";
    if (!std::isfinite(v)) fail(node.source(), at + "got " + format(v) + "; " + rule);
    if (v < 0 || (v == 0 && !zero_ok)) fail(node.source(), at + rule);
    if (v > kMaxSeconds)
      fail(node.source(), at + format(v) + " s is longer than the longest time allowed, " +
                              format(kMaxSeconds) + " s");
    return v;
  }

  static std::string format(double v) {
    std::ostringstream out;
    out << v;
    return out.str();
  }

  bool boolean(const toml::node& node, const std::string& key, const std::string& context) const {
    if (!node.is_boolean()) wrong_type(node, key, context, "true or false");
    return *node.value<bool>();
  }

 private:
  std::string source_;
};

const char* const kJobKeys =
    "name, command, workdir, env, gpus, cpus, memory_fraction, memory_limit_mb, priority, "
    "max_restarts, log, heartbeat_timeout, serial_time";
const char* const kLauncherKeys =
    "log_dir, event_log, summary, gpus_available, gpu_memory_mb, cpus_available, "
    "backoff_initial, backoff_max, grace_period, max_parallel, strict_order, sample_interval";

JobSpec read_job(const Reader& reader, const toml::table& table, std::size_t index) {
  JobSpec job;
  job.origin = reader.where(table.source());
  std::string context = " in [[job]] #" + std::to_string(index + 1);
  if (auto* name = table.get("name")) {
    job.name = reader.string(*name, "name", context);
    if (job.name.empty()) reader.fail(name->source(), "key 'name' is empty" + context);
    context = " of job '" + job.name + "'";
  }
  for (auto&& [key_obj, node] : table) {
    const std::string key(key_obj.str());
    if (key == "name") continue;
    if (key == "command") {
      if (node.is_string()) {
        // An empty script would run `/bin/sh -c ""`, which succeeds doing nothing: refused like
        // the empty array.
        const std::string script = *node.value<std::string>();
        if (trim(script).empty())
          reader.fail(node.source(), "key 'command'" + context + " is an empty shell command");
        job.command = {"/bin/sh", "-c", script};
      } else if (auto* array = node.as_array()) {
        for (auto&& item : *array) job.command.push_back(reader.string(item, key, context));
        if (job.command.empty())
          reader.fail(node.source(), "key 'command'" + context + " is empty");
      } else {
        reader.wrong_type(node, key, context,
                          "a string (run with /bin/sh -c) or an array of arguments");
      }
    } else if (key == "workdir") {
      job.working_dir = reader.string(node, key, context);
    } else if (key == "env") {
      auto* env = node.as_table();
      if (!env) reader.wrong_type(node, key, context, "a table of NAME = \"value\"");
      for (auto&& [name, value] : *env) {
        if (value.is_string()) {
          job.env[std::string(name.str())] = *value.value<std::string>();
        } else if (value.is_integer()) {
          job.env[std::string(name.str())] = std::to_string(*value.value<int64_t>());
        } else if (value.is_boolean()) {
          job.env[std::string(name.str())] = *value.value<bool>() ? "1" : "0";
        } else if (value.is_floating_point()) {
          std::ostringstream text;
          text << *value.value<double>();
          job.env[std::string(name.str())] = text.str();
        } else {
          reader.wrong_type(value, "env." + std::string(name.str()), context, "a string");
        }
      }
    } else if (key == "gpus") {
      if (node.is_integer()) {
        job.gpu_count = int(reader.integer(node, key, context, 0, 4096));
      } else if (auto* array = node.as_array()) {
        for (auto&& item : *array)
          job.gpu_ids.push_back(int(reader.integer(item, key, context, 0, 4096)));
        job.gpu_count = int(job.gpu_ids.size());
      } else {
        reader.wrong_type(node, key, context, "a GPU count or an array of GPU ids");
      }
    } else if (key == "cpus") {
      job.cpus = int(reader.integer(node, key, context, 1, 1 << 20));
    } else if (key == "serial_time") {
      job.serial_time_s =
          reader.seconds(node, key, context, false,
                         "must be a positive number of seconds (the job's wall time alone)");
    } else if (key == "memory_fraction") {
      const double f = reader.number(node, key, context);
      if (!(f > 0 && f <= 1))
        reader.fail(node.source(), "key 'memory_fraction'" + context + ": " + std::to_string(f) +
                                       " is outside (0, 1]");
      job.memory_fraction = f;
    } else if (key == "memory_limit_mb") {
      job.memory_limit_mb = reader.integer(node, key, context, 1, std::numeric_limits<long>::max());
    } else if (key == "priority") {
      job.priority = int(reader.integer(node, key, context, -1000000, 1000000));
    } else if (key == "max_restarts") {
      job.max_restarts = int(reader.integer(node, key, context, 0, 1000000));
    } else if (key == "log") {
      job.log_file = reader.string(node, key, context);
    } else if (key == "heartbeat_timeout") {
      job.heartbeat_timeout_s = reader.seconds(node, key, context, true,
                                               "must be 0 (off) or a positive number of seconds");
    } else {
      reader.fail(key_obj.source(),
                  "unknown key '" + key + "'" + context + " (known keys: " + kJobKeys + ")");
    }
  }
  if (job.command.empty()) reader.fail(table.source(), "key 'command' is missing" + context);
  try {
    if (job.name.empty()) job.name = "job-" + std::to_string(index + 1);
    validate_job(job);
  } catch (const LaunchError& e) {
    reader.fail(table.source(), e.what());
  }
  return job;
}

void read_launcher(const Reader& reader, const toml::table& table, LauncherOptions& options,
                   const std::set<std::string>& keep) {
  const std::string context = " in [launcher]";
  for (auto&& [key_obj, node] : table) {
    const std::string key(key_obj.str());
    const bool skip = keep.count(key) > 0;
    if (key == "log_dir") {
      auto v = reader.string(node, key, context);
      if (!skip) options.log_dir = v;
    } else if (key == "event_log") {
      auto v = reader.string(node, key, context);
      if (!skip) options.event_log = v;
    } else if (key == "summary") {
      auto v = reader.string(node, key, context);
      if (!skip) options.summary_file = v;
    } else if (key == "gpus_available") {
      auto* array = node.as_array();
      if (!array) reader.wrong_type(node, key, context, "an array of GPU ids");
      std::vector<int> ids;
      for (auto&& item : *array) ids.push_back(int(reader.integer(item, key, context, 0, 4096)));
      if (!skip) options.gpus_available = ids;
    } else if (key == "cpus_available") {
      std::vector<int> ids;
      if (auto* array = node.as_array()) {
        for (auto&& item : *array)
          ids.push_back(int(reader.integer(item, key, context, 0, 1 << 20)));
        std::sort(ids.begin(), ids.end());
        ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
      } else if (node.is_string()) {
        try {
          ids = parse_cpu_list(*node.value<std::string>(), "key 'cpus_available'" + context);
        } catch (const LaunchError& e) {
          reader.fail(node.source(), e.what());
        }
      } else {
        reader.wrong_type(node, key, context, "an array of CPU ids or a CPU list (\"0-3,8\")");
      }
      if (ids.empty()) reader.fail(node.source(), "key 'cpus_available'" + context + " is empty");
      if (!skip) options.cpus_available = ids;
    } else if (key == "gpu_memory_mb") {
      auto v = reader.integer(node, key, context, 0, std::numeric_limits<long>::max());
      if (!skip) options.gpu_memory_mb = v;
    } else if (key == "backoff_initial" || key == "backoff_max" || key == "grace_period" ||
               key == "sample_interval") {
      const bool zero_ok = key != "sample_interval";
      const double v = reader.seconds(node, key, context, zero_ok,
                                      zero_ok ? "must be 0 or a positive number of seconds"
                                              : "must be a positive number of seconds");
      if (skip) continue;
      if (key == "backoff_initial") options.backoff_initial_s = v;
      if (key == "backoff_max") options.backoff_max_s = v;
      if (key == "grace_period") options.grace_period_s = v;
      if (key == "sample_interval") options.sample_interval_s = v;
    } else if (key == "max_parallel") {
      auto v = int(reader.integer(node, key, context, 0, 1000000));
      if (!skip) options.max_parallel = v;
    } else if (key == "strict_order") {
      auto v = reader.boolean(node, key, context);
      if (!skip) options.strict_order = v;
    } else {
      reader.fail(key_obj.source(),
                  "unknown key '" + key + "'" + context + " (known keys: " + kLauncherKeys + ")");
    }
  }
}

}  // namespace

std::vector<JobSpec> parse_job_file_text(std::string_view text, const std::string& source,
                                         LauncherOptions& options,
                                         const std::set<std::string>& keep) {
  Reader reader(source);
  toml::table root;
  try {
    root = toml::parse(text, source);
  } catch (const toml::parse_error& e) {
    reader.fail(e.source(), std::string(e.description()));
  }
  std::vector<JobSpec> jobs;
  for (auto&& [key_obj, node] : root) {
    const std::string key(key_obj.str());
    if (key == "launcher") {
      auto* table = node.as_table();
      if (!table) reader.wrong_type(node, key, "", "a table ([launcher])");
      read_launcher(reader, *table, options, keep);
    } else if (key == "job") {
      auto* array = node.as_array();
      if (!array || !array->is_array_of_tables())
        reader.fail(node.source(),
                    "key 'job': write each job as an array-of-tables entry, "
                    "[[job]] (with two brackets)");
      for (std::size_t i = 0; i < array->size(); ++i)
        jobs.push_back(read_job(reader, *array->get(i)->as_table(), i));
    } else {
      reader.fail(key_obj.source(), "unknown top-level key '" + key +
                                        "' (a job file holds [launcher] and [[job]] tables)");
    }
  }
  if (jobs.empty()) throw LaunchError(source + ": no jobs; add at least one [[job]] table");
  for (std::size_t i = 0; i < jobs.size(); ++i)
    for (std::size_t j = 0; j < i; ++j)
      if (jobs[i].name == jobs[j].name)
        reader.fail(root["job"].as_array()->get(i)->source(),
                    "key 'name': job name '" + jobs[i].name + "' is used twice");
  return jobs;
}

std::vector<JobSpec> load_job_file(const std::string& path, LauncherOptions& options,
                                   const std::set<std::string>& keep) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw LaunchError("job file '" + path + "' is a directory");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw LaunchError("cannot open job file '" + path + "'");
  std::ostringstream text;
  text << in.rdbuf();
  std::vector<JobSpec> jobs = parse_job_file_text(text.str(), path, options, keep);
  for (JobSpec& job : jobs) job.file = path;
  return jobs;
}

}  // namespace galley::launch
