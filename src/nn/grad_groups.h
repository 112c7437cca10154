#pragma once
// Every gradient of a list of parameters, grouped by device as spans for the multi-tensor
// kernels of kernels/clip.h: what gradient clipping and the loss scaler's unscale pass share.
#include <vector>

#include "galley/tensor.h"
#include "kernels/clip.h"

namespace galley::detail {

// The gradients on one device, with the parameters they belong to.
struct GradGroup {
  Device device;
  std::vector<Tensor> grads;  // keeps the spans' memory alive
  std::vector<size_t> param;  // index of each in the caller's list
  std::vector<kernels::GradSpan> spans;
};

// The defined gradients of `params`, one group per device in order of first appearance. Each
// must be floating and contiguous on an existing device; errors name `fn` and the parameter.
std::vector<GradGroup> group_grads_by_device(const char* fn, const std::vector<Tensor>& params);
// The norm of all the spans (on `device`) taken together, as a float32 scalar there; queued on
// a GPU, so that several devices' reductions run side by side. norm_type = inf: the largest
// absolute value, NaN or inf when an element is.
Tensor grad_norm(Device device, const std::vector<kernels::GradSpan>& spans, double norm_type);
// x *= scale for every element of the group's gradients, in place (each counts a write).
void scale_grads(const GradGroup& group, float scale);

}  // namespace galley::detail
