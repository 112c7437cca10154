// The host's heap running out at chosen places, through an aligned_alloc of this program's own
// that refuses one size of block on demand (galley's host tensors come from aligned_alloc). The
// sanitizers bring their own aligned_alloc, so under them these tests skip.
#include <gtest/gtest.h>

#include "test_util.h"

#include <galley/galley.h>

#include <atomic>
#include <cstdlib>
#include <string>
#include <vector>

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define GALLEY_TEST_OWN_ALIGNED_ALLOC 0
#else
#define GALLEY_TEST_OWN_ALIGNED_ALLOC 1
#endif

namespace {
// While non-zero, aligned_alloc refuses blocks of exactly this many bytes.
std::atomic<size_t> refused_size{0};
}  // namespace

#if GALLEY_TEST_OWN_ALIGNED_ALLOC
extern "C" void* aligned_alloc(size_t alignment, size_t size) {
  if (size != 0 && size == refused_size.load()) return nullptr;
  void* p = nullptr;
  if (alignment < sizeof(void*)) alignment = sizeof(void*);
  return posix_memalign(&p, alignment, size) == 0 ? p : nullptr;
}
#endif

namespace {

namespace nn = galley::nn;
using galley::Device;
using galley::Tensor;

// 16 MiB of float32: a size class of its own in the host allocator.
constexpr int64_t kBig = int64_t(1) << 22;
constexpr size_t kBigBytes = size_t(kBig) * sizeof(float);

// One large parameter.
class Big : public nn::Layer {
 public:
  Big() { weight_ = &register_parameter("weight", galley::zeros({kBig})); }
  Tensor forward(const Tensor& x) override {
    return galley::add(x, galley::mul(galley::sum(*weight_), 0.5f));
  }

 private:
  Tensor* weight_ = nullptr;
};

// A small layer's parameters first and a large one's last: backward fills the large one's bucket
// first, so it is all-reduced before the small ones'.
class BigLast : public nn::Layer {
 public:
  BigLast() {
    register_layer("fc", fc_);
    register_layer("big", big_);
  }
  Tensor forward(const Tensor& x) override { return big_(fc_(x)); }

 private:
  nn::Linear fc_{4, 2};
  Big big_;
};

struct Refuse {
  explicit Refuse(size_t bytes) { refused_size.store(bytes); }
  ~Refuse() { refused_size.store(0); }
};

// A replica that cannot take its share of a reduced gradient (it had no rows, so it allocates
// the gradient when the sum arrives, and the host has no block for it) still takes part in every
// later bucket's collective. The caller gets that replica's OutOfMemoryError at once; before, it
// left its communication thread early, and its peer waited for it at the next bucket until the
// timeout, whose error was the one reported. The group stays usable.
TEST(HostOutOfMemory, AReplicaThatCannotTakeTheReducedGradientDoesNotStallItsPeers) {
  if (!GALLEY_TEST_OWN_ALIGNED_ALLOC) GTEST_SKIP() << "a sanitizer owns aligned_alloc";
  galley::DataParallel<BigLast> model({Device::cpu(0), Device::cpu(1)}, {.timeout_seconds = 20});
  const Tensor x = galley::randn({1, 4});  // one row: replica 1 gets none
  {
    // Replica 0's gradient of `big` comes from a cached block; replica 1's needs a new one.
    Tensor warm = Tensor::empty({kBig}, galley::DType::Float32, Device::cpu());
    (void)warm;
  }
  {
    Refuse refuse(kBigBytes);
    try {
      galley::sum(model(x)).backward();
      ADD_FAILURE() << "no exception";
    } catch (const galley::OutOfMemoryError& e) {
      testutil::expect_contains(e.what(), {"DataParallel all-reduce on replica 1", "cpu:1"});
    }
  }
  // Every replica ran every collective: the group takes the next step, and the replicas' reduced
  // gradients agree.
  for (auto& p : model.parameters()) p.set_grad(Tensor());
  galley::sum(model(x)).backward();
  const auto params = model.parameters();
  ASSERT_EQ(params.size(), 6u);
  for (size_t k = 0; k < 3; ++k) {
    ASSERT_TRUE(params[k].grad().defined()) << k;
    ASSERT_TRUE(params[k + 3].grad().defined()) << k;
    EXPECT_EQ(params[k].grad().to_vector(), params[k + 3].grad().to_vector()) << k;
  }
}

}  // namespace
