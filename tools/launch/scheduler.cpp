#include "scheduler.h"

#include <algorithm>
#include <sstream>

#include "job.h"

namespace galley::launch {
namespace {

// Shares are decimal fractions (0.4 + 0.4 + 0.2): compare with a tolerance.
constexpr double kEps = 1e-9;

std::string join_ids(const std::vector<GpuInfo>& gpus) {
  std::ostringstream out;
  for (std::size_t i = 0; i < gpus.size(); ++i) out << (i ? "," : "") << gpus[i].id;
  return out.str();
}

}  // namespace

Scheduler::Scheduler(std::vector<GpuInfo> gpus, SchedulerOptions options)
    : gpus_(std::move(gpus)), used_(gpus_.size(), 0.0), options_(options) {
  for (std::size_t i = 0; i < gpus_.size(); ++i)
    for (std::size_t j = i + 1; j < gpus_.size(); ++j)
      if (gpus_[i].id == gpus_[j].id)
        throw LaunchError("GPU id " + std::to_string(gpus_[i].id) +
                          " appears twice in the GPU inventory");
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
    long smallest = 0;
    for (const auto& gpu : gpus_)
      if (gpu.memory_mb > 0 && (smallest == 0 || gpu.memory_mb < smallest))
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
      if (gpu.memory_mb > 0 && *request.memory_limit_mb > gpu.memory_mb && wanted > 0)
        throw LaunchError("memory limit " + std::to_string(*request.memory_limit_mb) +
                          " MiB is more than GPU " + std::to_string(gpu.id) + " has (" +
                          std::to_string(gpu.memory_mb) + " MiB)");
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

std::vector<Assignment> Scheduler::schedule() {
  std::vector<Assignment> started;
  for (auto it = queue_.begin(); it != queue_.end();) {
    if (options_.max_parallel > 0 && int(running_.size()) >= options_.max_parallel) break;
    const Entry& entry = jobs_[*it];
    auto ids = place(entry);
    if (!ids) {
      if (options_.strict_order) break;
      ++it;
      continue;
    }
    Assignment assignment{*it, *ids, ids->empty() ? 0.0 : entry.share};
    for (int id : *ids) used_[index_of(id)] += assignment.share;
    running_[*it] = assignment;
    started.push_back(std::move(assignment));
    it = queue_.erase(it);
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
  running_.erase(it);
}

double Scheduler::used_share(int id) const {
  const std::size_t index = index_of(id);
  if (index == gpus_.size()) throw LaunchError("unknown GPU id " + std::to_string(id));
  return used_[index];
}

}  // namespace galley::launch
