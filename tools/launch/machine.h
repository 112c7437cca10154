#pragma once
/// \file
/// What galley-launch was given to pack onto: the CPU topology (sysfs), its own affinity mask,
/// the cgroup cpuset, and the Slurm and CUDA variables it inherited. Reading the machine
/// (probe_machine) is kept apart from deciding (detect_allocation), so that tests feed the
/// latter fake topologies and environments, and the former a fake sysfs tree.

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "scheduler.h"

namespace galley::launch {

/// The environment variables detect_allocation reads.
inline constexpr const char* kAllocationVariables[] = {"CUDA_VISIBLE_DEVICES", "SLURM_STEP_GPUS",
                                                       "SLURM_JOB_GPUS", "SLURM_CPUS_ON_NODE",
                                                       "SLURM_JOB_ID"};

/// Where probe_machine reads: the real machine by default, a fake tree in tests.
struct ProbeSources {
  /// Root of sysfs: devices/system/cpu, devices/system/node and fs/cgroup under it.
  std::string sys_root = "/sys";
  /// The process's cgroup membership, for its cgroup v2 path ("0::/path").
  std::string proc_cgroup = "/proc/self/cgroup";
  /// Read the launcher's real affinity mask (sched_getaffinity); off in tests that set it.
  bool read_affinity = true;
  /// Read the real environment (the kAllocationVariables); off in tests that set it.
  bool read_environment = true;
};

/// Everything detect_allocation looks at: gathered by probe_machine, or written by a test.
struct MachineProbe {
  /// Online CPUs with their physical cores and NUMA nodes, ascending by id (empty: unknown).
  std::vector<CpuInfo> topology;
  /// The launcher's affinity mask (empty: unknown).
  std::vector<int> affinity;
  /// The cgroup's effective cpuset, when a cgroup file gave one.
  std::optional<std::vector<int>> cgroup_cpus;
  /// The file it came from.
  std::string cgroup_file;
  /// The kAllocationVariables that are set, with their values.
  std::map<std::string, std::string> env;
};

/// Reads the online CPUs under `sys_root`/devices/system: a physical core per distinct
/// topology/thread_siblings_list (else per physical_package_id and core_id, else per CPU) and
/// the NUMA node from node*/cpulist (node 0 when absent). Empty when sysfs has no CPUs.
std::vector<CpuInfo> read_cpu_topology(const std::string& sys_root);

/// Reads the machine as `sources` say. Never throws: what cannot be read is left empty.
MachineProbe probe_machine(const ProbeSources& sources = {});

/// What galley-launch may pack onto.
struct Allocation {
  /// CPUs to hand out, ascending by id, with their topology.
  std::vector<CpuInfo> cpus;
  /// How they were found, for the startup line ("affinity mask 0-15, cgroup cpuset 0-7").
  std::string cpu_source;
  /// The GPUs jobs may use, as the restricting variable names them (physical ids, or UUIDs),
  /// in its order; job GPU ids are indexes into this list. Unset when nothing restricts GPUs.
  std::optional<std::vector<std::string>> gpus;
  /// The variable that restricted the GPUs ("CUDA_VISIBLE_DEVICES"); empty when none did.
  std::string gpu_source;
  /// Oddities worth a line in the log (a Slurm count larger than the mask, a bad value).
  std::vector<std::string> notes;
};

/// Decides the allocation. CPUs: the affinity mask, intersected with the cgroup cpuset, less
/// CPUs the topology does not list as online; then, inside Slurm, the first SLURM_CPUS_ON_NODE
/// of them. GPUs: CUDA_VISIBLE_DEVICES when set (it names devices as this process's CUDA sees
/// them, which is what a child's CUDA_VISIBLE_DEVICES must use), else SLURM_STEP_GPUS, else
/// SLURM_JOB_GPUS. An entry CUDA would stop at (not an id, a "GPU-" or a "MIG-" UUID) ends
/// the list, as it does for CUDA. Never throws.
Allocation detect_allocation(const MachineProbe& probe);

/// One line saying what `allocation` holds and where it came from.
std::string describe_allocation(const Allocation& allocation);

}  // namespace galley::launch
