// Weight files cross between galley and PyTorch: ctest runs WriteForTorch, then
// parity/interop.py (which checks galley's file in PyTorch and writes one of its own), then
// ReadFromTorch. Run alone, without GALLEY_INTEROP_DIR, the tests skip.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "galley/galley.h"
#include "models.h"

namespace nn = galley::nn;
using galley::Tensor;

namespace {

using testmodels::SimpleCNN;

std::string interop_dir() {
  const char* d = std::getenv("GALLEY_INTEROP_DIR");
  return d ? d : "";
}

}  // namespace

TEST(Interop, WriteForTorch) {
  const std::string dir = interop_dir();
  if (dir.empty()) GTEST_SKIP() << "GALLEY_INTEROP_DIR is not set (ctest sets it)";
  std::filesystem::create_directories(dir);
  galley::manual_seed(77);
  SimpleCNN model;
  galley::NoGradGuard no_grad;
  Tensor x = galley::randn({3, 3, 32, 32});
  galley::io::save_safetensors(dir + "/galley_model.safetensors", model.state_dict());
  galley::io::save_safetensors(dir + "/galley_io.safetensors", {{"x", x}, {"y", model(x)}});
}

TEST(Interop, ReadFromTorch) {
  const std::string dir = interop_dir();
  if (dir.empty()) GTEST_SKIP() << "GALLEY_INTEROP_DIR is not set (ctest sets it)";
  auto file = galley::io::read_safetensors(dir + "/torch_model.safetensors");
  EXPECT_EQ(file.tensors["conv.weight"].dtype(), galley::DType::BFloat16);
  EXPECT_EQ(file.tensors["fc.bias"].dtype(), galley::DType::Float16);
  SimpleCNN model;
  model.load_state_dict(file.tensors);
  auto io = galley::io::load_safetensors(dir + "/torch_io.safetensors");
  galley::NoGradGuard no_grad;
  auto y = model(io["x"]).to_vector(), expected = io["y"].to_vector();
  float scale = 1.f;
  for (float v : expected) scale = std::max(scale, std::abs(v));
  for (size_t i = 0; i < y.size(); ++i)
    ASSERT_NEAR(y[i], expected[i], 1e-5f * scale) << "output " << i;
}
