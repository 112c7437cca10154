#pragma once
/// \file
/// Packing jobs onto GPUs and CPU cores: a pure component with no processes, clocks or I/O, so
/// that every placement decision can be unit-tested.

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <vector>

namespace galley::launch {

/// One GPU the scheduler may hand out.
struct GpuInfo {
  /// Index as CUDA_VISIBLE_DEVICES (with CUDA_DEVICE_ORDER=PCI_BUS_ID) and NVML know it.
  int id = 0;
  /// Total memory in MiB; 0 when unknown (a declared, fake inventory).
  long memory_mb = 0;
};

/// One logical CPU (hardware thread) the scheduler may hand out.
struct CpuInfo {
  /// Id as the kernel numbers it (sched_setaffinity, /proc/cpuinfo).
  int id = 0;
  /// Physical core: CPUs with the same value are hyper-thread siblings of one core.
  int core = 0;
  /// NUMA node.
  int node = 0;
};

/// What a job asks of the scheduler.
struct JobRequest {
  /// GPUs wanted; 0 means none.
  int gpu_count = 0;
  /// Explicit GPU ids (gpu_count is then their number).
  std::vector<int> gpu_ids;
  /// Memory share of each GPU in (0, 1], if the job declared one.
  std::optional<double> memory_fraction;
  /// Memory cap per GPU in MiB, if the job declared one.
  std::optional<long> memory_limit_mb;
  /// Larger starts first.
  int priority = 0;
  /// CPUs (hardware threads) held by this job alone; unset: an even share of the CPUs no job
  /// with `cpus` holds (see Scheduler).
  std::optional<int> cpus;
};

/// Knobs of the scheduling policy.
struct SchedulerOptions {
  /// Most jobs running at once (0: no limit); guards the CPU when many 0-GPU jobs queue.
  int max_parallel = 0;
  /// When true a job that does not fit blocks every job behind it; otherwise later jobs that
  /// fit start ahead of it (backfill).
  bool strict_order = false;
};

/// A decision: start this job on these GPUs and CPUs.
struct Assignment {
  /// Id returned by Scheduler::submit.
  std::size_t job = 0;
  /// GPUs given to the job, in ascending order; empty for a 0-GPU job.
  std::vector<int> gpu_ids;
  /// Share of each of those GPUs the job holds.
  double share = 0;
  /// CPU ids the job is pinned to, ascending; empty when the scheduler tracks no CPUs.
  std::vector<int> cpus;
};

/// Priority queue of jobs and the GPU shares and CPUs they hold. Not thread-safe.
///
/// CPUs. A job that declares `cpus = N` holds N CPUs that no other running job holds: whole
/// physical cores first (every hyper-thread of a core before the next core), within one NUMA
/// node when one has N free CPUs (the fullest node that fits, so that large holes stay whole),
/// otherwise spread over the nodes with the most free CPUs. It waits until N CPUs are free.
///
/// A job without `cpus` gets an even share of the unreserved CPUs, those no job with `cpus`
/// holds: when a scheduling pass starts it, U unreserved CPUs are divided among the n jobs
/// without `cpus` then running or starting in that pass, U / n each (the first U % n starting
/// in queue order take one more), at least 1. It takes CPUs that no running job holds first
/// (placed as above), and only when too few are free, the unreserved CPUs fewest jobs hold: so
/// such jobs overlap only when they outnumber the unreserved CPUs or when earlier ones, started
/// with a larger share, still run. Such a job never waits for CPUs while one unreserved CPU
/// exists; a job with `cpus` waits for CPUs such jobs hold, and does not start where it would
/// leave a job without `cpus` starting in the same pass no unreserved CPU.
class Scheduler {
 public:
  /// A scheduler over `gpus` (may be empty: then only 0-GPU jobs run) that tracks no CPUs:
  /// jobs get none and a job declaring `cpus` is refused.
  explicit Scheduler(std::vector<GpuInfo> gpus, SchedulerOptions options = {});

  /// A scheduler over `gpus` and `cpus` (the CPUs it may hand out; ids unique).
  Scheduler(std::vector<GpuInfo> gpus, std::vector<CpuInfo> cpus, SchedulerOptions options = {});

  /// Queues a job; throws LaunchError when it could never run on this machine (more GPUs than
  /// exist, an unknown id, a share above 1, a memory limit above a GPU's memory, more CPUs than
  /// the scheduler has).
  std::size_t submit(const JobRequest& request);

  /// Puts a job that has released its GPUs back in the queue at its original place.
  void requeue(std::size_t job);

  /// Removes a queued job (the launcher is stopping); no effect on a running one.
  void cancel(std::size_t job);

  /// Starts as many queued jobs as fit, by priority then submission, and returns them.
  std::vector<Assignment> schedule();

  /// Frees what a running job holds.
  void release(std::size_t job);

  /// Share of GPU `id` in use, in [0, 1].
  double used_share(int id) const;

  /// Number of running jobs pinned to CPU `id` (0 when free).
  int cpu_holders(int id) const;

  /// Number of jobs waiting.
  std::size_t queued() const { return queue_.size(); }

  /// Number of jobs holding resources.
  std::size_t running() const { return running_.size(); }

  /// The GPU inventory.
  const std::vector<GpuInfo>& gpus() const { return gpus_; }

  /// The CPU inventory, ascending by id.
  const std::vector<CpuInfo>& cpus() const { return cpus_; }

  /// Share of a GPU a request takes (fraction, limit over the GPU's memory, or 1).
  double share_of(const JobRequest& request) const;

 private:
  struct Entry {
    JobRequest request;
    double share = 1;
  };
  std::optional<std::vector<int>> place(const Entry& entry) const;
  std::size_t index_of(int gpu_id) const;
  std::size_t cpu_index_of(int cpu_id) const;
  std::vector<std::size_t> pick_cpus(const std::vector<std::size_t>& candidates, int count) const;
  std::vector<std::size_t> pick_in_node(const std::vector<std::size_t>& candidates,
                                        int count) const;
  std::vector<int> hold_cpus(const std::vector<std::size_t>& picked, bool reserve);

  std::vector<GpuInfo> gpus_;
  std::vector<double> used_;  // share in use, per index of gpus_
  std::vector<CpuInfo> cpus_;
  std::vector<int> holders_;    // running jobs pinned to each CPU, per index of cpus_
  std::vector<char> reserved_;  // held by a job that declared cpus, per index of cpus_
  SchedulerOptions options_;
  std::vector<Entry> jobs_;                    // by job id (= submission order)
  std::vector<std::size_t> queue_;             // ids waiting, ordered
  std::map<std::size_t, Assignment> running_;  // id -> what it holds
};

}  // namespace galley::launch
