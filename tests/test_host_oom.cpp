// The host's heap running out at chosen places, through an aligned_alloc and an operator new of
// this program's own that refuse one size of block on demand (galley's host tensors come from
// aligned_alloc, the standard containers from operator new). The sanitizers bring their own
// allocators, so under them these tests skip.
#include <gtest/gtest.h>

#include "test_util.h"

#include <galley/galley.h>

#include <atomic>
#include <cstdlib>
#include <new>
#include <string>
#include <vector>

#include "src/allocator.h"

#if defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define GALLEY_TEST_UNDER_SANITIZER 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define GALLEY_TEST_UNDER_SANITIZER 1
#endif
#if defined(GALLEY_TEST_UNDER_SANITIZER)
#define GALLEY_TEST_OWN_ALLOCATORS 0
#else
#define GALLEY_TEST_OWN_ALLOCATORS 1
#endif

namespace {
// While non-zero, aligned_alloc (operator new) refuses blocks of exactly this many bytes.
std::atomic<size_t> refused_aligned{0};
std::atomic<size_t> refused_new{0};
}  // namespace

#if GALLEY_TEST_OWN_ALLOCATORS
extern "C" void* aligned_alloc(size_t alignment, size_t size) noexcept {
  if (size != 0 && size == refused_aligned.load()) return nullptr;
  void* p = nullptr;
  if (alignment < sizeof(void*)) alignment = sizeof(void*);
  return posix_memalign(&p, alignment, size) == 0 ? p : nullptr;
}

// The default operator delete frees with free(), so blocks from malloc go back the usual way.
void* operator new(std::size_t size) {
  if (size != 0 && size == refused_new.load()) throw std::bad_alloc();
  if (void* p = std::malloc(size ? size : 1)) return p;
  throw std::bad_alloc();
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

// While alive, refuses blocks of `bytes` from aligned_alloc or from operator new.
struct Refuse {
  std::atomic<size_t>& which;
  Refuse(std::atomic<size_t>& from, size_t bytes) : which(from) { which.store(bytes); }
  ~Refuse() { which.store(0); }
};

// A step of `model` (two replicas) on `x` while `from` refuses blocks of `bytes` fails with
// replica 1's OutOfMemoryError. Every replica ran every collective: the group takes the next
// step, and the replicas' reduced gradients agree.
template <typename M>
void expect_replica_1_out_of_memory(galley::DataParallel<M>& model, const Tensor& x,
                                    std::atomic<size_t>& from, size_t bytes) {
  {
    Refuse refuse(from, bytes);
    try {
      galley::sum(model(x)).backward();
      ADD_FAILURE() << "no exception";
    } catch (const galley::OutOfMemoryError& e) {
      testutil::expect_contains(e.what(), {"DataParallel all-reduce on replica 1", "cpu:1"});
    }
  }
  for (auto& p : model.parameters()) p.set_grad(Tensor());
  galley::sum(model(x)).backward();
  const auto params = model.parameters();
  const size_t half = params.size() / 2;
  for (size_t k = 0; k < half; ++k) {
    ASSERT_TRUE(params[k].grad().defined()) << k;
    ASSERT_TRUE(params[k + half].grad().defined()) << k;
    EXPECT_EQ(params[k].grad().to_vector(), params[k + half].grad().to_vector()) << k;
  }
}

// A replica that cannot take its share of a reduced gradient (it had no rows, so it allocates
// the gradient when the sum arrives, and the host has no block for it) still takes part in every
// later bucket's collective. The caller gets that replica's OutOfMemoryError at once; before, it
// left its communication thread early, and its peer waited for it at the next bucket until the
// timeout, whose error was the one reported. The group stays usable.
TEST(HostOutOfMemory, AReplicaThatCannotTakeTheReducedGradientDoesNotStallItsPeers) {
  if (!GALLEY_TEST_OWN_ALLOCATORS) GTEST_SKIP() << "a sanitizer owns the allocators";
  galley::DataParallel<BigLast> model({Device::cpu(0), Device::cpu(1)}, {.timeout_seconds = 20});
  const Tensor x = galley::randn({1, 4});  // one row: replica 1 gets none
  {
    // Replica 0's gradient of `big` comes from the one cached block; replica 1's needs a new one.
    galley::detail::host_empty_cache();
    Tensor warm = Tensor::empty({kBig}, galley::DType::Float32, Device::cpu());
    (void)warm;
  }
  expect_replica_1_out_of_memory(model, x, refused_aligned, kBigBytes);
}

// A replica whose share of an all-reduce runs out of memory makes its peers' collectives fail
// too ("another participant failed"): the caller gets the replica's own OutOfMemoryError, not a
// peer's echo of it, whichever replica it was. One 4,096-weight bucket (4,097 values with its
// flag) splits into shares of 2,049 and 2,048: replica 1's accumulator alone is 8,192 bytes.
TEST(HostOutOfMemory, TheReplicaWhoseShareFailedIsTheOneReported) {
  if (!GALLEY_TEST_OWN_ALLOCATORS) GTEST_SKIP() << "a sanitizer owns the allocators";
  struct Square : nn::Layer {
    Square() { register_layer("fc", fc); }
    Tensor forward(const Tensor& x) override { return fc(x); }
    nn::Linear fc{64, 64, {.bias = false}};
  };
  galley::DataParallel<Square> model({Device::cpu(0), Device::cpu(1)}, {.timeout_seconds = 20});
  const Tensor x = galley::randn({4, 64});
  expect_replica_1_out_of_memory(model, x, refused_new, 2048 * sizeof(float));
}

}  // namespace
