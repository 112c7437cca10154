// Training checkpoints: exact resume (also in a new process), atomic saves that survive a
// kill, retention, bad files, data-parallel models, half precision.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "galley/galley.h"
#include "test_util.h"

extern char** environ;

namespace fs = std::filesystem;
namespace nn = galley::nn;
using galley::Generator;
using galley::Tensor;

namespace {

class Net : public nn::Layer {
 public:
  Net() {
    register_layer("conv", conv_);
    register_layer("fc1", fc1_);
    register_layer("fc2", fc2_);
  }
  Tensor forward(const Tensor& x) override {
    auto h = galley::max_pool2d(galley::relu(conv_(x)), {.kernel_size = 2});
    // Noise from the default generator: resuming must restore its state too.
    auto noise = galley::randn(h.shape()) * 0.01f;
    return fc2_(galley::relu(fc1_(galley::flatten(h + noise, 1))));
  }

 private:
  nn::Conv2D conv_{1, 2, 3, {.padding = 1}};
  nn::Linear fc1_{2 * 3 * 3, 16};
  nn::Linear fc2_{16, 4};
};

std::string temp_dir(const std::string& name) {
  auto d =
      fs::path(::testing::TempDir()) / ("galley_ckpt_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d.string();
}

struct TrainRun {
  Net model;
  galley::optim::Adam opt{model.parameters(), {.learning_rate = 1e-2}};
  galley::optim::StepLR sched{opt, 3, 0.5};
  nn::CrossEntropyLoss loss_fn;

  galley::io::TrainingState state() {
    return {.model = &model, .optimizer = &opt, .scheduler = &sched};
  }
  // Step k's batch depends only on k.
  float step(int64_t k) {
    galley::Generator gen(1000 + k);
    Tensor x = galley::randn({6, 1, 6, 6}, gen);
    std::vector<int64_t> l(6);
    for (auto& v : l) v = static_cast<int64_t>(gen.next_u64() % 4);
    auto loss = loss_fn(model(x), Tensor::from_vector(l, {6}));
    loss.backward();
    opt.step();
    opt.clear_grad();
    sched.step();
    return loss.item();
  }
};

std::vector<float> straight_losses(int64_t steps) {
  galley::manual_seed(17);
  TrainRun run;
  std::vector<float> out;
  for (int64_t k = 0; k < steps; ++k) out.push_back(run.step(k));
  return out;
}

// Runs this test binary again with `filter` and extra environment; returns its exit status.
int run_child(const std::string& filter, const std::vector<std::string>& env,
              pid_t* pid_out = nullptr, bool wait = true) {
  std::string self = fs::read_symlink("/proc/self/exe").string();
  std::string arg = "--gtest_filter=" + filter;
  std::vector<char*> argv{self.data(), arg.data(), nullptr};
  std::vector<std::string> envs(env);
  for (char** e = environ; *e; ++e) envs.emplace_back(*e);
  std::vector<char*> envp;
  for (auto& e : envs) envp.push_back(e.data());
  envp.push_back(nullptr);
  pid_t pid;
  EXPECT_EQ(posix_spawn(&pid, self.c_str(), nullptr, nullptr, argv.data(), envp.data()), 0);
  if (pid_out) *pid_out = pid;
  if (!wait) return 0;
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace

TEST(Checkpoint, ResumeContinuesBitForBit) {
  const int64_t n = 5;
  const auto expected = straight_losses(2 * n);
  const std::string dir = temp_dir("resume");
  {
    galley::manual_seed(17);
    TrainRun run;
    for (int64_t k = 0; k < n; ++k) ASSERT_EQ(run.step(k), expected[k]);
    galley::io::Checkpointer ck(dir);
    auto st = run.state();
    st.epoch = 1;
    st.step = n;
    st.extra["note"] = "half way";
    ck.save(st);
  }
  galley::manual_seed(999);  // a fresh start that differs everywhere
  TrainRun fresh;
  galley::io::Checkpointer ck(dir);
  auto st = fresh.state();
  ASSERT_TRUE(ck.resume(st));
  EXPECT_EQ(st.step, n);
  EXPECT_EQ(st.epoch, 1);
  EXPECT_EQ(st.extra["note"], "half way");
  EXPECT_DOUBLE_EQ(fresh.opt.learning_rate(), 1e-2 * 0.5);  // StepLR(3) after 5 steps
  for (int64_t k = n; k < 2 * n; ++k) EXPECT_EQ(fresh.step(k), expected[k]) << "step " << k;
}

// The second half of ResumeInANewProcess, run in a child process.
TEST(CheckpointChild, ContinueFromDirectory) {
  const char* dir = std::getenv("GALLEY_CKPT_CHILD_DIR");
  if (!dir) GTEST_SKIP() << "runs only as the child of Checkpoint.ResumeInANewProcess";
  TrainRun run;
  galley::io::Checkpointer ck(dir);
  auto st = run.state();
  ASSERT_TRUE(ck.resume(st));
  std::ofstream out(std::string(dir) + "/child_losses.txt");
  out.precision(9);
  for (int64_t k = st.step; k < 2 * st.step; ++k) out << run.step(k) << "\n";
}

TEST(Checkpoint, ResumeInANewProcess) {
  const int64_t n = 4;
  const auto expected = straight_losses(2 * n);
  const std::string dir = temp_dir("process");
  {
    galley::manual_seed(17);
    TrainRun run;
    for (int64_t k = 0; k < n; ++k) run.step(k);
    auto st = run.state();
    st.step = n;
    galley::io::Checkpointer(dir).save(st);
  }
  ASSERT_EQ(run_child("CheckpointChild.ContinueFromDirectory", {"GALLEY_CKPT_CHILD_DIR=" + dir}),
            0);
  std::ifstream in(dir + "/child_losses.txt");
  for (int64_t k = n; k < 2 * n; ++k) {
    float v = 0;
    ASSERT_TRUE(in >> v) << "child wrote too few losses";
    EXPECT_EQ(v, expected[k]) << "step " << k;
  }
}

// Saves ever-growing checkpoints until killed; run by KilledDuringSaveKeepsTheLastGoodOne.
TEST(CheckpointChild, SaveUntilKilled) {
  const char* dir = std::getenv("GALLEY_CKPT_KILL_DIR");
  if (!dir)
    GTEST_SKIP() << "runs only as the child of Checkpoint.KilledDuringSaveKeepsTheLastGoodOne";
  nn::Linear big(2048, 2048);  // 16 MB per save: the kill lands inside a write
  galley::io::Checkpointer ck(dir, {.keep_last = 2});
  for (int64_t step = 1;; ++step) ck.save({.model = &big, .step = step});
}

TEST(Checkpoint, KilledDuringSaveKeepsTheLastGoodOne) {
  const std::string dir = temp_dir("kill");
  pid_t pid;
  run_child("CheckpointChild.SaveUntilKilled", {"GALLEY_CKPT_KILL_DIR=" + dir}, &pid, false);
  // Wait until a few checkpoints exist, then kill the writer in the middle of the next one.
  for (int i = 0; i < 400; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
    size_t done = 0;
    for (auto& e : fs::directory_iterator(dir)) done += e.path().extension() == ".safetensors";
    if (done >= 2) break;
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(37));
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  galley::io::Checkpointer ck(dir, {.keep_last = 2});
  auto files = ck.list();
  ASSERT_FALSE(files.empty());
  for (auto& e : fs::directory_iterator(dir))
    EXPECT_EQ(e.path().string().find(".tmp."), std::string::npos) << "temporary left: " << e.path();
  nn::Linear big(2048, 2048);
  galley::io::TrainingState st{.model = &big};
  ASSERT_TRUE(ck.resume(st));
  EXPECT_GE(st.step, 1);
}

// A Checkpointer opening a directory clears the temporaries of killed saves, and leaves those of
// saves still running (an evaluator opening a trainer's directory deleted the trainer's save in
// progress, whose rename then failed): a save holds a lock on its temporary.
TEST(Checkpoint, ClearsTheTemporariesOfKilledSavesOnly) {
  const std::string dir = temp_dir("temporaries");
  const auto make = [&](const std::string& name, const std::string& bytes) {
    std::ofstream(fs::path(dir) / name) << bytes;
    return (fs::path(dir) / name).string();
  };
  const std::string killed = make("checkpoint-000000000002.safetensors.tmp.99999999.0", "partial");
  const std::string running = make("checkpoint-000000000003.safetensors.tmp.1.0", "partial");
  const std::string starting = make("checkpoint-000000000004.safetensors.tmp.1.1", "");
  const std::string other = make("other-000000000001.safetensors.tmp.99999999.0", "partial");
  // The save in progress: its lock is held (here by another open description of the file, as
  // another process's would be).
  const int fd = ::open(running.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX), 0);
  { galley::io::Checkpointer ck(dir); }
  EXPECT_FALSE(fs::exists(killed));
  EXPECT_TRUE(fs::exists(running));
  EXPECT_TRUE(fs::exists(starting));  // empty and new: perhaps a save about to lock it
  EXPECT_TRUE(fs::exists(other));     // another prefix's
  // Once its writer is gone, and an empty one once it is old, they go too.
  ::close(fd);
  fs::last_write_time(starting, fs::file_time_type::clock::now() - std::chrono::minutes(1));
  { galley::io::Checkpointer ck(dir); }
  EXPECT_FALSE(fs::exists(running));
  EXPECT_FALSE(fs::exists(starting));
  // A save really running in another process while a Checkpointer opens the directory.
  nn::Linear big(1024, 1024);
  std::string failed;
  std::thread saver([&] {
    try {
      for (int i = 0; i < 20; ++i) galley::io::Checkpointer(dir).save({.model = &big, .step = i});
    } catch (const std::exception& e) {
      failed = e.what();
    }
  });
  for (int i = 0; i < 200; ++i) galley::io::Checkpointer ck(dir, {.keep_last = 100});
  saver.join();
  EXPECT_EQ(failed, "");
  EXPECT_EQ(galley::io::Checkpointer(dir, {.keep_last = 100}).list().size(), 3u);
}

TEST(Checkpoint, KeepsTheNewestK) {
  const std::string dir = temp_dir("keep");
  nn::Linear fc(3, 2);
  galley::io::Checkpointer ck(dir, {.keep_last = 3});
  for (int64_t s = 1; s <= 6; ++s) ck.save({.model = &fc, .step = s * 10});
  auto files = ck.list();
  ASSERT_EQ(files.size(), 3u);
  EXPECT_NE(files.back().find("000000000060"), std::string::npos);
  EXPECT_NE(files.front().find("000000000040"), std::string::npos);
  // Saves below the directory's newest (another run's higher steps) keep the file just written.
  const std::string written = ck.save({.model = &fc, .step = 1});
  EXPECT_TRUE(fs::exists(written));
  EXPECT_EQ(ck.list().size(), 3u);
}

TEST(Checkpoint, AnUnreadableNewestFileFallsBackToThePreviousOne) {
  const std::string dir = temp_dir("fallback");
  nn::Linear fc(3, 2);
  galley::io::Checkpointer ck(dir);
  ck.save({.model = &fc, .step = 1});
  ck.save({.model = &fc, .step = 2});
  const std::string newest = ck.list().back();
  fs::resize_file(newest, 20);  // damaged after the fact
  galley::io::TrainingState st{.model = &fc};
  EXPECT_EQ(ck.resumed_from(), "");
  ASSERT_TRUE(ck.resume(st));
  EXPECT_EQ(st.step, 1);
  // Which file it loaded, and which it skipped and why.
  EXPECT_EQ(ck.resumed_from(), ck.list().front());
  ASSERT_EQ(ck.skipped().size(), 1u);
  EXPECT_EQ(ck.skipped()[0].rfind(newest + ": ", 0), 0u) << ck.skipped()[0];
}

TEST(Checkpoint, MismatchedModelIsAnErrorNamingTheEntryAndChangesNothing) {
  const std::string dir = temp_dir("mismatch");
  nn::Linear small(3, 2), other(4, 2);
  const std::string path = dir + "/a.safetensors";
  galley::io::save_checkpoint(path, {.model = &small});
  auto before = other.weight().to_vector();
  galley::io::TrainingState st{.model = &other};
  std::string msg = testutil::error_of([&] { galley::io::load_checkpoint(path, st); });
  testutil::expect_contains(msg, {"a.safetensors", "weight", "[2, 3]", "[2, 4]"});
  EXPECT_EQ(other.weight().to_vector(), before);
}

TEST(Checkpoint, OptimizerStateOfTheWrongShapeIsAnError) {
  nn::Linear a(3, 2), b(5, 2);
  galley::optim::Adam oa(a.parameters()), ob(b.parameters());
  galley::Tensor x = galley::randn({4, 3});
  galley::sum(a(x)).backward();
  oa.step();
  std::string msg = testutil::error_of([&] { ob.load_state_dict(oa.state_dict()); });
  testutil::expect_contains(msg, {"Adam", "state.0.exp_avg", "[2, 3]", "[2, 5]"});
}

TEST(SafeTensorsFile, OverlappingTensorsAreAnError) {
  const std::string dir = temp_dir("overlap");
  const std::string path = dir + "/o.safetensors";
  std::string header =
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})";
  std::ofstream out(path, std::ios::binary);
  uint64_t len = header.size();
  out.write(reinterpret_cast<const char*>(&len), 8);
  out << header << std::string(12, '\0');
  out.close();
  testutil::expect_contains(testutil::error_of([&] { galley::io::load_safetensors(path); }),
                            {"o.safetensors", "overlap", "'a'", "'b'"});
}

TEST(SafeTensorsFile, SizesThatAreNotWholeNumbersOrOverflowAreErrors) {
  // Found by the fuzzer: a size too large for 64 bits parses as a float, which must not be
  // converted to an integer; products of sizes must not overflow either.
  const std::string dir = temp_dir("sizes");
  const std::string path = dir + "/s.safetensors";
  struct Case {
    std::string shape, offsets, expect;
  };
  for (const Case& c :
       {Case{"[22222222222222222228, 10]", "[0, 8]", "shape holds"},
        Case{"[1.5]", "[0, 8]", "shape holds 1.5"}, Case{"[-2]", "[0, 8]", "shape holds -2"},
        Case{"[2]", "[-1, 8]", "data_offsets holds -1"},
        Case{"[2]", "\"0\"", "data_offsets is not an array"},
        Case{"[4294967296, 4294967296, 4]", "[0, 8]", "larger than any file"}}) {
    const std::string header =
        R"({"t":{"dtype":"F32","shape":)" + c.shape + R"(,"data_offsets":)" + c.offsets + "}}";
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    uint64_t len = header.size();
    out.write(reinterpret_cast<const char*>(&len), 8);
    out << header << std::string(8, '\0');
    out.close();
    testutil::expect_contains(testutil::error_of([&] { galley::io::load_safetensors(path); }),
                              {"s.safetensors", "'t'", c.expect});
  }
}

TEST(SafeTensorsFile, HalfPrecisionRoundTripsAndLoadsIntoFloatLayers) {
  const std::string dir = temp_dir("half");
  nn::Linear fc(4, 3);
  std::map<std::string, Tensor> half;
  for (auto& [k, t] : fc.state_dict()) half[k] = t.to(galley::DType::BFloat16);
  half["weight"] = fc.state_dict()["weight"].to(galley::DType::Float16);
  galley::io::save_safetensors(dir + "/h.safetensors", half, {{"origin", "test"}});
  auto back = galley::io::read_safetensors(dir + "/h.safetensors");
  EXPECT_EQ(back.metadata["origin"], "test");
  EXPECT_EQ(back.tensors["weight"].dtype(), galley::DType::Float16);
  EXPECT_EQ(back.tensors["bias"].dtype(), galley::DType::BFloat16);
  nn::Linear loaded(4, 3);
  loaded.load_state_dict(back.tensors);
  auto w = fc.weight().to_vector(), lw = loaded.weight().to_vector();
  for (size_t i = 0; i < w.size(); ++i) EXPECT_NEAR(lw[i], w[i], std::abs(w[i]) * 1e-3 + 1e-7);
}

TEST(SafeTensorsFile, HalfConversionsAreExactWhereTheyShouldBe) {
  auto h =
      Tensor::from_vector({1.f, -2.5f, 65504.f, 6.1035156e-05f, 5.9604645e-08f, 0.f, 1e6f}, {7})
          .to(galley::DType::Float16)
          .to(galley::DType::Float32)
          .to_vector();
  EXPECT_EQ(h[0], 1.f);
  EXPECT_EQ(h[1], -2.5f);
  EXPECT_EQ(h[2], 65504.f);
  EXPECT_EQ(h[3], 6.1035156e-05f);  // smallest normal
  EXPECT_EQ(h[4], 5.9604645e-08f);  // smallest subnormal
  EXPECT_EQ(h[5], 0.f);
  EXPECT_TRUE(std::isinf(h[6]));
  auto b = Tensor::from_vector({1.f, 3.140625f, -1e30f}, {3})
               .to(galley::DType::BFloat16)
               .to(galley::DType::Float32)
               .to_vector();
  EXPECT_EQ(b[0], 1.f);
  EXPECT_EQ(b[1], 3.140625f);
  EXPECT_NEAR(b[2], -1e30f, 1e28f);
}

namespace {
class Tiny : public nn::Layer {
 public:
  Tiny() { register_layer("fc", fc_); }
  Tensor forward(const Tensor& x) override { return fc_(x); }

 private:
  nn::Linear fc_{3, 2};
};
}  // namespace

TEST(Checkpoint, DataParallelSavesOnceAndLoadsOntoEveryReplica) {
  const std::string dir = temp_dir("dp");
  std::vector<galley::Device> two{galley::Device::cpu(0), galley::Device::cpu(1)};
  galley::DataParallel<Tiny> dp(two);
  galley::optim::Adam opt(dp.parameters());
  nn::CrossEntropyLoss loss_fn;
  auto y = Tensor::from_vector(std::vector<int64_t>{0, 1, 1, 0}, {4});
  loss_fn(dp(galley::randn({4, 3})), y).backward();
  opt.step();
  const std::string path = dir + "/dp.safetensors";
  galley::io::save_checkpoint(path, {.parallel_model = &dp, .optimizer = &opt, .step = 1});
  auto file = galley::io::load_safetensors(path);
  EXPECT_TRUE(file.count("model.fc.weight"));
  EXPECT_TRUE(file.count("optimizer.state.1.exp_avg"));
  EXPECT_FALSE(file.count("optimizer.state.2.exp_avg"));  // replica 1's copy is not stored

  std::vector<galley::Device> three{galley::Device::cpu(0), galley::Device::cpu(1),
                                    galley::Device::cpu(2)};
  galley::DataParallel<Tiny> dp3(three);
  galley::optim::Adam opt3(dp3.parameters());
  galley::io::TrainingState st{.parallel_model = &dp3, .optimizer = &opt3};
  galley::io::load_checkpoint(path, st);
  for (size_t r = 0; r < 3; ++r) {
    EXPECT_EQ(dp3.module(r).parameters()[0].to_vector(), dp.module(0).parameters()[0].to_vector());
    EXPECT_EQ(opt3.state(dp3.module(r).parameters()[0]).exp_avg.to_vector(),
              opt.state(dp.module(0).parameters()[0]).exp_avg.to_vector());
  }
}

// Dropout's masks come from generators outside the state_dict (each Dropout layer's, and under
// DataParallel each replica's default stream, which functional dropout draws from): the
// checkpoint keeps where they stand, so a resumed run draws the masks the uninterrupted one does.
namespace {
class Dropouts : public nn::Layer {
 public:
  Dropouts() { register_layer("drop", drop_); }
  Tensor forward(const Tensor& x) override {
    return galley::dropout(drop_(x), 0.5f, is_training());  // the layer's, then the default's
  }

 private:
  nn::Dropout drop_{0.3f};
};
}  // namespace

TEST(Checkpoint, KeepsWhereTheDropoutGeneratorsStand) {
  const std::string dir = temp_dir("rng");
  const Tensor x = galley::ones({4, 256});
  {
    Dropouts model;
    model(x);
    const std::string path = dir + "/one.safetensors";
    galley::io::save_checkpoint(path, {.model = &model, .step = 1});
    EXPECT_TRUE(galley::io::read_safetensors(path).metadata.count("rng.model.drop.generator"));
    const std::vector<float> next = model(x).to_vector();
    model(x);  // moves on
    galley::io::TrainingState st{.model = &model};
    galley::io::load_checkpoint(path, st);
    EXPECT_EQ(model(x).to_vector(), next) << "one model";
  }
  galley::DataParallel<Dropouts> dp({galley::Device::cpu(0), galley::Device::cpu(1)});
  dp(x);
  galley::io::Checkpointer ckpt(dir + "/dp");
  const std::string saved = ckpt.save({.parallel_model = &dp, .step = 1});
  const auto meta = galley::io::read_safetensors(saved).metadata;
  for (const char* key : {"rng.replica0", "rng.replica1", "rng.replica1.drop.generator"})
    EXPECT_TRUE(meta.count(key)) << key;
  const std::vector<float> next = dp(x).to_vector();
  dp(x);
  galley::io::TrainingState st{.parallel_model = &dp};
  ASSERT_TRUE(ckpt.resume(st));
  EXPECT_EQ(dp(x).to_vector(), next) << "DataParallel";
}

// ---------------------------------------------------------------------------------------------
// Preemption: a watched signal only sets a flag; the next boundary saves and throws Preempted.

namespace {
volatile sig_atomic_t g_usr1_seen = 0;
extern "C" void count_usr1(int) {
  g_usr1_seen = g_usr1_seen + 1;
}
}  // namespace

TEST(Preemption, ASignalSavesAtTheNextBoundaryAndResumesBitForBit) {
  const int64_t n = 4;
  const auto expected = straight_losses(2 * n);
  const std::string dir = temp_dir("preempt");
  {
    galley::manual_seed(17);
    TrainRun run;
    galley::io::Checkpointer ck(dir, {.preempt_signals = {SIGTERM, SIGUSR1}});
    auto st = run.state();
    for (int64_t k = 0; k < n; ++k) {
      ASSERT_EQ(run.step(k), expected[k]);
      st.step = k + 1;
      ck.stop_if_preempted(st);  // no signal yet: nothing happens
    }
    EXPECT_FALSE(ck.preempted());
    EXPECT_TRUE(ck.list().empty());
    ASSERT_EQ(raise(SIGTERM), 0);  // the process lives on: the handler only records it
    EXPECT_TRUE(ck.preempted());
    EXPECT_EQ(ck.preempt_signal(), SIGTERM);
    EXPECT_TRUE(ck.list().empty()) << "the handler itself must not save";
    try {
      ck.stop_if_preempted(st);
      ADD_FAILURE() << "stop_if_preempted did not throw after SIGTERM";
    } catch (const galley::io::Preempted& p) {
      EXPECT_EQ(p.signal(), SIGTERM);
      ASSERT_EQ(ck.list().size(), 1u);
      EXPECT_EQ(p.path(), ck.list().back());
      testutil::expect_contains(p.what(), {"SIGTERM", p.path()});
    }
  }
  // As the restarted program would: a fresh start, then resume and continue.
  galley::manual_seed(999);
  TrainRun fresh;
  galley::io::Checkpointer ck(dir, {.preempt_signals = {SIGTERM}});
  EXPECT_FALSE(ck.preempted()) << "a new watcher starts with no signal pending";
  auto st = fresh.state();
  ASSERT_TRUE(ck.resume(st));
  EXPECT_EQ(st.step, n);
  for (int64_t k = n; k < 2 * n; ++k) EXPECT_EQ(fresh.step(k), expected[k]) << "step " << k;
}

TEST(Preemption, TheWatcherGivesThePreviousHandlerBack) {
  const std::string dir = temp_dir("preempt_handler");
  struct sigaction mine {
  }, before{};
  mine.sa_handler = count_usr1;
  sigemptyset(&mine.sa_mask);
  ASSERT_EQ(sigaction(SIGUSR1, &mine, &before), 0);
  g_usr1_seen = 0;
  {
    galley::io::Checkpointer ck(dir, {.preempt_signals = {SIGTERM, SIGUSR1}});
    ASSERT_EQ(raise(SIGUSR1), 0);
    EXPECT_EQ(ck.preempt_signal(), SIGUSR1);
    EXPECT_EQ(g_usr1_seen, 0);
    // A Checkpointer that watches nothing never reports a preemption.
    galley::io::Checkpointer plain(dir);
    EXPECT_FALSE(plain.preempted());
    plain.stop_if_preempted({.step = 1});
  }
  ASSERT_EQ(raise(SIGUSR1), 0);
  EXPECT_EQ(g_usr1_seen, 1);
  sigaction(SIGUSR1, &before, nullptr);
}

TEST(Preemption, OneWatcherAtATimeAndOnlyCatchableSignals) {
  const std::string dir = temp_dir("preempt_bad");
  galley::io::Checkpointer ck(dir, {.preempt_signals = {SIGTERM}});
  testutil::expect_contains(testutil::error_of([&] {
                              galley::io::Checkpointer second(dir, {.preempt_signals = {SIGTERM}});
                            }),
                            {"another Checkpointer"});
  testutil::expect_contains(testutil::error_of([&] {
                              galley::io::Checkpointer bad(dir, {.preempt_signals = {SIGKILL}});
                            }),
                            {"cannot watch signal"});
  EXPECT_FALSE(ck.preempted());
}

// A checkpoint whose optimizer state does not fit the optimizer it is loaded into changes
// nothing: the model it was loaded into first keeps its weights, and the error names the file.
TEST(Checkpoint, ALoadThatFailsLaterChangesNothingEarlier) {
  const std::string dir = temp_dir("atomic");
  nn::Linear a(3, 2), b(3, 2);
  galley::optim::SGD sgd(a.parameters(), {.learning_rate = 0.1, .momentum = 0.9});
  galley::sum(a(galley::ones({4, 3}))).backward();
  sgd.step();  // momentum buffers: state for two parameters
  const std::string path = dir + "/a.safetensors";
  galley::io::save_checkpoint(path, {.model = &a, .optimizer = &sgd});
  galley::optim::SGD one({b.parameters()[0]}, {.learning_rate = 0.1, .momentum = 0.9});
  const std::vector<float> before = b.parameters()[0].to_vector();
  galley::io::TrainingState into{.model = &b, .optimizer = &one};
  testutil::expect_contains(testutil::error_of([&] { galley::io::load_checkpoint(path, into); }),
                            {"a.safetensors"});
  EXPECT_EQ(b.parameters()[0].to_vector(), before) << "the model was changed by a failed load";
}

// A file in the directory whose step does not fit 64 bits is not one of the checkpoints, not an
// exception out of list().
TEST(Checkpoint, AFileWithAHugeStepIsNotACheckpoint) {
  const std::string dir = temp_dir("huge_step");
  std::ofstream(dir + "/checkpoint-99999999999999999999999.safetensors") << "not one";
  galley::io::Checkpointer ck(dir);
  EXPECT_TRUE(ck.list().empty());
}

TEST(Checkpoint, ANegativeStepIsAnErrorAndWritesNothing) {
  const std::string dir = temp_dir("negative_step");
  nn::Linear fc(3, 2);
  galley::io::Checkpointer ck(dir);
  testutil::expect_contains(testutil::error_of([&] { ck.save({.model = &fc, .step = -1}); }),
                            {"step -1", "negative"});
  EXPECT_TRUE(fs::is_empty(dir));
  ck.save({.model = &fc, .step = 0});
  EXPECT_EQ(ck.list().size(), 1u);
}

// An optimizer state saved for another parameter count is refused under DataParallel as it is
// without (once spread over the replicas it would land on other parameters), and a file saved
// without an optimizer or a scheduler says so; nothing changes.
TEST(Checkpoint, OptimizerStatesThatDoNotFitADataParallelModelAreRefused) {
  const std::string dir = temp_dir("dp_count");
  Tiny one;
  galley::optim::SGD sgd_one({one.parameters()[0]}, {.learning_rate = 0.1, .momentum = 0.9});
  galley::sum(one(galley::randn({4, 3}))).backward();
  sgd_one.step();
  const std::string part = dir + "/part.safetensors", bare = dir + "/bare.safetensors";
  galley::io::save_checkpoint(part, {.model = &one, .optimizer = &sgd_one, .step = 1});
  galley::io::save_checkpoint(bare, {.model = &one, .step = 1});
  galley::DataParallel<Tiny> dp({galley::Device::cpu(0), galley::Device::cpu(1)});
  galley::optim::SGD sgd(dp.parameters(), {.learning_rate = 0.1, .momentum = 0.9});
  const std::vector<float> before = dp.module(1).parameters()[0].to_vector();
  galley::io::TrainingState st{.parallel_model = &dp, .optimizer = &sgd};
  testutil::expect_contains(testutil::error_of([&] { galley::io::load_checkpoint(part, st); }),
                            {part, "saved state is for 1 parameters", "has 2"});
  EXPECT_EQ(dp.module(1).parameters()[0].to_vector(), before);
  testutil::expect_contains(testutil::error_of([&] { galley::io::load_checkpoint(bare, st); }),
                            {bare, "no optimizer state"});
  galley::optim::StepLR sched(sgd, 2);
  galley::io::TrainingState with_sched{.parallel_model = &dp, .scheduler = &sched};
  testutil::expect_contains(
      testutil::error_of([&] { galley::io::load_checkpoint(bare, with_sched); }),
      {bare, "no scheduler state"});
}

// A directory that goes away under a Checkpointer is a galley error naming it, not a
// std::filesystem exception; a prefix too long for the temporary files' names is refused.
TEST(Checkpoint, AnUnreadableDirectoryAndAnOverlongPrefixAreGalleyErrors) {
  const std::string dir = temp_dir("gone");
  galley::io::Checkpointer ckpt(dir);
  fs::remove_all(dir);
  testutil::expect_contains(testutil::error_of([&] { (void)ckpt.list(); }),
                            {"Checkpointer", "cannot read directory", dir});
  galley::io::TrainingState st;
  testutil::expect_contains(testutil::error_of([&] { ckpt.resume(st); }),
                            {"cannot read directory"});
  testutil::expect_contains(
      testutil::error_of(
          [&] { galley::io::Checkpointer(temp_dir("long"), {.prefix = std::string(200, 'p')}); }),
      {"Checkpointer", "prefix of 200 bytes", "at most 190"});
}

// A rate moved after the schedule's last step (set_learning_rate, a ReduceLROnPlateau's cut) is
// saved with the optimizer and kept on load: the schedule's next step follows it by PyTorch's
// recursive form (PyTorch 2.15 and 1.13: 0.2, 0.1, 0.1, 0.05 from there).
TEST(Checkpoint, ARateMovedAfterTheSchedulesStepIsKept) {
  const std::string dir = temp_dir("moved_rate");
  Tiny a;
  galley::optim::SGD opt_a(a.parameters(), {.learning_rate = 1.0});
  galley::optim::StepLR sched_a(opt_a, 2, 0.5);
  sched_a.step();
  opt_a.set_learning_rate(0.2);
  const std::string path = dir + "/moved.safetensors";
  galley::io::save_checkpoint(path, {.model = &a, .optimizer = &opt_a, .scheduler = &sched_a});
  Tiny b;
  galley::optim::SGD opt_b(b.parameters(), {.learning_rate = 1.0});
  galley::optim::StepLR sched_b(opt_b, 2, 0.5);
  galley::io::TrainingState st{.model = &b, .optimizer = &opt_b, .scheduler = &sched_b};
  galley::io::load_checkpoint(path, st);
  std::vector<double> rates{opt_b.learning_rate()};
  for (int e = 0; e < 3; ++e) {
    sched_b.step();
    rates.push_back(opt_b.learning_rate());
  }
  EXPECT_EQ(rates, (std::vector<double>{0.2, 0.1, 0.1, 0.05}));
  EXPECT_TRUE(sched_b.chained());
  // A chained schedule's state round-trips as it stands.
  galley::StateDict saved = sched_b.state_dict();
  opt_b.set_learning_rate(3.0);
  sched_b.load_state_dict(saved);
  EXPECT_EQ(opt_b.learning_rate(), 0.05);
  sched_b.step();
  EXPECT_EQ(opt_b.learning_rate(), 0.05);  // period 5: no step of 2
}

// A checkpoint keeps the process's default generator, also when saved or loaded on a thread
// inside a GeneratorScope (it kept, and restored, the scope's), and reads and writes it under the
// generator's lock while other threads draw from it.
TEST(Checkpoint, KeepsTheProcessGeneratorInsideAScopeAndWhileOthersDraw) {
  const std::string dir = temp_dir("process_generator");
  const std::string path = dir + "/a.safetensors";
  galley::manual_seed(5);
  const std::string process = galley::default_generator_state();
  Generator mine(99);
  const std::string mine_before = mine.state();
  {
    galley::GeneratorScope scope(mine);
    galley::io::save_checkpoint(path, {.step = 1});
  }
  EXPECT_EQ(galley::io::read_safetensors(path).metadata.at("rng.default"), process);
  galley::randn({10});  // the process generator moves on
  {
    galley::GeneratorScope scope(mine);
    galley::io::TrainingState st;
    galley::io::load_checkpoint(path, st);
  }
  EXPECT_EQ(galley::default_generator_state(), process);
  EXPECT_EQ(mine.state(), mine_before);
  // Saves and loads while another thread draws: each file holds a state the generator had.
  std::atomic<bool> stop{false};
  std::thread drawer([&] {
    while (!stop) galley::randn({16});
  });
  for (int i = 0; i < 50; ++i) {
    galley::io::save_checkpoint(path, {.step = 1});
    Generator g;
    g.set_state(galley::io::read_safetensors(path).metadata.at("rng.default"));
    galley::io::TrainingState st;
    galley::io::load_checkpoint(path, st);
  }
  stop = true;
  drawer.join();
}
