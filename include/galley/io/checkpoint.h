#pragma once
/// \file Tensors to and from safetensors files (the format PyTorch and others read).
#include <map>
#include <string>

#include "galley/tensor.h"

namespace galley::io {

/// Writes `tensors` (host copies are taken as needed) to `path` in the safetensors format.
/// The file is written beside `path` first and renamed over it, so a failure never leaves a
/// half-written file behind.
void save_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors);
/// Reads every tensor of a safetensors file (F32, I64, U8). Errors name the file, the tensor
/// and the byte offset at fault.
std::map<std::string, Tensor> load_safetensors(const std::string& path);

}  // namespace galley::io
