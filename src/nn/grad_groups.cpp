// Gradients grouped by device for the multi-tensor kernels (gradient clipping, loss scaling).
#include "src/nn/grad_groups.h"

#include <algorithm>

#include "src/ops/dispatch.h"

namespace galley::detail {

std::vector<GradGroup> group_grads_by_device(const char* fn, const std::vector<Tensor>& params) {
  std::vector<GradGroup> groups;
  for (size_t i = 0; i < params.size(); ++i) {
    GALLEY_CHECK(params[i].defined(), fn, ": parameter ", i, " is undefined");
    Tensor g = params[i].grad();
    if (!g.defined()) continue;
    GALLEY_CHECK(is_floating_point(g.dtype()), fn, ": the gradient of parameter ", i, " (shape ",
                 shape_str(g.shape()), ") is ", dtype_name(g.dtype()),
                 "; gradients must be float32, bfloat16 or float16");
    GALLEY_CHECK(g.is_contiguous(), fn, ": the gradient of parameter ", i, " (shape ",
                 shape_str(g.shape()), ") is not contiguous");
    const Device d = g.device();
    GALLEY_CHECK(d.is_cpu() || d.index() < cuda_device_count(), fn, ": the gradient of parameter ",
                 i, " is on ", d.str(), ", which does not exist here");
    GradGroup* group = nullptr;
    for (auto& gr : groups)
      if (gr.device == d) group = &gr;
    if (!group) {
      groups.push_back(GradGroup{d, {}, {}, {}});
      group = &groups.back();
    }
    group->spans.push_back({g.raw_data(), g.numel(), g.dtype()});
    group->grads.push_back(std::move(g));
    group->param.push_back(i);
  }
  return groups;
}

Tensor grad_norm(Device device, const std::vector<kernels::GradSpan>& spans, double norm_type) {
  Tensor out = Tensor::empty({}, DType::Float32, device);
  const int count = static_cast<int>(spans.size());
  if (device.is_cpu()) {
    out.data_ptr<float>()[0] =
        static_cast<float>(kernels::cpu::grad_norm(spans.data(), count, norm_type));
    return out;
  }
  // One double per chunk (int64 storage: tensors have no float64 dtype), from the caching
  // allocator, so a step allocates nothing new.
  const int64_t parts = kernels::cuda::grad_norm_scratch(spans.data(), count);
  Tensor scratch = Tensor::empty({std::max<int64_t>(parts, 1)}, DType::Int64, device);
  kernels::cuda::grad_norm(spans.data(), count, norm_type,
                           reinterpret_cast<double*>(scratch.raw_data()), out.data_ptr<float>(),
                           detail::stream(device));
  return out;
}

void scale_grads(const GradGroup& group, float scale) {
  for (const Tensor& g : group.grads) g.bump_version();
  const auto& spans = group.spans;
  if (group.device.is_cpu())
    return kernels::cpu::scale_grads(spans.data(), int(spans.size()), scale);
  kernels::cuda::scale_grads(spans.data(), int(spans.size()), scale, detail::stream(group.device));
}

}  // namespace galley::detail
