// MetricsLogger: JSON lines with time stamps, appending, errors naming the file, non-finite
// values, user values. The GPU memory figures are tested in test_cuda_metrics.cpp.
#include <gtest/gtest.h>

#include "test_util.h"

#include <galley/galley.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

namespace fs = std::filesystem;
using galley::MetricsLogger;
using galley::MetricsRecord;
using Json = nlohmann::json;
using testutil::error_of;
using testutil::expect_contains;

class Metrics : public testutil::TempDirTest {
 protected:
  static std::vector<std::string> lines_of(const std::string& p) {
    std::vector<std::string> out;
    std::istringstream in(read(p));
    for (std::string line; std::getline(in, line);) out.push_back(line);
    return out;
  }
  // Every line parsed by a strict parser (no NaN, no trailing garbage).
  static std::vector<Json> parse(const std::string& p) {
    std::vector<Json> out;
    for (const std::string& line : lines_of(p)) {
      try {
        out.push_back(Json::parse(line));
      } catch (const Json::exception& e) {
        ADD_FAILURE() << "not JSON: " << line << " (" << e.what() << ")";
      }
    }
    return out;
  }
};

TEST_F(Metrics, EachLogIsOneJsonLineWithTheGivenKeysAndTimeStamps) {
  const std::string p = path("m.jsonl");
  const auto before = std::chrono::system_clock::now();
  {
    MetricsLogger log({.path = p});
    log.log({.step = 50,
             .loss = 0.5,
             .learning_rate = 1e-3,
             .samples_per_s = 1234.5,
             .starvation = 0.01,
             .values = {{"grad_norm", 1.5}, {"tokens", 64}, {"phase", "warmup"}, {"ok", true}}});
    log.log({.event = "epoch", .step = 100, .epoch = 1, .loss = 0.25, .accuracy = 0.875});
    EXPECT_EQ(log.lines_written(), 2u);
    EXPECT_EQ(log.path(), p);
  }
  const std::string text = read(p);
  ASSERT_FALSE(text.empty());
  EXPECT_EQ(text.back(), '\n');
  EXPECT_EQ(text.find('\r'), std::string::npos);
  const auto lines = parse(p);
  ASSERT_EQ(lines.size(), 2u);

  const Json& a = lines[0];
  EXPECT_EQ(a["event"], "step");
  EXPECT_EQ(a["step"], 50);
  EXPECT_FALSE(a.contains("epoch"));  // unset fields are left out
  EXPECT_FALSE(a.contains("accuracy"));
  EXPECT_DOUBLE_EQ(a["loss"].get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(a["learning_rate"].get<double>(), 1e-3);
  EXPECT_DOUBLE_EQ(a["samples_per_s"].get<double>(), 1234.5);
  EXPECT_DOUBLE_EQ(a["starvation"].get<double>(), 0.01);
  EXPECT_DOUBLE_EQ(a["grad_norm"].get<double>(), 1.5);
  EXPECT_TRUE(a["tokens"].is_number_integer());
  EXPECT_EQ(a["tokens"], 64);
  EXPECT_EQ(a["phase"], "warmup");
  EXPECT_EQ(a["ok"], true);
  EXPECT_FALSE(a.contains("nonfinite"));
  EXPECT_FALSE(a.contains("gpu_memory"));  // no GPU asked for
#ifdef __linux__
  ASSERT_TRUE(a.contains("host_rss_bytes"));
  EXPECT_GT(a["host_rss_bytes"].get<int64_t>(), 0);
#endif

  const Json& b = lines[1];
  EXPECT_EQ(b["event"], "epoch");
  EXPECT_EQ(b["epoch"], 1);
  EXPECT_DOUBLE_EQ(b["accuracy"].get<double>(), 0.875);

  // Time stamps: ISO 8601 UTC with milliseconds, within this test's run, and seconds since
  // the logger was made, not decreasing.
  const std::regex iso(R"(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z)");
  for (const Json& j : lines) {
    ASSERT_TRUE(j["time"].is_string());
    const std::string t = j["time"];
    EXPECT_TRUE(std::regex_match(t, iso)) << t;
    std::tm tm{};
    ASSERT_NE(strptime(t.c_str(), "%Y-%m-%dT%H:%M:%S", &tm), nullptr) << t;
    const auto stamped = std::chrono::system_clock::from_time_t(timegm(&tm));
    EXPECT_GE(stamped,
              std::chrono::time_point_cast<std::chrono::seconds>(before) - std::chrono::seconds(1));
    EXPECT_LE(stamped, std::chrono::system_clock::now());
    ASSERT_TRUE(j["elapsed_s"].is_number());
    EXPECT_GE(j["elapsed_s"].get<double>(), 0);
    EXPECT_LT(j["elapsed_s"].get<double>(), 60);
  }
  EXPECT_LE(a["elapsed_s"].get<double>(), b["elapsed_s"].get<double>());
  // The logger's keys come first, in a fixed order.
  EXPECT_EQ(lines_of(p)[0].rfind("{\"time\":", 0), 0u) << lines_of(p)[0];
}

TEST_F(Metrics, TheFileIsAppendedToUnlessAskedToStartAfresh) {
  const std::string p = path("m.jsonl");
  {
    MetricsLogger log({.path = p});
    log.log({.step = 1});
  }
  {
    MetricsLogger log({.path = p});  // a resumed run
    log.log({.step = 2});
  }
  auto lines = parse(p);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0]["step"], 1);
  EXPECT_EQ(lines[1]["step"], 2);
  {
    MetricsLogger log({.path = p, .append = false});
    log.log({.step = 3});
  }
  lines = parse(p);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0]["step"], 3);
  // A file of something else (a checkpoint named by mistake) is not appended to, nor changed.
  const std::string other = path("model.safetensors");
  std::ofstream(other) << "\x08\x00\x00\x00\x00\x00\x00\x00{}      ";
  const auto before = std::filesystem::file_size(other);
  testutil::expect_contains(testutil::error_of([&] { MetricsLogger log({.path = other}); }),
                            {"MetricsLogger", "model.safetensors", "JSON lines"});
  EXPECT_EQ(std::filesystem::file_size(other), before);
}

TEST_F(Metrics, EachLineIsInTheFileAsSoonAsLogReturns) {
  // What a crash would leave: everything logged so far, read while the logger is still open.
  const std::string p = path("m.jsonl");
  MetricsLogger log({.path = p});
  for (int i = 0; i < 3; ++i) {
    log.log({.step = i, .loss = 1.0 / (i + 1)});
    const auto lines = parse(p);
    ASSERT_EQ(lines.size(), size_t(i + 1));
    EXPECT_EQ(lines.back()["step"], i);
  }
}

TEST_F(Metrics, ATornLastLineIsEndedBeforeNewLines) {
  const std::string p = path("m.jsonl");
  std::ofstream(p) << "{\"step\":1}\n{\"step\":2,\"lo";  // a crash mid-write
  {
    MetricsLogger log({.path = p});
    log.log({.step = 3});
  }
  const auto lines = lines_of(p);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[1], "{\"step\":2,\"lo");
  EXPECT_EQ(Json::parse(lines[2])["step"], 3);
}

TEST_F(Metrics, NonFiniteValuesAreNullAndNamedSoTheLineStaysJson) {
  const std::string p = path("m.jsonl");
  const double inf = std::numeric_limits<double>::infinity();
  {
    MetricsLogger log({.path = p});
    log.log({.step = 7,
             .loss = std::nan(""),
             .accuracy = 0.5,
             .samples_per_s = inf,
             .values = {{"grad_norm", -inf}, {"lr_scale", 2.0f}}});
  }
  const std::string text = read(p);
  for (const char* bad : {"NaN,", "nan", "inf,", "Infinity,"})
    EXPECT_EQ(text.find(bad), std::string::npos) << bad << " in " << text;
  const auto lines = parse(p);
  ASSERT_EQ(lines.size(), 1u);
  const Json& j = lines[0];
  EXPECT_TRUE(j["loss"].is_null());
  EXPECT_TRUE(j["samples_per_s"].is_null());
  EXPECT_TRUE(j["grad_norm"].is_null());
  EXPECT_DOUBLE_EQ(j["accuracy"].get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(j["lr_scale"].get<double>(), 2.0);
  ASSERT_TRUE(j.contains("nonfinite"));
  EXPECT_EQ(j["nonfinite"],
            Json({{"loss", "NaN"}, {"samples_per_s", "Infinity"}, {"grad_norm", "-Infinity"}}));
}

TEST_F(Metrics, BadPathsAreErrorsNamingThePath) {
  const std::string missing_dir = path("no/such/dir/m.jsonl");
  expect_contains(error_of([&] { MetricsLogger log({.path = missing_dir}); }),
                  {"MetricsLogger", missing_dir, "No such file or directory"});
  expect_contains(error_of([&] { MetricsLogger log({.path = dir_.string()}); }),
                  {"MetricsLogger", dir_.string()});
  expect_contains(error_of([&] { MetricsLogger log({.path = ""}); }), {"MetricsLogger", "path"});
  if (::access("/dev/full", W_OK) == 0) {
    // A write that fails (a full disk) names the file too.
    MetricsLogger log({.path = "/dev/full"});
    expect_contains(error_of([&] { log.log({.step = 1}); }),
                    {"MetricsLogger", "/dev/full", "No space left on device"});
  }
  if (::geteuid() != 0) {  // root writes anywhere
    const std::string ro = path("ro.jsonl");
    std::ofstream(ro) << "";
    fs::permissions(ro, fs::perms::owner_read);
    expect_contains(error_of([&] { MetricsLogger log({.path = ro}); }),
                    {"MetricsLogger", ro, "Permission denied"});
  }
}

TEST_F(Metrics, OptionsAndRecordsAreValidated) {
  const int gpus = galley::cuda_device_count();
  expect_contains(error_of([&] {
                    MetricsLogger log(
                        {.path = path("m.jsonl"), .memory_devices = {galley::Device::cuda(gpus)}});
                  }),
                  {"cuda:" + std::to_string(gpus), "does not exist"});
  // CPU devices are skipped: a program passes its training device whatever it is.
  MetricsLogger log({.path = path("m.jsonl"), .memory_devices = {galley::Device::cpu()}});
  expect_contains(error_of([&] {
                    log.log({.values = {{"loss", 1.0}}});
                  }),
                  {"'loss'", "logger's own keys", path("m.jsonl")});
  expect_contains(error_of([&] {
                    log.log({.values = {{"a", 1.0}, {"a", 2.0}}});
                  }),
                  {"'a'", "twice"});
  expect_contains(error_of([&] { log.log({.values = {{"", 1.0}}}); }), {"empty key"});
  // Keys that differ in invalid bytes would both be written as one repaired key.
  expect_contains(error_of([&] {
                    log.log({.values = {{"k\xff", 1.0}, {"k\xfe", 2.0}}});
                  }),
                  {"not valid UTF-8"});
  expect_contains(error_of([&] { log.log({.event = ""}); }), {"empty event"});
  EXPECT_EQ(log.lines_written(), 0u);
  log.log({.step = 1});
  const auto lines = parse(path("m.jsonl"));
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_FALSE(lines[0].contains("gpu_memory"));
}

TEST_F(Metrics, HostMemoryCanBeLeftOut) {
  const std::string p = path("m.jsonl");
  {
    MetricsLogger log({.path = p, .host_memory = false});
    log.log({.step = 1});
  }
  const auto lines = parse(p);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_FALSE(lines[0].contains("host_rss_bytes"));
}

TEST_F(Metrics, LinesFromSeveralThreadsStayWhole) {
  const std::string p = path("m.jsonl");
  {
    MetricsLogger log({.path = p});
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t)
      threads.emplace_back([&, t] {
        for (int i = 0; i < 200; ++i)
          log.log({.step = i, .values = {{"thread", t}, {"pad", std::string(300, 'x')}}});
      });
    for (auto& th : threads) th.join();
    EXPECT_EQ(log.lines_written(), 800u);
  }
  const std::vector<Json> lines = parse(p);
  EXPECT_EQ(lines.size(), 800u);
  // The lines are in the order of their times: each is stamped under the logger's lock (they
  // used to be stamped before it, and a thread could write an earlier time after a later one).
  for (size_t i = 1; i < lines.size(); ++i)
    ASSERT_LE(lines[i - 1]["elapsed_s"].get<double>(), lines[i]["elapsed_s"].get<double>())
        << "line " << i;
}

// Unsigned values above INT64_MAX are written exactly (they used to wrap to negative numbers).
TEST_F(Metrics, LargeUnsignedValuesAreWrittenExactly) {
  const std::string p = path("u.jsonl");
  {
    MetricsLogger log({.path = p, .host_memory = false});
    log.log({.values = {{"max", std::numeric_limits<uint64_t>::max()},
                        {"top_bit", uint64_t(1) << 63},
                        {"small", uint64_t(7)},
                        {"negative", int64_t(-3)}}});
  }
  const Json line = parse(p).at(0);
  EXPECT_EQ(line["max"].get<uint64_t>(), std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(line["top_bit"].get<uint64_t>(), uint64_t(1) << 63);
  EXPECT_EQ(line["small"].get<int64_t>(), 7);
  EXPECT_EQ(line["negative"].get<int64_t>(), -3);
  EXPECT_EQ(galley::MetricValue(uint64_t(7)).kind(), galley::MetricValue::Kind::Integer);
  EXPECT_EQ(galley::MetricValue(uint64_t(1) << 63).kind(), galley::MetricValue::Kind::Unsigned);
}

TEST_F(Metrics, TheLoggerMoves) {
  const std::string p = path("m.jsonl");
  MetricsLogger a({.path = p});
  MetricsLogger b = std::move(a);
  b.log({.step = 1});
  EXPECT_EQ(parse(p).size(), 1u);
}

}  // namespace

// A named pipe that no process reads is an error at once (opening it waited for ever).
TEST_F(Metrics, ANamedPipeWithoutAReaderIsAnError) {
  const std::string p = path("pipe");
  ASSERT_EQ(mkfifo(p.c_str(), 0644), 0);
  testutil::expect_contains(testutil::error_of([&] { MetricsLogger log({.path = p}); }),
                            {"MetricsLogger", "pipe", "named pipe that no process reads"});
}
