// DataParallel over several CPU devices must train exactly like one model on the whole batch.
#include <gtest/gtest.h>

#include <cmath>
#include <thread>

#include "galley/galley.h"
#include "models.h"
#include "test_util.h"

namespace nn = galley::nn;
using galley::Device;
using galley::DType;
using galley::Tensor;

namespace {

class SmallCNN : public nn::Layer {
 public:
  SmallCNN() {
    register_layer("conv", conv_);
    register_layer("pool", pool_);
    register_layer("fc", fc_);
    register_layer("out", out_);
  }
  Tensor forward(const Tensor& x) override {
    auto h = pool_(galley::relu(conv_(x)));
    return out_(galley::relu(fc_(galley::flatten(h, 1))));
  }

 private:
  nn::Conv2D conv_{2, 4, 3, {.padding = 1}};
  nn::MaxPool2D pool_{2};
  nn::Linear fc_{4 * 4 * 4, 16};
  nn::Linear out_{16, 5};
};

std::vector<Device> cpus(int n) {
  std::vector<Device> d;
  for (int i = 0; i < n; ++i) d.push_back(Device::cpu(i));
  return d;
}

struct Batch {
  Tensor x, y;
};

std::vector<Batch> batches(int count, int64_t size, uint64_t seed) {
  galley::Generator gen(seed);
  std::vector<Batch> out;
  for (int i = 0; i < count; ++i) {
    std::vector<int64_t> labels(size);
    for (auto& l : labels) l = static_cast<int64_t>(gen.next_u64() % 5);
    out.push_back({galley::randn({size, 2, 8, 8}, gen), Tensor::from_vector(labels, {size})});
  }
  return out;
}

// One Adam step per batch; works for a model and for a DataParallel of it alike.
template <typename M>
void train(M& model, const std::vector<Batch>& data) {
  galley::optim::Adam opt(model.parameters(), {.learning_rate = 1e-2});
  nn::CrossEntropyLoss loss_fn;
  for (auto& b : data) {
    loss_fn(model(b.x), b.y).backward();
    opt.step();
    opt.clear_grad();
  }
}

// Parameters after one Adam step per batch of one model on whole batches, from `init`.
std::vector<std::vector<float>> train_single(const std::map<std::string, Tensor>& init,
                                             const std::vector<Batch>& data) {
  SmallCNN model;
  model.load_state_dict(init);
  train(model, data);
  std::vector<std::vector<float>> out;
  for (auto& p : model.parameters()) out.push_back(p.to_vector());
  return out;
}

void expect_close(const std::vector<std::vector<float>>& a, const std::vector<Tensor>& b,
                  const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t k = 0; k < a.size(); ++k) {
    auto v = b[k].to_vector();
    for (size_t i = 0; i < v.size(); ++i)
      ASSERT_NEAR(v[i], a[k][i], 1e-5f) << what << ": parameter " << k << " element " << i;
  }
}

}  // namespace

TEST(DataParallel, MatchesOneDeviceOnTheFullBatchAfterTenAdamSteps) {
  galley::manual_seed(3);
  SmallCNN reference;
  const auto init = reference.state_dict();
  const auto data = batches(10, 10, 11);  // 10 does not split evenly over 3 or 4 replicas
  const auto expected = train_single(init, data);
  for (int n : {1, 2, 3, 4}) {
    galley::DataParallel<SmallCNN> model(cpus(n));
    model.load_state_dict(init);
    train(model, data);
    for (size_t r = 0; r < model.num_replicas(); ++r)
      expect_close(expected, model.module(r).parameters(),
                   std::to_string(n) + " replicas, replica " + std::to_string(r));
  }
}

TEST(DataParallel, ReplicasStartIdenticalAndLiveOnTheirDevices) {
  galley::DataParallel<SmallCNN> model(cpus(3));
  auto p0 = model.module(0).parameters();
  for (size_t r = 1; r < 3; ++r) {
    auto pr = model.module(r).parameters();
    for (size_t k = 0; k < p0.size(); ++k) {
      EXPECT_EQ(pr[k].to_vector(), p0[k].to_vector());
      EXPECT_EQ(pr[k].device(), Device::cpu(static_cast<int>(r)));
    }
  }
  EXPECT_EQ(model.parameters().size(), 3 * p0.size());
}

TEST(DataParallel, BucketSizesFromTinyToHugeGiveTheSameResult) {
  galley::manual_seed(5);
  SmallCNN reference;
  const auto init = reference.state_dict();
  const auto data = batches(3, 8, 12);
  const auto expected = train_single(init, data);
  for (int64_t bytes : {int64_t(1), int64_t(256), int64_t(4096), int64_t(1) << 30}) {
    galley::DataParallel<SmallCNN> model(cpus(2), {.bucket_bytes = bytes});
    model.load_state_dict(init);
    train(model, data);
    expect_close(expected, model.module(1).parameters(), "bucket_bytes " + std::to_string(bytes));
  }
}

TEST(DataParallel, NoSyncAccumulationEqualsOneLargeBatch) {
  galley::manual_seed(7);
  SmallCNN single;
  const auto init = single.state_dict();
  const auto data = batches(2, 6, 13);
  nn::CrossEntropyLoss loss_fn;
  // One model: the two half-batch losses summed, one step.
  for (auto& b : data) loss_fn(single(b.x), b.y).backward();
  std::vector<std::vector<float>> expected;
  for (auto& p : single.parameters()) expected.push_back(p.grad().to_vector());

  galley::DataParallel<SmallCNN> model(cpus(3));
  model.load_state_dict(init);
  {
    auto guard = model.no_sync();
    loss_fn(model(data[0].x), data[0].y).backward();
    EXPECT_EQ(model.last_stats().buckets, 0);
  }
  loss_fn(model(data[1].x), data[1].y).backward();
  EXPECT_GT(model.last_stats().buckets, 0);
  for (size_t r = 0; r < 3; ++r) {
    std::vector<Tensor> grads;
    for (auto& p : model.module(r).parameters()) grads.push_back(p.grad());
    expect_close(expected, grads, "no_sync replica " + std::to_string(r));
  }
}

// Replica r's gradients.
template <typename M>
std::vector<Tensor> grads_of(galley::DataParallel<M>& model, size_t r) {
  std::vector<Tensor> out;
  for (auto& p : model.module(r).parameters()) out.push_back(p.grad());
  return out;
}

TEST(DataParallel, GradientsAccumulateOverBackwardsAndForwardsAsOnOneModel) {
  galley::manual_seed(17);
  SmallCNN single;
  const auto init = single.state_dict();
  const auto data = batches(6, 7, 18);
  nn::CrossEntropyLoss loss_fn;
  auto loss = [&](auto& model, int i) { return loss_fn(model(data[i].x), data[i].y); };
  // One model, never cleared: a backward per batch, and batches 2 and 3 in one loss.
  loss(single, 0).backward();
  loss(single, 1).backward();
  (loss(single, 2) + loss(single, 3)).backward();
  loss(single, 4).backward();
  loss(single, 5).backward();
  std::vector<std::vector<float>> expected;
  for (auto& p : single.parameters()) expected.push_back(p.grad().to_vector());

  for (int n : {2, 3}) {
    galley::DataParallel<SmallCNN> model(cpus(n));
    model.load_state_dict(init);
    loss(model, 0).backward();
    loss(model, 1).backward();                     // onto the reduced sum
    (loss(model, 2) + loss(model, 3)).backward();  // the second reduction sees the first's sum
    {
      auto guard = model.no_sync();
      loss(model, 4).backward();  // a local part onto a reduced sum
    }
    loss(model, 5).backward();
    for (size_t r = 0; r < size_t(n); ++r)
      expect_close(expected, grads_of(model, r),
                   std::to_string(n) + " replicas, replica " + std::to_string(r));
  }
}

// Takes its first head for two input channels and its second for three: a parameter that one
// backward reaches and the next does not.
class TwoHeads : public nn::Layer {
 public:
  TwoHeads() {
    register_layer("a", a_);
    register_layer("b", b_);
    register_layer("fc", fc_);
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = x.size(1) == 2 ? a_(x) : b_(x);
    return fc_(galley::flatten(galley::relu(h), 1));
  }

 private:
  nn::Conv2D a_{2, 3, 3, {.padding = 1}};
  nn::Conv2D b_{3, 3, 3, {.padding = 1}};
  nn::Linear fc_{3 * 4 * 4, 5};
};

TEST(DataParallel, NoSyncPartsOfParametersTheSyncedBackwardMissesAreReducedToo) {
  galley::manual_seed(19);
  galley::Generator gen(20);
  const Tensor x2 = galley::randn({5, 2, 4, 4}, gen), x3 = galley::randn({5, 3, 4, 4}, gen);
  const Tensor y = Tensor::from_vector(std::vector<int64_t>{0, 1, 2, 3, 4}, {5});
  nn::CrossEntropyLoss loss_fn;
  TwoHeads single;
  const auto init = single.state_dict();
  loss_fn(single(x2), y).backward();  // head a
  loss_fn(single(x3), y).backward();  // head b
  std::vector<std::vector<float>> expected;
  for (auto& p : single.parameters()) expected.push_back(p.grad().to_vector());

  galley::DataParallel<TwoHeads> model(cpus(2));
  model.load_state_dict(init);
  {
    auto guard = model.no_sync();
    loss_fn(model(x2), y).backward();
  }
  loss_fn(model(x3), y).backward();  // reaches head b only; head a's parts are reduced all the same
  for (size_t r = 0; r < 2; ++r)
    expect_close(expected, grads_of(model, r), "replica " + std::to_string(r));
}

TEST(DataParallel, BatchSmallerThanTheReplicaCount) {
  galley::manual_seed(9);
  SmallCNN reference;
  const auto init = reference.state_dict();
  const auto data = batches(2, 2, 14);
  const auto expected = train_single(init, data);
  galley::DataParallel<SmallCNN> model(cpus(3));
  model.load_state_dict(init);
  train(model, data);
  expect_close(expected, model.module(2).parameters(), "idle third replica");
}

TEST(DataParallel, InferenceUnderNoGradRecordsNothing) {
  galley::DataParallel<SmallCNN> model(cpus(2));
  galley::NoGradGuard no_grad;
  Tensor out = model(galley::randn({5, 2, 8, 8}));
  EXPECT_EQ(out.shape(), (galley::Shape{5, 5}));
  EXPECT_FALSE(out.requires_grad());
}

TEST(DataParallel, ReplicaErrorsNameTheReplicaAndDevice) {
  galley::DataParallel<SmallCNN> model(cpus(2));
  std::string msg = testutil::error_of([&] { model(galley::randn({4, 3, 8, 8})); });
  testutil::expect_contains(msg,
                            {"DataParallel forward on replica", "(cpu", "Conv2D", "[2, 3, 8, 8]"});
  // The replicas still work afterwards.
  EXPECT_EQ(model(galley::randn({4, 2, 8, 8})).shape(), (galley::Shape{4, 5}));
}

namespace {
// Runs out of memory on one replica's device, as a GPU replica over its cap would.
class HungryOnCpu1 : public nn::Layer {
 public:
  HungryOnCpu1() { register_layer("fc", fc_); }
  Tensor forward(const Tensor& x) override {
    if (fc_.weight().device() == Device::cpu(1))
      throw galley::OutOfMemoryError("out of memory on cpu:1: requested 64.00 MiB");
    return fc_(x);
  }

 private:
  nn::Linear fc_{3, 2};
};
}  // namespace

// The error crosses the replica thread with its type: a job that catches OutOfMemoryError to
// shrink its batch sees one, and the message says which replica and device ran out.
TEST(DataParallel, OutOfMemoryOnAReplicaReachesTheCallerAsOutOfMemory) {
  galley::DataParallel<HungryOnCpu1> model(cpus(2));
  try {
    (void)model(galley::randn({4, 3}));
    ADD_FAILURE() << "the replica's error was lost";
  } catch (const galley::OutOfMemoryError& e) {
    testutil::expect_contains(
        e.what(), {"DataParallel forward on replica 1", "(cpu:1)", "out of memory on cpu:1"});
  }
}

TEST(DataParallel, RejectsBadOptions) {
  testutil::expect_contains(
      testutil::error_of([] { galley::DataParallel<SmallCNN> m(std::vector<Device>{}); }),
      {"device list is empty"});
  testutil::expect_contains(testutil::error_of([] {
                              galley::DataParallel<SmallCNN> m({Device::cpu(0), Device::cpu(0)});
                            }),
                            {"listed twice"});
}

// Gradient compression (reduce_dtype): every replica rounds its float32 gradients into a 16-bit
// bucket, the replicas sum those, and the sum comes back as float32 gradients that are 16-bit
// values, equal on every replica and within the roundings of the exact float32 reduction.
TEST(DataParallel, GradientsCompressedTo16BitsStayWithinTheirRoundingOnEveryReplica) {
  galley::manual_seed(7);
  SmallCNN reference;
  const auto init = reference.state_dict();
  const auto data = batches(1, 8, 13);
  nn::CrossEntropyLoss loss_fn;
  auto gradients = [&](DType wire) {
    galley::DataParallel<SmallCNN> model(cpus(2), {.reduce_dtype = wire});
    model.load_state_dict(init);
    loss_fn(model(data[0].x), data[0].y).backward();
    std::vector<std::vector<std::vector<float>>> out(2);
    for (size_t r = 0; r < 2; ++r)
      for (auto& p : model.module(r).parameters()) {
        EXPECT_EQ(p.grad().dtype(), DType::Float32) << "gradients stay float32";
        out[r].push_back(p.grad().to_vector());
      }
    return out;
  };
  const auto exact = gradients(DType::Float32);
  for (DType wire : {DType::BFloat16, DType::Float16}) {
    const std::string what = galley::dtype_name(wire);
    const auto got = gradients(wire);
    const float rtol = wire == DType::BFloat16 ? 1.6e-2f : 2e-3f;
    bool any_rounded = false;
    for (size_t k = 0; k < exact[0].size(); ++k) {
      EXPECT_EQ(got[0][k], got[1][k])
          << what << ": the replicas' gradients differ, parameter " << k;
      const auto& want = exact[0][k];
      const std::vector<float>& g = got[0][k];
      const Tensor as_wire = Tensor::from_vector(g, {int64_t(g.size())}).to(wire);
      EXPECT_EQ(as_wire.to(DType::Float32).to_vector(), g)
          << what << ": parameter " << k << "'s gradient is not a " << what << " value";
      float max_abs = 0;
      for (float v : want) max_abs = std::max(max_abs, std::abs(v));
      for (size_t i = 0; i < g.size(); ++i) {
        ASSERT_NEAR(g[i], want[i], rtol * (std::abs(want[i]) + max_abs))
            << what << ": parameter " << k << " element " << i;
        any_rounded = any_rounded || g[i] != want[i];
      }
    }
    EXPECT_TRUE(any_rounded) << what << ": no gradient was rounded, so nothing was compressed";
  }
  testutil::expect_contains(
      testutil::error_of(
          [] { galley::DataParallel<SmallCNN> m(cpus(2), {.reduce_dtype = DType::Int64}); }),
      {"reduce_dtype", "int64"});
}

TEST(DataParallel, ReportsHowMuchAllReduceWasHidden) {
  galley::DataParallel<SmallCNN> model(cpus(2), {.bucket_bytes = 512});
  nn::CrossEntropyLoss loss_fn;
  auto b = batches(1, 8, 15)[0];
  loss_fn(model(b.x), b.y).backward();
  auto s = model.last_stats();
  EXPECT_GT(s.buckets, 1);
  EXPECT_GE(s.allreduce_ms, 0.0);
  EXPECT_GE(s.hidden_fraction(), 0.0);
  EXPECT_LE(s.hidden_fraction(), 1.0);
}

// ---------------------------------------------------------------------------------------------
// The in-process communicator

namespace {
template <typename F>
void on_threads(int n, F f) {
  std::vector<std::thread> ts;
  for (int r = 0; r < n; ++r) ts.emplace_back([&, r] { f(r); });
  for (auto& t : ts) t.join();
}
}  // namespace

TEST(DataParallel, EveryReplicaTakesReplicaZerosBuffersAtEachForward) {
  for (bool broadcast : {true, false}) {
    SCOPED_TRACE(broadcast ? "broadcast_buffers" : "each replica its own buffers");
    galley::DataParallel<testmodels::CountingBuffer> model(cpus(2),
                                                           {.broadcast_buffers = broadcast});
    EXPECT_EQ(model.module(0).named_buffers().size(), 1u);
    model.module(1).named_buffers()[0].second.fill_(100.f);
    const Tensor x = galley::zeros({4, 1});
    // Two forwards: with the broadcast both halves see replica 0's count (0, then 1).
    for (float step : {0.f, 1.f}) {
      const std::vector<float> y = model(x).to_vector();
      const float second_half = broadcast ? step : 100.f + step;
      EXPECT_EQ(y, (std::vector<float>{step, step, second_half, second_half}));
    }
  }
}

namespace {
class BatchNormNet : public nn::Layer {
 public:
  BatchNormNet() { register_layer("bn", bn_); }
  Tensor forward(const Tensor& x) override { return bn_(x); }
  nn::BatchNorm2D bn_{3};
};
}  // namespace

// As PyTorch DDP: each replica updates the running statistics from its own part of the batch,
// and every forward starts from replica 0's, so replica 0's running statistics are those of a
// single layer fed replica 0's parts, and the replicas agree at every forward.
TEST(DataParallel, BatchNormRunningStatisticsFollowReplicaZero) {
  galley::DataParallel<BatchNormNet> model(cpus(2));
  BatchNormNet single;
  for (int step = 0; step < 3; ++step) {
    galley::Generator gen(50 + step);
    Tensor first = galley::randn({2, 3, 2, 2}, gen) + float(step);
    Tensor second = galley::randn({2, 3, 2, 2}, gen) * 3.f - 2.f;
    std::vector<float> both = first.to_vector(), rest = second.to_vector();
    both.insert(both.end(), rest.begin(), rest.end());
    Tensor x = Tensor::from_vector(both, {4, 3, 2, 2});
    galley::sum(galley::mul(model(x), x)).backward();
    single(first);
    EXPECT_NE(model.module(0).bn_.running_mean().to_vector(),
              model.module(1).bn_.running_mean().to_vector())
        << "each replica updates from its own part";
  }
  model.eval();
  model(galley::zeros({4, 3, 2, 2}));  // takes replica 0's buffers everywhere
  for (size_t r = 0; r < 2; ++r) {
    SCOPED_TRACE(r);
    auto& bn = model.module(r).bn_;
    EXPECT_EQ(bn.running_mean().to_vector(), single.bn_.running_mean().to_vector());
    EXPECT_EQ(bn.running_var().to_vector(), single.bn_.running_var().to_vector());
    EXPECT_EQ(bn.num_batches_tracked().to_vector<int64_t>(), std::vector<int64_t>{3});
  }
}

TEST(ThreadCommunicator, AllReduceBroadcastAllGather) {
  const int n = 3;
  auto comms = galley::parallel::make_thread_communicators(n);
  std::vector<std::vector<float>> sums(n), avgs(n), bcast(n), gathered(n);
  on_threads(n, [&](int r) {
    auto& c = *comms[r];
    std::vector<float> v(7);
    for (int i = 0; i < 7; ++i) v[i] = float(r * 10 + i);
    auto s = v;
    c.all_reduce(s.data(), 7, galley::parallel::ReduceOp::Sum);
    sums[r] = s;
    auto a = v;
    c.all_reduce(a.data(), 7, galley::parallel::ReduceOp::Avg);
    avgs[r] = a;
    auto b = v;
    c.broadcast(b.data(), 7, 2);
    bcast[r] = b;
    std::vector<float> g(n * 7);
    c.all_gather(v.data(), 7, g.data());
    gathered[r] = g;
    c.barrier();
  });
  for (int r = 0; r < n; ++r)
    for (int i = 0; i < 7; ++i) {
      EXPECT_EQ(sums[r][i], float(30 + 3 * i));
      EXPECT_FLOAT_EQ(avgs[r][i], float(10 + i));
      EXPECT_EQ(bcast[r][i], float(20 + i));
      for (int q = 0; q < n; ++q) EXPECT_EQ(gathered[r][q * 7 + i], float(q * 10 + i));
    }
}

// broadcast and all_gather copy bits, so they carry every dtype (DataParallel broadcasts
// BatchNorm's int64 counter with them); all_reduce sums, so an integer tensor is an error that
// names its dtype.
TEST(ThreadCommunicator, BroadcastAndAllGatherCarryIntegerTensors) {
  const int n = 2;
  auto comms = galley::parallel::make_thread_communicators(n);
  std::vector<std::vector<int64_t>> bcast(n), gathered(n);
  std::vector<std::vector<uint8_t>> bytes(n);
  std::vector<std::string> errors(n);
  const int64_t big = int64_t(1) << 53;  // past float32's and float64's exact integers
  on_threads(n, [&](int r) {
    auto& c = *comms[r];
    Tensor b = Tensor::from_vector(std::vector<int64_t>{big + 1 + r, -7 * r, r}, {3});
    c.broadcast(b, 1);
    bcast[r] = b.to_vector<int64_t>();
    gathered[r] =
        c.all_gather(Tensor::from_vector(std::vector<int64_t>{big + r}, {1})).to_vector<int64_t>();
    const uint8_t mine[2] = {uint8_t(200 + r), uint8_t(r)};
    Tensor u = Tensor::from_host(mine, {2}, galley::DType::UInt8);
    c.broadcast(u, 0);
    bytes[r] = u.to_vector<uint8_t>();
    Tensor s = Tensor::from_vector(std::vector<int64_t>{1, 2}, {2});
    errors[r] = testutil::error_of([&] { c.all_reduce(s); });
  });
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(bcast[r], (std::vector<int64_t>{big + 2, -7, 1})) << "rank " << r;
    EXPECT_EQ(gathered[r], (std::vector<int64_t>{big, big + 1})) << "rank " << r;
    EXPECT_EQ(bytes[r], (std::vector<uint8_t>{200, 0})) << "rank " << r;
    testutil::expect_contains(errors[r], {"threads all_reduce", "int64"});
  }
}

TEST(ThreadCommunicator, APeerThatNeverArrivesIsAnErrorNotAHang) {
  auto comms = galley::parallel::make_thread_communicators(2, {.timeout_seconds = 0.2});
  std::vector<float> v(4, 1.f);
  std::string msg = testutil::error_of(
      [&] { comms[0]->all_reduce(v.data(), 4, galley::parallel::ReduceOp::Sum); });
  testutil::expect_contains(msg, {"all_reduce", "timed out", "1 of 2"});
  // The group stays unusable rather than pairing a late peer with the wrong collective.
  testutil::expect_contains(testutil::error_of([&] { comms[1]->barrier(); }), {"unusable"});
}

TEST(ThreadCommunicator, MismatchedSizesAreAnError) {
  auto comms = galley::parallel::make_thread_communicators(2, {.timeout_seconds = 5});
  std::vector<std::string> errors(2);
  on_threads(2, [&](int r) {
    std::vector<float> v(4 + r, 1.f);
    try {
      comms[r]->all_reduce(v.data(), 4 + r, galley::parallel::ReduceOp::Sum);
    } catch (const galley::Error& e) {
      errors[r] = e.what();
    }
  });
  for (auto& e : errors) testutil::expect_contains(e, {"elements"});
}

// ---------------------------------------------------------------------------------------------
// 16-bit models and data

namespace {

using galley::DType;

// x * weight + bias over the last dimension: elementwise ops only (every op takes 16-bit data).
class Diagonal : public nn::Layer {
 public:
  explicit Diagonal(int64_t n) {
    weight_ = register_parameter("weight", galley::randn({n}) * 0.5f + 1.f);
    bias_ = register_parameter("bias", galley::randn({n}) * 0.1f);
  }
  Tensor forward(const Tensor& x) override { return x * weight_ + bias_; }

 private:
  Tensor weight_, bias_;
};

constexpr int64_t kFeatures = 5;  // the classes too

// Two diagonal layers with a ReLU between them, built in float32.
class Elementwise : public nn::Layer {
 public:
  Elementwise() {
    register_layer("a", a_);
    register_layer("b", b_);
  }
  Tensor forward(const Tensor& x) override { return b_(galley::relu(a_(x))); }

 private:
  Diagonal a_{kFeatures}, b_{kFeatures};
};

// The same converted to bfloat16 when built (Layer::to).
class BFloat16Elementwise : public Elementwise {
 public:
  BFloat16Elementwise() { to(DType::BFloat16); }
};

// A float32 linear layer, then a bfloat16 diagonal one: gradients of two dtypes.
class Mixed : public nn::Layer {
 public:
  Mixed() {
    register_layer("fc", fc_);
    register_layer("out", out_);
    out_.to(DType::BFloat16);
  }
  Tensor forward(const Tensor& x) override {
    return out_(galley::relu(fc_(x.to(DType::Float32))).to(DType::BFloat16));
  }

 private:
  nn::Linear fc_{kFeatures, kFeatures};
  Diagonal out_{kFeatures};
};

std::vector<Batch> feature_batches(int count, int64_t size, uint64_t seed) {
  galley::Generator gen(seed);
  std::vector<Batch> out;
  for (int i = 0; i < count; ++i) {
    std::vector<int64_t> labels(size);
    for (auto& l : labels) l = static_cast<int64_t>(gen.next_u64() % kFeatures);
    out.push_back({galley::randn({size, kFeatures}, gen), Tensor::from_vector(labels, {size})});
  }
  return out;
}

// SGD with momentum, one step per batch, inputs in `input` dtype and the loss in float32.
template <typename M>
void train16(M& model, const std::vector<Batch>& data, DType input) {
  galley::optim::SGD opt(model.parameters(), {.learning_rate = 0.05, .momentum = 0.9});
  nn::CrossEntropyLoss loss_fn;
  for (auto& b : data) {
    loss_fn(model(b.x.to(input)).to(DType::Float32), b.y).backward();
    opt.step();
    opt.clear_grad();
  }
}

std::map<std::string, Tensor> converted(const std::map<std::string, Tensor>& state, DType dtype) {
  std::map<std::string, Tensor> out;
  for (auto& [k, t] : state) out[k] = t.to(dtype);
  return out;
}

std::vector<std::vector<float>> widened(const std::vector<Tensor>& params) {
  std::vector<std::vector<float>> out;
  for (auto& p : params) out.push_back(p.to(DType::Float32).to_vector());
  return out;
}

// Replicas identical bit for bit, and close to `single` (another split of the batch rounds the
// 16-bit gradients differently).
template <typename M>
void expect_replicas_equal_and_close(const galley::DataParallel<M>& model,
                                     const std::vector<Tensor>& single, double tol,
                                     const std::string& what) {
  const auto first = widened(model.module(0).parameters());
  for (size_t r = 1; r < model.num_replicas(); ++r)
    EXPECT_EQ(widened(model.module(r).parameters()), first) << what << ": replica " << r;
  const auto want = widened(single);
  ASSERT_EQ(first.size(), want.size());
  for (size_t k = 0; k < want.size(); ++k)
    for (size_t i = 0; i < want[k].size(); ++i)
      ASSERT_NEAR(first[k][i], want[k][i], tol * std::max(1.f, std::fabs(want[k][i])))
          << what << ": parameter " << k << " element " << i;
}

}  // namespace

TEST(DataParallel16Bit, ABFloat16ModelTrainsOnTwoReplicasThatStayIdentical) {
  galley::manual_seed(21);
  const auto init = converted(Elementwise().state_dict(), DType::BFloat16);
  const auto data = feature_batches(8, 12, 31);
  BFloat16Elementwise single;
  single.load_state_dict(init);
  train16(single, data, DType::BFloat16);
  for (int64_t bytes : {int64_t(8), int64_t(25) << 20}) {
    const std::string what = "bucket_bytes " + std::to_string(bytes);
    galley::DataParallel<BFloat16Elementwise> model(cpus(2), {.bucket_bytes = bytes});
    model.load_state_dict(init);
    train16(model, data, DType::BFloat16);
    for (auto& p : model.parameters()) EXPECT_EQ(p.dtype(), DType::BFloat16) << what;
    for (auto& [name, p] : model.module(0).named_parameters())
      EXPECT_NE(widened({p}), widened({init.at(name)})) << what << ": " << name << " trained";
    expect_replicas_equal_and_close(model, single.parameters(), 1e-2, what);
  }
}

TEST(DataParallel16Bit, ConvertingAfterConstructionRebuildsTheBuckets) {
  galley::manual_seed(22);
  const auto init = Elementwise().state_dict();
  const auto data = feature_batches(6, 10, 32);
  galley::DataParallel<BFloat16Elementwise> built(cpus(2));
  built.load_state_dict(converted(init, DType::BFloat16));
  train16(built, data, DType::BFloat16);
  // A float32 model converted afterwards, as a whole or replica by replica, trains the same.
  galley::DataParallel<Elementwise> whole(cpus(2));
  whole.load_state_dict(init);
  whole.to(DType::BFloat16);
  train16(whole, data, DType::BFloat16);
  galley::DataParallel<Elementwise> each(cpus(2));
  each.load_state_dict(init);
  for (size_t r = 0; r < 2; ++r) each.module(r).to(DType::BFloat16);
  train16(each, data, DType::BFloat16);
  for (size_t r = 0; r < 2; ++r) {
    EXPECT_EQ(widened(whole.module(r).parameters()), widened(built.module(r).parameters()));
    EXPECT_EQ(widened(each.module(r).parameters()), widened(built.module(r).parameters()));
  }
}

TEST(DataParallel16Bit, ConvertingBetweenBackwardsCountsTheReducedGradientOnce) {
  galley::manual_seed(23);
  Elementwise single;
  const auto init = single.state_dict();
  const auto data = feature_batches(2, 10, 33);
  nn::CrossEntropyLoss loss_fn;
  loss_fn(single(data[0].x), data[0].y).backward();
  single.to(DType::BFloat16);  // the gradients too
  loss_fn(single(data[1].x.to(DType::BFloat16)).to(DType::Float32), data[1].y).backward();
  std::vector<Tensor> expected;
  for (auto& p : single.parameters()) expected.push_back(p.grad());

  galley::DataParallel<Elementwise> model(cpus(2));
  model.load_state_dict(init);
  loss_fn(model(data[0].x), data[0].y).backward();
  model.to(DType::BFloat16);
  loss_fn(model(data[1].x.to(DType::BFloat16)).to(DType::Float32), data[1].y).backward();
  const auto want = widened(expected);
  for (size_t r = 0; r < 2; ++r) {
    std::vector<Tensor> grads;
    for (auto& p : model.module(r).parameters()) grads.push_back(p.grad());
    const auto got = widened(grads);
    for (size_t k = 0; k < want.size(); ++k)
      for (size_t i = 0; i < want[k].size(); ++i)
        EXPECT_NEAR(got[k][i], want[k][i], 0.02 + 0.02 * std::fabs(want[k][i]))
            << "replica " << r << " parameter " << k << " element " << i;
  }
}

// A gradient that cannot go into its bucket (replica 1 alone converted, against the rule) fails
// the backward with an error naming it, also when it is a part held from a no_sync backward,
// which the backward's clean-up writes: the collectives it would leave waiting must not hang.
// A diagonal layer that takes its input in its own dtype and answers in float32.
class CastingDiagonal : public nn::Layer {
 public:
  CastingDiagonal() { register_layer("d", d_); }
  Tensor forward(const Tensor& x) override {
    return d_(x.to(d_.parameters()[0].dtype())).to(DType::Float32);
  }

 private:
  Diagonal d_{kFeatures};
};

TEST(DataParallel16Bit, AHeldGradientThatCannotBeReducedIsAnErrorNotAHang) {
  galley::manual_seed(24);
  const auto data = feature_batches(2, 6, 34);
  nn::CrossEntropyLoss loss_fn;
  galley::DataParallel<CastingDiagonal> model(cpus(2));
  {
    auto guard = model.no_sync();
    loss_fn(model(data[0].x), data[0].y).backward();
  }
  model.module(1).to(DType::BFloat16);
  testutil::expect_contains(testutil::error_of([&] {
                              loss_fn(model(data[1].x).to(DType::Float32), data[1].y).backward();
                            }),
                            {"replica 1", "gradient of parameter", "bfloat16"});
}

TEST(DataParallel16Bit, Float32AndBFloat16ParametersGoToTheirOwnBuckets) {
  galley::manual_seed(23);
  Mixed reference;
  const auto init = reference.state_dict();
  const auto data = feature_batches(8, 12, 33);
  Mixed single;
  single.load_state_dict(init);
  train16(single, data, DType::Float32);
  for (int64_t bytes : {int64_t(8), int64_t(25) << 20}) {
    const std::string what = "bucket_bytes " + std::to_string(bytes);
    galley::DataParallel<Mixed> model(cpus(2), {.bucket_bytes = bytes});
    model.load_state_dict(init);
    train16(model, data, DType::Float32);
    auto params = model.module(0).named_parameters();
    for (auto& [name, p] : params)
      EXPECT_EQ(p.dtype(), name.rfind("fc.", 0) == 0 ? DType::Float32 : DType::BFloat16) << name;
    EXPECT_GE(model.last_stats().buckets, 2) << what;
    expect_replicas_equal_and_close(model, single.parameters(), 1e-2, what);
  }
}

TEST(ThreadCommunicator, SixteenBitAllReduceIsTheFloat32SumRoundedOnce) {
  const int n = 3;
  const int64_t count = 5000;  // several of the widening blocks, split over the ranks
  for (DType dtype : {DType::BFloat16, DType::Float16}) {
    auto comms = galley::parallel::make_thread_communicators(n);
    // Rank r's values, exact in `dtype`; their float32 sum is not.
    std::vector<std::vector<float>> values(n);
    for (int r = 0; r < n; ++r) {
      std::vector<float> v(count);
      for (int64_t i = 0; i < count; ++i)
        v[i] = std::sin(0.37f * float(i) + float(r)) * (1.f + float(r) / 7.f) + 0.001f * float(i);
      values[r] = Tensor::from_vector(v, {count}).to(dtype).to(DType::Float32).to_vector();
    }
    std::vector<float> sum(count, 0.f), avg(count);
    for (int64_t i = 0; i < count; ++i) {
      for (int r = 0; r < n; ++r) sum[i] += values[r][i];
      avg[i] = sum[i] * (1.f / float(n));
    }
    const auto want_sum =
        Tensor::from_vector(sum, {count}).to(dtype).to(DType::Float32).to_vector();
    const auto want_avg =
        Tensor::from_vector(avg, {count}).to(dtype).to(DType::Float32).to_vector();
    std::vector<std::vector<float>> sums(n), avgs(n), bcast(n), gathered(n);
    std::vector<DType> gathered_dtype(n);
    on_threads(n, [&](int r) {
      auto& c = *comms[r];
      Tensor s = Tensor::from_vector(values[r], {count}).to(dtype);
      c.all_reduce(s, galley::parallel::ReduceOp::Sum);
      sums[r] = s.to(DType::Float32).to_vector();
      Tensor a = Tensor::from_vector(values[r], {count}).to(dtype);
      c.all_reduce(a.raw_data(), count, dtype, galley::parallel::ReduceOp::Avg);
      avgs[r] = a.to(DType::Float32).to_vector();
      Tensor b = Tensor::from_vector(values[r], {count}).to(dtype);
      c.broadcast(b, 1);
      bcast[r] = b.to(DType::Float32).to_vector();
      Tensor g = c.all_gather(Tensor::from_vector(values[r], {count}).to(dtype));
      gathered_dtype[r] = g.dtype();
      gathered[r] = g.to(DType::Float32).to_vector();
    });
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(sums[r], want_sum) << "rank " << r;
      EXPECT_EQ(avgs[r], want_avg) << "rank " << r;
      EXPECT_EQ(bcast[r], values[1]) << "rank " << r;
      EXPECT_EQ(gathered_dtype[r], dtype);
      for (int q = 0; q < n; ++q)
        EXPECT_EQ(std::vector<float>(gathered[r].begin() + q * count,
                                     gathered[r].begin() + (q + 1) * count),
                  values[q]);
    }
    // Ranks passing different dtypes is an error.
    auto pair = galley::parallel::make_thread_communicators(2, {.timeout_seconds = 5});
    std::vector<std::string> errors(2);
    on_threads(2, [&](int r) {
      Tensor t = galley::zeros({4}, r == 0 ? dtype : DType::Float32);
      try {
        pair[r]->all_reduce(t);
      } catch (const galley::Error& e) {
        errors[r] = e.what();
      }
    });
    for (auto& e : errors) testutil::expect_contains(e, {"float32", galley::dtype_name(dtype)});
  }
}

// ---------------------------------------------------------------------------------------------
// Random layers under DataParallel

namespace {
// Per sample of the batch: 1 where the output is kept.
std::vector<std::vector<int>> kept_rows(const Tensor& y) {
  const auto v = y.to_vector();
  const int64_t cols = y.size(1);
  std::vector<std::vector<int>> rows(y.size(0));
  for (int64_t i = 0; i < y.size(0); ++i)
    for (int64_t j = 0; j < cols; ++j) rows[i].push_back(v[i * cols + j] != 0.f);
  return rows;
}

// Masks of two steps of 4 samples over 2 replicas (samples 0-1 on replica 0, 2-3 on replica 1):
// the same position in each replica's slice must not share a mask, nor a replica's row its mask
// of the step before.
void expect_own_masks(const std::vector<std::vector<std::vector<int>>>& steps) {
  for (const auto& rows : steps) {
    EXPECT_NE(rows[0], rows[2]);
    EXPECT_NE(rows[1], rows[3]);
  }
  EXPECT_NE(steps[0][0], steps[1][0]);
  EXPECT_NE(steps[0][2], steps[1][2]);
}
}  // namespace

// Functional dropout draws from the default generator: inside DataParallel each replica's own
// (GeneratorScope), so the replicas' masks differ and repeat from the same manual_seed however
// the replica threads interleave.
TEST(DataParallel, FunctionalDropoutDrawsEachReplicasOwnStream) {
  struct Net : galley::nn::Layer {
    Tensor forward(const Tensor& x) override { return galley::dropout(x, 0.5f, is_training()); }
  };
  const Tensor x = galley::ones({4, 512});
  auto run = [&] {
    galley::manual_seed(42);
    galley::DataParallel<Net> model(cpus(2));
    std::vector<std::vector<std::vector<int>>> steps;
    for (int s = 0; s < 3; ++s) steps.push_back(kept_rows(model(x)));
    return steps;
  };
  const auto first = run();
  expect_own_masks(first);
  for (int k = 0; k < 8; ++k) EXPECT_EQ(run(), first) << "rerun " << k;
}

TEST(DataParallel, ReplicasDrawTheirOwnDropoutMasksReproducibly) {
  const Tensor x = galley::uniform({4, 8}, 1.f, 2.f);
  auto run = [&] {
    galley::DataParallel<testmodels::DropoutNet> model(cpus(2));
    EXPECT_TRUE(model.state_dict().size() == 2u);  // fc.weight, fc.bias: dropout adds nothing
    // Two steps: each replica's masks move on from step to step.
    std::vector<std::vector<std::vector<int>>> steps;
    for (int s = 0; s < 2; ++s) {
      Tensor y = model(x);
      steps.push_back(kept_rows(y));
      galley::sum(y).backward();
    }
    return steps;
  };
  const auto first = run();
  expect_own_masks(first);
  // Replica 0 draws what the layer draws outside DataParallel.
  testmodels::DropoutNet single;
  EXPECT_EQ(kept_rows(single(x))[0], first[0][0]);
  // A rerun from the same seeds reproduces every replica's masks.
  EXPECT_EQ(run(), first);
  // In evaluation mode nothing is dropped.
  galley::DataParallel<testmodels::DropoutNet> model(cpus(2));
  model.eval();
  for (const auto& row : kept_rows(model(x))) EXPECT_EQ(row, std::vector<int>(512, 1));
}

// A replica's output must keep its rows as the first dimension: one without rows or without
// dimensions is an error naming the replica, not a division by its zero rows.
TEST(DataParallel, OutputsWithoutTheBatchDimensionAreErrors) {
  struct NoRows : galley::nn::Layer {
    Tensor forward(const Tensor& x) override { return galley::narrow(x, 0, 0, 0); }
  };
  struct Scalar : galley::nn::Layer {
    Tensor forward(const Tensor& x) override { return galley::sum(x); }
  };
  galley::DataParallel<NoRows> no_rows(cpus(2));
  testutil::expect_contains(testutil::error_of([&] {
                              no_rows(galley::ones({2, 3}));
                            }),
                            {"DataParallel", "replica 0", "[0, 3]", "batch dimension"});
  galley::DataParallel<Scalar> scalar(cpus(2));
  testutil::expect_contains(testutil::error_of([&] {
                              scalar(galley::ones({2, 3}));
                            }),
                            {"DataParallel", "replica 0", "[]", "batch dimension"});
}

// A replica's std::bad_alloc reaches the caller as galley's OutOfMemoryError (which a training
// loop catches to lower its batch), not as a plain Error.
TEST(DataParallel, AReplicasBadAllocIsAnOutOfMemoryError) {
  struct Hungry : galley::nn::Layer {
    Tensor forward(const Tensor&) override { throw std::bad_alloc(); }
  };
  galley::DataParallel<Hungry> model(cpus(2));
  EXPECT_THROW(model(galley::ones({2, 3})), galley::OutOfMemoryError);
}

// A replica's error crosses the replica thread with its type and the cause nested in it; a
// user's own exception type crosses as it was thrown.
TEST(DataParallel, AReplicasNestedCauseAndAUsersOwnExceptionReachTheCaller) {
  struct Thrower : galley::nn::Layer {
    Tensor forward(const Tensor&) override {
      try {
        throw std::runtime_error("the cause");
      } catch (...) {
        std::throw_with_nested(galley::OutOfMemoryError("replica failed"));
      }
    }
  };
  galley::DataParallel<Thrower> model(cpus(2));
  try {
    model(galley::ones({2, 3}));
    ADD_FAILURE() << "no exception";
  } catch (const galley::OutOfMemoryError& e) {
    testutil::expect_contains(e.what(), {"DataParallel forward on replica 0", "replica failed"});
    testutil::expect_nested<std::runtime_error>(e, "the cause");
  }
  struct StopTraining {
    int at = 0;
  };
  struct Stopper : galley::nn::Layer {
    Tensor forward(const Tensor&) override { throw StopTraining{3}; }
  };
  galley::DataParallel<Stopper> stopper(cpus(2));
  try {
    stopper(galley::ones({2, 3}));
    ADD_FAILURE() << "no exception";
  } catch (const StopTraining& s) {
    EXPECT_EQ(s.at, 3);
  }
}

// An input that takes a gradient gets the one model's gradient, rows gathered from the replicas
// (as PyTorch's scatter passes it back): a stem in front of the DataParallel trains. An input
// that takes none gets none.
TEST(DataParallel, TheInputGetsItsGradient) {
  galley::manual_seed(5);
  SmallCNN single;
  const auto data = batches(1, 7, 13);  // 7 rows over 2 and 3 replicas: uneven shares
  Tensor x1 = data[0].x.detach().clone().set_requires_grad(true);
  galley::sum(single(x1)).backward();
  const std::vector<float> want = x1.grad().to_vector();
  for (int n : {2, 3}) {
    galley::DataParallel<SmallCNN> model(cpus(n));
    model.load_state_dict(single.state_dict());
    Tensor x2 = data[0].x.detach().clone().set_requires_grad(true);
    galley::sum(model(x2)).backward();
    ASSERT_TRUE(x2.grad().defined()) << n << " replicas";
    EXPECT_EQ(x2.grad().shape(), x2.shape());
    const std::vector<float> got = x2.grad().to_vector();
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_NEAR(got[i], want[i], 1e-5f) << n << " replicas, element " << i;
    Tensor x3 = data[0].x.detach().clone();
    galley::sum(model(x3)).backward();
    EXPECT_FALSE(x3.grad().defined());
  }
}

// A backward through the output of a DataParallel that has since been destroyed is an error that
// says so, not a use of freed memory; nothing of it runs.
TEST(DataParallel, ABackwardAfterTheDataParallelIsGoneIsAnError) {
  Tensor loss;
  {
    galley::DataParallel<SmallCNN> model(cpus(2));
    loss = galley::sum(model(batches(1, 4, 3)[0].x));
  }
  testutil::expect_contains(testutil::error_of([&] { loss.backward(); }),
                            {"DataParallel", "destroyed", "keep it alive"});
}

// A parameter of one replica written between the forward and the backward (a conv2d saved it for
// the input's gradient) is refused before anything runs, the head in front of the DataParallel's
// output included: the replica graphs are checked with the caller's (nothing of the step is
// half-done, and the backward may be retried once the cause is gone).
TEST(DataParallel, AReplicaParameterWrittenBeforeTheBackwardIsRefusedBeforeAnyGradient) {
  galley::DataParallel<SmallCNN> model(cpus(2));
  nn::Linear head(5, 2);
  Tensor x = batches(1, 4, 3)[0].x.detach().clone().set_requires_grad(true);
  Tensor loss = galley::sum(head(model(x)));
  {
    galley::NoGradGuard no_grad;
    model.module(1).parameters()[0].add_(galley::ones_like(model.module(1).parameters()[0]));
  }
  testutil::expect_contains(testutil::error_of([&] { loss.backward(); }),
                            {"conv2d", "modified in place", "no gradient was computed"});
  EXPECT_FALSE(head.weight().grad().defined());
  for (size_t r = 0; r < 2; ++r)
    for (const Tensor& p : model.module(r).parameters()) EXPECT_FALSE(p.grad().defined());
  EXPECT_FALSE(x.grad().defined());
}

// A gradient hook that writes a replica's parameter before the DataParallel's node runs is
// refused there, saying the backward had begun (the replica graphs are checked just before the
// node runs, as every node is).
TEST(DataParallel, AReplicaParameterWrittenByAHookIsRefusedAsWrittenDuringTheBackward) {
  galley::DataParallel<SmallCNN> model(cpus(2));
  nn::Linear head(5, 2);
  Tensor x = batches(1, 4, 3)[0].x.detach().clone().set_requires_grad(true);
  Tensor loss = galley::sum(head(model(x)));
  Tensor w1 = model.module(1).parameters()[0];
  head.weight().register_grad_hook([w1](const Tensor&) {
    galley::NoGradGuard no_grad;
    Tensor(w1).add_(galley::ones_like(w1));
  });
  testutil::expect_contains(testutil::error_of([&] { loss.backward(); }),
                            {"conv2d", "written during this backward"});
}
