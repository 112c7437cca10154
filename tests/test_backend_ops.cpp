// One table of op cases, run on every backend and dtype against the CPU float32 result (as
// ggml's test-backend-ops does).
//
// Each row of kOps names an op case: a function building it from input tensors through the
// public functional ops, its inputs (shape and generator) and the dtypes it accepts. The runner
// makes one gtest case per (row, dtype, backend, mode), named row_dtype_backend_mode:
//
//   forward    the op on the backend in the dtype, against the CPU float32 op on the same
//              inputs (rounded to the dtype first, then widened for the reference)
//   gradient   backward of a fixed random weighting of the output (rounded the same way), the
//              input gradients against the CPU float32 ones
//   gradcheck  CPU float32 only: the analytic gradients against central differences
//              (testutil::gradcheck, shared with test_gradcheck)
//
// Tolerance, per dtype and relative to magnitude: |got - want| <= rtol * (|want| + max|want|)
// over the tensor compared; NaN matches NaN, infinities must be equal, int64 results (argmax)
// must be equal. float32 backends differ from the CPU by summation order and the libraries' ulp
// errors (rtol 1e-5); bfloat16 and float16 results are rounded once from a float32 accumulation
// (half an ulp: 2^-9 and 2^-11), so rtol is about two ulps of the format.
//
// CUDA cases run on every CUDA device and skip, saying why, when there is none. The kernel-level
// checks of the CUDA launchers (misaligned pointers, NaNs, bit-exact sums, in-place calls,
// determinism, graphs and streams, optimizer updates) are in test_cuda_launchers.cpp.
//
// To add an op: one row. To widen a row to 16-bit: its dtype list (the last field).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "galley/galley.h"
#include "gradcheck.h"
#include "test_util.h"

using galley::Device;
using galley::DType;
using galley::Shape;
using galley::Tensor;

namespace {

// ---------------------------------------------------------------------------------------------
// Inputs

enum class Gen {
  Normal,        // standard normal times `scale`
  Positive,      // uniform in [1, 2): log, division, fractional powers
  AwayFromZero,  // normal, at least 0.1 from 0: relu's kink stays out of a difference step
  Distinct,      // distinct values 0.05 apart: max-pool winners never swap
  Labels,        // int64 class labels, given
};

struct Input {
  Shape shape;
  Gen gen = Gen::Normal;
  float scale = 1.f;
  std::vector<int64_t> labels = {};
};

Input normal(Shape s, float scale = 1.f) {
  return {std::move(s), Gen::Normal, scale};
}
Input positive(Shape s) {
  return {std::move(s), Gen::Positive};
}
Input kinkless(Shape s) {
  return {std::move(s), Gen::AwayFromZero};
}
Input distinct(Shape s) {
  return {std::move(s), Gen::Distinct};
}
Input labels(std::vector<int64_t> v) {
  const int64_t n = static_cast<int64_t>(v.size());
  return {{n}, Gen::Labels, 1.f, std::move(v)};
}

Tensor generate(const Input& in, uint64_t seed) {
  switch (in.gen) {
    case Gen::Normal:
      return testutil::rnd(in.shape, seed, in.scale);
    case Gen::Positive: {
      galley::Generator gen(seed);
      return galley::uniform(in.shape, 1.f, 2.f, gen);
    }
    case Gen::AwayFromZero:
      return testutil::away_from_zero(in.shape, seed);
    case Gen::Distinct:
      return testutil::distinct(in.shape, seed);
    case Gen::Labels:
      return Tensor::from_vector(in.labels, in.shape);
  }
  return Tensor();
}

// ---------------------------------------------------------------------------------------------
// The table

using Build = std::function<Tensor(const std::vector<Tensor>&)>;

struct OpCase {
  const char* name;  // [a-z0-9_]: it starts the gtest case's name
  Build build;
  std::vector<Input> inputs;
  std::vector<DType> dtypes;
  bool differentiable = true;
};

const std::vector<DType> kFloat32 = {DType::Float32};
const std::vector<DType> kAllFloat = {DType::Float32, DType::BFloat16, DType::Float16};

Build conv(galley::Conv2dOptions o) {
  return [o](const std::vector<Tensor>& v) {
    return galley::conv2d(v[0], v[1], v.size() > 2 ? v[2] : Tensor(), o);
  };
}
Build pool(galley::MaxPool2dOptions o) {
  return [o](const std::vector<Tensor>& v) { return galley::max_pool2d(v[0], o); };
}
Build cross_entropy(galley::CrossEntropyOptions o) {
  return [o](const std::vector<Tensor>& v) { return galley::cross_entropy(v[0], v[1], o); };
}
// batch_norm on v = {x[, weight, bias]} (batch_norm_add on {x, weight, bias, residual} with
// `residual`), with fresh running statistics on x's device at each call (float32 [C]): zeros and
// ones when `training` (they are updated), fixed values otherwise.
Build batch_norm(galley::BatchNormOptions o, bool running = true, bool residual = false) {
  return [o, running, residual](const std::vector<Tensor>& v) {
    const int64_t C = v[0].size(1);
    std::vector<float> mean(C), var(C);
    for (int64_t c = 0; c < C; ++c)
      mean[c] = 0.2f * float(c) - 0.3f, var[c] = 0.5f + 0.25f * float(c);
    Tensor rm = running ? Tensor::from_vector(mean, {C}).to(v[0].device()) : Tensor();
    Tensor rv = running ? Tensor::from_vector(var, {C}).to(v[0].device()) : Tensor();
    if (residual) return galley::batch_norm_add(v[0], v[3], rm, rv, v[1], v[2], o);
    return galley::batch_norm(v[0], rm, rv, v.size() > 1 ? v[1] : Tensor(),
                              v.size() > 2 ? v[2] : Tensor(), o);
  };
}

using V = const std::vector<Tensor>&;
const std::vector<int64_t> kLabels = {0, 3, 1, 4, 2, 3};
const std::vector<int64_t> kIgnored = {0, -100, 1, 4, -100, 3};

// clang-format off
const std::vector<OpCase> kOps = {
    // elementwise, with broadcasting
    {"add",                  [](V v) { return v[0] + v[1]; }, {normal({3, 4}), normal({3, 4})}, kAllFloat},
    {"add_broadcast",        [](V v) { return v[0] + v[1]; }, {normal({2, 3, 4}), normal({3, 1})}, kAllFloat},
    {"add_row",              [](V v) { return v[0] + v[1]; }, {normal({5, 4}), normal({4})}, kAllFloat},
    {"add_odd_size",         [](V v) { return v[0] + v[1]; }, {normal({1037}), normal({1037})}, kAllFloat},
    {"sub_broadcast",        [](V v) { return v[0] - v[1]; }, {normal({2, 3, 4}), normal({1, 3, 1})}, kAllFloat},
    {"mul",                  [](V v) { return v[0] * v[1]; }, {normal({3, 4}), normal({3, 4})}, kAllFloat},
    {"mul_broadcast",        [](V v) { return v[0] * v[1]; }, {normal({4, 1, 3}), normal({2, 1})}, kAllFloat},
    {"mul_outer",            [](V v) { return v[0] * v[1]; }, {normal({6, 1}), normal({1, 7})}, kAllFloat},
    {"square",               [](V v) { return v[0] * v[0]; }, {normal({6})}, kAllFloat},
    {"div",                  [](V v) { return v[0] / v[1]; }, {normal({3, 4}), positive({3, 4})}, kAllFloat},
    {"div_broadcast",        [](V v) { return v[0] / v[1]; }, {normal({3, 4}), positive({4})}, kAllFloat},
    {"add_scalar",           [](V v) { return v[0] + 3.f; }, {normal({5})}, kAllFloat},
    {"rsub_scalar",          [](V v) { return 2.f - v[0]; }, {normal({4})}, kAllFloat},
    {"mul_scalar",           [](V v) { return v[0] * 1.5f; }, {normal({6})}, kAllFloat},
    {"div_scalar",           [](V v) { return v[0] / 4.f; }, {normal({6})}, kAllFloat},
    {"neg",                  [](V v) { return -v[0]; }, {normal({5})}, kAllFloat},
    {"exp",                  [](V v) { return galley::exp(v[0]); }, {normal({4, 5}, 0.5f)}, kAllFloat},
    {"log",                  [](V v) { return galley::log(v[0]); }, {positive({4, 5})}, kAllFloat},
    {"pow_3",                [](V v) { return galley::pow(v[0], 3.f); }, {normal({5})}, kAllFloat},
    {"pow_fractional",       [](V v) { return galley::pow(v[0], 2.5f); }, {positive({7})}, kAllFloat},
    {"pow_negative",         [](V v) { return galley::pow(v[0], -1.5f); }, {positive({7})}, kAllFloat},
    {"relu",                 [](V v) { return galley::relu(v[0]); }, {kinkless({4, 5})}, kAllFloat},
    // relu(Tensor&&): a temporary's buffer is reused for the result
    {"relu_temporary",       [](V v) { return galley::relu(v[0].clone()); }, {kinkless({4, 5})}, kAllFloat},
    // activations; 1037 elements: whole 256-element blocks of the CPU kernels and a short one
    {"gelu",                 [](V v) { return galley::gelu(v[0]); }, {normal({4, 5}, 2.f)}, kAllFloat},
    {"gelu_odd_size",        [](V v) { return galley::gelu(v[0]); }, {normal({1037}, 3.f)}, kAllFloat},
    {"gelu_tanh",            [](V v) { return galley::gelu(v[0], galley::GeluApproximate::Tanh); }, {normal({4, 5}, 2.f)}, kAllFloat},
    {"gelu_tanh_odd_size",   [](V v) { return galley::gelu(v[0], galley::GeluApproximate::Tanh); }, {normal({1037}, 3.f)}, kAllFloat},
    {"silu",                 [](V v) { return galley::silu(v[0]); }, {normal({4, 5}, 2.f)}, kAllFloat},
    {"silu_odd_size",        [](V v) { return galley::silu(v[0]); }, {normal({1037}, 3.f)}, kAllFloat},
    {"sigmoid",              [](V v) { return galley::sigmoid(v[0]); }, {normal({4, 5}, 2.f)}, kAllFloat},
    {"sigmoid_odd_size",     [](V v) { return galley::sigmoid(v[0]); }, {normal({1037}, 3.f)}, kAllFloat},
    {"tanh",                 [](V v) { return galley::tanh(v[0]); }, {normal({4, 5}, 1.5f)}, kAllFloat},
    {"tanh_odd_size",        [](V v) { return galley::tanh(v[0]); }, {normal({1037}, 3.f)}, kAllFloat},
    {"leaky_relu",           [](V v) { return galley::leaky_relu(v[0]); }, {kinkless({4, 5})}, kAllFloat},
    {"leaky_relu_slope",     [](V v) { return galley::leaky_relu(v[0], 0.2f); }, {kinkless({4, 5})}, kAllFloat},
    // after a broadcast add: the gradient flows on to both inputs
    {"silu_of_sum",          [](V v) { return galley::silu(v[0] + v[1]); }, {normal({3, 4}), normal({4})}, kAllFloat},
    // bias + x stays clear of relu's kink: |x| >= 0.1, |bias| ~ 0.01
    {"bias_relu_channels",   [](V v) { return galley::bias_relu(v[0], v[1]); }, {kinkless({2, 3, 4, 5}), normal({3}, 0.01f)}, kAllFloat},
    {"bias_relu_features",   [](V v) { return galley::bias_relu(v[0], v[1], -1); }, {kinkless({6, 7}), normal({7}, 0.01f)}, kAllFloat},
    // matrix products
    {"matmul",               [](V v) { return galley::matmul(v[0], v[1]); }, {normal({3, 5}), normal({5, 4})}, kAllFloat},
    {"matmul_odd",           [](V v) { return galley::matmul(v[0], v[1]); }, {normal({17, 33}), normal({33, 9})}, kAllFloat},
    {"linear",               [](V v) { return galley::linear(v[0], v[1], v[2]); }, {normal({4, 6}), normal({3, 6}), normal({3})}, kAllFloat},
    {"linear_3d_no_bias",    [](V v) { return galley::linear(v[0], v[1]); }, {normal({2, 4, 6}), normal({3, 6})}, kAllFloat},
    // convolution: the geometry of each code path
    {"conv2d",               conv({}), {normal({2, 3, 7, 7}), normal({4, 3, 3, 3}, 0.5f), normal({4})}, kAllFloat},
    {"conv2d_stride2_pad1",  conv({.stride = 2, .padding = 1}), {normal({1, 2, 8, 9}), normal({3, 2, 3, 3}, 0.5f), normal({3})}, kAllFloat},
    {"conv2d_dilation2",     conv({.padding = 2, .dilation = 2}), {normal({1, 2, 9, 9}), normal({2, 2, 3, 3}, 0.5f)}, kAllFloat},
    {"conv2d_groups2",       conv({.padding = 1, .groups = 2}), {normal({2, 4, 6, 6}), normal({6, 2, 3, 3}, 0.5f), normal({6})}, kAllFloat},
    {"conv2d_1x1",           conv({}), {normal({2, 3, 5, 5}), normal({4, 3, 1, 1}, 0.5f), normal({4})}, kAllFloat},
    {"conv2d_rect_stride2",  conv({.stride = 2}), {normal({1, 1, 6, 5}), normal({2, 1, 2, 3}, 0.5f), normal({2})}, kAllFloat},
    // enough channels and images for the CPU's direct path
    {"conv2d_direct",        conv({.padding = 1}), {normal({2, 16, 5, 5}), normal({4, 16, 3, 3}, 0.5f), normal({4})}, kAllFloat},
    // pooling
    {"max_pool2d",           pool({.kernel_size = 2}), {distinct({2, 3, 6, 6})}, kAllFloat},
    {"max_pool2d_k3_s2_p1",  pool({.kernel_size = 3, .stride = 2, .padding = 1}), {distinct({1, 2, 7, 7})}, kAllFloat},
    {"max_pool2d_k3_s1",     pool({.kernel_size = 3, .stride = 1}), {distinct({1, 2, 5, 6})}, kAllFloat},
    // shapes
    {"flatten",              [](V v) { return galley::flatten(v[0], 1); }, {normal({2, 3, 4})}, kAllFloat},
    {"reshape",              [](V v) { return galley::reshape(v[0], {4, -1}); }, {normal({2, 3, 4})}, kAllFloat},
    // reductions
    {"sum",                  [](V v) { return galley::sum(v[0]); }, {normal({3, 4})}, kAllFloat},
    {"sum_large",            [](V v) { return galley::sum(v[0]); }, {normal({4097})}, kAllFloat},
    {"sum_dim",              [](V v) { return galley::sum(v[0], 1); }, {normal({3, 4, 2})}, kAllFloat},
    {"mean",                 [](V v) { return galley::mean(v[0]); }, {normal({3, 4})}, kAllFloat},
    {"mean_dim_keepdim",     [](V v) { return galley::mean(v[0], -1, true); }, {normal({3, 4, 2})}, kAllFloat},
    {"softmax",              [](V v) { return galley::softmax(v[0], 1); }, {normal({3, 5})}, kAllFloat},
    {"softmax_dim1_of_3",    [](V v) { return galley::softmax(v[0], 1); }, {normal({2, 4, 3})}, kAllFloat},
    {"softmax_wide",         [](V v) { return galley::softmax(v[0], -1); }, {normal({3, 1000}, 2.f)}, kAllFloat},
    {"log_softmax",          [](V v) { return galley::log_softmax(v[0], -1); }, {normal({3, 5})}, kAllFloat},
    {"log_softmax_dim0",     [](V v) { return galley::log_softmax(v[0], 0); }, {normal({6, 4})}, kAllFloat},
    {"argmax",               [](V v) { return galley::argmax(v[0], -1); }, {normal({6, 10})}, kAllFloat, false},
    {"argmax_dim1_keepdim",  [](V v) { return galley::argmax(v[0], 1, true); }, {normal({5, 33, 4})}, kAllFloat, false},
    // losses
    {"cross_entropy",        cross_entropy({}), {normal({6, 5}), labels(kLabels)}, kAllFloat},
    {"cross_entropy_sum",    cross_entropy({.reduction = galley::Reduction::Sum}), {normal({6, 5}), labels(kLabels)}, kAllFloat},
    {"cross_entropy_none",   cross_entropy({.reduction = galley::Reduction::None}), {normal({6, 5}), labels(kLabels)}, kAllFloat},
    {"cross_entropy_smooth", cross_entropy({.label_smoothing = 0.1f}), {normal({6, 5}), labels(kLabels)}, kAllFloat},
    {"cross_entropy_ignore", cross_entropy({}), {normal({6, 5}), labels(kIgnored)}, kAllFloat},
    // joining, slicing and views: cat, stack, split, narrow, select, transpose, permute, add_
    {"cat_dim0",             [](V v) { return galley::cat({v[0], v[1]}); }, {normal({2, 3}), normal({4, 3})}, kAllFloat},
    {"cat_dim1_three",       [](V v) { return galley::cat({v[0], v[1], v[2]}, 1); }, {normal({2, 1, 4}), normal({2, 3, 4}), normal({2, 2, 4})}, kAllFloat},
    {"cat_negative_dim",     [](V v) { return galley::cat({v[0], v[1]}, -1); }, {normal({3, 2}), normal({3, 5})}, kAllFloat},
    {"cat_of_views",         [](V v) { return galley::cat({galley::transpose(v[0], 0, 1), v[1].narrow(1, 1, 3)}); }, {normal({3, 2}), normal({4, 5})}, kAllFloat},
    {"stack_dim0",           [](V v) { return galley::stack({v[0], v[1]}); }, {normal({3, 4}), normal({3, 4})}, kAllFloat},
    {"stack_last_three",     [](V v) { return galley::stack({v[0], v[1], v[2]}, -1); }, {normal({2, 3}), normal({2, 3}), normal({2, 3})}, kAllFloat},
    {"split_reordered",      [](V v) { auto p = galley::split(v[0], 2, 1); return galley::cat({p[2], p[0], p[1]}, 1); }, {normal({3, 6})}, kAllFloat},
    {"split_sizes_empty",    [](V v) { auto p = galley::split(v[0], {1, 0, 3}); return galley::cat({p[2] * 2.f, p[1], p[0]}); }, {normal({4, 5})}, kAllFloat},
    {"split_uneven_unused",  [](V v) { auto p = galley::split(v[0], 3, -1); return p[1] * p[2]; }, {normal({2, 7})}, kAllFloat},
    {"narrow",               [](V v) { return galley::narrow(v[0], 1, 1, 3); }, {normal({2, 5, 3})}, kAllFloat},
    {"narrow_negative",      [](V v) { return v[0].narrow(-1, -3, 2); }, {normal({4, 5})}, kAllFloat},
    {"select",               [](V v) { return galley::select(v[0], 1, -1); }, {normal({3, 4, 2})}, kAllFloat},
    {"transpose",            [](V v) { return galley::transpose(v[0], 0, 2); }, {normal({2, 3, 4})}, kAllFloat},
    {"permute",              [](V v) { return galley::permute(v[0], {2, 0, 1}); }, {normal({2, 3, 4})}, kAllFloat},
    {"permute_contiguous",   [](V v) { return v[0].permute({1, 2, 0}).contiguous(); }, {normal({2, 3, 4})}, kAllFloat},
    {"transpose_matmul",     [](V v) { return galley::matmul(v[0].transpose(0, 1), v[1]); }, {normal({5, 3}), normal({5, 4})}, kAllFloat},
    {"permute_add",          [](V v) { return galley::permute(v[0], {1, 0, 2}) + v[1]; }, {normal({2, 3, 4}), normal({3, 2, 4})}, kAllFloat},
    {"add_inplace",          [](V v) { Tensor t = v[0] * 1.f; t.add_(v[1]); return t; }, {normal({3, 4}), normal({3, 4})}, kAllFloat},
    {"add_inplace_broadcast", [](V v) { Tensor t = v[0] * 2.f; galley::add_(t, v[1]); return t; }, {normal({2, 3, 4}), normal({3, 1})}, kAllFloat},
    {"add_inplace_residual", [](V v) { Tensor h = galley::matmul(v[0], v[1]); h.add_(v[2]); h.add_(v[2]); return h * h; }, {normal({3, 5}), normal({5, 4}), normal({3, 4})}, kAllFloat},
    // batch_norm: batch statistics (training), running statistics (eval), no affine, none kept
    {"batch_norm_train_2d",  batch_norm({.training = true}), {normal({4, 3, 5, 5}), normal({3}), normal({3})}, kAllFloat},
    {"batch_norm_train_1d",  batch_norm({.training = true}), {normal({6, 4}), normal({4}), normal({4})}, kAllFloat},
    {"batch_norm_train_3d",  batch_norm({.training = true}), {normal({3, 4, 7}), normal({4}), normal({4})}, kAllFloat},
    {"batch_norm_eval_2d",   batch_norm({}), {normal({4, 3, 5, 5}), normal({3}), normal({3})}, kAllFloat},
    {"batch_norm_eval_1d",   batch_norm({}), {normal({6, 4}), normal({4}), normal({4})}, kAllFloat},
    {"batch_norm_no_affine", batch_norm({.training = true}), {normal({4, 3, 2, 3})}, kAllFloat},
    {"batch_norm_no_running", batch_norm({.training = true}, false), {normal({5, 3, 4}), normal({3}), normal({3})}, kAllFloat},
    // a small weight and |bias| >= 0.1 keep the output clear of relu's kink
    {"batch_norm_relu",      batch_norm({.training = true, .relu = true}), {normal({4, 3, 3, 3}), normal({3}, 0.02f), kinkless({3})}, kAllFloat},
    // batch_norm_add: the residual away from zero and a small affine keep the sum clear of the kink;
    // planes of 529 take the host kernel's channel-at-a-time backward, [N, C] its row path
    {"batch_norm_add_relu",      batch_norm({.training = true, .relu = true}, true, true), {normal({4, 3, 5, 5}), normal({3}, 0.01f), normal({3}, 0.01f), kinkless({4, 3, 5, 5})}, kAllFloat},
    {"batch_norm_add_relu_long", batch_norm({.training = true, .relu = true}, true, true), {normal({2, 2, 23, 23}), normal({2}, 0.01f), normal({2}, 0.01f), kinkless({2, 2, 23, 23})}, kAllFloat},
    {"batch_norm_add_relu_1d",   batch_norm({.training = true, .relu = true}, true, true), {normal({6, 4}), normal({4}, 0.01f), normal({4}, 0.01f), kinkless({6, 4})}, kAllFloat},
    {"batch_norm_add_eval",      batch_norm({}, true, true), {normal({4, 3, 5, 5}), normal({3}), normal({3}), normal({4, 3, 5, 5})}, kAllFloat},
    {"batch_norm_add_eval_relu", batch_norm({.relu = true}, true, true), {normal({4, 3, 5, 5}), normal({3}, 0.01f), normal({3}, 0.01f), kinkless({4, 3, 5, 5})}, kAllFloat},
    // avg_pool2d, adaptive_avg_pool2d, dropout
    {"avg_pool2d",               [](V v) { return galley::avg_pool2d(v[0], {.kernel_size = 2}); }, {normal({2, 3, 6, 6})}, kAllFloat},
    {"avg_pool2d_k3_s2_p1",      [](V v) { return galley::avg_pool2d(v[0], {.kernel_size = 3, .stride = 2, .padding = 1}); }, {normal({1, 2, 7, 8})}, kAllFloat},
    {"avg_pool2d_k3_s1_exclude", [](V v) { return galley::avg_pool2d(v[0], {.kernel_size = 3, .stride = 1, .padding = 1, .count_include_pad = false}); }, {normal({2, 2, 5, 6})}, kAllFloat},
    {"avg_pool2d_ceil_exclude",  [](V v) { return galley::avg_pool2d(v[0], {.kernel_size = 3, .stride = 2, .padding = 1, .count_include_pad = false, .ceil_mode = true}); }, {normal({1, 3, 8, 7})}, kAllFloat},
    {"avg_pool2d_ceil",          [](V v) { return galley::avg_pool2d(v[0], {.kernel_size = 2, .ceil_mode = true}); }, {normal({1, 2, 5, 7})}, kAllFloat},
    {"adaptive_avg_pool2d_1x1",  [](V v) { return galley::adaptive_avg_pool2d(v[0], {1, 1}); }, {normal({3, 4, 7, 9})}, kAllFloat},
    {"adaptive_avg_pool2d_3x4",  [](V v) { return galley::adaptive_avg_pool2d(v[0], {3, 4}); }, {normal({2, 2, 7, 10})}, kAllFloat},
    {"adaptive_avg_pool2d_up",   [](V v) { return galley::adaptive_avg_pool2d(v[0], {5, 3}); }, {normal({1, 2, 3, 2})}, kAllFloat},
    // dropout: a fresh generator per call, so every backend and dtype draws the same mask
    {"dropout",                  [](V v) { galley::Generator g(5); return galley::dropout(v[0], 0.3f, true, g); }, {normal({3, 1037})}, kAllFloat},
};
// clang-format on

// ---------------------------------------------------------------------------------------------
// The runner

enum class Backend { Cpu, Cuda };
enum class Mode { Forward, Gradient, GradCheck };

struct Case {
  size_t row;  // index into kOps
  DType dtype;
  Backend backend;
  Mode mode;
};

const char* backend_name(Backend b) {
  return b == Backend::Cpu ? "cpu" : "cuda";
}
const char* mode_name(Mode m) {
  return m == Mode::Forward ? "forward" : m == Mode::Gradient ? "gradient" : "gradcheck";
}

// What a failure prints for the parameter: the case's name.
void PrintTo(const Case& c, std::ostream* os) {
  *os << kOps[c.row].name << " " << galley::dtype_name(c.dtype) << " " << backend_name(c.backend)
      << " " << mode_name(c.mode);
}

std::vector<Case> all_cases() {
  std::vector<Case> cases;
  for (size_t r = 0; r < kOps.size(); ++r) {
    const OpCase& op = kOps[r];
    for (DType d : op.dtypes)
      for (Backend b : {Backend::Cpu, Backend::Cuda}) {
        cases.push_back({r, d, b, Mode::Forward});
        if (op.differentiable) cases.push_back({r, d, b, Mode::Gradient});
      }
    if (op.differentiable) cases.push_back({r, DType::Float32, Backend::Cpu, Mode::GradCheck});
  }
  return cases;
}

std::string case_name(const testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  return std::string(kOps[c.row].name) + "_" + galley::dtype_name(c.dtype) + "_" +
         backend_name(c.backend) + "_" + mode_name(c.mode);
}

bool is_float(const Tensor& t) {
  return t.dtype() == DType::Float32 || t.dtype() == DType::BFloat16 || t.dtype() == DType::Float16;
}

double rtol(DType d) {
  switch (d) {
    case DType::BFloat16:
      return 1.6e-2;  // 2 ulps of an 8-bit significand
    case DType::Float16:
      return 2e-3;  // 2 ulps of an 11-bit significand
    default:
      return 1e-5;
  }
}

// `got` (any device and dtype) against `want` (CPU float32, or int64 for exact results).
void expect_close(const Tensor& got, const Tensor& want, DType dtype, const std::string& what) {
  ASSERT_TRUE(got.defined()) << what << ": undefined";
  ASSERT_EQ(galley::shape_str(got.shape()), galley::shape_str(want.shape())) << what;
  if (want.dtype() == DType::Int64) {
    ASSERT_EQ(got.dtype(), DType::Int64) << what;
    const auto g = got.to(Device::cpu()).to_vector<int64_t>();
    const auto w = want.to_vector<int64_t>();
    int bad = 0;
    for (size_t i = 0; i < w.size(); ++i)
      if (g[i] != w[i] && bad++ < 5)
        ADD_FAILURE() << what << " [" << i << "]: got " << g[i] << ", want " << w[i];
    EXPECT_EQ(bad, 0) << what << ": " << bad << " mismatching element(s)";
    return;
  }
  ASSERT_EQ(got.dtype(), dtype) << what << ": an op returns its input's dtype";
  const auto g = got.to(Device::cpu()).to(DType::Float32).to_vector();
  const auto w = want.to_vector();
  double max_abs = 0;
  for (float v : w)
    if (std::isfinite(v)) max_abs = std::max(max_abs, std::abs(double(v)));
  const double r = rtol(dtype);
  int bad = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    const bool same = g[i] == w[i] || (std::isnan(g[i]) && std::isnan(w[i]));
    const bool near = std::isfinite(g[i]) && std::isfinite(w[i]) &&
                      std::abs(double(g[i]) - double(w[i])) <= r * (std::abs(w[i]) + max_abs);
    if (!same && !near && bad++ < 5)
      ADD_FAILURE() << what << " [" << i << "]: got " << g[i] << ", want " << w[i] << " (tolerance "
                    << r * (std::abs(w[i]) + max_abs) << ")";
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << w.size() << " element(s) differ";
}

class BackendOps : public testing::TestWithParam<Case> {
 protected:
  // The row's inputs in float32 on the CPU; each row and input has its own seed.
  std::vector<Tensor> inputs() const {
    const Case& c = GetParam();
    std::vector<Tensor> v;
    for (size_t k = 0; k < op().inputs.size(); ++k)
      v.push_back(generate(op().inputs[k], 1000 * (c.row + 1) + k));
    return v;
  }
  const OpCase& op() const { return kOps[GetParam().row]; }

  void forward(Device dev) const {
    const DType d = GetParam().dtype;
    std::vector<Tensor> ref_in, dev_in;
    for (const Tensor& x : inputs()) {
      const Tensor rounded = is_float(x) ? x.to(d) : x;
      ref_in.push_back(is_float(x) ? rounded.to(DType::Float32) : x);
      dev_in.push_back(rounded.to(dev));
    }
    galley::NoGradGuard no_grad;
    const Tensor want = op().build(ref_in);
    const Tensor got = op().build(dev_in);
    ASSERT_EQ(got.device(), dev) << "the result lives on its inputs' device";
    expect_close(got, want, d, std::string(op().name) + " on " + dev.str());
  }

  void gradient(Device dev) const {
    const DType d = GetParam().dtype;
    std::vector<Tensor> ref_in, dev_in;
    for (const Tensor& x : inputs()) {
      if (!is_float(x)) {
        ref_in.push_back(x);
        dev_in.push_back(x.to(dev));
        continue;
      }
      const Tensor rounded = x.to(d);
      ref_in.push_back(rounded.to(DType::Float32).detach().set_requires_grad(true));
      dev_in.push_back(rounded.to(dev).detach().set_requires_grad(true));
    }
    const Tensor want = op().build(ref_in);
    const Tensor got = op().build(dev_in);
    galley::Generator gen(77);
    const Tensor weights = galley::randn(want.shape(), gen).to(d);
    want.backward(weights.to(DType::Float32));
    got.backward(weights.to(dev));
    for (size_t k = 0; k < ref_in.size(); ++k) {
      if (!ref_in[k].requires_grad()) continue;
      const std::string what =
          std::string(op().name) + " gradient of input " + std::to_string(k) + " on " + dev.str();
      ASSERT_TRUE(ref_in[k].grad().defined()) << what << ": none on the CPU float32 reference";
      ASSERT_TRUE(dev_in[k].grad().defined()) << what << ": no gradient reached the input";
      EXPECT_EQ(dev_in[k].grad().device(), dev) << what;
      expect_close(dev_in[k].grad(), ref_in[k].grad(), d, what);
    }
  }

  void gradcheck() const {
    // The checker perturbs the floating inputs; labels stay fixed inside the op.
    const std::vector<Tensor> all = inputs();
    std::vector<Tensor> floats;
    std::vector<int> slot;  // for each input: its index among `floats`, or -1
    for (const Tensor& x : all) {
      slot.push_back(is_float(x) ? static_cast<int>(floats.size()) : -1);
      if (is_float(x)) floats.push_back(x);
    }
    const Build& build = op().build;
    testutil::gradcheck(
        op().name,
        [&](const std::vector<Tensor>& v) {
          std::vector<Tensor> in = all;
          for (size_t k = 0; k < in.size(); ++k)
            if (slot[k] >= 0) in[k] = v[slot[k]];
          return build(in);
        },
        floats);
  }
};

TEST_P(BackendOps, MatchesTheCpuFloat32) {
  const Case& c = GetParam();
  std::vector<Device> devices = {Device::cpu()};
  if (c.backend == Backend::Cuda) {
    REQUIRE_GPU();
    devices.clear();
    for (int i = 0; i < galley::cuda_device_count(); ++i) devices.push_back(Device::cuda(i));
  }
  for (const Device& dev : devices) {
    SCOPED_TRACE(dev.str());
    switch (c.mode) {
      case Mode::Forward:
        forward(dev);
        break;
      case Mode::Gradient:
        gradient(dev);
        break;
      case Mode::GradCheck:
        gradcheck();
        break;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Table, BackendOps, testing::ValuesIn(all_cases()), case_name);

// Every row builds, its name is a unique identifier, and its inputs match what it uses.
TEST(BackendOpsTable, RowsAreWellFormed) {
  std::vector<std::string> names;
  for (const OpCase& op : kOps) {
    const std::string name = op.name;
    EXPECT_FALSE(name.empty());
    for (char ch : name)
      EXPECT_TRUE((ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '_') << name;
    EXPECT_EQ(std::count(names.begin(), names.end(), name), 0) << name << " appears twice";
    names.push_back(name);
    EXPECT_FALSE(op.dtypes.empty()) << name;
    EXPECT_EQ(op.dtypes.front(), DType::Float32) << name << ": every row runs in float32";
  }
}

}  // namespace
