#pragma once
/// \file Per-sample transforms that the DataLoader runs in its workers.
///
/// A transform changes one float32 sample in place. Its randomness comes from a Generator the
/// loader seeds from (seed, epoch, sample index) alone, so an augmented epoch is the same with
/// any number of workers and any batch size. List them in DataLoaderOptions::transforms:
///
///     DataLoader loader(cifar, {.batch_size = 128, .shuffle = true, .num_workers = 2,
///                               .transforms = {random_crop(4), random_horizontal_flip(),
///                                              normalize(kCifar10Mean, kCifar10Std)}});
///
/// uint8 to float conversion happens when a dataset that holds bytes (UInt8ImageDataset, CIFAR)
/// writes a batch: that is inside the workers too, before these transforms run.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "galley/tensor.h"

namespace galley::data {

/// Modifies one contiguous float32 sample of `shape` in place, drawing random numbers from `gen`.
/// Throws galley::Error when the shape does not suit it.
using Transform = std::function<void(float* sample, const Shape& shape, Generator& gen)>;

/// (x - mean[c]) / stddev[c] for channel c = the first dimension of the sample. One value in each
/// list applies to every channel. Every stddev must be positive.
Transform normalize(std::vector<float> mean, std::vector<float> stddev);

/// Pads the last two dimensions (H, W) by `padding` on every side with `fill` and crops a random
/// H x W window back out: torchvision's RandomCrop(size=(H, W), padding). The shape is kept.
Transform random_crop(int64_t padding, float fill = 0.f);

/// Mirrors the last dimension (W) with probability `p`.
Transform random_horizontal_flip(float p = 0.5f);

/// The seed of sample `index`'s generator in epoch `epoch` of a loader seeded with `seed`.
uint64_t sample_seed(uint64_t seed, uint64_t epoch, size_t index);

/// Runs `transforms` in order on each sample of `batch` [B, ...] (contiguous float32); sample i
/// uses a Generator seeded with sample_seed(seed, epoch, indices[i]). A transform's exception
/// comes back as an error whose message is `context` followed by the transform and the sample,
/// of the same type where it is a galley::Error (an OutOfMemoryError stays one), else a
/// galley::Error, with the original nested inside it.
void apply_transforms(const std::vector<Transform>& transforms, Tensor& batch,
                      const std::vector<size_t>& indices, uint64_t seed, uint64_t epoch,
                      const std::string& context = "");

/// dst[i] = src[i] * scale for n bytes (the uint8 to float step, scale 1/255 gives [0, 1]); a scale
/// that is the reciprocal of a whole number divides by it, so the default gives torchvision's
/// ToTensor bits (byte / 255).
void uint8_to_float(const uint8_t* src, float* dst, size_t n, float scale = 1.f / 255.f);

/// Per-channel mean of the CIFAR-10 training images in [0, 1] (R, G, B).
inline const std::vector<float> kCifar10Mean = {0.4914f, 0.4822f, 0.4465f};
/// Per-channel standard deviation of the CIFAR-10 training images in [0, 1] (R, G, B).
inline const std::vector<float> kCifar10Std = {0.2470f, 0.2435f, 0.2616f};

}  // namespace galley::data
