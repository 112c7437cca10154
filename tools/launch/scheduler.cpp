#include "scheduler.h"

#include <algorithm>
#include <map>
#include <sstream>

#include "job.h"
#include "options.h"

namespace galley::launch {
namespace {

// Shares are decimal fractions (0.4 + 0.4 + 0.2): compare with a tolerance.
constexpr double kEps = 1e-9;

std::string join_ids(const std::vector<GpuInfo>& gpus) {
  std::ostringstream out;
  for (std::size_t i = 0; i < gpus.size(); ++i) out << (i ? "," : "") << gpus[i].id;
  return out.str();
}

std::string cpu_list(const std::vector<CpuInfo>& cpus) {
  std::vector<int> ids;
  for (const auto& cpu : cpus) ids.push_back(cpu.id);
  return format_cpu_list(ids);
}

}  // namespace

Scheduler::Scheduler(std::vector<GpuInfo> gpus, SchedulerOptions options)
    : Scheduler(std::move(gpus), {}, options) {}

Scheduler::Scheduler(std::vector<GpuInfo> gpus, std::vector<CpuInfo> cpus, SchedulerOptions options)
    : gpus_(std::move(gpus)),
      used_(gpus_.size(), 0.0),
      cpus_(std::move(cpus)),
      holders_(cpus_.size(), 0),
      reserved_(cpus_.size(), 0),
      options_(options) {
  for (std::size_t i = 0; i < gpus_.size(); ++i)
    for (std::size_t j = i + 1; j < gpus_.size(); ++j)
      if (gpus_[i].id == gpus_[j].id)
        throw LaunchError("GPU id " + std::to_string(gpus_[i].id) +
                          " appears twice in the GPU inventory");
  std::sort(cpus_.begin(), cpus_.end(),
            [](const CpuInfo& a, const CpuInfo& b) { return a.id < b.id; });
  for (std::size_t i = 0; i + 1 < cpus_.size(); ++i)
    if (cpus_[i].id == cpus_[i + 1].id)
      throw LaunchError("CPU " + std::to_string(cpus_[i].id) +
                        " appears twice in the CPU inventory");
}

std::size_t Scheduler::cpu_index_of(int cpu_id) const {
  for (std::size_t i = 0; i < cpus_.size(); ++i)
    if (cpus_[i].id == cpu_id) return i;
  return cpus_.size();
}

std::size_t Scheduler::index_of(int gpu_id) const {
  for (std::size_t i = 0; i < gpus_.size(); ++i)
    if (gpus_[i].id == gpu_id) return i;
  return gpus_.size();
}

double Scheduler::share_of(const JobRequest& request) const {
  double share = 0;
  if (request.memory_fraction) share = *request.memory_fraction;
  if (request.memory_limit_mb) {
    // Over the GPUs the job may be placed on: the ones it names, else any.
    long smallest = 0;
    for (const auto& gpu : gpus_)
      if (gpu.memory_mb > 0 && (smallest == 0 || gpu.memory_mb < smallest) &&
          (request.gpu_ids.empty() ||
           std::count(request.gpu_ids.begin(), request.gpu_ids.end(), gpu.id) > 0))
        smallest = gpu.memory_mb;
    // Without known GPU memory a limit cannot be turned into a share: hold the GPU alone.
    double limit_share = smallest > 0 ? double(*request.memory_limit_mb) / double(smallest) : 1.0;
    share = std::max(share, limit_share);
  }
  return share > 0 ? share : 1.0;
}

std::size_t Scheduler::submit(const JobRequest& request) {
  const int wanted = request.gpu_ids.empty() ? request.gpu_count : int(request.gpu_ids.size());
  if (wanted < 0) throw LaunchError("a job cannot want a negative number of GPUs");
  if (wanted > int(gpus_.size())) {
    throw LaunchError("the job wants " + std::to_string(wanted) + " GPU(s) but this machine has " +
                      std::to_string(gpus_.size()) +
                      (gpus_.empty() ? std::string(" (no GPU found: is the NVIDIA driver "
                                                   "loaded? --gpus-available declares GPUs for a "
                                                   "dry run)")
                                     : " (ids " + join_ids(gpus_) + "); ask for fewer GPUs"));
  }
  for (std::size_t i = 0; i < request.gpu_ids.size(); ++i) {
    const int id = request.gpu_ids[i];
    if (index_of(id) == gpus_.size())
      throw LaunchError("the job asks for GPU " + std::to_string(id) +
                        ", which this machine does not have (ids: " +
                        (gpus_.empty() ? std::string("none") : join_ids(gpus_)) + ")");
    for (std::size_t j = 0; j < i; ++j)
      if (request.gpu_ids[j] == id)
        throw LaunchError("the job lists GPU " + std::to_string(id) + " twice");
  }
  if (request.memory_fraction && !(*request.memory_fraction > 0 && *request.memory_fraction <= 1))
    throw LaunchError("memory fraction " + std::to_string(*request.memory_fraction) +
                      " is outside (0, 1]");
  if (request.memory_limit_mb) {
    if (*request.memory_limit_mb <= 0)
      throw LaunchError("memory limit must be a positive number of MiB");
    for (const auto& gpu : gpus_)
      if (gpu.memory_mb > 0 && *request.memory_limit_mb > gpu.memory_mb && wanted > 0 &&
          (request.gpu_ids.empty() ||
           std::count(request.gpu_ids.begin(), request.gpu_ids.end(), gpu.id) > 0))
        throw LaunchError("memory limit " + std::to_string(*request.memory_limit_mb) +
                          " MiB is more than GPU " + std::to_string(gpu.id) + " has (" +
                          std::to_string(gpu.memory_mb) + " MiB)");
  }
  if (request.cpus) {
    if (*request.cpus < 1) throw LaunchError("a job must ask for at least 1 CPU");
    if (*request.cpus > int(cpus_.size()))
      throw LaunchError("the job wants " + std::to_string(*request.cpus) + " CPU(s) but only " +
                        std::to_string(cpus_.size()) +
                        (cpus_.size() == 1 ? " is available" : " are available") +
                        (cpus_.empty() ? std::string(" (CPUs are not tracked)")
                                       : " (cpus " + cpu_list(cpus_) + "); ask for fewer"));
  }
  Entry entry{request, share_of(request)};
  entry.request.gpu_count = wanted;
  jobs_.push_back(entry);
  const std::size_t id = jobs_.size() - 1;
  requeue(id);
  return id;
}

void Scheduler::requeue(std::size_t job) {
  if (job >= jobs_.size()) throw LaunchError("unknown job id " + std::to_string(job));
  if (running_.count(job)) release(job);
  if (std::find(queue_.begin(), queue_.end(), job) != queue_.end()) return;
  auto before = [this](std::size_t a, std::size_t b) {
    const int pa = jobs_[a].request.priority, pb = jobs_[b].request.priority;
    return pa != pb ? pa > pb : a < b;
  };
  queue_.insert(std::upper_bound(queue_.begin(), queue_.end(), job, before), job);
}

void Scheduler::cancel(std::size_t job) {
  queue_.erase(std::remove(queue_.begin(), queue_.end(), job), queue_.end());
}

std::optional<std::vector<int>> Scheduler::place(const Entry& entry) const {
  const auto& request = entry.request;
  auto fits = [&](std::size_t index) { return used_[index] + entry.share <= 1.0 + kEps; };
  if (!request.gpu_ids.empty()) {
    for (int id : request.gpu_ids)
      if (!fits(index_of(id))) return std::nullopt;
    std::vector<int> ids = request.gpu_ids;
    std::sort(ids.begin(), ids.end());
    return ids;
  }
  std::vector<std::size_t> candidates;
  for (std::size_t i = 0; i < gpus_.size(); ++i)
    if (fits(i)) candidates.push_back(i);
  if (int(candidates.size()) < request.gpu_count) return std::nullopt;
  // Best fit: fill GPUs that are already partly used before opening empty ones, so whole GPUs
  // stay free for jobs that need them alone.
  std::stable_sort(candidates.begin(), candidates.end(),
                   [this](std::size_t a, std::size_t b) { return used_[a] > used_[b] + kEps; });
  std::vector<int> ids;
  for (int i = 0; i < request.gpu_count; ++i) ids.push_back(gpus_[candidates[i]].id);
  std::sort(ids.begin(), ids.end());
  return ids;
}

std::vector<std::size_t> Scheduler::pick_in_node(const std::vector<std::size_t>& candidates,
                                                 int count) const {
  // Cores in the order of their lowest CPU id, with the candidate CPUs of each.
  std::map<int, std::vector<std::size_t>> by_core;
  std::map<int, int> core_size, core_first;
  for (std::size_t i = 0; i < cpus_.size(); ++i) {
    core_size[cpus_[i].core] += 1;
    if (!core_first.count(cpus_[i].core)) core_first[cpus_[i].core] = cpus_[i].id;
  }
  for (std::size_t index : candidates) by_core[cpus_[index].core].push_back(index);
  std::vector<int> order;
  for (const auto& [core, list] : by_core) order.push_back(core);
  std::sort(order.begin(), order.end(),
            [&](int a, int b) { return core_first.at(a) < core_first.at(b); });
  std::vector<std::size_t> picked;
  std::vector<char> used_core(order.size(), 0);
  auto take = [&](std::size_t k, int most) {
    auto& list = by_core.at(order[k]);
    for (int i = 0; i < most && i < int(list.size()); ++i) picked.push_back(list[std::size_t(i)]);
    used_core[k] = 1;
  };
  // Whole free cores while the request holds a whole core.
  for (std::size_t k = 0; k < order.size() && int(picked.size()) < count; ++k) {
    const int size = int(by_core.at(order[k]).size());
    if (size == core_size.at(order[k]) && count - int(picked.size()) >= size) take(k, size);
  }
  // The rest from cores already split (fewest free first), so that whole cores stay whole;
  // then by splitting whole cores.
  std::vector<std::size_t> rest;
  for (std::size_t k = 0; k < order.size(); ++k)
    if (!used_core[k]) rest.push_back(k);
  std::stable_sort(rest.begin(), rest.end(), [&](std::size_t a, std::size_t b) {
    const bool split_a = int(by_core.at(order[a]).size()) < core_size.at(order[a]);
    const bool split_b = int(by_core.at(order[b]).size()) < core_size.at(order[b]);
    if (split_a != split_b) return split_a;
    return split_a && by_core.at(order[a]).size() < by_core.at(order[b]).size();
  });
  for (std::size_t k : rest) {
    if (int(picked.size()) >= count) break;
    take(k, count - int(picked.size()));
  }
  return picked;
}

std::vector<std::size_t> Scheduler::pick_cpus(const std::vector<std::size_t>& candidates,
                                              int count) const {
  std::map<int, std::vector<std::size_t>> by_node;
  for (std::size_t index : candidates) by_node[cpus_[index].node].push_back(index);
  std::vector<int> nodes;
  for (const auto& [node, list] : by_node) nodes.push_back(node);
  // One node if any fits: the one with the fewest free CPUs that still fits. Otherwise the
  // nodes with the most free CPUs first, to span as few as possible.
  std::optional<int> fit;
  for (int node : nodes)
    if (int(by_node[node].size()) >= count && (!fit || by_node[node].size() < by_node[*fit].size()))
      fit = node;
  if (fit) {
    nodes = {*fit};
  } else {
    std::stable_sort(nodes.begin(), nodes.end(),
                     [&](int a, int b) { return by_node[a].size() > by_node[b].size(); });
  }
  std::vector<std::size_t> picked;
  for (int node : nodes) {
    if (int(picked.size()) >= count) break;
    for (std::size_t index : pick_in_node(by_node[node], count - int(picked.size())))
      picked.push_back(index);
  }
  return picked;
}

std::vector<int> Scheduler::hold_cpus(const std::vector<std::size_t>& picked, bool reserve) {
  std::vector<int> ids;
  for (std::size_t index : picked) {
    holders_[index] += 1;
    if (reserve) reserved_[index] = 1;
    ids.push_back(cpus_[index].id);
  }
  std::sort(ids.begin(), ids.end());
  return ids;
}

std::vector<Assignment> Scheduler::schedule() {
  const bool track_cpus = !cpus_.empty();
  auto count_cpus = [&](auto&& pred) {
    int n = 0;
    for (std::size_t i = 0; i < cpus_.size(); ++i) n += pred(i) ? 1 : 0;
    return n;
  };
  std::vector<Assignment> started;
  std::vector<std::size_t> shared;  // positions in `started` of jobs without cpus
  for (auto it = queue_.begin(); it != queue_.end();) {
    if (options_.max_parallel > 0 && int(running_.size()) >= options_.max_parallel) break;
    const Entry& entry = jobs_[*it];
    auto ids = place(entry);
    bool fits = ids.has_value();
    if (fits && track_cpus) {
      const int unreserved = count_cpus([&](std::size_t i) { return !reserved_[i]; });
      if (entry.request.cpus) {
        const int wanted = *entry.request.cpus;
        fits = count_cpus([&](std::size_t i) { return holders_[i] == 0; }) >= wanted &&
               (shared.empty() || unreserved - wanted >= 1);
      } else {
        fits = unreserved >= 1;
      }
    }
    if (!fits) {
      if (options_.strict_order) break;
      ++it;
      continue;
    }
    Assignment assignment{*it, *ids, ids->empty() ? 0.0 : entry.share, {}};
    for (int id : *ids) used_[index_of(id)] += assignment.share;
    if (track_cpus && entry.request.cpus) {
      std::vector<std::size_t> free;
      for (std::size_t i = 0; i < cpus_.size(); ++i)
        if (holders_[i] == 0) free.push_back(i);
      assignment.cpus = hold_cpus(pick_cpus(free, *entry.request.cpus), true);
    } else if (track_cpus) {
      shared.push_back(started.size());
    }
    running_[*it] = assignment;
    started.push_back(std::move(assignment));
    it = queue_.erase(it);
  }
  if (!shared.empty()) {
    // The even share, once every job with cpus of this pass holds its CPUs.
    int sharing = int(shared.size());
    for (const auto& [id, held] : running_)
      if (!jobs_[id].request.cpus && !held.cpus.empty()) sharing += 1;
    const int unreserved = count_cpus([&](std::size_t i) { return !reserved_[i]; });
    for (std::size_t k = 0; k < shared.size(); ++k) {
      const int count = std::max(1, unreserved / sharing + (int(k) < unreserved % sharing ? 1 : 0));
      std::vector<std::size_t> free, busy;
      for (std::size_t i = 0; i < cpus_.size(); ++i) {
        if (holders_[i] == 0)
          free.push_back(i);
        else if (!reserved_[i])
          busy.push_back(i);
      }
      std::vector<std::size_t> picked;
      if (int(free.size()) >= count) {
        picked = pick_cpus(free, count);
      } else {
        picked = free;
        std::stable_sort(busy.begin(), busy.end(),
                         [&](std::size_t a, std::size_t b) { return holders_[a] < holders_[b]; });
        for (std::size_t i = 0; int(picked.size()) < count && i < busy.size(); ++i)
          picked.push_back(busy[i]);
      }
      Assignment& assignment = started[shared[k]];
      assignment.cpus = hold_cpus(picked, false);
      running_[assignment.job].cpus = assignment.cpus;
    }
  }
  return started;
}

void Scheduler::release(std::size_t job) {
  auto it = running_.find(job);
  if (it == running_.end()) return;
  for (int id : it->second.gpu_ids) {
    double& used = used_[index_of(id)];
    used = std::max(0.0, used - it->second.share);
    if (used < kEps) used = 0;
  }
  for (int id : it->second.cpus) {
    const std::size_t index = cpu_index_of(id);
    holders_[index] = std::max(0, holders_[index] - 1);
    if (jobs_[job].request.cpus) reserved_[index] = 0;
  }
  running_.erase(it);
}

double Scheduler::used_share(int id) const {
  const std::size_t index = index_of(id);
  if (index == gpus_.size()) throw LaunchError("unknown GPU id " + std::to_string(id));
  return used_[index];
}

int Scheduler::cpu_holders(int id) const {
  const std::size_t index = cpu_index_of(id);
  if (index == cpus_.size()) throw LaunchError("unknown CPU id " + std::to_string(id));
  return holders_[index];
}

}  // namespace galley::launch
