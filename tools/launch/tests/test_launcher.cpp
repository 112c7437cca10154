// The launcher's checks made before anything runs (the Launcher constructor), and the time
// conversion its deadlines use. Running jobs is left to the integration tests.

#include <chrono>
#include <cmath>
#include <limits>

#include <gtest/gtest.h>

#include "launcher.h"
#include "options.h"

namespace galley::launch {
namespace {

using Duration = std::chrono::steady_clock::duration;

// The message of the LaunchError the constructor throws, or "no error".
std::string construction_error(std::vector<JobSpec> jobs, LauncherOptions options) {
  try {
    Launcher launcher(std::move(jobs), std::move(options));
  } catch (const LaunchError& e) {
    return e.what();
  }
  return "no error";
}

JobSpec job(const std::string& name) {
  JobSpec spec;
  spec.name = name;
  spec.command = {"true"};
  return spec;
}

LauncherOptions no_gpus() {
  LauncherOptions options;
  options.gpus_available = std::vector<int>{};
  return options;
}

TEST(ClockDuration, SaturatesInsteadOfOverflowing) {
  using namespace std::chrono_literals;
  EXPECT_EQ(clock_duration(1.5), 1500ms);
  EXPECT_EQ(clock_duration(1e9), std::chrono::seconds(1'000'000'000));
  // 1e10 s is more nanoseconds than int64 holds: it was converted to a negative duration, so a
  // heartbeat or grace period of 1e10 s ran out at once.
  const Duration longest = Duration::max() / 4;
  EXPECT_EQ(clock_duration(1e10), longest);
  EXPECT_EQ(clock_duration(1e300), longest);
  EXPECT_EQ(clock_duration(std::numeric_limits<double>::infinity()), longest);
  EXPECT_EQ(clock_duration(-1), Duration::zero());
  EXPECT_EQ(clock_duration(std::nan("")), Duration::zero());
  // A deadline of now plus the longest does not overflow.
  const auto now = std::chrono::steady_clock::now();
  EXPECT_GT(now + clock_duration(1e300), now);
}

TEST(LauncherChecks, TimesInOptionsBuiltInCodeAreHeldToTheCommandLinesRule) {
  for (double bad : {std::numeric_limits<double>::infinity(), std::nan(""), -1.0, 1e10}) {
    auto options = no_gpus();
    options.grace_period_s = bad;
    EXPECT_NE(construction_error({job("a")}, options).find("grace_period must be"),
              std::string::npos)
        << bad;
    options = no_gpus();
    options.backoff_initial_s = bad;
    EXPECT_NE(construction_error({job("a")}, options).find("backoff_initial must be"),
              std::string::npos)
        << bad;
  }
  auto options = no_gpus();
  options.sample_interval_s = 0;
  EXPECT_NE(construction_error({job("a")}, options).find("sample_interval must be a positive"),
            std::string::npos);
  EXPECT_EQ(construction_error({job("a")}, no_gpus()), "no error");
}

}  // namespace
}  // namespace galley::launch
