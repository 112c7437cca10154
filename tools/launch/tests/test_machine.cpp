// The machine probe on fake sysfs trees, and allocation detection on injected probes: affinity
// masks, cgroup cpusets, Slurm's and CUDA's variables.

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "job.h"
#include "machine.h"
#include "options.h"

namespace galley::launch {
namespace {

namespace fs = std::filesystem;

// A scratch sysfs tree, removed at the end of the test.
class FakeSys : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    root_ = fs::temp_directory_path() /
            ("galley-launch-sys-" + std::to_string(getpid()) + "-" + info->name());
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void TearDown() override { fs::remove_all(root_); }

  void write(const std::string& path, const std::string& text) {
    fs::create_directories((root_ / path).parent_path());
    std::ofstream(root_ / path) << text << "\n";
  }

  // CPU `id` with its topology files; `siblings` empty leaves thread_siblings_list out.
  void cpu(int id, int package, int core, const std::string& siblings) {
    const std::string dir = "devices/system/cpu/cpu" + std::to_string(id) + "/topology/";
    write(dir + "physical_package_id", std::to_string(package));
    write(dir + "core_id", std::to_string(core));
    if (!siblings.empty()) write(dir + "thread_siblings_list", siblings);
  }

  ProbeSources sources() const {
    ProbeSources s;
    s.sys_root = root_.string();
    s.proc_cgroup = (root_ / "proc-self-cgroup").string();
    s.read_affinity = false;
    s.read_environment = false;
    return s;
  }

  fs::path root_;
};

std::vector<int> ids_of(const std::vector<CpuInfo>& cpus) {
  std::vector<int> ids;
  for (const auto& cpu : cpus) ids.push_back(cpu.id);
  return ids;
}

TEST(CpuList, ParsesAndFormatsRanges) {
  EXPECT_EQ(parse_cpu_list("0-3,8,10-11\n", "x"), (std::vector<int>{0, 1, 2, 3, 8, 10, 11}));
  EXPECT_EQ(parse_cpu_list(" 5 ", "x"), std::vector<int>{5});
  EXPECT_EQ(parse_cpu_list("3,1,1", "x"), (std::vector<int>{1, 3}));
  EXPECT_TRUE(parse_cpu_list("", "x").empty());
  EXPECT_THROW(parse_cpu_list("3-1", "x"), LaunchError);
  EXPECT_THROW(parse_cpu_list("0,,1", "x"), LaunchError);
  EXPECT_THROW(parse_cpu_list("0,", "x"), LaunchError);
  EXPECT_THROW(parse_cpu_list("a", "x"), LaunchError);
  EXPECT_EQ(format_cpu_list({8, 0, 1, 2, 3, 10, 11}), "0-3,8,10-11");
  EXPECT_EQ(format_cpu_list({}), "");
}

TEST_F(FakeSys, TopologyGroupsHyperThreadsIntoCoresAndReadsNumaNodes) {
  // Two nodes of two 2-thread cores each; CPU 8 is offline.
  write("devices/system/cpu/online", "0-7");
  for (int c = 0; c < 4; ++c) {
    const std::string siblings = std::to_string(c) + "," + std::to_string(c + 4);
    cpu(c, c / 2, c % 2, siblings);
    cpu(c + 4, c / 2, c % 2, siblings);
  }
  cpu(8, 1, 7, "8");
  write("devices/system/node/node0/cpulist", "0-1,4-5");
  write("devices/system/node/node1/cpulist", "2-3,6-7");
  const auto cpus = read_cpu_topology(root_.string());
  ASSERT_EQ(ids_of(cpus), (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
  for (int c = 0; c < 4; ++c) {
    EXPECT_EQ(cpus[std::size_t(c)].core, cpus[std::size_t(c + 4)].core) << "cpu " << c;
    EXPECT_EQ(cpus[std::size_t(c)].node, c / 2) << "cpu " << c;
  }
  EXPECT_NE(cpus[0].core, cpus[1].core);
  EXPECT_NE(cpus[0].core, cpus[2].core);  // core_id 0 again, but on the other package
}

TEST_F(FakeSys, TopologyWithoutSiblingListsUsesPackageAndCoreIds) {
  cpu(0, 0, 0, "");
  cpu(1, 1, 0, "");
  cpu(2, 0, 0, "");
  const auto cpus = read_cpu_topology(root_.string());
  ASSERT_EQ(cpus.size(), 3u);
  EXPECT_EQ(cpus[0].core, cpus[2].core);
  EXPECT_NE(cpus[0].core, cpus[1].core);
  EXPECT_EQ(cpus[1].node, 0);  // no node directory: node 0
}

TEST_F(FakeSys, NoSysfsMeansNoTopology) {
  EXPECT_TRUE(read_cpu_topology((root_ / "absent").string()).empty());
}

TEST_F(FakeSys, TheCgroupCpusetOfTheProcessOwnCgroupComesFirst) {
  cpu(0, 0, 0, "0");
  write("fs/cgroup/cpuset.cpus.effective", "0-7");
  write("fs/cgroup/slurm/job_42/cpuset.cpus.effective", "2-3");
  write("proc-self-cgroup", "0::/slurm/job_42");
  auto probe = probe_machine(sources());
  ASSERT_TRUE(probe.cgroup_cpus);
  EXPECT_EQ(*probe.cgroup_cpus, (std::vector<int>{2, 3}));
  EXPECT_NE(probe.cgroup_file.find("job_42"), std::string::npos);
  EXPECT_TRUE(probe.affinity.empty());
  EXPECT_TRUE(probe.env.empty());
  // Without a cgroup of its own (a container's namespace root) the root file counts.
  write("proc-self-cgroup", "0::/");
  probe = probe_machine(sources());
  ASSERT_TRUE(probe.cgroup_cpus);
  EXPECT_EQ(probe.cgroup_cpus->size(), 8u);
}

TEST(ProbeMachine, TheRealMachineHasAnAffinityMask) {
  const auto probe = probe_machine();
  EXPECT_FALSE(probe.affinity.empty());
  const auto allocation = detect_allocation(probe);
  EXPECT_FALSE(allocation.cpus.empty());
  EXPECT_NE(describe_allocation(allocation).find("affinity mask"), std::string::npos);
}

// A flat 8-CPU machine, one core per CPU, whose launcher may use every CPU.
MachineProbe eight_cpus() {
  MachineProbe p;
  for (int id = 0; id < 8; ++id) p.topology.push_back(CpuInfo{id, id, id / 4});
  p.affinity = {0, 1, 2, 3, 4, 5, 6, 7};
  return p;
}

TEST(DetectAllocation, TheAffinityMaskLimitsTheCpus) {
  auto p = eight_cpus();
  p.affinity = {2, 3, 6};
  const auto a = detect_allocation(p);
  EXPECT_EQ(ids_of(a.cpus), (std::vector<int>{2, 3, 6}));
  EXPECT_EQ(a.cpus[2].node, 1);  // topology kept
  EXPECT_EQ(a.cpu_source, "affinity mask 2-3,6");
  EXPECT_FALSE(a.gpus);
}

TEST(DetectAllocation, TheCgroupCpusetLimitsTheMaskFurther) {
  auto p = eight_cpus();
  p.cgroup_cpus = std::vector<int>{0, 1, 2, 3};
  p.cgroup_file = "/sys/fs/cgroup/cpuset.cpus.effective";
  p.affinity = {2, 3, 4, 5};
  const auto a = detect_allocation(p);
  EXPECT_EQ(ids_of(a.cpus), (std::vector<int>{2, 3}));
  EXPECT_NE(a.cpu_source.find("cgroup cpuset 0-3"), std::string::npos) << a.cpu_source;
}

TEST(DetectAllocation, SlurmCpusOnNodeTakesTheFirstCpusOfALargerMask) {
  auto p = eight_cpus();
  p.env["SLURM_CPUS_ON_NODE"] = "3";
  p.env["SLURM_JOB_ID"] = "42";
  const auto a = detect_allocation(p);
  EXPECT_EQ(ids_of(a.cpus), (std::vector<int>{0, 1, 2}));
  EXPECT_NE(a.cpu_source.find("SLURM_CPUS_ON_NODE=3"), std::string::npos) << a.cpu_source;
  EXPECT_TRUE(a.notes.empty());
}

TEST(DetectAllocation, SlurmCpusOnNodeNeverWidensTheMask) {
  auto p = eight_cpus();
  p.affinity = {4, 5};
  p.env["SLURM_CPUS_ON_NODE"] = "4";
  auto a = detect_allocation(p);
  EXPECT_EQ(ids_of(a.cpus), (std::vector<int>{4, 5}));
  ASSERT_EQ(a.notes.size(), 1u);
  EXPECT_NE(a.notes[0].find("only 2 CPUs are usable"), std::string::npos) << a.notes[0];
  p.env["SLURM_CPUS_ON_NODE"] = "lots";
  a = detect_allocation(p);
  EXPECT_EQ(a.cpus.size(), 2u);
  ASSERT_EQ(a.notes.size(), 1u);
  EXPECT_NE(a.notes[0].find("not a CPU count"), std::string::npos);
}

TEST(DetectAllocation, OfflineCpusAreLeftOutAndUnknownOnesGetACoreOfTheirOwn) {
  auto p = eight_cpus();
  p.affinity = {6, 7, 8, 9};  // 8 and 9 are not online
  EXPECT_EQ(ids_of(detect_allocation(p).cpus), (std::vector<int>{6, 7}));
  p.topology.clear();  // no sysfs: every CPU of the mask, each its own core
  const auto a = detect_allocation(p);
  ASSERT_EQ(ids_of(a.cpus), (std::vector<int>{6, 7, 8, 9}));
  EXPECT_NE(a.cpus[0].core, a.cpus[1].core);
}

TEST(DetectAllocation, CudaVisibleDevicesRestrictsTheGpusInItsOrder) {
  auto p = eight_cpus();
  p.env["CUDA_VISIBLE_DEVICES"] = "3, 1";
  p.env["SLURM_JOB_GPUS"] = "6,7";  // CUDA's own numbering wins
  const auto a = detect_allocation(p);
  ASSERT_TRUE(a.gpus);
  EXPECT_EQ(*a.gpus, (std::vector<std::string>{"3", "1"}));
  EXPECT_EQ(a.gpu_source, "CUDA_VISIBLE_DEVICES");
  EXPECT_NE(describe_allocation(a).find("CUDA_VISIBLE_DEVICES to [3,1]"), std::string::npos)
      << describe_allocation(a);
}

TEST(DetectAllocation, AGpuIdWrittenTwoWaysIsCountedOnce) {
  auto p = eight_cpus();
  p.env["CUDA_VISIBLE_DEVICES"] = "1,01,001,2";  // CUDA reads 01 as device 1
  const auto a = detect_allocation(p);
  ASSERT_TRUE(a.gpus);
  EXPECT_EQ(*a.gpus, (std::vector<std::string>{"1", "2"}));
  ASSERT_EQ(a.notes.size(), 2u);
  EXPECT_NE(a.notes[0].find("lists GPU 1 twice"), std::string::npos) << a.notes[0];
}

TEST(DetectAllocation, SlurmStepGpusThenJobGpusWithoutCudaVisibleDevices) {
  auto p = eight_cpus();
  p.env["SLURM_JOB_GPUS"] = "4,5,6";
  auto a = detect_allocation(p);
  ASSERT_TRUE(a.gpus);
  EXPECT_EQ(*a.gpus, (std::vector<std::string>{"4", "5", "6"}));
  EXPECT_EQ(a.gpu_source, "SLURM_JOB_GPUS");
  p.env["SLURM_STEP_GPUS"] = "5";
  a = detect_allocation(p);
  EXPECT_EQ(*a.gpus, std::vector<std::string>{"5"});
  EXPECT_EQ(a.gpu_source, "SLURM_STEP_GPUS");
}

TEST(DetectAllocation, EmptyCudaVisibleDevicesMeansNoGpu) {
  auto p = eight_cpus();
  p.env["CUDA_VISIBLE_DEVICES"] = "";
  const auto a = detect_allocation(p);
  ASSERT_TRUE(a.gpus);
  EXPECT_TRUE(a.gpus->empty());
}

TEST(DetectAllocation, UuidsAreKeptAndAnInvalidEntryEndsTheListAsForCuda) {
  auto p = eight_cpus();
  p.env["CUDA_VISIBLE_DEVICES"] = "GPU-8f0c,2,-1,3";
  const auto a = detect_allocation(p);
  ASSERT_TRUE(a.gpus);
  EXPECT_EQ(*a.gpus, (std::vector<std::string>{"GPU-8f0c", "2"}));
  ASSERT_EQ(a.notes.size(), 1u);
  EXPECT_NE(a.notes[0].find("\"-1\""), std::string::npos) << a.notes[0];
}

}  // namespace
}  // namespace galley::launch
