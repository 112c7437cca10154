#include <gtest/gtest.h>

#include "job_file.h"

namespace galley::launch {
namespace {

std::vector<JobSpec> parse(const std::string& text, LauncherOptions* options = nullptr,
                           const std::set<std::string>& keep = {}) {
  LauncherOptions local;
  return parse_job_file_text(text, "jobs.toml", options ? *options : local, keep);
}

// Parses `text`, expects a LaunchError and returns its message.
std::string error_of(const std::string& text) {
  try {
    parse(text);
  } catch (const LaunchError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no error for:\n" << text;
  return "";
}

TEST(JobFile, ReadsEveryJobKey) {
  const auto jobs = parse(R"(
[[job]]
name = "train-a"
command = ["./train", "--epochs", "5"]
workdir = "/tmp"
env = { SEED = "1", STEPS = 100, DEBUG = true }
gpus = 1
memory_fraction = 0.4
priority = 10
max_restarts = 3
log = "a.log"
heartbeat_timeout = 2.5

[[job]]
command = "echo hi && sleep 1"
gpus = [2, 3]
memory_limit_mb = 20000
)");
  ASSERT_EQ(jobs.size(), 2u);
  const auto& a = jobs[0];
  EXPECT_EQ(a.name, "train-a");
  EXPECT_EQ(a.command, (std::vector<std::string>{"./train", "--epochs", "5"}));
  EXPECT_EQ(a.working_dir, "/tmp");
  EXPECT_EQ(a.env.at("SEED"), "1");
  EXPECT_EQ(a.env.at("STEPS"), "100");
  EXPECT_EQ(a.env.at("DEBUG"), "1");
  EXPECT_EQ(a.gpu_count, 1);
  EXPECT_DOUBLE_EQ(*a.memory_fraction, 0.4);
  EXPECT_EQ(a.priority, 10);
  EXPECT_EQ(a.max_restarts, 3);
  EXPECT_EQ(a.log_file, "a.log");
  EXPECT_DOUBLE_EQ(a.heartbeat_timeout_s, 2.5);
  const auto& b = jobs[1];
  EXPECT_EQ(b.name, "job-2");
  EXPECT_EQ(b.command, (std::vector<std::string>{"/bin/sh", "-c", "echo hi && sleep 1"}));
  EXPECT_EQ(b.gpu_ids, (std::vector<int>{2, 3}));
  EXPECT_EQ(b.gpu_count, 2);
  EXPECT_EQ(*b.memory_limit_mb, 20000);
}

TEST(JobFile, LauncherTableSetsOptionsUnlessKeptFromTheCommandLine) {
  LauncherOptions options;
  options.grace_period_s = 3;
  parse(R"(
[launcher]
log_dir = "runs"
grace_period = 30
backoff_initial = 0.5
gpus_available = [0, 1]
strict_order = true

[[job]]
command = "true"
)",
        &options, {"grace_period"});
  EXPECT_EQ(options.log_dir, "runs");
  EXPECT_EQ(options.grace_period_s, 3);  // the command line wins
  EXPECT_EQ(options.backoff_initial_s, 0.5);
  EXPECT_EQ(*options.gpus_available, (std::vector<int>{0, 1}));
  EXPECT_TRUE(options.strict_order);
}

TEST(JobFile, ReadsCpusSerialTimeAndDeclaredCpus) {
  LauncherOptions options;
  const auto jobs = parse(R"(
[launcher]
cpus_available = "0-3,8"

[[job]]
command = "true"
cpus = 4
serial_time = 12.5

[[job]]
command = "true"
)",
                          &options);
  EXPECT_EQ(*jobs[0].cpus, 4);
  EXPECT_DOUBLE_EQ(*jobs[0].serial_time_s, 12.5);
  EXPECT_FALSE(jobs[1].cpus);
  EXPECT_FALSE(jobs[1].serial_time_s);
  EXPECT_EQ(*options.cpus_available, (std::vector<int>{0, 1, 2, 3, 8}));
  parse("[launcher]\ncpus_available = [3, 1]\n[[job]]\ncommand = \"true\"\n", &options);
  EXPECT_EQ(*options.cpus_available, (std::vector<int>{1, 3}));
}

TEST(JobFile, BadCpusAndSerialTimeNameLineAndKey) {
  auto msg = error_of("[[job]]\ncommand = \"true\"\ncpus = 0\n");
  EXPECT_NE(msg.find("jobs.toml:3:"), std::string::npos) << msg;
  EXPECT_NE(msg.find("key 'cpus'"), std::string::npos) << msg;
  msg = error_of("[[job]]\ncommand = \"true\"\ncpus = \"all\"\n");
  EXPECT_NE(msg.find("key 'cpus'"), std::string::npos) << msg;
  msg = error_of("[[job]]\ncommand = \"true\"\nserial_time = -1\n");
  EXPECT_NE(msg.find("key 'serial_time'"), std::string::npos) << msg;
  msg = error_of("[launcher]\ncpus_available = \"0-\"\n[[job]]\ncommand = \"true\"\n");
  EXPECT_NE(msg.find("jobs.toml:2:"), std::string::npos) << msg;
  EXPECT_NE(msg.find("cpus_available"), std::string::npos) << msg;
}

TEST(JobFile, WrongTypeNamesLineAndKey) {
  const auto msg = error_of(R"([[job]]
name = "a"
command = "true"
gpus = "two"
)");
  EXPECT_NE(msg.find("jobs.toml:4:"), std::string::npos) << msg;
  EXPECT_NE(msg.find("key 'gpus'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("job 'a'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("got a string"), std::string::npos) << msg;
}

TEST(JobFile, UnknownKeyNamesLineAndKey) {
  const auto msg = error_of(R"([[job]]
command = "true"

memory_fractoin = 0.4
)");
  EXPECT_NE(msg.find("jobs.toml:4:"), std::string::npos) << msg;
  EXPECT_NE(msg.find("unknown key 'memory_fractoin'"), std::string::npos) << msg;
}

TEST(JobFile, OutOfRangeFractionNamesLineAndKey) {
  const auto msg = error_of("[[job]]\ncommand = \"true\"\nmemory_fraction = 1.5\n");
  EXPECT_NE(msg.find("jobs.toml:3:"), std::string::npos) << msg;
  EXPECT_NE(msg.find("key 'memory_fraction'"), std::string::npos) << msg;
}

TEST(JobFile, NegativeRestartsNameLineAndKey) {
  const auto msg = error_of("[[job]]\ncommand = \"true\"\nmax_restarts = -1\n");
  EXPECT_NE(msg.find("jobs.toml:3:"), std::string::npos) << msg;
  EXPECT_NE(msg.find("key 'max_restarts'"), std::string::npos) << msg;
}

TEST(JobFile, MissingCommandNamesTheJobsLine) {
  const auto msg = error_of("[[job]]\nname = \"a\"\n\n[[job]]\nname = \"b\"\ngpus = 1\n");
  EXPECT_NE(msg.find("key 'command' is missing"), std::string::npos) << msg;
  EXPECT_NE(msg.find("job 'a'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("jobs.toml:1:"), std::string::npos) << msg;
}

TEST(JobFile, SyntaxErrorNamesLine) {
  const auto msg = error_of("[[job]]\ncommand = \"true\"\npriority = = 3\n");
  EXPECT_NE(msg.find("jobs.toml:3:"), std::string::npos) << msg;
}

TEST(JobFile, SingleBracketJobTableIsExplained) {
  const auto msg = error_of("[job]\ncommand = \"true\"\n");
  EXPECT_NE(msg.find("[[job]]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("jobs.toml:1:"), std::string::npos) << msg;
}

TEST(JobFile, DuplicateNamesAreRejected) {
  const auto msg = error_of(
      "[[job]]\nname = \"a\"\ncommand = \"true\"\n[[job]]\nname = \"a\"\ncommand = \"true\"\n");
  EXPECT_NE(msg.find("used twice"), std::string::npos) << msg;
  EXPECT_NE(msg.find("jobs.toml:4:"), std::string::npos) << msg;
}

TEST(JobFile, UnknownLauncherKeyAndTopLevelKey) {
  auto msg = error_of("[launcher]\ngrace = 3\n[[job]]\ncommand = \"true\"\n");
  EXPECT_NE(msg.find("jobs.toml:2:"), std::string::npos) << msg;
  EXPECT_NE(msg.find("unknown key 'grace' in [launcher]"), std::string::npos) << msg;
  msg = error_of("jobs = 3\n");
  EXPECT_NE(msg.find("unknown top-level key 'jobs'"), std::string::npos) << msg;
}

TEST(JobFile, TimesMustBeFiniteAndAtMostABillionSeconds) {
  // TOML has nan and inf; a time past 1e9 s overflowed the clock's nanoseconds and came out as
  // "at once". Each is refused at its own line, naming the key.
  for (const char* key : {"backoff_initial", "backoff_max", "grace_period", "sample_interval"})
    for (const char* value : {"nan", "inf", "-inf", "1e10", "10000000000", "-1"}) {
      const std::string msg = error_of(std::string("[launcher]\n") + key + " = " + value +
                                       "\n[[job]]\ncommand = \"true\"\n");
      EXPECT_NE(msg.find("jobs.toml:2:"), std::string::npos)
          << key << " = " << value << ": " << msg;
      EXPECT_NE(msg.find("key '" + std::string(key) + "' in [launcher]"), std::string::npos) << msg;
    }
  for (const char* key : {"heartbeat_timeout", "serial_time"})
    for (const char* value : {"nan", "inf", "1e10", "-1"}) {
      const std::string msg = error_of(std::string("[[job]]\nname = \"a\"\ncommand = \"true\"\n") +
                                       key + " = " + value + "\n");
      EXPECT_NE(msg.find("jobs.toml:4:"), std::string::npos)
          << key << " = " << value << ": " << msg;
      EXPECT_NE(msg.find("key '" + std::string(key) + "' of job 'a'"), std::string::npos) << msg;
    }
  EXPECT_NE(error_of("[launcher]\ngrace_period = 1e10\n[[job]]\ncommand = \"true\"\n")
                .find("longer than the longest time allowed, 1e+09 s"),
            std::string::npos);
  LauncherOptions options;
  const auto jobs = parse(
      "[launcher]\ngrace_period = 1e9\nbackoff_max = 0\n[[job]]\ncommand = \"true\"\n"
      "heartbeat_timeout = 1000000000\n",
      &options);
  EXPECT_EQ(options.grace_period_s, 1e9);
  EXPECT_EQ(options.backoff_max_s, 0);
  EXPECT_EQ(jobs[0].heartbeat_timeout_s, 1e9);
}

TEST(JobFile, AnEmptyShellCommandIsRefusedLikeAnEmptyArray) {
  for (const char* command : {"\"\"", "\"  \\t \"", "[]", "[\"\"]"}) {
    const std::string msg =
        error_of(std::string("[[job]]\nname = \"a\"\ncommand = ") + command + "\n");
    EXPECT_NE(msg.find("jobs.toml:"), std::string::npos) << command << ": " << msg;
    EXPECT_NE(msg.find("empty"), std::string::npos) << command << ": " << msg;
  }
  EXPECT_NE(error_of("[[job]]\nname = \"a\"\ncommand = \"\"\n").find("jobs.toml:3:"),
            std::string::npos);
}

TEST(JobFile, EmptyFileHasNoJobs) {
  EXPECT_NE(error_of("").find("no jobs"), std::string::npos);
}

TEST(JobFile, MissingFileIsReported) {
  LauncherOptions options;
  EXPECT_THROW(load_job_file("/nonexistent/jobs.toml", options), LaunchError);
}

}  // namespace
}  // namespace galley::launch
