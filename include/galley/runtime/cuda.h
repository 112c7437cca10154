#pragma once
/// \file The CUDA runtime as galley's users see it: devices, names, synchronisation.
/// No CUDA type appears here; the backend's internals live in the library.
#include <cstddef>
#include <string>

#include "galley/device.h"

namespace galley::cuda {

/// True when this build has the CUDA backend and the machine has at least one usable GPU.
bool available();
/// The GPU's name ("NVIDIA H200"); errors name the device when it does not exist.
std::string device_name(int index);
/// The GPU's total memory in bytes.
size_t total_memory(int index);
/// Waits until everything galley queued on the device's streams has finished; raises errors
/// the GPU found in earlier steps (a label out of range).
void synchronize(Device device);
/// Lets float32 matrix products and convolutions use TF32 tensor cores (about 1e-3 relative
/// error, several times faster on Ampere and later). Off by default, as in PyTorch for
/// exactness; applies from the next product or convolution on.
void set_allow_tf32(bool on);
/// Whether TF32 is allowed.
bool allow_tf32();
/// Makes convolutions use only cuDNN algorithms that give the same bits at every run (often
/// slower, and some need more workspace). Off by default: each convolution takes the fastest
/// algorithm whose workspace fits, and some of those accumulate with atomics in varying order.
/// Matrix products (cuBLAS) repeat their bits on the same GPU either way. Applies from the next
/// convolution on.
void set_deterministic(bool on);
/// Whether deterministic convolution algorithms are asked for.
bool deterministic();

}  // namespace galley::cuda
