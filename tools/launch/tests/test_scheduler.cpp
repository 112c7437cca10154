#include <gtest/gtest.h>

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
