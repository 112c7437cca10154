// Per-sample augmentations and the byte-to-float conversion, run by the loader's workers.
#include "galley/data/transforms.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>

namespace galley::data {

namespace {
uint64_t mix(uint64_t x) {  // splitmix64's finaliser
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}
}  // namespace

uint64_t sample_seed(uint64_t seed, uint64_t epoch, size_t index) {
  return mix(mix(mix(seed) ^ epoch) ^ static_cast<uint64_t>(index));
}

Transform normalize(std::vector<float> mean, std::vector<float> stddev) {
  GALLEY_CHECK(!mean.empty() && mean.size() == stddev.size(), "normalize: ", mean.size(),
               " means and ", stddev.size(), " standard deviations; give one of each per channel");
  for (size_t c = 0; c < stddev.size(); ++c)
    GALLEY_CHECK(std::isfinite(mean[c]) && std::isfinite(stddev[c]) && stddev[c] > 0,
                 "normalize: mean[", c, "] = ", mean[c], " and stddev[", c, "] = ", stddev[c],
                 " must be finite, the stddev positive");
  // Divided, as torchvision's Normalize does (a product with the reciprocal parts from it by an
  // ulp in about one value in eight).
  return [mean = std::move(mean), stddev = std::move(stddev)](float* x, const Shape& shape,
                                                              Generator&) {
    GALLEY_CHECK(!shape.empty(), "normalize: the sample is a scalar; it needs a channel dimension");
    const int64_t channels = shape[0];
    GALLEY_CHECK(mean.size() == 1 || int64_t(mean.size()) == channels, "normalize: ", mean.size(),
                 " channel statistics for a sample of shape ", shape_str(shape));
    const int64_t plane = channels > 0 ? shape_numel(shape) / channels : 0;
    for (int64_t c = 0; c < channels; ++c) {
      const float m = mean.size() == 1 ? mean[0] : mean[c];
      const float s = stddev.size() == 1 ? stddev[0] : stddev[c];
      float* p = x + c * plane;
      for (int64_t i = 0; i < plane; ++i) p[i] = (p[i] - m) / s;
    }
  };
}

Transform random_crop(int64_t padding, float fill) {
  // (Far past any image: 2 * padding + 1 must not overflow.)
  GALLEY_CHECK(padding >= 0 && padding <= (int64_t(1) << 40), "random_crop: padding ", padding,
               " must be in [0, 2^40]");
  return [padding, fill](float* x, const Shape& shape, Generator& gen) {
    GALLEY_CHECK(shape.size() >= 2, "random_crop: sample of shape ", shape_str(shape),
                 " has no (H, W) dimensions");
    const int64_t h = shape[shape.size() - 2], w = shape[shape.size() - 1];
    const int64_t planes = h * w > 0 ? shape_numel(shape) / (h * w) : 0;
    // The window's top-left corner in the padded image is (oy, ox) in [0, 2 * padding]; output
    // (y, x) reads input (y + dy, x + dx) with dy = oy - padding, dx = ox - padding.
    const uint64_t span = static_cast<uint64_t>(2 * padding + 1);
    const int64_t dy = static_cast<int64_t>(gen.next_u64() % span) - padding;
    const int64_t dx = static_cast<int64_t>(gen.next_u64() % span) - padding;
    if (dy == 0 && dx == 0) return;
    // In place, like memmove: rows are visited in the direction that reads each source row
    // before it is overwritten, and each row is moved with memmove.
    const int64_t x_lo = std::max<int64_t>(0, -dx), x_hi = std::min(w, w - dx);  // valid outputs
    for (int64_t p = 0; p < planes; ++p) {
      float* img = x + p * h * w;
      for (int64_t k = 0; k < h; ++k) {
        const int64_t y = dy >= 0 ? k : h - 1 - k;
        const int64_t sy = y + dy;
        float* out = img + y * w;
        if (sy < 0 || sy >= h || x_lo >= x_hi) {
          std::fill(out, out + w, fill);
          continue;
        }
        std::memmove(out + x_lo, img + sy * w + x_lo + dx, sizeof(float) * (x_hi - x_lo));
        std::fill(out, out + x_lo, fill);
        std::fill(out + x_hi, out + w, fill);
      }
    }
  };
}

Transform random_horizontal_flip(float p) {
  GALLEY_CHECK(p >= 0.f && p <= 1.f, "random_horizontal_flip: probability ", p,
               " is outside [0, 1]");
  return [p](float* x, const Shape& shape, Generator& gen) {
    GALLEY_CHECK(!shape.empty(), "random_horizontal_flip: the sample is a scalar");
    if (!(gen.next_float() < p)) return;
    const int64_t w = shape.back();
    const int64_t rows = w > 0 ? shape_numel(shape) / w : 0;
    for (int64_t r = 0; r < rows; ++r) std::reverse(x + r * w, x + (r + 1) * w);
  };
}

void apply_transforms(const std::vector<Transform>& transforms, Tensor& batch,
                      const std::vector<size_t>& indices, uint64_t seed, uint64_t epoch,
                      const std::string& context) {
  if (transforms.empty()) return;
  GALLEY_CHECK(batch.dtype() == DType::Float32 && batch.is_contiguous() && batch.dim() >= 1 &&
                   batch.size(0) == int64_t(indices.size()),
               "apply_transforms: batch ", shape_str(batch.shape()), " ", dtype_name(batch.dtype()),
               " does not hold ", indices.size(), " contiguous float32 samples");
  const Shape sample(batch.shape().begin() + 1, batch.shape().end());
  const int64_t numel = shape_numel(sample);
  float* base = batch.data<float>();
  for (size_t i = 0; i < indices.size(); ++i) {
    Generator gen(sample_seed(seed, epoch, indices[i]));
    for (size_t t = 0; t < transforms.size(); ++t) {
      // The error names the transform and the sample, with the original nested inside it
      // (typed as detail::raise_nested types it: an OutOfMemoryError stays one).
      try {
        transforms[t](base + int64_t(i) * numel, sample, gen);
      } catch (...) {
        detail::raise_nested(detail::str_cat(context, "transform ", t, " failed on sample ",
                                             indices[i], ": ", detail::current_what()));
      }
    }
  }
}

void uint8_to_float(const uint8_t* src, float* dst, size_t n, float scale) {
  // A scale that is the reciprocal of a whole number (1/255) divides by that number, as
  // torchvision's ToTensor divides by 255: the product with the rounded reciprocal differs from
  // the quotient by an ulp in about half the byte values.
  const float divisor = std::nearbyint(1.f / scale);
  if (divisor >= 1.f && 1.f / divisor == scale) {
    for (size_t i = 0; i < n; ++i) dst[i] = src[i] / divisor;
    return;
  }
  for (size_t i = 0; i < n; ++i) dst[i] = src[i] * scale;
}

}  // namespace galley::data
