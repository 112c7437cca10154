#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <iterator>

#include "gpu_monitor.h"
#include "job.h"
#include "options.h"
#include "scheduler.h"

namespace galley::launch {
namespace {

std::vector<GpuInfo> gpus(int n, long memory_mb = 0) {
  std::vector<GpuInfo> list;
  for (int i = 0; i < n; ++i) list.push_back(GpuInfo{i, memory_mb});
  return list;
}

JobRequest on_gpus(int count, std::optional<double> fraction = std::nullopt, int priority = 0) {
  JobRequest r;
  r.gpu_count = count;
  r.memory_fraction = fraction;
  r.priority = priority;
  return r;
}

std::vector<std::size_t> ids(const std::vector<Assignment>& assignments) {
  std::vector<std::size_t> out;
  for (const auto& a : assignments) out.push_back(a.job);
  return out;
}

TEST(Scheduler, HigherPriorityStartsFirstThenSubmissionOrder) {
  Scheduler s(gpus(1));
  const auto low = s.submit(on_gpus(1, std::nullopt, 1));
  const auto high = s.submit(on_gpus(1, std::nullopt, 5));
  const auto mid_a = s.submit(on_gpus(1, std::nullopt, 3));
  const auto mid_b = s.submit(on_gpus(1, std::nullopt, 3));
  std::vector<std::size_t> order;
  for (int round = 0; round < 4; ++round) {
    auto started = s.schedule();
    ASSERT_EQ(started.size(), 1u);
    order.push_back(started[0].job);
    s.release(started[0].job);
  }
  EXPECT_EQ(order, (std::vector<std::size_t>{high, mid_a, mid_b, low}));
  EXPECT_TRUE(s.schedule().empty());
}

TEST(Scheduler, TwoJobsAtPointFourShareOneGpu) {
  Scheduler s(gpus(1));
  s.submit(on_gpus(1, 0.4));
  s.submit(on_gpus(1, 0.4));
  auto started = s.schedule();
  ASSERT_EQ(started.size(), 2u);
  EXPECT_EQ(started[0].gpu_ids, std::vector<int>{0});
  EXPECT_EQ(started[1].gpu_ids, std::vector<int>{0});
  EXPECT_NEAR(s.used_share(0), 0.8, 1e-9);
}

TEST(Scheduler, RefusesPointSevenPlusPointFourOnOneGpu) {
  Scheduler s(gpus(1));
  const auto a = s.submit(on_gpus(1, 0.7));
  const auto b = s.submit(on_gpus(1, 0.4));
  EXPECT_EQ(ids(s.schedule()), std::vector<std::size_t>{a});
  EXPECT_TRUE(s.schedule().empty());
  s.release(a);
  EXPECT_EQ(ids(s.schedule()), std::vector<std::size_t>{b});
}

TEST(Scheduler, SharesThatSumToExactlyOneFit) {
  Scheduler s(gpus(1));
  s.submit(on_gpus(1, 0.4));
  s.submit(on_gpus(1, 0.4));
  s.submit(on_gpus(1, 0.2));
  EXPECT_EQ(s.schedule().size(), 3u);
}

TEST(Scheduler, WholeGpuJobWaitsForASharedGpuToEmpty) {
  Scheduler s(gpus(1));
  const auto shared = s.submit(on_gpus(1, 0.3));
  const auto whole = s.submit(on_gpus(1));
  EXPECT_EQ(ids(s.schedule()), std::vector<std::size_t>{shared});
  s.release(shared);
  EXPECT_EQ(ids(s.schedule()), std::vector<std::size_t>{whole});
}

TEST(Scheduler, BestFitFillsAPartlyUsedGpuBeforeAnEmptyOne) {
  Scheduler s(gpus(2));
  const auto first = s.submit(on_gpus(1, 0.5));
  s.schedule();
  (void)first;
  s.submit(on_gpus(1, 0.5));
  const auto whole = s.submit(on_gpus(1));
  auto started = s.schedule();
  ASSERT_EQ(started.size(), 2u);
  EXPECT_EQ(started[0].gpu_ids, std::vector<int>{0});  // joins the half-used GPU
  EXPECT_EQ(started[1].job, whole);
  EXPECT_EQ(started[1].gpu_ids, std::vector<int>{1});  // the empty one stays whole
}

TEST(Scheduler, ExplicitIdsAreHonoured) {
  Scheduler s(gpus(4));
  JobRequest r;
  r.gpu_ids = {3, 1};
  const auto a = s.submit(r);
  const auto b = s.submit(r);
  auto started = s.schedule();
  ASSERT_EQ(started.size(), 1u);
  EXPECT_EQ(started[0].job, a);
  EXPECT_EQ(started[0].gpu_ids, (std::vector<int>{1, 3}));
  EXPECT_EQ(s.used_share(0), 0.0);
  EXPECT_EQ(s.used_share(1), 1.0);
  s.release(a);
  EXPECT_EQ(ids(s.schedule()), std::vector<std::size_t>{b});
}

TEST(Scheduler, ZeroGpuJobsRunWithoutAnyGpu) {
  Scheduler s({});
  s.submit(on_gpus(0));
  s.submit(on_gpus(0));
  auto started = s.schedule();
  ASSERT_EQ(started.size(), 2u);
  EXPECT_TRUE(started[0].gpu_ids.empty());
}

TEST(Scheduler, MaxParallelCapsRunningJobs) {
  Scheduler s({}, SchedulerOptions{.max_parallel = 2});
  for (int i = 0; i < 5; ++i) s.submit(on_gpus(0));
  EXPECT_EQ(s.schedule().size(), 2u);
  EXPECT_EQ(s.queued(), 3u);
}

TEST(Scheduler, BackfillLetsASmallJobPassABlockedOne) {
  Scheduler s(gpus(2));
  const auto running = s.submit(on_gpus(1));
  s.schedule();
  const auto big = s.submit(on_gpus(2, std::nullopt, 9));
  const auto small = s.submit(on_gpus(1));
  EXPECT_EQ(ids(s.schedule()), std::vector<std::size_t>{small});
  s.release(running);
  s.release(small);
  EXPECT_EQ(ids(s.schedule()), std::vector<std::size_t>{big});
}

TEST(Scheduler, StrictOrderBlocksBehindAJobThatDoesNotFit) {
  Scheduler s(gpus(2), SchedulerOptions{.strict_order = true});
  const auto running = s.submit(on_gpus(1));
  s.schedule();
  s.submit(on_gpus(2, std::nullopt, 9));
  s.submit(on_gpus(1));
  EXPECT_TRUE(s.schedule().empty());
  s.release(running);
  EXPECT_EQ(s.schedule().size(), 1u);
}

TEST(Scheduler, RequeueKeepsTheOriginalPlace) {
  Scheduler s(gpus(1));
  const auto a = s.submit(on_gpus(1));
  const auto b = s.submit(on_gpus(1));
  EXPECT_EQ(ids(s.schedule()), std::vector<std::size_t>{a});
  s.release(a);
  s.requeue(a);  // a restart: still ahead of b
  EXPECT_EQ(ids(s.schedule()), std::vector<std::size_t>{a});
  s.cancel(b);
  s.release(a);
  EXPECT_TRUE(s.schedule().empty());
}

TEST(Scheduler, MemoryLimitBecomesAShareWhenGpuMemoryIsKnown) {
  Scheduler s(gpus(1, 10000));
  JobRequest r;
  r.gpu_count = 1;
  r.memory_limit_mb = 4000;
  EXPECT_NEAR(s.share_of(r), 0.4, 1e-12);
  s.submit(r);
  s.submit(r);
  s.submit(r);
  EXPECT_EQ(s.schedule().size(), 2u);
}

// On GPUs of different sizes a job that names its GPUs is measured against those: 60 GB fits the
// 80 GB GPU it names (the 40 GB one is not its concern), and two 40 GB jobs share it.
TEST(Scheduler, AMemoryLimitIsMeasuredAgainstTheGpusTheJobNames) {
  Scheduler s({GpuInfo{0, 40960}, GpuInfo{1, 81920}});
  JobRequest big;
  big.gpu_ids = {1};
  big.memory_limit_mb = 61440;
  EXPECT_NEAR(s.share_of(big), 0.75, 1e-12);
  EXPECT_NO_THROW(s.submit(big));
  JobRequest half;
  half.gpu_ids = {1};
  half.memory_limit_mb = 40960;
  EXPECT_NEAR(s.share_of(half), 0.5, 1e-12);
  JobRequest any;  // may land on either: measured against the smaller
  any.gpu_count = 1;
  any.memory_limit_mb = 61440;
  EXPECT_THROW(s.submit(any), LaunchError);
  Scheduler t({GpuInfo{0, 40960}, GpuInfo{1, 81920}});
  t.submit(half);
  t.submit(half);
  EXPECT_EQ(t.schedule().size(), 2u);
}

TEST(Scheduler, MemoryLimitWithUnknownGpuMemoryTakesTheGpuAlone) {
  Scheduler s(gpus(1));
  JobRequest r;
  r.gpu_count = 1;
  r.memory_limit_mb = 4000;
  EXPECT_EQ(s.share_of(r), 1.0);
}

TEST(Scheduler, JobLargerThanTheMachineIsRejectedAtSubmission) {
  Scheduler s(gpus(2));
  try {
    s.submit(on_gpus(3));
    FAIL() << "expected LaunchError";
  } catch (const LaunchError& e) {
    EXPECT_NE(std::string(e.what()).find("wants 3 GPU(s) but this machine has 2"),
              std::string::npos)
        << e.what();
  }
  Scheduler none({});
  EXPECT_THROW(none.submit(on_gpus(1)), LaunchError);
}

TEST(Scheduler, UnknownOrRepeatedExplicitIdsAreRejected) {
  Scheduler s(gpus(2));
  JobRequest r;
  r.gpu_ids = {0, 5};
  EXPECT_THROW(s.submit(r), LaunchError);
  r.gpu_ids = {1, 1};
  EXPECT_THROW(s.submit(r), LaunchError);
}

TEST(Scheduler, BadSharesAndLimitsAreRejected) {
  Scheduler s(gpus(1, 1000));
  EXPECT_THROW(s.submit(on_gpus(1, 1.5)), LaunchError);
  EXPECT_THROW(s.submit(on_gpus(1, 0.0)), LaunchError);
  JobRequest r;
  r.gpu_count = 1;
  r.memory_limit_mb = 2000;
  EXPECT_THROW(s.submit(r), LaunchError);
}

TEST(Scheduler, DuplicateInventoryIdsAreRejected) {
  EXPECT_THROW(Scheduler({GpuInfo{0, 0}, GpuInfo{0, 0}}), LaunchError);
}

// --- CPUs ------------------------------------------------------------------------------------

// `n` physical cores of `threads` hyper-threads each over `nodes` NUMA nodes (cores split evenly,
// in order), numbered as Linux numbers them on x86: thread t of core c is CPU t * n + c.
std::vector<CpuInfo> cores(int n, int threads = 1, int nodes = 1) {
  std::vector<CpuInfo> list;
  for (int t = 0; t < threads; ++t)
    for (int c = 0; c < n; ++c) list.push_back(CpuInfo{t * n + c, c, c / (n / nodes)});
  return list;
}

JobRequest on_cpus(int cpus, int gpus = 0, int priority = 0) {
  JobRequest r;
  r.cpus = cpus;
  r.gpu_count = gpus;
  r.priority = priority;
  return r;
}

JobRequest without_cpus(int gpus = 0, int priority = 0) {
  return on_gpus(gpus, std::nullopt, priority);
}

const Assignment& of(const std::vector<Assignment>& started, std::size_t job) {
  for (const auto& a : started)
    if (a.job == job) return a;
  ADD_FAILURE() << "job " << job << " did not start";
  static const Assignment none;
  return none;
}

bool disjoint(std::vector<int> a, std::vector<int> b) {
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  std::vector<int> both;
  std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(both));
  return both.empty();
}

TEST(SchedulerCpus, JobsWithCpusGetDisjointCpus) {
  Scheduler s({}, cores(4));
  const auto a = s.submit(on_cpus(1));
  const auto b = s.submit(on_cpus(2));
  const auto c = s.submit(on_cpus(1));
  const auto started = s.schedule();
  ASSERT_EQ(started.size(), 3u);
  EXPECT_EQ(of(started, a).cpus, std::vector<int>{0});
  EXPECT_EQ(of(started, b).cpus, (std::vector<int>{1, 2}));
  EXPECT_EQ(of(started, c).cpus, std::vector<int>{3});
  for (int id = 0; id < 4; ++id) EXPECT_EQ(s.cpu_holders(id), 1);
  s.release(b);
  EXPECT_EQ(s.cpu_holders(1), 0);
  EXPECT_EQ(s.cpu_holders(2), 0);
}

TEST(SchedulerCpus, BothHyperThreadsOfACoreBeforeTheNextCore) {
  // Cores 0..3 with siblings {0,4}, {1,5}, {2,6}, {3,7}.
  Scheduler s({}, cores(4, 2));
  const auto a = s.submit(on_cpus(2));
  const auto b = s.submit(on_cpus(3));
  const auto started = s.schedule();
  EXPECT_EQ(of(started, a).cpus, (std::vector<int>{0, 4}));
  EXPECT_EQ(of(started, b).cpus, (std::vector<int>{1, 2, 5}));  // core 1 whole, then half of 2
  // One thread goes to the core already split (2), keeping core 3 whole for a pair.
  const auto c = s.submit(on_cpus(1));
  const auto d = s.submit(on_cpus(2));
  const auto next = s.schedule();
  EXPECT_EQ(of(next, c).cpus, std::vector<int>{6});
  EXPECT_EQ(of(next, d).cpus, (std::vector<int>{3, 7}));
}

TEST(SchedulerCpus, AJobStaysOnOneNumaNodeWhereItFits) {
  // Two nodes of 4 cores each: CPUs 0-3 on node 0, 4-7 on node 1.
  Scheduler s({}, cores(8, 1, 2));
  const auto a = s.submit(on_cpus(3));
  const auto b = s.submit(on_cpus(2));  // does not fit beside a on node 0: node 1
  const auto c = s.submit(on_cpus(1));  // the fullest node that fits: node 0
  const auto started = s.schedule();
  EXPECT_EQ(of(started, a).cpus, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(of(started, b).cpus, (std::vector<int>{4, 5}));
  EXPECT_EQ(of(started, c).cpus, std::vector<int>{3});
  s.release(a);
  s.release(c);
  // 4 free on node 0 and 2 on node 1: 5 CPUs fit on no node, so they span, fullest-free first.
  const auto d = s.submit(on_cpus(5));
  const auto next = s.schedule();
  EXPECT_EQ(of(next, d).cpus, (std::vector<int>{0, 1, 2, 3, 6}));
}

TEST(SchedulerCpus, AJobWaitsForItsCpus) {
  Scheduler s({}, cores(2));
  const auto a = s.submit(on_cpus(2));
  const auto b = s.submit(on_cpus(2));
  EXPECT_EQ(ids(s.schedule()), std::vector<std::size_t>{a});
  EXPECT_TRUE(s.schedule().empty());
  EXPECT_EQ(s.queued(), 1u);
  s.release(a);
  const auto next = s.schedule();
  EXPECT_EQ(ids(next), std::vector<std::size_t>{b});
  EXPECT_EQ(next[0].cpus, (std::vector<int>{0, 1}));
}

TEST(SchedulerCpus, AJobWaitsUntilItsCpusAndItsGpuShareAreBothFree) {
  Scheduler s(gpus(1), cores(2));
  const auto a = s.submit(on_cpus(1, 1));
  const auto b = s.submit(on_cpus(1, 1));  // CPUs free, GPU not
  const auto c = s.submit(on_cpus(2));     // no GPU needed, CPUs not free
  EXPECT_EQ(ids(s.schedule()), std::vector<std::size_t>{a});
  s.release(a);
  EXPECT_EQ(ids(s.schedule()), std::vector<std::size_t>{b});
  s.release(b);
  EXPECT_EQ(ids(s.schedule()), std::vector<std::size_t>{c});
}

TEST(SchedulerCpus, JobsWithoutCpusShareTheUnreservedCpusEvenly) {
  Scheduler s({}, cores(8));
  const auto fixed = s.submit(on_cpus(2));
  const auto x = s.submit(without_cpus());
  const auto y = s.submit(without_cpus());
  const auto z = s.submit(without_cpus());
  const auto started = s.schedule();
  ASSERT_EQ(started.size(), 4u);
  EXPECT_EQ(of(started, fixed).cpus, (std::vector<int>{0, 1}));
  // 6 unreserved CPUs over 3 jobs: 2 each, disjoint.
  EXPECT_EQ(of(started, x).cpus, (std::vector<int>{2, 3}));
  EXPECT_EQ(of(started, y).cpus, (std::vector<int>{4, 5}));
  EXPECT_EQ(of(started, z).cpus, (std::vector<int>{6, 7}));
}

TEST(SchedulerCpus, TheRemainderOfTheEvenShareGoesToTheFirstJobs) {
  Scheduler s({}, cores(5));
  const auto x = s.submit(without_cpus());
  const auto y = s.submit(without_cpus());
  const auto started = s.schedule();
  EXPECT_EQ(of(started, x).cpus, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(of(started, y).cpus, (std::vector<int>{3, 4}));
}

TEST(SchedulerCpus, JobsWithoutCpusNeverWaitAndOverlapOnlyWhenTheyOutnumberTheCpus) {
  Scheduler s({}, cores(2));
  for (int i = 0; i < 3; ++i) s.submit(without_cpus());
  const auto started = s.schedule();
  ASSERT_EQ(started.size(), 3u);
  for (const auto& a : started) EXPECT_EQ(a.cpus.size(), 1u);
  EXPECT_TRUE(disjoint(started[0].cpus, started[1].cpus));
  EXPECT_EQ(s.cpu_holders(0) + s.cpu_holders(1), 3);
  EXPECT_LE(std::abs(s.cpu_holders(0) - s.cpu_holders(1)), 1);  // the least held CPU first
}

TEST(SchedulerCpus, ALaterJobWithoutCpusTakesFreeCpusFirst) {
  Scheduler s(gpus(1), cores(4));
  const auto a = s.submit(without_cpus(1));
  const auto b = s.submit(without_cpus(1));  // waits for the GPU
  const auto c = s.submit(without_cpus());
  const auto started = s.schedule();
  ASSERT_EQ(started.size(), 2u);
  EXPECT_EQ(of(started, a).cpus, (std::vector<int>{0, 1}));
  EXPECT_EQ(of(started, c).cpus, (std::vector<int>{2, 3}));
  s.release(a);
  const auto next = s.schedule();
  EXPECT_EQ(ids(next), std::vector<std::size_t>{b});
  EXPECT_EQ(next[0].cpus, (std::vector<int>{0, 1}));  // 4 over b and c: 2, from the free ones
}

TEST(SchedulerCpus, AJobWithCpusWaitsForCpusAJobWithoutCpusHolds) {
  Scheduler s(gpus(1), cores(2));
  const auto alone = s.submit(without_cpus(1));
  EXPECT_EQ(s.schedule()[0].cpus, (std::vector<int>{0, 1}));  // alone: every CPU
  const auto fixed = s.submit(on_cpus(1));
  EXPECT_TRUE(s.schedule().empty());
  s.release(alone);
  EXPECT_EQ(ids(s.schedule()), std::vector<std::size_t>{fixed});
}

TEST(SchedulerCpus, AJobWithCpusLeavesAJobWithoutCpusOfTheSamePassACpu) {
  Scheduler s({}, cores(2));
  const auto shared = s.submit(without_cpus(0, 5));
  const auto fixed = s.submit(on_cpus(2));
  const auto started = s.schedule();
  EXPECT_EQ(ids(started), std::vector<std::size_t>{shared});
  EXPECT_EQ(started[0].cpus, (std::vector<int>{0, 1}));
  s.release(shared);
  EXPECT_EQ(ids(s.schedule()), std::vector<std::size_t>{fixed});
}

TEST(SchedulerCpus, BackfillLetsASmallerCpuRequestPass) {
  Scheduler s({}, cores(2));
  const auto running = s.submit(on_cpus(1));
  s.schedule();
  const auto big = s.submit(on_cpus(2, 0, 9));
  const auto small = s.submit(on_cpus(1));
  EXPECT_EQ(ids(s.schedule()), std::vector<std::size_t>{small});
  s.release(running);
  s.release(small);
  EXPECT_EQ(ids(s.schedule()), std::vector<std::size_t>{big});
}

TEST(SchedulerCpus, StrictOrderBlocksBehindACpuRequestThatDoesNotFit) {
  Scheduler s({}, cores(2), SchedulerOptions{.strict_order = true});
  const auto running = s.submit(on_cpus(1));
  s.schedule();
  const auto big = s.submit(on_cpus(2, 0, 9));
  s.submit(on_cpus(1));
  EXPECT_TRUE(s.schedule().empty());
  s.release(running);
  EXPECT_EQ(ids(s.schedule()), std::vector<std::size_t>{big});
}

TEST(SchedulerCpus, ARestartedJobGetsItsCpusAgain) {
  Scheduler s({}, cores(2));
  const auto a = s.submit(on_cpus(2));
  s.schedule();
  s.requeue(a);  // releases, then queues again
  EXPECT_EQ(s.cpu_holders(0), 0);
  EXPECT_EQ(s.schedule()[0].cpus, (std::vector<int>{0, 1}));
}

TEST(SchedulerCpus, MoreCpusThanTheMachineHasIsRejectedWithTheNumbers) {
  Scheduler s({}, cores(2));
  try {
    s.submit(on_cpus(3));
    FAIL() << "expected LaunchError";
  } catch (const LaunchError& e) {
    EXPECT_NE(std::string(e.what()).find("wants 3 CPU(s) but only 2 are available (cpus 0-1)"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(s.submit(on_cpus(0)), LaunchError);
  Scheduler untracked(gpus(1));
  EXPECT_THROW(untracked.submit(on_cpus(1)), LaunchError);
  untracked.submit(without_cpus());
  EXPECT_TRUE(untracked.schedule()[0].cpus.empty());  // untracked: nothing pinned
}

TEST(SchedulerCpus, DuplicateCpuIdsAreRejected) {
  EXPECT_THROW(Scheduler({}, {CpuInfo{1, 0, 0}, CpuInfo{1, 1, 0}}), LaunchError);
}

TEST(ParseGpuIds, ListsAndNone) {
  EXPECT_EQ(parse_gpu_ids("0,1,3", "x"), (std::vector<int>{0, 1, 3}));
  EXPECT_EQ(parse_gpu_ids("2", "x"), (std::vector<int>{2}));
  EXPECT_TRUE(parse_gpu_ids("none", "x").empty());
  EXPECT_THROW(parse_gpu_ids("0,,1", "x"), LaunchError);
  EXPECT_THROW(parse_gpu_ids("a", "x"), LaunchError);
}

TEST(GpuMonitor, NeverThrowsAndExplainsItsAbsence) {
  GpuMonitor monitor;
  if (monitor.available()) {
    EXPECT_TRUE(monitor.unavailable_reason().empty());
  } else {
    EXPECT_TRUE(monitor.devices().empty());
    EXPECT_TRUE(monitor.sample({0, 1}).empty());
    EXPECT_NE(monitor.unavailable_reason().find("libnvidia-ml.so.1"), std::string::npos);
  }
}

}  // namespace
}  // namespace galley::launch
