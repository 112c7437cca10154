// The launcher's checks made before anything runs (the Launcher constructor), and the time
// conversion its deadlines use. Running jobs is left to the integration tests.

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>

#include <gtest/gtest.h>

#include "launcher.h"
#include "options.h"

namespace galley::launch {
namespace {

namespace fs = std::filesystem;
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

JobSpec job(const std::string& name, const std::string& log = "") {
  JobSpec spec;
  spec.name = name;
  spec.command = {"true"};
  spec.log_file = log;
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

// A scratch directory for the outputs, removed at the end of the test.
class LauncherOutputs : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("galley-launch-outputs-" + std::to_string(getpid()) + "-" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    fs::permissions(dir_, fs::perms::owner_all, fs::perm_options::add);
    fs::remove_all(dir_);
  }

  // Options whose default outputs all go under the scratch directory.
  LauncherOptions options() const {
    auto o = no_gpus();
    o.log_dir = (dir_ / "logs").string();
    return o;
  }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  fs::path dir_;
};

TEST_F(LauncherOutputs, TwoOutputsThatAreOneFileAreRefusedNamingBoth) {
  // Each output was opened on its own, truncating the other's lines.
  auto msg = construction_error({job("a", path("same.log")), job("b", path("sub/../same.log"))},
                                options());
  EXPECT_NE(msg.find("the log of job 'a' and the log of job 'b' are the same file"),
            std::string::npos)
      << msg;
  auto o = options();
  o.event_log = path("events.jsonl");
  msg = construction_error({job("a", path("./events.jsonl"))}, o);
  EXPECT_NE(msg.find("the event log and the log of job 'a'"), std::string::npos) << msg;
  o = options();
  o.summary_file = path("logs/a.log");  // job a's default log
  msg = construction_error({job("a")}, o);
  EXPECT_NE(msg.find("the summary and the log of job 'a'"), std::string::npos) << msg;
  // Through a symbolic link to a directory, and through a hard link.
  fs::create_directories(dir_ / "real");
  fs::create_directory_symlink(dir_ / "real", dir_ / "link");
  msg = construction_error({job("a", path("real/x.log")), job("b", path("link/x.log"))}, options());
  EXPECT_NE(msg.find("the log of job 'a' and the log of job 'b'"), std::string::npos) << msg;
  std::ofstream(dir_ / "h1") << "x";
  fs::create_hard_link(dir_ / "h1", dir_ / "h2");
  msg = construction_error({job("a", path("h1")), job("b", path("h2"))}, options());
  EXPECT_NE(msg.find("the log of job 'a' and the log of job 'b'"), std::string::npos) << msg;
  // Writing to /dev/null truncates nothing: jobs may share it.
  EXPECT_EQ(construction_error({job("a", "/dev/null"), job("b", "/dev/null")}, options()),
            "no error");
  EXPECT_EQ(construction_error({job("a"), job("b")}, options()), "no error");
  // Nor does writing to a pipe (/dev/stderr under `| tee`).
  ASSERT_EQ(mkfifo(path("fifo").c_str(), 0600), 0);
  EXPECT_EQ(construction_error({job("a", path("fifo")), job("b", path("fifo"))}, options()),
            "no error");
  // A symbolic link to a file not there yet is that file: fopen would create and share it.
  fs::create_symlink(dir_ / "target.log", dir_ / "dangling.log");
  msg =
      construction_error({job("a", path("dangling.log")), job("b", path("target.log"))}, options());
  EXPECT_NE(msg.find("the log of job 'a' and the log of job 'b'"), std::string::npos) << msg;
}

TEST_F(LauncherOutputs, AnOutputThatCannotBeWrittenIsRefusedNamingWhatItIsForAndNothingIsMade) {
  std::ofstream(dir_ / "file") << "x";
  auto o = options();
  o.summary_file = path("file/summary.json");
  auto msg = construction_error({job("a")}, o);
  EXPECT_NE(msg.find("cannot write the summary '" + path("file/summary.json") + "': '" +
                     path("file") + "' is not a directory"),
            std::string::npos)
      << msg;
  o = options();
  o.event_log = path("file/deeper/events.jsonl");
  msg = construction_error({job("a")}, o);
  EXPECT_NE(msg.find("cannot write the event log"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'" + path("file") + "' is not a directory"), std::string::npos) << msg;
  fs::create_directories(dir_ / "adir");
  msg = construction_error({job("a", path("adir"))}, options());
  EXPECT_NE(msg.find("cannot write the log of job 'a' '" + path("adir") + "': it is a directory"),
            std::string::npos)
      << msg;
  msg = construction_error({job("a", path("adir/"))}, options());
  EXPECT_NE(msg.find("names a directory"), std::string::npos) << msg;
  // Checking made nothing: not the log directory, not a file.
  EXPECT_FALSE(fs::exists(dir_ / "logs"));
  if (geteuid() != 0) {  // root may write anywhere
    fs::create_directories(dir_ / "locked");
    fs::permissions(dir_ / "locked", fs::perms::owner_read | fs::perms::owner_exec);
    msg = construction_error({job("a", path("locked/sub/a.log"))}, options());
    EXPECT_NE(msg.find("cannot create files in '" + path("locked") + "'"), std::string::npos)
        << msg;
    fs::permissions(dir_ / "locked", fs::perms::owner_all);
  }
}

}  // namespace
}  // namespace galley::launch
