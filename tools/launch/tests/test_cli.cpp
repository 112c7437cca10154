#include <unistd.h>

#include <array>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "cli.h"

namespace galley::launch {
namespace {

// The message of the LaunchError parse_command_line throws for `args`, or "no error".
std::string message(const std::vector<std::string>& args) {
  try {
    parse_command_line(args);
  } catch (const LaunchError& e) {
    return e.what();
  }
  return "no error";
}

TEST(CommandLine, JobAfterDoubleDash) {
  const auto cl =
      parse_command_line({"--gpus", "1", "--memory-fraction", "0.4", "--priority=3", "--env",
                          "A=b=c", "--max-restarts", "2", "--", "./train", "--lr", "0.1"});
  ASSERT_TRUE(cl.job);
  EXPECT_EQ(cl.job->name, "train");
  EXPECT_EQ(cl.job->command, (std::vector<std::string>{"./train", "--lr", "0.1"}));
  EXPECT_EQ(cl.job->gpu_count, 1);
  EXPECT_DOUBLE_EQ(*cl.job->memory_fraction, 0.4);
  EXPECT_EQ(cl.job->priority, 3);
  EXPECT_EQ(cl.job->env.at("A"), "b=c");
  EXPECT_EQ(cl.job->max_restarts, 2);
  EXPECT_FALSE(cl.job_file);
}

TEST(CommandLine, LauncherOptionsAreRecordedAsSet) {
  const auto cl = parse_command_line(
      {"--grace-period", "0.5", "--gpus-available", "0,1", "--strict-order", "jobs.toml"});
  EXPECT_EQ(*cl.job_file, "jobs.toml");
  EXPECT_EQ(cl.options.grace_period_s, 0.5);
  EXPECT_EQ(*cl.options.gpus_available, (std::vector<int>{0, 1}));
  EXPECT_TRUE(cl.options.strict_order);
  EXPECT_TRUE(cl.set_keys.count("grace_period"));
  EXPECT_TRUE(cl.set_keys.count("gpus_available"));
}

TEST(CommandLine, ErrorsNameTheOption) {
  EXPECT_NE(message({"--gpus", "x", "--", "true"}).find("--gpus"), std::string::npos);
  EXPECT_NE(message({"--bogus"}).find("unknown option --bogus"), std::string::npos);
  EXPECT_NE(message({}).find("nothing to run"), std::string::npos);
  EXPECT_NE(message({"--gpus", "1", "jobs.toml"}).find("after --"), std::string::npos);
  EXPECT_NE(message({"--"}).find("no command"), std::string::npos);
  EXPECT_NE(message({"--env", "X", "--", "true"}).find("NAME=VALUE"), std::string::npos);
}

TEST(CommandLine, CpusSerialTimeAndDeclaredCpus) {
  const auto cl = parse_command_line(
      {"--cpus-available", "0-7", "--cpus", "2", "--serial-time=30", "--", "./train"});
  ASSERT_TRUE(cl.job);
  EXPECT_EQ(*cl.job->cpus, 2);
  EXPECT_DOUBLE_EQ(*cl.job->serial_time_s, 30.0);
  EXPECT_EQ(cl.options.cpus_available->size(), 8u);
  EXPECT_TRUE(cl.set_keys.count("cpus_available"));
  EXPECT_THROW(parse_command_line({"--cpus", "0", "--", "true"}), LaunchError);
  EXPECT_THROW(parse_command_line({"--serial-time", "0", "--", "true"}), LaunchError);
  EXPECT_THROW(parse_command_line({"--cpus-available", "x", "--", "true"}), LaunchError);
  EXPECT_THROW(parse_command_line({"--cpus", "2", "jobs.toml"}), LaunchError);  // no command
}

TEST(CommandLine, IntegersOutsideTheJobFileRangesAreRefusedNotCut) {
  // 2^32 + 1 and 2^32 were read as 1 and 0 once cut to an int; the ranges are the job file's.
  for (const auto& [option, value, range] : std::vector<std::array<std::string, 3>>{
           {"--gpus", "4294967297", "[0, 4096]"},
           {"--cpus", "4294967297", "[1, 1048576]"},
           {"--priority", "4294967296", "[-1000000, 1000000]"},
           {"--priority", "-1000001", "[-1000000, 1000000]"},
           {"--max-restarts", "4294967296", "[0, 1000000]"},
           {"--max-parallel", "4294967296", "[0, 1000000]"},
           {"--memory-limit-mb", "99999999999999999999", "[1, "},
           {"--gpu-memory-mb", "99999999999999999999", "[0, "}}) {
    const std::string msg = message({option, value, "--", "true"});
    EXPECT_NE(msg.find("option " + option + ": " + value + " is out of range " + range),
              std::string::npos)
        << msg;
  }
  const auto cl = parse_command_line({"--gpus", "4096", "--priority", "-1000000", "--max-parallel",
                                      "1000000", "--cpus=1048576", "--", "true"});
  EXPECT_EQ(cl.job->gpu_count, 4096);
  EXPECT_EQ(cl.job->priority, -1000000);
  EXPECT_EQ(*cl.job->cpus, 1 << 20);
  EXPECT_EQ(cl.options.max_parallel, 1000000);
}

TEST(CommandLine, TimesAreFiniteAndAtMostABillionSeconds) {
  for (const char* option : {"--grace-period", "--backoff-initial", "--backoff-max",
                             "--heartbeat-timeout", "--sample-interval", "--serial-time"}) {
    EXPECT_NE(message({option, "1e10", "--", "true"}).find("longer than the longest time allowed"),
              std::string::npos)
        << option;
    EXPECT_NE(message({option, "inf", "--", "true"}).find("expected a number"), std::string::npos)
        << option;
    EXPECT_NE(message({option, "nan", "--", "true"}).find("expected a number"), std::string::npos)
        << option;
    EXPECT_NE(message({option, "-1", "--", "true"}).find("number of seconds"), std::string::npos)
        << option;
    EXPECT_EQ(message({option, "1e9", "--", "true"}), "no error") << option;
  }
  EXPECT_EQ(message({"--grace-period", "0", "--", "true"}), "no error");
  EXPECT_NE(message({"--sample-interval", "0", "--", "true"}).find("positive"), std::string::npos);
}

// Writes a job file with one job named `eval` into the test's temporary directory.
std::string eval_job_file() {
  const auto path = std::filesystem::path(::testing::TempDir()) /
                    ("galley-launch-cli-" + std::to_string(getpid()) + ".toml");
  std::ofstream(path) << "[[job]]\nname = \"eval\"\ncommand = \"true\"\n";
  return path.string();
}

TEST(CommandLine, TheDefaultNameIsSuffixedWhereTheJobFileHasItAnExplicitOneIsAnError) {
  const std::string file = eval_job_file();
  auto cl = parse_command_line({file, "--", "/usr/bin/eval", "x"});
  auto jobs = collect_jobs(cl);
  ASSERT_EQ(jobs.size(), 2u);
  EXPECT_EQ(jobs[1].name, "eval-2");
  cl = parse_command_line({file, "--name", "eval", "--", "true"});
  std::string msg;
  try {
    collect_jobs(cl);
  } catch (const LaunchError& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find("option --name: job name 'eval' is already taken"), std::string::npos) << msg;
  EXPECT_NE(msg.find(file + ":1:1"), std::string::npos) << msg;  // where the other one is
  cl = parse_command_line({file, "--name", "eval2", "--", "true"});
  EXPECT_EQ(collect_jobs(cl)[1].name, "eval2");
  std::filesystem::remove(file);
}

TEST(CommandLine, HelpNeedsNothingElse) {
  EXPECT_TRUE(parse_command_line({"--help"}).help);
  EXPECT_NE(usage().find("--gpus-available"), std::string::npos);
}

}  // namespace
}  // namespace galley::launch
