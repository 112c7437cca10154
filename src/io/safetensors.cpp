// safetensors: an 8-byte little-endian header length, a JSON header, then raw tensor bytes.
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "galley/io/checkpoint.h"

namespace galley::io {

namespace {
const char* st_dtype(DType t) {
  switch (t) {
    case DType::Float32:
      return "F32";
    case DType::Int64:
      return "I64";
    case DType::UInt8:
      return "U8";
    case DType::Float16:
      return "F16";
    case DType::BFloat16:
      return "BF16";
  }
  return "";
}

DType from_st_dtype(const std::string& s, const std::string& path, const std::string& name) {
  if (s == "F32") return DType::Float32;
  if (s == "I64") return DType::Int64;
  if (s == "U8") return DType::UInt8;
  GALLEY_CHECK(false, "safetensors file '", path, "': tensor '", name, "' has dtype ", s,
               ", supported are F32, I64 and U8");
  return DType::Float32;
}
}  // namespace

void save_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors) {
  nlohmann::json header = nlohmann::json::object();
  std::vector<Tensor> host;
  uint64_t offset = 0;
  for (auto& [name, t] : tensors) {
    GALLEY_CHECK(t.defined(), "save_safetensors: tensor '", name, "' is undefined");
    Tensor h = t.detach().to(Device::cpu()).contiguous();
    uint64_t bytes = h.numel() * dtype_size(h.dtype());
    header[name] = {{"dtype", st_dtype(h.dtype())},
                    {"shape", h.shape()},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    host.push_back(h);
  }
  std::string text = header.dump();
  while (text.size() % 8) text += ' ';  // keeps the data 8-byte aligned
  // A name of its own per save, so concurrent saves to one path cannot mix their bytes.
  static std::atomic<uint64_t> counter{0};
  const std::string tmp = detail::str_cat(path, ".tmp.", ::getpid(), ".", counter++);
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    GALLEY_CHECK(out.good(), "save_safetensors: cannot write '", tmp, "'");
    uint64_t len = text.size();
    unsigned char le[8];
    for (int i = 0; i < 8; ++i) le[i] = static_cast<unsigned char>(len >> (8 * i));
    out.write(reinterpret_cast<const char*>(le), 8);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    for (const Tensor& h : host)
      out.write(static_cast<const char*>(h.raw_data()),
                static_cast<std::streamsize>(h.numel() * dtype_size(h.dtype())));
    out.flush();
    if (!out.good()) {
      out.close();
      std::remove(tmp.c_str());
      GALLEY_CHECK(false, "save_safetensors: writing '", tmp, "' failed (disk full?)");
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    GALLEY_CHECK(false, "save_safetensors: cannot rename '", tmp, "' to '", path, "'");
  }
}

std::map<std::string, Tensor> load_safetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  GALLEY_CHECK(in.good(), "load_safetensors: cannot open '", path, "'");
  const uint64_t file_size = static_cast<uint64_t>(in.tellg());
  in.seekg(0);
  GALLEY_CHECK(file_size >= 8, "safetensors file '", path, "' is truncated: ", file_size,
               " bytes, the header length alone needs 8");
  unsigned char le[8];
  in.read(reinterpret_cast<char*>(le), 8);
  uint64_t len = 0;
  for (int i = 0; i < 8; ++i) len |= uint64_t(le[i]) << (8 * i);
  GALLEY_CHECK(len <= file_size - 8, "safetensors file '", path, "': header length ", len,
               " at byte 0 runs past the end of the file (", file_size, " bytes)");
  std::string text(len, '\0');
  in.read(text.data(), static_cast<std::streamsize>(len));
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    GALLEY_CHECK(false, "safetensors file '", path, "': the JSON header (bytes 8..", 8 + len,
                 ") does not parse: ", e.what());
  }
  GALLEY_CHECK(header.is_object(), "safetensors file '", path, "': the header is not an object");
  const uint64_t data_start = 8 + len, data_size = file_size - data_start;
  std::map<std::string, Tensor> out;
  for (auto& [name, entry] : header.items()) {
    if (name == "__metadata__") continue;
    try {
      DType dt = from_st_dtype(entry.at("dtype").get<std::string>(), path, name);
      Shape shape = entry.at("shape").get<Shape>();
      auto offs = entry.at("data_offsets").get<std::vector<uint64_t>>();
      GALLEY_CHECK(offs.size() == 2 && offs[0] <= offs[1] && offs[1] <= data_size,
                   "safetensors file '", path, "': tensor '", name, "' data offsets run past the ",
                   data_size, " bytes of data");
      uint64_t bytes = shape_numel(shape) * dtype_size(dt);
      GALLEY_CHECK(offs[1] - offs[0] == bytes, "safetensors file '", path, "': tensor '", name,
                   "' of shape ", shape_str(shape), " needs ", bytes, " bytes but spans ",
                   offs[1] - offs[0], " (at byte ", data_start + offs[0], ")");
      Tensor t = Tensor::empty(shape, dt);
      in.seekg(static_cast<std::streamoff>(data_start + offs[0]));
      in.read(static_cast<char*>(t.raw_data()), static_cast<std::streamsize>(bytes));
      GALLEY_CHECK(in.good(), "safetensors file '", path, "': reading tensor '", name, "' at byte ",
                   data_start + offs[0], " failed");
      out[name] = t;
    } catch (const nlohmann::json::exception& e) {
      GALLEY_CHECK(false, "safetensors file '", path, "': entry '", name,
                   "' is malformed: ", e.what());
    }
  }
  return out;
}

}  // namespace galley::io
