#include "machine.h"

#include <errno.h>
#include <sched.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "job.h"
#include "options.h"

namespace galley::launch {
namespace {

namespace fs = std::filesystem;

std::optional<std::string> read_line(const fs::path& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::string line;
  std::getline(in, line);
  return line;
}

std::optional<std::vector<int>> try_cpu_list(std::string_view text) {
  try {
    return parse_cpu_list(text, "");
  } catch (const LaunchError&) {
    return std::nullopt;
  }
}

// Numbers of the entries named `prefix`N in `dir` (cpu0, cpu1, node0, ...).
std::vector<int> numbered_entries(const fs::path& dir, const std::string& prefix) {
  std::vector<int> ids;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.rfind(prefix, 0) == 0 && all_digits(name.substr(prefix.size())))
      ids.push_back(std::stoi(name.substr(prefix.size())));
  }
  std::sort(ids.begin(), ids.end());
  return ids;
}

// The cgroup v2 path of this process ("0::/a/b" gives "/a/b").
std::string cgroup_v2_path(const std::string& proc_cgroup) {
  std::ifstream in(proc_cgroup);
  for (std::string line; std::getline(in, line);)
    if (line.rfind("0::", 0) == 0) return line.substr(3);
  return "";
}

// The GPU entries of a CUDA_VISIBLE_DEVICES-like value, up to the first CUDA would stop at.
std::vector<std::string> gpu_entries(const std::string& name, const std::string& value,
                                     std::vector<std::string>& notes) {
  std::vector<std::string> list;
  if (trim(value).empty()) return list;
  std::stringstream in(value);
  for (std::string item; std::getline(in, item, ',');) {
    item = trim(item);
    const bool uuid = item.rfind("GPU-", 0) == 0 || item.rfind("MIG-", 0) == 0;
    if (!all_digits(item) && !uuid) {
      notes.push_back(name + " entry \"" + item +
                      "\" is not a GPU id or UUID: it and the entries after it are ignored, "
                      "as CUDA ignores them");
      break;
    }
    // CUDA reads "01" as device 1: ids are compared as numbers.
    const std::string entry = uuid ? item : std::to_string(std::stoi(item));
    if (std::find(list.begin(), list.end(), entry) != list.end()) {
      notes.push_back(name + " lists GPU " + entry + " twice: counted once");
      continue;
    }
    list.push_back(entry);
  }
  return list;
}

}  // namespace

std::vector<CpuInfo> read_cpu_topology(const std::string& sys_root) {
  const fs::path cpu_dir = fs::path(sys_root) / "devices/system/cpu";
  const fs::path node_dir = fs::path(sys_root) / "devices/system/node";
  std::optional<std::vector<int>> online;
  if (auto text = read_line(cpu_dir / "online")) online = try_cpu_list(*text);
  std::map<int, int> node_of;
  for (int node : numbered_entries(node_dir, "node"))
    if (auto text = read_line(node_dir / ("node" + std::to_string(node)) / "cpulist"))
      if (auto list = try_cpu_list(*text))
        for (int id : *list) node_of.emplace(id, node);
  std::vector<CpuInfo> cpus;
  std::map<std::string, int> core_of;  // sibling list, or "package:core", to a dense core index
  for (int id : numbered_entries(cpu_dir, "cpu")) {
    if (online && !std::binary_search(online->begin(), online->end(), id)) continue;
    const fs::path topo = cpu_dir / ("cpu" + std::to_string(id)) / "topology";
    std::string key;
    if (auto siblings = read_line(topo / "thread_siblings_list"))
      if (auto list = try_cpu_list(*siblings); list && !list->empty())
        key = "siblings:" + format_cpu_list(*list);
    if (key.empty()) {
      auto package = read_line(topo / "physical_package_id");
      auto core = read_line(topo / "core_id");
      key = package && core ? "core:" + trim(*package) + ":" + trim(*core)
                            : "cpu:" + std::to_string(id);
    }
    const int core = core_of.emplace(key, int(core_of.size())).first->second;
    const auto node = node_of.find(id);
    cpus.push_back(CpuInfo{id, core, node == node_of.end() ? 0 : node->second});
  }
  return cpus;
}

MachineProbe probe_machine(const ProbeSources& sources) {
  MachineProbe probe;
  probe.topology = read_cpu_topology(sources.sys_root);
  if (sources.read_affinity) {
    // Large machines need a mask wider than cpu_set_t's 1024 bits.
    for (int bits = 1024; bits <= (1 << 20); bits *= 4) {
      cpu_set_t* set = CPU_ALLOC(bits);
      const std::size_t size = CPU_ALLOC_SIZE(bits);
      CPU_ZERO_S(size, set);
      const bool ok = sched_getaffinity(0, size, set) == 0;
      if (ok)
        for (int id = 0; id < bits; ++id)
          if (CPU_ISSET_S(id, size, set)) probe.affinity.push_back(id);
      CPU_FREE(set);
      if (ok || errno != EINVAL) break;
    }
  }
  // cgroup v2 at this process's own cgroup, then at the root (a container's namespace), then
  // cgroup v1's cpuset controller.
  const fs::path cgroup = fs::path(sources.sys_root) / "fs/cgroup";
  std::vector<fs::path> files;
  const std::string own = cgroup_v2_path(sources.proc_cgroup);
  if (!own.empty() && own != "/")
    files.push_back(cgroup / fs::path(own).relative_path() / "cpuset.cpus.effective");
  files.push_back(cgroup / "cpuset.cpus.effective");
  files.push_back(cgroup / "cpuset/cpuset.effective_cpus");
  for (const auto& file : files)
    if (auto text = read_line(file))
      if (auto list = try_cpu_list(*text); list && !list->empty()) {
        probe.cgroup_cpus = *list;
        probe.cgroup_file = file.string();
        break;
      }
  if (sources.read_environment)
    for (const char* name : kAllocationVariables)
      if (const char* value = std::getenv(name)) probe.env[name] = value;
  return probe;
}

Allocation detect_allocation(const MachineProbe& probe) {
  Allocation a;
  std::vector<int> ids = probe.affinity;
  std::vector<std::string> sources;
  if (!ids.empty()) {
    sources.push_back("affinity mask " + format_cpu_list(ids));
  } else {
    for (const auto& cpu : probe.topology) ids.push_back(cpu.id);
    sources.push_back(ids.empty() ? "no CPU information: CPU 0 alone"
                                  : "online CPUs " + format_cpu_list(ids));
    if (ids.empty()) ids = {0};
  }
  if (probe.cgroup_cpus) {
    std::vector<int> both;
    std::set_intersection(ids.begin(), ids.end(), probe.cgroup_cpus->begin(),
                          probe.cgroup_cpus->end(), std::back_inserter(both));
    if (both.empty()) {
      a.notes.push_back("the cgroup cpuset " + format_cpu_list(*probe.cgroup_cpus) + " (" +
                        probe.cgroup_file + ") shares no CPU with the affinity mask: ignored");
    } else {
      if (both != ids)
        sources.push_back("cgroup cpuset " + format_cpu_list(*probe.cgroup_cpus) + " (" +
                          probe.cgroup_file + ")");
      ids = both;
    }
  }
  if (!probe.topology.empty()) {
    std::vector<int> online;
    for (int id : ids)
      for (const auto& cpu : probe.topology)
        if (cpu.id == id) online.push_back(id);
    if (online.size() != ids.size() && !online.empty()) {
      sources.push_back("online " + format_cpu_list(online));
      ids = online;
    }
  }
  if (auto it = probe.env.find("SLURM_CPUS_ON_NODE"); it != probe.env.end()) {
    const std::string value = trim(it->second);
    if (!all_digits(value) || std::stoi(value) < 1) {
      a.notes.push_back("SLURM_CPUS_ON_NODE=\"" + it->second + "\" is not a CPU count: ignored");
    } else if (std::size_t(std::stoi(value)) < ids.size()) {
      ids.resize(std::size_t(std::stoi(value)));
      sources.push_back("SLURM_CPUS_ON_NODE=" + value + ": the first " + value);
    } else if (std::size_t(std::stoi(value)) > ids.size()) {
      a.notes.push_back("SLURM_CPUS_ON_NODE=" + value + " but only " + std::to_string(ids.size()) +
                        " CPUs are usable: using those");
    }
  }
  // Topology where known; a CPU it does not know becomes a core of its own on node 0.
  int next_core = 1 << 30;
  for (int id : ids) {
    auto known = std::find_if(probe.topology.begin(), probe.topology.end(),
                              [&](const CpuInfo& cpu) { return cpu.id == id; });
    a.cpus.push_back(known != probe.topology.end() ? *known : CpuInfo{id, next_core++, 0});
  }
  for (std::size_t i = 0; i < sources.size(); ++i) a.cpu_source += (i ? ", " : "") + sources[i];

  for (const char* name : {"CUDA_VISIBLE_DEVICES", "SLURM_STEP_GPUS", "SLURM_JOB_GPUS"}) {
    auto it = probe.env.find(name);
    if (it == probe.env.end()) continue;
    a.gpus = gpu_entries(name, it->second, a.notes);
    a.gpu_source = name;
    break;
  }
  return a;
}

std::string describe_allocation(const Allocation& a) {
  std::set<int> cores, nodes;
  std::vector<int> ids;
  for (const auto& cpu : a.cpus)
    cores.insert(cpu.core), nodes.insert(cpu.node), ids.push_back(cpu.id);
  std::string text = std::to_string(a.cpus.size()) + " CPU(s) " + format_cpu_list(ids) + " on " +
                     std::to_string(cores.size()) + " core(s), " + std::to_string(nodes.size()) +
                     " NUMA node(s) (" + a.cpu_source + ")";
  if (a.gpus) {
    std::string list;
    for (std::size_t i = 0; i < a.gpus->size(); ++i) list += (i ? "," : "") + (*a.gpus)[i];
    text += "; GPUs restricted by " + a.gpu_source + " to " +
            (a.gpus->empty() ? std::string("none") : "[" + list + "]");
  }
  return text;
}

}  // namespace galley::launch
