// Built instead of the .cu files when the CUDA backend is off: every launcher says so. No GPU
// tensor can exist in such a build (cuda_device_count() is 0), so these are never reached from
// the ops; they keep the one dispatch in src/ops free of conditional compilation.
#include <atomic>
#include <string>

#include "galley/error.h"
#include "kernels/cuda/blas.cuh"
#include "kernels/cuda/clip.cuh"
#include "kernels/cuda/convert.cuh"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/fill.cuh"
#include "kernels/cuda/nonfinite.cuh"

namespace galley::kernels::cuda {
namespace {
[[noreturn]] void absent() {
  throw Error("this build of galley has no CUDA backend");
}
// Kept so that the public switch reads back what was set, whatever the build.
std::atomic<bool> deterministic_only{false};
}  // namespace

void convert(const void*, DType, void*, DType, int64_t, void*) {
  absent();
}
void fill_u32(uint32_t*, size_t, uint32_t, void*) {
  absent();
}
void fill_bytes(void*, size_t, uint64_t, int, void*) {
  absent();
}
void gemm(int, bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t, const float*,
          int64_t, float, float*, int64_t, void*) {
  absent();
}
void prepare(int) {}
void set_allow_tf32(bool) {}
bool allow_tf32() {
  return false;
}
void set_deterministic(bool on) {
  deterministic_only = on;
}
bool deterministic() {
  return deterministic_only.load();
}
void conv2d_forward(int, const cpu::Conv2dGeometry&, const float*, const float*, const float*,
                    float*, const Workspace&, void*) {
  absent();
}
void conv2d_backward(int, const cpu::Conv2dGeometry&, const float*, const float*, const float*,
                     float*, float*, float*, const Workspace&, void*) {
  absent();
}
std::string conv2d_algorithms(int, const cpu::Conv2dGeometry&, size_t) {
  absent();
}
void binary(Binary, DType, const void*, const int64_t*, const void*, const int64_t*, void*,
            const int64_t*, int, void*) {
  absent();
}
void sum_to(DType, const void*, const int64_t*, void*, const int64_t*, int, void*) {
  absent();
}
void add_inplace(DType, void*, const void*, int64_t, void*) {
  absent();
}
void unary(Unary, DType, const void*, void*, int64_t, float, float, void*) {
  absent();
}
void pow_backward(DType, const void*, const void*, void*, int64_t, float, void*) {
  absent();
}
void relu_backward(DType, const void*, const void*, void*, int64_t, void*) {
  absent();
}
void sum_dim(const float*, int64_t, int64_t, int64_t, float, float*, void*) {
  absent();
}
void sum_all(const float*, int64_t, float, float*, void*) {
  absent();
}
void expand_dim(const float*, int64_t, int64_t, int64_t, float, float*, void*) {
  absent();
}
void argmax_dim(const float*, int64_t, int64_t, int64_t, int64_t*, void*) {
  absent();
}
void column_sums(const float*, int64_t, int64_t, float*, bool, void*) {
  absent();
}
void broadcast_rows(const float*, int64_t, int64_t, float*, void*) {
  absent();
}
void broadcast_channels(const float*, int64_t, int64_t, int64_t, float*, void*) {
  absent();
}
void softmax_forward(const float*, int64_t, int64_t, int64_t, bool, float*, void*) {
  absent();
}
void softmax_backward(const float*, const float*, int64_t, int64_t, int64_t, bool, float*, void*) {
  absent();
}
void cross_entropy_forward(const float*, const int64_t*, int64_t, int64_t, float, int64_t, float*,
                           float*, int64_t*, int64_t*, int64_t*, void*) {
  absent();
}
void cross_entropy_backward(const float*, const int64_t*, const float*, int64_t, int64_t, float,
                            int64_t, float*, void*) {
  absent();
}
void fill_scaled(const float*, float, const int64_t*, float*, int64_t, void*) {
  absent();
}
void bias_relu_forward(const float*, const float*, int64_t, int64_t, int64_t, float*, void*) {
  absent();
}
void bias_relu_backward(const float*, const float*, int64_t, int64_t, int64_t, float*, float*,
                        void*) {
  absent();
}
void max_pool2d_forward(const cpu::Pool2dGeometry&, const float*, float*, int32_t*, void*) {
  absent();
}
void max_pool2d_backward(const cpu::Pool2dGeometry&, const float*, const int32_t*, float*, void*) {
  absent();
}

void adam_update_multi(const cpu::AdamStep&, double, double, double, const OptimizerTensor*, int,
                       void*) {
  absent();
}
void sgd_update_multi(const cpu::SGDStep&, const OptimizerTensor*, int, void*) {
  absent();
}

int64_t grad_norm_scratch(const cpu::GradSpan*, int) {
  absent();
}
void grad_norm(const cpu::GradSpan*, int, double, double*, float*, void*) {
  absent();
}
void scale_grads(const cpu::GradSpan*, int, float, void*) {
  absent();
}
void clamp_grads(const cpu::GradSpan*, int, float, void*) {
  absent();
}
void first_nonfinite(const void*, DType, int64_t, int64_t*, void*) {
  absent();
}
void report_nonfinite_scalar(const float*, int64_t, int64_t*, void*) {
  absent();
}

}  // namespace galley::kernels::cuda
