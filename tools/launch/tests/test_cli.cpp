#include <gtest/gtest.h>

#include "cli.h"

namespace galley::launch {
namespace {

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
  auto message = [](std::vector<std::string> args) {
    try {
      parse_command_line(args);
    } catch (const LaunchError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
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

TEST(CommandLine, HelpNeedsNothingElse) {
  EXPECT_TRUE(parse_command_line({"--help"}).help);
  EXPECT_NE(usage().find("--gpus-available"), std::string::npos);
}

}  // namespace
}  // namespace galley::launch
