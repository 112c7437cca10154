#pragma once
/// \file Tensors to and from safetensors files (the format PyTorch and others read).
#include <map>
#include <string>

#include "galley/tensor.h"

namespace galley::io {

/// Writes `tensors` (host copies are taken as needed), and optional string `metadata`, to
/// `path` in the safetensors format. The file is written beside `path` under a name of its own,
/// flushed to disk and renamed over `path`, so a crash or a failure at any point leaves either
/// the previous file or the complete new one, never a half-written file.
void save_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

/// The contents of a safetensors file.
struct SafetensorsFile {
  std::map<std::string, Tensor> tensors{};
  std::map<std::string, std::string> metadata{};  ///< the header's "__metadata__"
};
/// Reads a safetensors file (F32, F16, BF16, I64, U8). Truncated files, offsets outside the
/// data, sizes that do not match shapes, overlapping tensors, data bytes no tensor holds, a name
/// or field given twice, a header longer than 100 MB or nested deeper than 64 levels are errors
/// naming the file, the tensor and the byte offset; every entry is checked before any tensor is
/// allocated. "__metadata__": null reads as no metadata.
SafetensorsFile read_safetensors(const std::string& path);
/// The tensors of a safetensors file (see read_safetensors()).
std::map<std::string, Tensor> load_safetensors(const std::string& path);

}  // namespace galley::io
