// dropout: checks, the mask's key drawn from the generator, the device switch and the autograd
// record. The kernels take every floating dtype; the uint8 mask (one byte per element, on the
// input's device) is what backward keeps.
#include "kernels/dropout.h"

#include <memory>

#include "galley/autograd.h"
#include "galley/ops.h"
#include "galley/profiler.h"
#include "src/ops/dispatch.h"
#include "src/runtime/device_memory.h"

namespace galley {

namespace cpu = kernels::cpu;
namespace gpu = kernels::cuda;

Tensor dropout(const Tensor& x, float p, bool training, Generator& gen) {
  profiler::OpScope prof("dropout", {&x});
  detail::check_floating("dropout", x);
  GALLEY_CHECK(p >= 0.f && p <= 1.f, "dropout: probability ", p, " is not in [0, 1] (input ",
               shape_str(x.shape()), ", ", dtype_name(x.dtype()), ")");
  if (!training || p == 0.f) return x;
  const DType dtype = x.dtype();
  const Device dev = x.device();
  const int64_t n = x.numel();
  // The key is drawn on the host: a captured graph would replay one mask forever.
  GALLEY_CHECK(!detail::capturing(dev), "dropout: a mask drawn while capturing a CUDA graph on ",
               dev.str(), " would be the same at every replay (input ", shape_str(x.shape()), ", ",
               dtype_name(dtype), "); run steps with dropout in training mode eagerly");
  // One draw per call, whatever the size: the mask is Philox at (key, element index).
  const kernels::DropoutParams d{next_seed(gen), kernels::dropout_keep_threshold(p),
                                 p == 1.f ? 0.f : 1.f / (1.f - p)};
  Tensor cx = x.contiguous();
  Tensor out = Tensor::empty(x.shape(), dtype, dev);
  auto mask = std::make_shared<Storage>(static_cast<size_t>(n), dev);
  uint8_t* pm = static_cast<uint8_t*>(mask->data());
  if (dev.is_cuda())
    gpu::dropout_forward(d, dtype, cx.raw_data(), out.raw_data(), pm, n, detail::stream(dev));
  else
    cpu::dropout_forward(d, dtype, cx.raw_data(), out.raw_data(), pm, n);
  if (!autograd::needs_grad({&x})) return out;
  const Shape shape = x.shape();
  const float scale = d.scale;
  return autograd::record(out, "dropout", {x}, [=](const Tensor& gy, std::vector<Tensor>& gi) {
    Tensor cgy = gy.to(dtype).contiguous();
    gi[0] = Tensor::empty(shape, dtype, dev);
    const uint8_t* kept = static_cast<const uint8_t*>(mask->data());
    if (dev.is_cuda())
      gpu::dropout_backward(dtype, cgy.raw_data(), kept, scale, gi[0].raw_data(), n,
                            detail::stream(dev));
    else
      cpu::dropout_backward(dtype, cgy.raw_data(), kept, scale, gi[0].raw_data(), n);
  });
}

}  // namespace galley
