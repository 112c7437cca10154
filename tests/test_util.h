#pragma once
// Helpers shared by the unit tests.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <string>
#include <system_error>

#include "galley/error.h"
#include "galley/runtime/cuda.h"
#include "galley/tensor.h"

// Skips a GPU test, saying why, on a machine without a CUDA device.
#define REQUIRE_GPU()                                                                     \
  if (!galley::cuda::available())                                                         \
  GTEST_SKIP() << "no CUDA device here (galley::cuda_device_count() == 0): the GPU path " \
                  "is compiled but cannot run"

namespace testutil {

// The address space this process has mapped, in bytes (for a limit on it a little above).
inline size_t mapped_bytes() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  unsigned long pages = 0;
  if (f) {
    if (std::fscanf(f, "%lu", &pages) != 1) pages = 0;
    std::fclose(f);
  }
  return size_t(pages) * size_t(sysconf(_SC_PAGESIZE));
}

// How much f raised this process's peak resident size, in KiB (0 where it stayed under the
// peak reached before).
template <typename F>
long peak_rss_growth_kib(F&& f) {
  rusage before{}, after{};
  getrusage(RUSAGE_SELF, &before);
  f();
  getrusage(RUSAGE_SELF, &after);
  return after.ru_maxrss - before.ru_maxrss;
}

// Runs f and returns the message of the galley::Error it throws; records a failure if it
// throws something else or nothing.
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const galley::Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected galley::Error, got another exception: " << e.what();
    return {};
  }
  ADD_FAILURE() << "expected galley::Error, nothing was thrown";
  return {};
}

// Expects the exception nested inside `e` to be a `Nested` whose message is `what`; with
// `plain`, one that is not also a galley::Error (a wrapper nested inside the wrapper).
template <typename Nested>
void expect_nested(const std::exception& e, const char* what, bool plain = false) {
  try {
    std::rethrow_if_nested(e);
    ADD_FAILURE() << "no nested exception";
  } catch (const Nested& original) {
    EXPECT_FALSE(plain && dynamic_cast<const galley::Error*>(&original) != nullptr)
        << "the original is not the error nested inside: " << original.what();
    EXPECT_STREQ(original.what(), what);
  }
}

// Expects every part to appear in msg.
inline void expect_contains(const std::string& msg, std::initializer_list<std::string> parts) {
  for (const std::string& p : parts)
    EXPECT_NE(msg.find(p), std::string::npos) << "message lacks \"" << p << "\": " << msg;
}

// A fixture with a fresh temporary directory for each test, removed after it.
class TempDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl =
        (std::filesystem::path(::testing::TempDir()) / "galley_test_XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  // `name` inside the test's directory.
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  static std::string read(const std::string& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  std::filesystem::path dir_;
};

// Gives `t` the gradient `g` past set_grad's checks (shape, dtype, device), as a gradient
// written by other means would arrive: for the checks of the code that reads gradients.
inline void force_grad(const galley::Tensor& t, const galley::Tensor& g) {
  t.impl()->grad = g.impl_ptr();
}

}  // namespace testutil
