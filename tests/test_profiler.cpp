// The profiler: ops with names, shapes and layer paths; backward events; nothing when off; the
// Chrome trace as strict JSON; key_averages adding up; loader waits; DataParallel's buckets on
// their own threads; CUDA events on a GPU.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include <unistd.h>

#include "galley/galley.h"
#include "models.h"
#include "test_util.h"

namespace nn = galley::nn;
namespace prof = galley::profiler;
using galley::Device;
using galley::Tensor;

namespace {

struct Step {
  testmodels::SimpleCNN model;
  nn::CrossEntropyLoss loss_fn;
  Tensor x, y;
  explicit Step(Device device = Device::cpu()) {
    galley::Generator gen(3);
    x = galley::randn({2, 3, 32, 32}, gen);
    y = Tensor::from_vector(std::vector<int64_t>{1, 7}, {2});
    model.to(device);
    x = x.to(device);
    y = y.to(device);
  }
  void run() { loss_fn(model(x), y).backward(); }
};

const prof::Event* find(const std::vector<prof::Event>& evs, const std::string& name) {
  for (const auto& e : evs)
    if (e.name == name) return &e;
  return nullptr;
}

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          (name + "_" + std::to_string(::getpid()) + ".json"))
      .string();
}

}  // namespace

TEST(Profiler, RecordsOpsWithShapesDtypesAndLayerPaths) {
  Step s;
  prof::Profiler p({.record_shapes = true});
  s.run();
  p.stop();
  const auto evs = p.events();
  const prof::Event* conv = find(evs, "conv2d");
  ASSERT_NE(conv, nullptr);
  EXPECT_EQ(conv->kind, prof::EventKind::Op);
  EXPECT_EQ(conv->layer_path, "conv");
  ASSERT_EQ(conv->shapes.size(), 3u);
  EXPECT_EQ(conv->shapes[0], (galley::Shape{2, 3, 32, 32}));
  EXPECT_EQ(conv->shapes[1], (galley::Shape{64, 3, 3, 3}));
  EXPECT_EQ(conv->dtypes[0], galley::DType::Float32);
  EXPECT_GE(conv->end_us, conv->start_us);
  const prof::Event* fc = find(evs, "linear");
  ASSERT_NE(fc, nullptr);
  EXPECT_EQ(fc->layer_path, "fc");
  const prof::Event* ce = find(evs, "cross_entropy");
  ASSERT_NE(ce, nullptr);
  EXPECT_EQ(ce->dtypes.at(1), galley::DType::Int64);
  // Backward closures are events too, under the layer of their forward.
  const prof::Event* conv_bw = find(evs, "conv2d_backward");
  ASSERT_NE(conv_bw, nullptr);
  EXPECT_EQ(conv_bw->kind, prof::EventKind::Backward);
  EXPECT_EQ(conv_bw->layer_path, "conv");
  EXPECT_GT(conv_bw->start_us, conv->end_us);
  EXPECT_EQ(conv->thread, conv_bw->thread);
  // Layer paths are tracked only while something needs them.
  EXPECT_FALSE(galley::autograd::layer_paths_enabled());
}

TEST(Profiler, WithoutRecordShapesKeepsNoShapes) {
  Step s;
  prof::Profiler p;
  s.run();
  p.stop();
  const std::vector<prof::Event> events = p.events();  // find points into it
  const prof::Event* conv = find(events, "conv2d");
  ASSERT_NE(conv, nullptr);
  EXPECT_TRUE(conv->shapes.empty());
}

TEST(Profiler, OpsWithoutGradAreRecorded) {
  prof::Profiler p;
  {
    galley::NoGradGuard no_grad;
    Tensor a = galley::ones({4, 4});
    (void)galley::argmax(galley::exp(a) * 2.f, 1);
  }
  p.stop();
  const auto evs = p.events();
  EXPECT_NE(find(evs, "exp"), nullptr);
  EXPECT_NE(find(evs, "mul"), nullptr);
  EXPECT_NE(find(evs, "argmax"), nullptr);
}

TEST(Profiler, NothingRecordedWhenNoProfilerRecords) {
  Step s;
  prof::Profiler p({.start = false});
  EXPECT_FALSE(prof::is_recording());
  s.run();
  EXPECT_TRUE(p.events().empty());
  p.start();
  EXPECT_TRUE(prof::is_recording());
  s.run();
  p.stop();
  const size_t n = p.events().size();
  EXPECT_GT(n, 0u);
  s.run();  // stopped: nothing more
  EXPECT_EQ(p.events().size(), n);
  p.start();  // resumed: events accumulate
  s.run();
  p.stop();
  EXPECT_EQ(p.events().size(), 2 * n);
}

TEST(Profiler, OneProfilerRecordsAtATime) {
  prof::Profiler a;
  EXPECT_THROW(prof::Profiler b, galley::Error);
  a.stop();
  prof::Profiler c;  // fine once the first stopped
  EXPECT_TRUE(c.recording());
}

TEST(Profiler, AScopeOutlivingItsProfilerAndLaterOnesEndsSafely) {
  // The scope opens in the first profiler's buffer, which three more profilers on this thread
  // replace before the scope ends (the sanitizer build checks that its end writes no freed
  // memory); every later profiler records its own event at the top level.
  auto first = std::make_unique<prof::Profiler>();
  auto outer = std::make_unique<prof::RecordScope>("outer");
  first.reset();
  for (int i = 0; i < 3; ++i) {
    prof::Profiler later;
    { prof::RecordScope inner("inner"); }
    later.stop();
    const auto evs = later.events();
    ASSERT_EQ(evs.size(), 1u) << "profiler " << i;
    EXPECT_EQ(evs[0].name, "inner");
    EXPECT_NEAR(evs[0].self_us, evs[0].end_us - evs[0].start_us, 1e-6);
  }
  outer.reset();
  EXPECT_FALSE(prof::is_recording());
}

TEST(Profiler, NestedEventsHaveSelfTimeWithinTotal) {
  prof::Profiler p;
  {
    prof::RecordScope outer("my_region");
    Tensor a = galley::ones({64, 64});
    (void)galley::matmul(a, a);
  }
  p.stop();
  const auto evs = p.events();
  const prof::Event* region = find(evs, "my_region");
  const prof::Event* mm = find(evs, "matmul");
  ASSERT_NE(region, nullptr);
  ASSERT_NE(mm, nullptr);
  EXPECT_EQ(region->kind, prof::EventKind::User);
  EXPECT_LE(region->start_us, mm->start_us);
  EXPECT_GE(region->end_us, mm->end_us);
  EXPECT_NEAR(region->self_us, (region->end_us - region->start_us) - (mm->end_us - mm->start_us),
              1e-3);
}

TEST(Profiler, ChromeTraceIsValidJsonWithTheExpectedEvents) {
  Step s;
  prof::Profiler p({.record_shapes = true});
  s.run();
  p.stop();
  const std::string path = temp_path("galley_trace");
  p.export_chrome_trace(path);
  std::ifstream f(path);
  const nlohmann::json j = nlohmann::json::parse(f);  // throws on invalid JSON
  std::remove(path.c_str());
  ASSERT_TRUE(j.contains("traceEvents"));
  size_t complete = 0;
  bool conv_seen = false, thread_named = false;
  for (const auto& e : j["traceEvents"]) {
    const std::string ph = e.at("ph");
    if (ph == "M") {
      thread_named = thread_named || (e.at("name") == "thread_name" && e["args"]["name"] == "main");
      continue;
    }
    ASSERT_EQ(ph, "X");
    ++complete;
    EXPECT_TRUE(e.at("ts").is_number());
    EXPECT_GE(e.at("dur").get<double>(), 0.0);
    EXPECT_TRUE(e.contains("pid") && e.contains("tid"));
    if (e.at("name") == "conv2d") {
      conv_seen = true;
      EXPECT_EQ(e["args"]["layer"], "conv");
      EXPECT_EQ(e["args"]["input_shapes"][0], nlohmann::json::parse("[2, 3, 32, 32]"));
      EXPECT_EQ(e["args"]["input_dtypes"][0], "float32");
    }
  }
  EXPECT_EQ(complete, p.events().size());
  EXPECT_TRUE(conv_seen);
  EXPECT_TRUE(thread_named);
}

TEST(Profiler, AFailedWriteOfAShortTraceIsAnError) {
  if (!std::filesystem::exists("/dev/full")) GTEST_SKIP() << "no /dev/full on this system";
  prof::Profiler p;
  { prof::RecordScope one("one"); }
  p.stop();
  // A trace of a few hundred bytes stays in the stream's buffer until it is closed: the error
  // of writing it must still be seen.
  const std::string msg = testutil::error_of([&] { p.export_chrome_trace("/dev/full"); });
  testutil::expect_contains(msg, {"export_chrome_trace", "/dev/full", "failed"});
}

// A profiler started inside a forward pass: the ops after it carry the whole layer path, with
// the layers entered before it started.
TEST(Profiler, StartedInsideAForwardGivesTheWholeLayerPath) {
  struct Starter : nn::Layer {
    prof::Profiler* p = nullptr;
    Tensor forward(const Tensor& x) override {
      p->start();
      return x;
    }
  };
  auto starter = std::make_shared<Starter>();
  nn::Sequential model(
      std::make_shared<nn::Linear>(4, 4),
      std::make_shared<nn::Sequential>(starter, std::make_shared<nn::Linear>(4, 2)));
  prof::Profiler p({.start = false});
  starter->p = &p;
  model(galley::ones({3, 4}));
  p.stop();
  const auto evs = p.events();
  const prof::Event* fc = find(evs, "linear");
  ASSERT_NE(fc, nullptr);
  EXPECT_EQ(fc->layer_path, "1.1");
}

TEST(Profiler, NamesThatAreNotUtf8StillGiveAValidTrace) {
  prof::Profiler p;
  { prof::RecordScope bad("region\xff\xfe"); }
  p.stop();
  const std::string path = temp_path("galley_trace_names");
  p.export_chrome_trace(path);
  std::ifstream f(path);
  const nlohmann::json j = nlohmann::json::parse(f);
  std::remove(path.c_str());
  bool seen = false;
  for (const auto& e : j["traceEvents"])
    seen = seen || e.at("name") == "region\xef\xbf\xbd\xef\xbf\xbd";  // U+FFFD twice
  EXPECT_TRUE(seen);
}

TEST(Profiler, KeyAveragesSumToTheEvents) {
  Step s;
  prof::Profiler p;
  for (int i = 0; i < 3; ++i) s.run();
  p.stop();
  const auto evs = p.events();
  const auto avg = p.key_averages();
  std::map<std::string, std::pair<int64_t, double>> want;
  double self = 0;
  for (const auto& e : evs) {
    want[e.name].first += 1;
    want[e.name].second += e.end_us - e.start_us;
    self += e.self_us;
  }
  ASSERT_EQ(avg.rows().size(), want.size());
  for (size_t i = 0; i < avg.rows().size(); ++i) {
    const auto& r = avg.rows()[i];
    EXPECT_EQ(r.calls, want[r.name].first) << r.name;
    EXPECT_NEAR(r.cpu_total_us, want[r.name].second, 1e-6 * (1 + r.cpu_total_us)) << r.name;
    EXPECT_LE(r.cpu_min_us, r.cpu_avg_us());
    EXPECT_LE(r.cpu_avg_us(), r.cpu_max_us);
    if (i > 0) EXPECT_GE(avg.rows()[i - 1].cpu_total_us, r.cpu_total_us);
  }
  EXPECT_EQ(want["conv2d"].first, 3);
  EXPECT_NEAR(avg.self_sum_us(), self, 1e-3);
  const std::string table = avg.table(5);
  testutil::expect_contains(table, {"Name", "Calls", "CPU total", avg.rows()[0].name});
  EXPECT_EQ(avg.str(), avg.table());
}

TEST(Profiler, LoaderWaitsAreRecorded) {
  std::vector<float> d(40);
  std::vector<int64_t> l(20);
  galley::data::TensorDataset ds(Tensor::from_vector(d, {20, 2}), Tensor::from_vector(l, {20}));
  for (int workers : {0, 2}) {
    galley::data::DataLoader loader(ds, {.batch_size = 5, .num_workers = workers});
    prof::Profiler p;
    int batches = 0;
    for (auto& b : loader) {
      (void)b;
      ++batches;
    }
    p.stop();
    int waits = 0;
    for (const auto& e : p.events())
      if (e.kind == prof::EventKind::LoaderWait) {
        ++waits;
        EXPECT_EQ(e.name, "dataloader_wait");
      }
    EXPECT_EQ(waits, batches) << workers << " workers";
  }
}

TEST(Profiler, DataParallelBucketsOnTheirOwnThreads) {
  galley::DataParallel<testmodels::SimpleCNN> model({Device::cpu(0), Device::cpu(1)});
  nn::CrossEntropyLoss loss_fn;
  galley::Generator gen(5);
  Tensor x = galley::randn({4, 3, 32, 32}, gen);
  Tensor y = Tensor::from_vector(std::vector<int64_t>{0, 1, 2, 3}, {4});
  prof::Profiler p;
  loss_fn(model(x), y).backward();
  p.stop();
  std::set<uint64_t> reduce_threads;
  int buckets = 0;
  uint64_t main = 0;
  for (const auto& e : p.events()) {
    if (e.name == "cross_entropy") main = e.thread;
    if (e.kind != prof::EventKind::AllReduce) continue;
    ++buckets;
    reduce_threads.insert(e.thread);
    EXPECT_GT(e.bytes, 0);
  }
  EXPECT_GT(buckets, 0);
  EXPECT_EQ(reduce_threads.size(), 2u);  // one communication thread per replica
  EXPECT_EQ(reduce_threads.count(main), 0u);
  const std::string path = temp_path("galley_dp_trace");
  p.export_chrome_trace(path);
  std::ifstream f(path);
  const nlohmann::json j = nlohmann::json::parse(f);
  std::remove(path.c_str());
  int named = 0;
  for (const auto& e : j["traceEvents"])
    if (e["ph"] == "M" && e["name"] == "thread_name" &&
        e["args"]["name"].get<std::string>().rfind("DataParallel all-reduce", 0) == 0)
      ++named;
  EXPECT_EQ(named, 2);
}

TEST(Profiler, ThreadNamesAppearInTheTrace) {
  prof::Profiler p;
  std::thread t([] {
    prof::set_thread_name("my worker");
    (void)galley::exp(galley::ones({2}));
  });
  t.join();
  p.stop();
  const std::string path = temp_path("galley_named_trace");
  p.export_chrome_trace(path);
  std::ifstream f(path);
  const nlohmann::json j = nlohmann::json::parse(f);
  std::remove(path.c_str());
  bool found = false;
  for (const auto& e : j["traceEvents"])
    found = found || (e["ph"] == "M" && e["args"]["name"] == "my worker");
  EXPECT_TRUE(found);
}

TEST(Profiler, CudaEventsTimeGpuOps) {
  if (galley::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  Step s(Device::cuda(0));
  s.run();  // warm-up: cuDNN/cuBLAS handles
  prof::Profiler p({.record_shapes = true});
  s.run();
  p.stop();
  const std::vector<prof::Event> events = p.events();  // find points into it
  const prof::Event* conv = find(events, "conv2d");
  ASSERT_NE(conv, nullptr);
  EXPECT_EQ(conv->device, 0);
  EXPECT_GT(conv->cuda_us, 0.0);
  EXPECT_GE(conv->cuda_start_us, 0.0);
  EXPECT_GT(p.key_averages().rows().at(0).cuda_total_us + 1, 1.0);
  const std::string path = temp_path("galley_cuda_trace");
  p.export_chrome_trace(path);
  std::ifstream f(path);
  const nlohmann::json j = nlohmann::json::parse(f);
  std::remove(path.c_str());
  int gpu_events = 0;
  for (const auto& e : j["traceEvents"]) gpu_events += e["ph"] == "X" && e["pid"] == 1;
  EXPECT_GT(gpu_events, 0);
}
