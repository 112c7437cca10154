// MetricsLogger on a GPU: every line carries the allocator's figures of the devices asked for.
#include <gtest/gtest.h>

#include "test_util.h"

#include <galley/galley.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

TEST(CudaMetrics, GpuMemoryIsRecordedForEachGpuAskedFor) {
  REQUIRE_GPU();
  std::string dir = (fs::path(::testing::TempDir()) / "galley_cuda_metrics_XXXXXX").string();
  ASSERT_NE(mkdtemp(dir.data()), nullptr);
  const std::string p = (fs::path(dir) / "m.jsonl").string();
  const galley::Device gpu = galley::Device::cuda(0);
  {
    auto t = galley::zeros({1024, 1024}, galley::DType::Float32, gpu);  // 4 MiB in use
    // Repeats and CPU devices are dropped.
    galley::MetricsLogger log({.path = p, .memory_devices = {gpu, gpu, galley::Device::cpu()}});
    log.log({.step = 1});
  }
  std::ifstream in(p);
  std::string line;
  ASSERT_TRUE(std::getline(in, line));
  const Json j = Json::parse(line);
  ASSERT_TRUE(j.contains("gpu_memory")) << line;
  const Json& g = j["gpu_memory"];
  ASSERT_EQ(g.size(), 1u) << line;
  ASSERT_TRUE(g.contains("cuda:0")) << line;
  EXPECT_GE(g["cuda:0"]["allocated"].get<int64_t>(), 4 << 20);
  EXPECT_GE(g["cuda:0"]["reserved"].get<int64_t>(), g["cuda:0"]["allocated"].get<int64_t>());
  EXPECT_GE(g["cuda:0"]["peak_allocated"].get<int64_t>(), 4 << 20);
  EXPECT_FALSE(std::getline(in, line));
  std::error_code ec;
  fs::remove_all(dir, ec);
}

}  // namespace
