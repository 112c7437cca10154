// The NCCL communicator: argument checks (which run everywhere), then collectives on one GPU
// and across GPUs, one thread per rank, against results computed on the CPU. Compiled always;
// the GPU tests skip with the reason when the machine has too few GPUs.
#include <gtest/gtest.h>

#include <climits>
#include <cmath>
#include <exception>
#include <string>
#include <thread>
#include <vector>

#include "galley/galley.h"
#include "galley/parallel/communicator.h"
#include "test_util.h"

using galley::Device;
using galley::DType;
using galley::Tensor;
namespace par = galley::parallel;

#define REQUIRE_GPUS(n)                                                   \
  if (galley::cuda_device_count() < (n))                                  \
  GTEST_SKIP() << "needs " << (n) << " CUDA device(s), this machine has " \
               << galley::cuda_device_count()                             \
               << " (galley::cuda_device_count()): the NCCL path is compiled but cannot run"

namespace {

// Runs f(rank) on one thread per rank and returns what each threw ("" for nothing), so that a
// failing rank neither terminates the test nor leaves its peers waiting unseen.
template <typename F>
std::vector<std::string> on_threads(int n, F f) {
  std::vector<std::string> errors(n);
  std::vector<std::thread> ts;
  for (int r = 0; r < n; ++r)
    ts.emplace_back([&, r] {
      try {
        f(r);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : ts) t.join();
  return errors;
}

void expect_no_errors(const std::vector<std::string>& errors) {
  for (size_t r = 0; r < errors.size(); ++r) EXPECT_EQ(errors[r], "") << "rank " << r << " threw";
}

std::vector<Device> gpus(int n) {
  std::vector<Device> out;
  for (int i = 0; i < n; ++i) out.push_back(Device::cuda(i));
  return out;
}

// Rank r's input: small multiples of 1/4, so that sums over a few ranks are exact in float.
std::vector<float> input(int rank, int64_t count) {
  std::vector<float> v(count);
  for (int64_t i = 0; i < count; ++i) v[i] = float((i * 7 + rank * 13) % 101 - 50) * 0.25f;
  return v;
}

Tensor on_gpu(const std::vector<float>& v, int device) {
  return Tensor::from_vector(v, {int64_t(v.size())}, Device::cuda(device));
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Argument checks: no GPU needed

TEST(NcclArguments, ACpuDeviceIsRejectedBeforeAnyGpuIsTouched) {
  testutil::expect_contains(testutil::error_of([] {
                              par::make_nccl_communicators({Device::cuda(0), Device::cpu(1)});
                            }),
                            {"make_nccl_communicators", "cpu:1", "not a CUDA device"});
  testutil::expect_contains(
      testutil::error_of([] { par::make_nccl_communicators({Device::cpu()}); }),
      {"cpu", "not a CUDA device", "make_thread_communicators"});
  auto boot = par::make_thread_communicators(1);
  testutil::expect_contains(
      testutil::error_of([&] { par::make_nccl_communicator(Device::cpu(), *boot[0]); }),
      {"make_nccl_communicator", "cpu", "not a CUDA device"});
}

TEST(NcclArguments, ADuplicateDeviceIsRejected) {
  testutil::expect_contains(
      testutil::error_of([] {
        par::make_nccl_communicators({Device::cuda(0), Device::cuda(1), Device::cuda(0)});
      }),
      {"cuda:0", "listed twice", "positions 0 and 2"});
}

TEST(NcclArguments, EmptyListAndNonPositiveTimeout) {
  testutil::expect_contains(testutil::error_of([] { par::make_nccl_communicators({}); }),
                            {"device list is empty"});
  testutil::expect_contains(
      testutil::error_of(
          [] { par::make_nccl_communicators({Device::cuda(0)}, {.timeout_seconds = 0}); }),
      {"timeout", "must be positive"});
}

TEST(NcclArguments, AMissingGpuIsNamed) {
  const int n = galley::cuda_device_count();
  const std::string msg =
      testutil::error_of([&] { par::make_nccl_communicators({Device::cuda(n)}); });
#ifdef GALLEY_HAVE_CUDA
  testutil::expect_contains(msg, {"cuda:" + std::to_string(n), "does not exist"});
#else
  testutil::expect_contains(msg, {"no CUDA backend"});
#endif
}

#ifndef GALLEY_HAVE_CUDA
TEST(NcclWithoutCuda, BothFactoriesSayTheBuildHasNoCudaBackend) {
  testutil::expect_contains(
      testutil::error_of([] { par::make_nccl_communicators({Device::cuda(0)}); }),
      {"make_nccl_communicators", "no CUDA backend"});
  auto boot = par::make_thread_communicators(1);
  testutil::expect_contains(
      testutil::error_of([&] { par::make_nccl_communicator(Device::cuda(0), *boot[0]); }),
      {"make_nccl_communicator", "no CUDA backend"});
}
#endif

// ---------------------------------------------------------------------------------------------
// One GPU: a group of one rank

TEST(NcclOneGpu, CollectivesOfOneRankGiveTheInputBack) {
  REQUIRE_GPUS(1);
  auto comms = par::make_nccl_communicators({Device::cuda(0)});
  ASSERT_EQ(comms.size(), 1u);
  par::Communicator& c = *comms[0];
  EXPECT_EQ(c.rank(), 0);
  EXPECT_EQ(c.size(), 1);
  EXPECT_EQ(c.kind(), "nccl");
  EXPECT_EQ(c.device(), Device::cuda(0));

  const std::vector<float> v = input(0, 1037);
  const int64_t n = int64_t(v.size());
  for (auto op : {par::ReduceOp::Sum, par::ReduceOp::Avg}) {
    Tensor d = on_gpu(v, 0);
    c.all_reduce(d.data_ptr<float>(), n, op);
    EXPECT_EQ(d.to_vector(), v);
  }
  Tensor b = on_gpu(v, 0);
  c.broadcast(b.data_ptr<float>(), n, 0);
  EXPECT_EQ(b.to_vector(), v);
  Tensor g = Tensor::empty({n}, DType::Float32, Device::cuda(0));
  c.all_gather(on_gpu(v, 0).data_ptr<float>(), n, g.data_ptr<float>());
  EXPECT_EQ(g.to_vector(), v);
  c.barrier();
}

TEST(NcclOneGpu, SixteenBitCollectivesOfOneRankGiveTheInputBack) {
  REQUIRE_GPUS(1);
  auto comms = par::make_nccl_communicators({Device::cuda(0)});
  par::Communicator& c = *comms[0];
  for (DType dtype : {DType::BFloat16, DType::Float16}) {
    const Tensor v = Tensor::from_vector(input(0, 1037), {1037}).to(dtype);
    const auto want = v.to(DType::Float32).to_vector();
    for (auto op : {par::ReduceOp::Sum, par::ReduceOp::Avg}) {
      Tensor d = v.to(Device::cuda(0));
      c.all_reduce(d, op);
      EXPECT_EQ(d.dtype(), dtype);
      EXPECT_EQ(d.to(DType::Float32).to_vector(), want);
    }
    Tensor b = v.to(Device::cuda(0));
    c.broadcast(b, 0);
    EXPECT_EQ(b.to(DType::Float32).to_vector(), want);
    Tensor g = c.all_gather(v.to(Device::cuda(0)));
    EXPECT_EQ(g.dtype(), dtype);
    EXPECT_EQ(g.to(DType::Float32).to_vector(), want);
  }
}

TEST(NcclOneGpu, BroadcastAndAllGatherCarryIntegerTensors) {
  REQUIRE_GPUS(1);
  auto comms = par::make_nccl_communicators({Device::cuda(0)});
  par::Communicator& c = *comms[0];
  const std::vector<int64_t> v{(int64_t(1) << 53) + 1, -3, 0};
  Tensor b = Tensor::from_vector(v, {3}).to(Device::cuda(0));
  c.broadcast(b, 0);
  EXPECT_EQ(b.to_vector<int64_t>(), v);
  Tensor h = Tensor::from_vector(v, {3});  // a host tensor through the GPU
  c.broadcast(h, 0);
  EXPECT_EQ(h.to_vector<int64_t>(), v);
  const uint8_t bytes[2] = {7, 250};
  Tensor g = c.all_gather(Tensor::from_host(bytes, {2}, DType::UInt8));
  EXPECT_EQ(g.dtype(), DType::UInt8);
  EXPECT_EQ(g.to_vector<uint8_t>(), (std::vector<uint8_t>{7, 250}));
  Tensor s = Tensor::from_vector(v, {3}).to(Device::cuda(0));
  testutil::expect_contains(testutil::error_of([&] { c.all_reduce(s); }), {"all_reduce", "int64"});
}

TEST(NcclOneGpu, BadArgumentsAreErrorsThatLeaveTheCommunicatorUsable) {
  REQUIRE_GPUS(1);
  auto comms = par::make_nccl_communicators({Device::cuda(0)});
  par::Communicator& c = *comms[0];
  c.all_reduce(nullptr, 0, par::ReduceOp::Sum);  // nothing to do, nothing touched
  testutil::expect_contains(
      testutil::error_of([&] { c.all_reduce(nullptr, -1, par::ReduceOp::Sum); }),
      {"all_reduce", "-1 elements", "negative"});
  testutil::expect_contains(
      testutil::error_of([&] { c.all_reduce(nullptr, int64_t(INT_MAX) + 1, par::ReduceOp::Sum); }),
      {"all_reduce", "2147483648 elements", "smaller buckets"});
  testutil::expect_contains(testutil::error_of([&] { c.broadcast(nullptr, 4, 1); }),
                            {"broadcast", "root 1 out of range"});
  c.barrier();
  Tensor d = on_gpu({1.f, 2.f}, 0);
  c.all_reduce(d);
  EXPECT_EQ(d.to_vector(), (std::vector<float>{1.f, 2.f}));
}

TEST(NcclOneGpu, TensorCallsOnDeviceAndHostTensors) {
  REQUIRE_GPUS(1);
  auto comms = par::make_nccl_communicators({Device::cuda(0)});
  par::Communicator& c = *comms[0];
  const std::vector<float> v = input(0, 2 * 3 * 5);

  Tensor d = Tensor::from_vector(v, {2, 3, 5}, Device::cuda(0));
  c.all_reduce(d, par::ReduceOp::Avg);
  c.broadcast(d, 0);
  EXPECT_EQ(d.device(), Device::cuda(0));
  EXPECT_EQ(d.to_vector(), v);
  Tensor g = c.all_gather(d);
  EXPECT_EQ(g.shape(), (galley::Shape{1, 2, 3, 5}));
  EXPECT_EQ(g.device(), Device::cuda(0));
  EXPECT_EQ(g.to_vector(), v);

  // A host tensor goes through a copy on the GPU and comes back.
  Tensor h = Tensor::from_vector(v, {30});
  c.all_reduce(h);
  EXPECT_EQ(h.device(), Device::cpu());
  EXPECT_EQ(h.to_vector(), v);
  Tensor hg = c.all_gather(h);
  EXPECT_EQ(hg.device(), Device::cpu());
  EXPECT_EQ(hg.to_vector(), v);
}

TEST(NcclOneGpu, HostCommunicatorsTakeDeviceTensorsThroughTheHost) {
  REQUIRE_GPUS(1);
  auto comms = par::make_thread_communicators(1);
  const std::vector<float> v = input(1, 17);
  Tensor d = on_gpu(v, 0);
  comms[0]->all_reduce(d);
  comms[0]->broadcast(d, 0);
  EXPECT_EQ(d.device(), Device::cuda(0));
  EXPECT_EQ(d.to_vector(), v);
  Tensor g = comms[0]->all_gather(d);
  EXPECT_EQ(g.device(), Device::cuda(0));
  EXPECT_EQ(g.shape(), (galley::Shape{1, 17}));
  EXPECT_EQ(g.to_vector(), v);
}

TEST(NcclOneGpu, BootstrapFactoryWithOneParticipant) {
  REQUIRE_GPUS(1);
  auto boot = par::make_thread_communicators(1);
  auto c = par::make_nccl_communicator(Device::cuda(0), *boot[0]);
  EXPECT_EQ(c->kind(), "nccl");
  EXPECT_EQ(c->rank(), 0);
  EXPECT_EQ(c->size(), 1);
  Tensor d = on_gpu({3.f, -1.5f}, 0);
  c->all_reduce(d, par::ReduceOp::Sum);
  EXPECT_EQ(d.to_vector(), (std::vector<float>{3.f, -1.5f}));
}

// ---------------------------------------------------------------------------------------------
// Several GPUs: one thread per rank, as DataParallel drives them

TEST(NcclGpus, SumAndAvgMatchTheCpuOnOddSizes) {
  REQUIRE_GPUS(2);
  const int n = galley::cuda_device_count();
  auto comms = par::make_nccl_communicators(gpus(n));
  for (int64_t count : {int64_t(1), int64_t(1000003)}) {
    std::vector<double> sum(count, 0.0);
    for (int r = 0; r < n; ++r) {
      const auto v = input(r, count);
      for (int64_t i = 0; i < count; ++i) sum[i] += v[i];
    }
    std::vector<std::vector<float>> sums(n), avgs(n);
    expect_no_errors(on_threads(n, [&](int r) {
      Tensor s = on_gpu(input(r, count), r);
      comms[r]->all_reduce(s.data_ptr<float>(), count, par::ReduceOp::Sum);
      sums[r] = s.to_vector();
      Tensor a = on_gpu(input(r, count), r);
      comms[r]->all_reduce(a.data_ptr<float>(), count, par::ReduceOp::Avg);
      avgs[r] = a.to_vector();
    }));
    for (int r = 0; r < n; ++r) {
      ASSERT_EQ(int64_t(sums[r].size()), count);
      ASSERT_EQ(int64_t(avgs[r].size()), count);
      int64_t bad_sum = 0, bad_avg = 0;
      for (int64_t i = 0; i < count; ++i) {
        if (sums[r][i] != float(sum[i])) ++bad_sum;  // exact: quarters summed over few ranks
        const double avg = sum[i] / n;
        if (std::abs(avgs[r][i] - avg) > 1e-5 * std::max(1.0, std::abs(avg))) ++bad_avg;
      }
      EXPECT_EQ(bad_sum, 0) << "rank " << r << ", " << count << " elements, Sum";
      EXPECT_EQ(bad_avg, 0) << "rank " << r << ", " << count << " elements, Avg";
    }
  }
}

TEST(NcclGpus, SixteenBitSumsAreCloseToTheFloat32SumRoundedOnce) {
  REQUIRE_GPUS(2);
  const int n = galley::cuda_device_count();
  auto comms = par::make_nccl_communicators(gpus(n));
  const int64_t count = 100003;
  for (DType dtype : {DType::BFloat16, DType::Float16}) {
    // NCCL reduces 16-bit data natively, rounding along its ring: within a few units of the
    // dtype's last place of the float32 sum.
    const double ulp = dtype == DType::BFloat16 ? std::ldexp(1.0, -7) : std::ldexp(1.0, -10);
    std::vector<double> sum(count, 0.0);
    for (int r = 0; r < n; ++r) {
      const auto v =
          Tensor::from_vector(input(r, count), {count}).to(dtype).to(DType::Float32).to_vector();
      for (int64_t i = 0; i < count; ++i) sum[i] += v[i];
    }
    std::vector<std::vector<float>> sums(n);
    expect_no_errors(on_threads(n, [&](int r) {
      Tensor s = Tensor::from_vector(input(r, count), {count}).to(dtype).to(Device::cuda(r));
      comms[r]->all_reduce(s, par::ReduceOp::Sum);
      sums[r] = s.to(DType::Float32).to_vector();
    }));
    for (int r = 0; r < n; ++r) {
      ASSERT_EQ(int64_t(sums[r].size()), count);
      int64_t bad = 0;
      for (int64_t i = 0; i < count; ++i)
        if (std::abs(sums[r][i] - sum[i]) > n * ulp * std::max(1.0, std::abs(sum[i]))) ++bad;
      EXPECT_EQ(bad, 0) << "rank " << r << ", " << galley::dtype_name(dtype);
      EXPECT_EQ(sums[r], sums[0]) << "every rank gets the same bits";
    }
  }
}

TEST(NcclGpus, CollectivesWaitForTheComputeStream) {
  REQUIRE_GPUS(2);
  const int n = galley::cuda_device_count();
  auto comms = par::make_nccl_communicators(gpus(n));
  // galley::full queues a fill on the compute stream and returns at once; the all-reduce must
  // see the filled values.
  const int64_t count = int64_t(1) << 24;
  std::vector<std::vector<float>> out(n);
  expect_no_errors(on_threads(n, [&](int r) {
    Tensor t = galley::full({count}, float(r + 1), DType::Float32, Device::cuda(r));
    comms[r]->all_reduce(t, par::ReduceOp::Sum);
    out[r] = t.to_vector();
  }));
  const float expected = float(n * (n + 1) / 2);
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(int64_t(out[r].size()), count);
    int64_t bad = 0;
    for (float x : out[r]) bad += x != expected;
    EXPECT_EQ(bad, 0) << "rank " << r;
  }
}

TEST(NcclGpus, BroadcastAllGatherBarrier) {
  REQUIRE_GPUS(2);
  const int n = galley::cuda_device_count();
  auto comms = par::make_nccl_communicators(gpus(n));
  const int64_t count = 1001;
  std::vector<std::vector<float>> bcast(n), gathered(n);
  expect_no_errors(on_threads(n, [&](int r) {
    Tensor b = on_gpu(input(r, count), r);
    comms[r]->broadcast(b.data_ptr<float>(), count, n - 1);
    bcast[r] = b.to_vector();
    Tensor g = Tensor::empty({n * count}, DType::Float32, Device::cuda(r));
    comms[r]->all_gather(on_gpu(input(r, count), r).data_ptr<float>(), count, g.data_ptr<float>());
    gathered[r] = g.to_vector();
    comms[r]->barrier();
    Tensor tg = comms[r]->all_gather(on_gpu(input(r, 3), r));
    EXPECT_EQ(tg.shape(), (galley::Shape{n, 3}));
  }));
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(bcast[r], input(n - 1, count)) << "rank " << r;
    for (int q = 0; q < n; ++q)
      EXPECT_EQ(std::vector<float>(gathered[r].begin() + q * count,
                                   gathered[r].begin() + (q + 1) * count),
                input(q, count))
          << "rank " << r << ", block of rank " << q;
  }
}

TEST(NcclGpus, BootstrapFactoryOnePerThread) {
  REQUIRE_GPUS(2);
  const int n = galley::cuda_device_count();
  auto boot = par::make_thread_communicators(n, {.timeout_seconds = 60});
  std::vector<std::vector<float>> sums(n);
  expect_no_errors(on_threads(n, [&](int r) {
    auto c = par::make_nccl_communicator(Device::cuda(r), *boot[r]);
    EXPECT_EQ(c->rank(), r);
    EXPECT_EQ(c->size(), n);
    Tensor t = on_gpu({float(r), 1.f}, r);
    c->all_reduce(t, par::ReduceOp::Sum);
    sums[r] = t.to_vector();
  }));
  for (int r = 0; r < n; ++r)
    EXPECT_EQ(sums[r], (std::vector<float>{float(n * (n - 1) / 2), float(n)}));
}

TEST(NcclGpus, ATensorOnAnotherGpuIsAnError) {
  REQUIRE_GPUS(2);
  auto comms = par::make_nccl_communicators(gpus(2));
  Tensor t = on_gpu({1.f}, 1);
  testutil::expect_contains(testutil::error_of([&] { comms[0]->all_reduce(t); }),
                            {"all_reduce", "cuda:1", "cuda:0"});
}

TEST(NcclGpus, APeerThatNeverArrivesIsAnErrorNotAHang) {
  REQUIRE_GPUS(2);
  auto comms = par::make_nccl_communicators(gpus(2), {.timeout_seconds = 2});
  // The same one-float all-reduce as the factory's first one, so NCCL is already connected
  // and the call reaches the GPU, where it waits for rank 1.
  const std::string msg = testutil::error_of([&] { comms[0]->barrier(); });
  testutil::expect_contains(
      msg, {"barrier", "rank 0 of 2", "cuda:0", "did not complete after", "aborted"});
  // The group stays unusable: a late peer must not pair with the wrong collective.
  testutil::expect_contains(testutil::error_of([&] { comms[1]->barrier(); }),
                            {"barrier", "rank 1", "unusable"});
  testutil::expect_contains(testutil::error_of([&] { comms[0]->barrier(); }), {"unusable"});
}
