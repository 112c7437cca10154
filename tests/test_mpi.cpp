// Multi-process data parallelism over MPI. ctest runs this under `mpirun -np 2`, with one and
// with two CPU devices per process (GALLEY_TEST_DEVICES); run alone it skips.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "galley/galley.h"
#include "models.h"
#include "test_util.h"

namespace nn = galley::nn;
using galley::Tensor;

namespace {

class TinyNet : public nn::Layer {
 public:
  TinyNet() {
    register_layer("conv", conv_);
    register_layer("fc", fc_);
  }
  Tensor forward(const Tensor& x) override {
    return fc_(galley::flatten(galley::max_pool2d(galley::relu(conv_(x)), {.kernel_size = 2}), 1));
  }

 private:
  nn::Conv2D conv_{1, 3, 3, {.padding = 1}};
  nn::Linear fc_{3 * 3 * 3, 4};
};

// x * weight + bias, then a ReLU: elementwise ops only, converted to bfloat16 when built.
class BFloat16Diagonal : public nn::Layer {
 public:
  BFloat16Diagonal() {
    weight_ = register_parameter("weight", galley::randn({4}) * 0.5f + 1.f);
    bias_ = register_parameter("bias", galley::randn({4}) * 0.1f);
    to(galley::DType::BFloat16);
  }
  Tensor forward(const Tensor& x) override { return galley::relu(x * weight_ + bias_); }

 private:
  Tensor weight_, bias_;
};

const galley::distributed::ParallelEnv& env() {
  const char* t = std::getenv("GALLEY_TEST_MPI_TIMEOUT");
  return galley::distributed::init_parallel_env({.timeout_seconds = t ? std::atof(t) : 60.0});
}

int local_devices() {
  const char* d = std::getenv("GALLEY_TEST_DEVICES");
  return d ? std::atoi(d) : 1;
}

// One CPU device per replica of this process.
std::vector<galley::Device> local_cpus() {
  std::vector<galley::Device> devs;
  for (int i = 0; i < local_devices(); ++i) devs.push_back(galley::Device::cpu(i));
  return devs;
}

// `count` global batches of TinyNet's inputs and labels, the same in every process (each
// trains on its own slice).
void global_batches(int count, int64_t global, uint64_t seed, std::vector<Tensor>& xs,
                    std::vector<Tensor>& ys) {
  galley::Generator gen(seed);
  for (int s = 0; s < count; ++s) {
    xs.push_back(galley::randn({global, 1, 6, 6}, gen));
    std::vector<int64_t> l(global);
    for (auto& v : l) v = static_cast<int64_t>(gen.next_u64() % 4);
    ys.push_back(Tensor::from_vector(l, {global}));
  }
}

}  // namespace

TEST(Mpi, EnvironmentMatchesTheLauncher) {
  const auto& e = env();
  if (e.world_size == 1) GTEST_SKIP() << "single process: run under mpirun -np 2";
  EXPECT_EQ(e.launcher, "mpirun");
  ASSERT_TRUE(galley::distributed::world());
  EXPECT_EQ(galley::distributed::world()->size(), e.world_size);
}

TEST(Mpi, DataParallelAcrossProcessesMatchesOneModelOnTheGlobalBatch) {
  const auto& e = env();
  if (e.world_size == 1) GTEST_SKIP() << "single process: run under mpirun -np 2";
  // Every process builds the same data; process r trains on its slice of each global batch.
  const int64_t per_rank = 6;
  std::vector<Tensor> xs, ys;
  global_batches(8, per_rank * e.world_size, 42, xs, ys);
  galley::manual_seed(1);
  TinyNet single;
  const auto init = single.state_dict();
  galley::optim::Adam opt1(single.parameters(), {.learning_rate = 1e-2});
  nn::CrossEntropyLoss loss_fn;
  for (size_t s = 0; s < xs.size(); ++s) {
    loss_fn(single(xs[s]), ys[s]).backward();
    opt1.step();
    opt1.clear_grad();
  }

  const std::vector<galley::Device> devs = local_cpus();
  // Different seeds per process: the constructor must still make every replica process 0's.
  galley::DataParallel<TinyNet> model(devs);
  model.load_state_dict(init);
  galley::optim::Adam opt(model.parameters(), {.learning_rate = 1e-2});
  for (size_t s = 0; s < xs.size(); ++s) {
    const int64_t row = 36;
    Tensor x =
        Tensor::from_host(xs[s].data<float>() + e.rank * per_rank * row, {per_rank, 1, 6, 6});
    Tensor y = Tensor::from_host(ys[s].data<int64_t>() + e.rank * per_rank, {per_rank},
                                 galley::DType::Int64);
    loss_fn(model(x), y).backward();
    opt.step();
    opt.clear_grad();
  }
  auto a = single.parameters();
  for (size_t r = 0; r < model.num_replicas(); ++r) {
    auto b = model.module(r).parameters();
    for (size_t k = 0; k < a.size(); ++k) {
      auto va = a[k].to_vector(), vb = b[k].to_vector();
      for (size_t i = 0; i < va.size(); ++i)
        ASSERT_NEAR(vb[i], va[i], 1e-5f)
            << "rank " << e.rank << " replica " << r << " param " << k << " element " << i;
    }
  }
}

TEST(Mpi, GradientsAccumulateAcrossBackwardsAsOnOneModel) {
  const auto& e = env();
  if (e.world_size == 1) GTEST_SKIP() << "single process: run under mpirun -np 2";
  const int64_t per_rank = 5;
  std::vector<Tensor> xs, ys;
  global_batches(6, per_rank * e.world_size, 43, xs, ys);
  galley::manual_seed(2);
  TinyNet single;
  const auto init = single.state_dict();
  nn::CrossEntropyLoss loss_fn;
  auto whole = [&](int s) { return loss_fn(single(xs[s]), ys[s]); };
  // Never cleared: a backward per batch, batches 2 and 3 in one loss.
  whole(0).backward();
  whole(1).backward();
  (whole(2) + whole(3)).backward();
  whole(4).backward();
  whole(5).backward();

  galley::DataParallel<TinyNet> model(local_cpus());
  model.load_state_dict(init);
  auto mine = [&](int s) {
    Tensor x = Tensor::from_host(xs[s].data<float>() + e.rank * per_rank * 36, {per_rank, 1, 6, 6});
    Tensor y = Tensor::from_host(ys[s].data<int64_t>() + e.rank * per_rank, {per_rank},
                                 galley::DType::Int64);
    return loss_fn(model(x), y);
  };
  mine(0).backward();
  mine(1).backward();
  (mine(2) + mine(3)).backward();
  {
    auto guard = model.no_sync();
    mine(4).backward();
  }
  mine(5).backward();
  auto a = single.parameters();
  for (size_t r = 0; r < model.num_replicas(); ++r) {
    auto b = model.module(r).parameters();
    for (size_t k = 0; k < a.size(); ++k) {
      auto va = a[k].grad().to_vector(), vb = b[k].grad().to_vector();
      for (size_t i = 0; i < va.size(); ++i)
        ASSERT_NEAR(vb[i], va[i], 1e-5f)
            << "rank " << e.rank << " replica " << r << " param " << k << " element " << i;
    }
  }
}

TEST(Mpi, ReplicasOfEveryProcessStartAsProcessZeros) {
  const auto& e = env();
  if (e.world_size == 1) GTEST_SKIP() << "single process: run under mpirun -np 2";
  galley::manual_seed(500 + e.rank);  // different initial weights in every process
  galley::DataParallel<TinyNet> model;
  auto p = model.module(0).parameters()[0];
  auto gathered = galley::distributed::world()->all_gather(p);
  auto v = gathered.to_vector();
  const size_t n = p.numel();
  for (int r = 1; r < e.world_size; ++r)
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(v[r * n + i], v[i]) << "process " << r;
}

TEST(Mpi, SixteenBitAllReduceIsTheFloat32SumRoundedOnce) {
  const auto& e = env();
  if (e.world_size == 1) GTEST_SKIP() << "single process: run under mpirun -np 2";
  auto world = galley::distributed::world();
  const int64_t count = 3000;
  // Process r's values, exact in the 16-bit dtype; every process can compute everyone's.
  auto values = [&](int r, galley::DType dtype) {
    std::vector<float> v(count);
    for (int64_t i = 0; i < count; ++i)
      v[i] = std::sin(0.37f * float(i) + float(r)) * (1.f + float(r) / 7.f) + 0.001f * float(i);
    return Tensor::from_vector(v, {count}).to(dtype);
  };
  for (galley::DType dtype : {galley::DType::BFloat16, galley::DType::Float16}) {
    std::vector<float> sum(count, 0.f);
    for (int r = 0; r < e.world_size; ++r) {
      const auto v = values(r, dtype).to(galley::DType::Float32).to_vector();
      for (int64_t i = 0; i < count; ++i) sum[i] += v[i];
    }
    std::vector<float> avg(sum);
    for (float& a : avg) a *= 1.f / float(e.world_size);
    auto rounded = [&](const std::vector<float>& v) {
      return Tensor::from_vector(v, {count}).to(dtype).to(galley::DType::Float32).to_vector();
    };
    Tensor s = values(e.rank, dtype);
    world->all_reduce(s, galley::parallel::ReduceOp::Sum);
    EXPECT_EQ(s.dtype(), dtype);
    EXPECT_EQ(s.to(galley::DType::Float32).to_vector(), rounded(sum)) << "rank " << e.rank;
    Tensor a = values(e.rank, dtype);
    world->all_reduce(a, galley::parallel::ReduceOp::Avg);
    EXPECT_EQ(a.to(galley::DType::Float32).to_vector(), rounded(avg)) << "rank " << e.rank;
    Tensor b = values(e.rank, dtype);
    world->broadcast(b, 1);
    EXPECT_EQ(b.to(galley::DType::Float32).to_vector(),
              values(1, dtype).to(galley::DType::Float32).to_vector());
    Tensor g = world->all_gather(values(e.rank, dtype));
    ASSERT_EQ(g.dtype(), dtype);
    const auto gv = g.to(galley::DType::Float32).to_vector();
    for (int r = 0; r < e.world_size; ++r)
      EXPECT_EQ(std::vector<float>(gv.begin() + r * count, gv.begin() + (r + 1) * count),
                values(r, dtype).to(galley::DType::Float32).to_vector());
  }
}

TEST(Mpi, ABFloat16ModelStaysIdenticalAcrossProcesses) {
  const auto& e = env();
  if (e.world_size == 1) GTEST_SKIP() << "single process: run under mpirun -np 2";
  const std::vector<galley::Device> devs = local_cpus();
  galley::manual_seed(700 + e.rank);  // process 0's start wins
  galley::DataParallel<BFloat16Diagonal> model(devs);
  galley::optim::SGD opt(model.parameters(), {.learning_rate = 0.05, .momentum = 0.9});
  nn::CrossEntropyLoss loss_fn;
  galley::Generator gen(99 + e.rank);  // each process its own data
  for (int s = 0; s < 5; ++s) {
    Tensor x = galley::randn({6, 4}, gen).to(galley::DType::BFloat16);
    std::vector<int64_t> l(6);
    for (auto& v : l) v = static_cast<int64_t>(gen.next_u64() % 4);
    loss_fn(model(x).to(galley::DType::Float32), Tensor::from_vector(l, {6})).backward();
    opt.step();
    opt.clear_grad();
  }
  for (size_t r = 0; r < model.num_replicas(); ++r)
    for (auto& p : model.module(r).parameters()) {
      ASSERT_EQ(p.dtype(), galley::DType::BFloat16);
      auto v = galley::distributed::world()->all_gather(p).to(galley::DType::Float32).to_vector();
      const size_t n = p.numel();
      for (int q = 1; q < e.world_size; ++q)
        for (size_t i = 0; i < n; ++i) ASSERT_EQ(v[q * n + i], v[i]) << "process " << q;
    }
}

TEST(Mpi, BuffersFollowProcessZerosReplicaZeroAtEachForward) {
  const auto& e = env();
  if (e.world_size == 1) GTEST_SKIP() << "single process: run under mpirun -np 2";
  const std::vector<galley::Device> devs = local_cpus();
  for (bool broadcast : {true, false}) {
    SCOPED_TRACE(broadcast ? "broadcast_buffers" : "each replica its own buffers");
    galley::DataParallel<testmodels::CountingBuffer> model(devs, {.broadcast_buffers = broadcast});
    // Construction gives every replica process 0's state; then each replica moves its own
    // buffer: 100 * process + 10 * replica.
    auto start = [&](int q, size_t r) { return 100.f * float(q) + 10.f * float(r); };
    for (size_t r = 0; r < model.num_replicas(); ++r)
      model.module(r).named_buffers()[0].second.fill_(start(e.rank, r));
    const int64_t per_replica = 2, rows = per_replica * int64_t(devs.size());
    for (float step : {0.f, 1.f, 2.f}) {
      const std::vector<float> y = model(galley::zeros({rows, 1})).to_vector();
      // With the broadcast every replica of every process adds process 0's replica 0's count.
      for (int64_t i = 0; i < rows; ++i)
        ASSERT_EQ(y[i], (broadcast ? 0.f : start(e.rank, size_t(i / per_replica))) + step)
            << "row " << i << ", step " << step;
    }
    for (size_t r = 0; r < model.num_replicas(); ++r) {
      Tensor b = model.module(r).named_buffers()[0].second;
      auto all = galley::distributed::world()->all_gather(b).to_vector();
      for (int q = 0; q < e.world_size; ++q)
        EXPECT_EQ(all[q], (broadcast ? 0.f : start(q, r)) + 3.f) << "process " << q;
    }
  }
}

// Every buffer crosses the processes, the int64 counter as well as the running statistics:
// each process's replicas start with their own counts and statistics, and after three training
// forwards on the same rows every replica of every process holds process 0's replica 0's state
// moved three steps (momentum None weighs each step by the counter, so a count left behind
// would part the statistics too).
TEST(Mpi, BatchNormCounterAndStatisticsFollowProcessZero) {
  const auto& e = env();
  if (e.world_size == 1) GTEST_SKIP() << "single process: run under mpirun -np 2";
  const std::vector<galley::Device> devs = local_cpus();
  // momentum None: the cumulative average, whose weights come from the counter.
  galley::DataParallel<nn::BatchNorm2D> model(devs, {}, int64_t(3),
                                              nn::BatchNormLayerOptions{.momentum = std::nullopt});
  for (size_t r = 0; r < model.num_replicas(); ++r)
    for (auto& [name, b] : model.module(r).named_buffers()) {
      galley::NoGradGuard no_grad;
      if (name == "num_batches_tracked")
        b.fill_(double(100 * e.rank + 10 * int(r)));
      else
        b.fill_(0.5 + e.rank + 0.25 * double(r));
    }
  model.train();
  // Every replica of every process is given the same rows, so that only the state each starts
  // from could part their statistics.
  galley::Generator gen(5);
  for (int step = 0; step < 3; ++step) {
    const Tensor rows = galley::randn({2, 3, 4, 4}, gen);
    model(galley::cat(std::vector<Tensor>(devs.size(), rows), 0));
  }
  for (size_t r = 0; r < model.num_replicas(); ++r)
    for (auto& [name, b] : model.module(r).named_buffers()) {
      SCOPED_TRACE(name + ", replica " + std::to_string(r));
      Tensor all = galley::distributed::world()->all_gather(b);
      ASSERT_EQ(all.dtype(), b.dtype());
      if (name == "num_batches_tracked") {
        const std::vector<int64_t> counts = all.to_vector<int64_t>();
        for (int q = 0; q < e.world_size; ++q) EXPECT_EQ(counts[size_t(q)], 3) << "process " << q;
      } else {
        const std::vector<float> v = all.to_vector();
        const size_t n = size_t(b.numel());
        for (int q = 1; q < e.world_size; ++q)
          for (size_t i = 0; i < n; ++i) ASSERT_EQ(v[q * n + i], v[i]) << "process " << q;
      }
    }
}

// Checkpointer::save gathers every process's generator states into process 0's file, and each
// process resumes its own: the masks after the resume are the ones an uninterrupted run draws.
TEST(Mpi, ACheckpointKeepsEveryProcesssDropoutStreams) {
  const auto& e = env();
  if (e.world_size == 1) GTEST_SKIP() << "single process: run under mpirun -np 2";
  const std::vector<galley::Device> devs = local_cpus();
  galley::DataParallel<testmodels::DropoutNet> model(devs);
  const Tensor x = galley::ones({2 * int64_t(devs.size()), 8});
  model(x);
  auto world = galley::distributed::world();
  // One directory for the job: the processes share mpirun as their parent.
  const std::string dir = ::testing::TempDir() + "galley_mpi_rng_" + std::to_string(getppid());
  galley::io::Checkpointer ckpt(dir);
  const std::string path = ckpt.save({.parallel_model = &model, .step = 1});
  world->barrier();  // process 0 has written the file
  const auto meta = galley::io::read_safetensors(path).metadata;
  EXPECT_TRUE(meta.count("rng.replica0.drop.generator"));
  EXPECT_TRUE(meta.count("rng.rank1.replica0.drop.generator"));
  const std::vector<float> next = model(x).to_vector();
  model(x);
  galley::io::TrainingState st{.parallel_model = &model};
  ASSERT_TRUE(ckpt.resume(st));
  EXPECT_EQ(model(x).to_vector(), next) << "process " << e.rank;
  world->barrier();
  if (e.rank == 0) std::filesystem::remove_all(dir);
}

TEST(Mpi, EveryProcessAndReplicaDrawsItsOwnDropoutMask) {
  const auto& e = env();
  if (e.world_size == 1) GTEST_SKIP() << "single process: run under mpirun -np 2";
  const std::vector<galley::Device> devs = local_cpus();
  galley::DataParallel<testmodels::DropoutNet> model(devs);
  const int64_t replicas = int64_t(devs.size());
  // One sample per replica; the output's zero pattern is the replica's mask.
  galley::Generator gen(3);
  Tensor y = model(galley::uniform({replicas, 8}, 1.f, 2.f, gen));
  const auto all = galley::distributed::world()->all_gather(y).to_vector();
  const int64_t per_process = replicas * 512;
  auto mask = [&](int q, int64_t r) {
    std::vector<int> m;
    for (int64_t j = 0; j < 512; ++j) m.push_back(all[q * per_process + r * 512 + j] != 0.f);
    return m;
  };
  for (int q = 0; q < e.world_size; ++q)
    for (int64_t r = 0; r < replicas; ++r)
      for (int q2 = 0; q2 < e.world_size; ++q2)
        for (int64_t r2 = 0; r2 < replicas; ++r2)
          if (q != q2 || r != r2)
            EXPECT_NE(mask(q, r), mask(q2, r2)) << "process " << q << " replica " << r
                                                << " and process " << q2 << " replica " << r2;
}

TEST(MpiTimeout, APeerThatNeverArrivesIsAnErrorNotAHang) {
  const auto& e = env();
  if (e.world_size == 1) GTEST_SKIP() << "single process: run under mpirun -np 2";
  auto world = galley::distributed::world();
  // The ranks take turns through files named after rank 0's pid (agreed on by a collective that
  // works), not through sleeps: rank 1 arrives only once rank 0 has given up, and rank 0 polls
  // the unusable group (which lets the abandoned collective finish, so that both processes exit
  // cleanly) until rank 1's late call has returned. A stalled process cannot reorder them (only
  // a stall longer than the timeout in a collective fails the test). The files are in the
  // temporary directory: the ranks of this test run on one machine.
  float token = e.rank == 0 ? float(getpid()) : 0.f;
  world->all_reduce(&token, 1, galley::parallel::ReduceOp::Sum);
  const auto mark = [&](const char* what) {
    return std::filesystem::temp_directory_path() /
           ("galley-mpi-timeout-" + std::to_string(int64_t(token)) + "." + what);
  };
  const auto wait_for = [](const std::filesystem::path& file) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (!std::filesystem::exists(file) && std::chrono::steady_clock::now() < end)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    return std::filesystem::exists(file);
  };
  std::vector<float> v(8, 1.f);
  if (e.rank == 0) {
    std::string msg = testutil::error_of(
        [&] { world->all_reduce(v.data(), 8, galley::parallel::ReduceOp::Sum); });
    testutil::expect_contains(msg, {"all_reduce", "timed out"});
    std::ofstream(mark("gave-up")).put('\n');
    ASSERT_TRUE(wait_for(mark("arriving"))) << "rank 1 never came";
    // The group is unusable: every later call fails at once, naming the first failure (and
    // lets the abandoned collective progress, so that rank 1's late call completes).
    const auto start = std::chrono::steady_clock::now();
    msg = testutil::error_of([&] { world->barrier(); });
    testutil::expect_contains(msg, {"barrier", "unusable", "all_reduce", "timed out"});
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (!std::filesystem::exists(mark("done")) && std::chrono::steady_clock::now() < end) {
      EXPECT_THROW(world->barrier(), galley::Error);
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ASSERT_TRUE(std::filesystem::exists(mark("done"))) << "rank 1's late all_reduce never ended";
    // The late collective wrote into the communicator's own buffer, not into v, which the caller
    // may have freed and reused after the error.
    EXPECT_EQ(v, std::vector<float>(8, 1.f));
    for (const char* f : {"gave-up", "arriving", "done"}) std::filesystem::remove(mark(f));
  } else {
    ASSERT_TRUE(wait_for(mark("gave-up"))) << "rank 0 never gave up";
    std::ofstream(mark("arriving")).put('\n');
    // It pairs with rank 0's abandoned call, whose input was rank 0's values.
    world->all_reduce(v.data(), 8, galley::parallel::ReduceOp::Sum);
    EXPECT_EQ(v, std::vector<float>(8, 2.f));
    std::ofstream(mark("done")).put('\n');
  }
}

// Loss scaling across processes: an Inf in the input of the last process only reaches every
// process's gradients through the all-reduce, so every process (and every replica) skips that
// step and lowers its scale alike; a clean step after it is taken everywhere with equal results.
TEST(Mpi, GradScalerSkipsTheSameStepsOnEveryProcess) {
  const auto& e = env();
  if (e.world_size == 1) GTEST_SKIP() << "single process: run under mpirun -np 2";
  const std::vector<galley::Device> devs = local_cpus();
  galley::DataParallel<TinyNet> model(devs);
  galley::optim::SGD opt(model.parameters(), {.learning_rate = 0.1});
  galley::amp::GradScaler scaler({.init_scale = 1024.0});
  nn::CrossEntropyLoss loss_fn;
  galley::Generator gen(7 + e.rank);
  auto step = [&](bool poison) {
    std::vector<float> x = galley::randn({4, 1, 6, 6}, gen).to_vector();
    if (poison) x[4 * 36 - 1] = INFINITY;
    Tensor labels = Tensor::from_vector(std::vector<int64_t>{0, 1, 2, 3}, {4});
    Tensor loss;
    {
      galley::amp::Autocast autocast(galley::DType::BFloat16);
      loss = loss_fn(model(Tensor::from_vector(x, {4, 1, 6, 6})), labels);
    }
    scaler.scale(loss).backward();
    const bool stepped = scaler.step(opt);
    scaler.update();
    opt.clear_grad();
    return stepped;
  };
  std::vector<std::vector<float>> before;
  for (auto& p : model.parameters()) before.push_back(p.to_vector());
  EXPECT_FALSE(step(e.rank == e.world_size - 1)) << "rank " << e.rank << " stepped over an Inf";
  EXPECT_EQ(scaler.get_scale(), 512.0) << "rank " << e.rank;
  auto params = model.parameters();
  for (size_t k = 0; k < params.size(); ++k)
    EXPECT_EQ(params[k].to_vector(), before[k]) << "rank " << e.rank << " parameter " << k;
  EXPECT_TRUE(step(false)) << "rank " << e.rank;
  // Every process ends with process 0's parameters.
  for (auto& p : model.module(0).parameters()) {
    Tensor g = galley::distributed::world()->all_gather(p.detach().clone());
    const auto all = g.to_vector();
    const size_t n = static_cast<size_t>(p.numel());
    for (int r = 1; r < e.world_size; ++r)
      for (size_t i = 0; i < n; ++i)
        ASSERT_EQ(all[r * n + i], all[i]) << "process " << r << " differs at " << i;
  }
}
