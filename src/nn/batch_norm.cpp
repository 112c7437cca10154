// The batch normalisation layers: their state under PyTorch's names and the forward that picks
// batch or running statistics by mode.
#include "galley/nn/batch_norm.h"

#include "src/ops/batch_norm.h"

namespace galley::nn {

BatchNorm::BatchNorm(const char* kind, int64_t num_features, BatchNormLayerOptions options,
                     int min_rank, int max_rank)
    : kind_(kind),
      features_(num_features),
      opt_(options),
      min_rank_(min_rank),
      max_rank_(max_rank) {
  GALLEY_CHECK(features_ > 0, kind_, ": the number of features must be positive, got ", features_);
  GALLEY_CHECK(opt_.eps >= 0, kind_, ": eps ", opt_.eps, " must be >= 0");
  GALLEY_CHECK(!opt_.momentum || (*opt_.momentum >= 0 && *opt_.momentum <= 1), kind_, ": momentum ",
               opt_.momentum.value_or(0), " must be in [0, 1]");
  if (opt_.affine) {
    weight_ = register_parameter("weight", ones({features_}));
    bias_ = register_parameter("bias", zeros({features_}));
  }
  if (opt_.track_running_stats) {
    running_mean_ = register_buffer("running_mean", zeros({features_}), /*keep_dtype=*/true);
    running_var_ = register_buffer("running_var", ones({features_}), /*keep_dtype=*/true);
    num_batches_tracked_ =
        register_buffer("num_batches_tracked", Tensor::from_vector(std::vector<int64_t>{0}, {}));
  }
}

Tensor BatchNorm::forward(const Tensor& x) {
  return normalize(x, Tensor());
}

Tensor BatchNorm::forward(const std::vector<Tensor>& inputs) {
  GALLEY_CHECK(inputs.size() == 2, repr(), ": takes an input and a residual, got ", inputs.size(),
               " inputs");
  GALLEY_CHECK(inputs[1].defined(), repr(), ": the residual is undefined");
  return normalize(inputs[0], inputs[1]);
}

Tensor BatchNorm::normalize(const Tensor& x, const Tensor& residual) {
  GALLEY_CHECK(
      x.defined() && x.dim() >= min_rank_ && x.dim() <= max_rank_ && x.size(1) == features_, repr(),
      ": expected input ",
      min_rank_ == 4 ? detail::str_cat("[N, ", features_, ", H, W]")
                     : detail::str_cat("[N, ", features_, "] or [N, ", features_, ", L]"),
      ", got ", x.defined() ? shape_str(x.shape()) : "undefined");
  try {
    const bool update = is_training() && opt_.track_running_stats;
    double momentum = opt_.momentum.value_or(0.0);
    if (update && !opt_.momentum) {  // the cumulative average over the batches with this one
      const Tensor n = num_batches_tracked_.device().is_cpu()
                           ? num_batches_tracked_
                           : num_batches_tracked_.to(Device::cpu());
      momentum = 1.0 / (double(*n.data_ptr<int64_t>()) + 1.0);
    }
    const BatchNormOptions o{.training = is_training() || !opt_.track_running_stats,
                             .momentum = momentum,
                             .eps = opt_.eps,
                             .relu = opt_.relu};
    Tensor y = residual.defined()
                   ? batch_norm_add(x, residual, running_mean_, running_var_, weight_, bias_, o)
                   : batch_norm(x, running_mean_, running_var_, weight_, bias_, o);
    // Counted once the batch is taken: one the op refuses (a residual of another shape, a
    // single value per channel) leaves the count, and the cumulative average, as they were.
    if (update) detail::count_batch(num_batches_tracked_);
    return y;
  } catch (...) {
    detail::rethrow_with_prefix(repr() + ": ");
  }
}

std::string BatchNorm::repr() const {
  return detail::str_cat(kind_, "(", features_, ", eps=", opt_.eps, ", momentum=",
                         opt_.momentum ? detail::str_cat(*opt_.momentum) : std::string("None"),
                         opt_.affine ? "" : ", affine=False",
                         opt_.track_running_stats ? "" : ", track_running_stats=False",
                         opt_.relu ? ", relu" : "", ")");
}

}  // namespace galley::nn
