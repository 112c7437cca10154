// safetensors: an 8-byte little-endian header length, a JSON header, then raw tensor bytes.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <unordered_set>

#include "galley/io/checkpoint.h"
#include "src/utf8.h"

namespace galley::io {

namespace {

const char* st_dtype(DType t) {
  switch (t) {
    case DType::Float32:
      return "F32";
    case DType::Float16:
      return "F16";
    case DType::BFloat16:
      return "BF16";
    case DType::Int64:
      return "I64";
    case DType::UInt8:
      return "U8";
  }
  return "";
}

DType from_st_dtype(const std::string& s, const std::string& path, const std::string& name) {
  if (s == "F32") return DType::Float32;
  if (s == "F16") return DType::Float16;
  if (s == "BF16") return DType::BFloat16;
  if (s == "I64") return DType::Int64;
  if (s == "U8") return DType::UInt8;
  GALLEY_CHECK(false, "safetensors file '", path, "': tensor '", name, "' has dtype ", s,
               ", supported are F32, F16, BF16, I64 and U8");
  return DType::Float32;
}

std::string directory_of(const std::string& path) {
  auto slash = path.rfind('/');
  return slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
}

// Writes all of `bytes` to fd or throws naming `path`.
// `what` names the file being written ("'a' (through 'b')").
void write_all(int fd, const void* data, size_t bytes, const std::string& what) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    ssize_t w = ::write(fd, p, bytes);
    if (w < 0 && errno == EINTR) continue;
    GALLEY_CHECK(w > 0, "save_safetensors: writing ", what, " failed: ", std::strerror(errno));
    p += w;
    bytes -= static_cast<size_t>(w);
  }
}

}  // namespace

void save_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  // The header is JSON: its text must be UTF-8 (checked before anything is written).
  for (auto& [key, value] : metadata)
    GALLEY_CHECK(detail::valid_utf8(key) && detail::valid_utf8(value), "save_safetensors: '", path,
                 "': metadata entry '", key, "' is not valid UTF-8");
  for (auto& [name, t] : tensors)
    GALLEY_CHECK(detail::valid_utf8(name), "save_safetensors: '", path, "': tensor name '", name,
                 "' is not valid UTF-8");
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<Tensor> host;
  uint64_t offset = 0;
  for (auto& [name, t] : tensors) {
    GALLEY_CHECK(name != "__metadata__", "save_safetensors: '", path,
                 "': the name '__metadata__' is reserved for the file's metadata");
    GALLEY_CHECK(t.defined(), "save_safetensors: '", path, "': tensor '", name, "' is undefined");
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
  // Written beside the target under a name of its own, flushed to disk, then renamed over the
  // target: a crash at any point leaves either the old file or the new one, never half of one.
  // Its name is the target's with ".tmp.<pid>.<n>" (what Checkpointer clears after a killed
  // save), the target's part cut short where the whole would pass a file name's 255 bytes.
  static std::atomic<uint64_t> counter{0};
  const size_t slash = path.rfind('/');
  const std::string suffix = detail::str_cat(".tmp.", ::getpid(), ".", counter++);
  std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
  if (base.size() + suffix.size() > 255) base.resize(255 - suffix.size());
  const std::string tmp =
      (slash == std::string::npos ? std::string() : path.substr(0, slash + 1)) + base + suffix;
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  GALLEY_CHECK(fd >= 0, "save_safetensors: '", path, "': cannot create its temporary file '", tmp,
               "': ", std::strerror(errno));
  // A save holds an exclusive lock on its temporary from before its first byte: Checkpointer
  // clears only a temporary nobody holds (its save was killed), not another process's save in
  // progress.
  ::flock(fd, LOCK_EX);
  const std::string writing = detail::str_cat("'", path, "' (through '", tmp, "')");
  try {
    const uint64_t len = text.size();
    unsigned char le[8];
    for (int i = 0; i < 8; ++i) le[i] = static_cast<unsigned char>(len >> (8 * i));
    write_all(fd, le, 8, writing);
    write_all(fd, text.data(), text.size(), writing);
    for (const Tensor& h : host)
      write_all(fd, h.raw_data(), h.numel() * dtype_size(h.dtype()), writing);
    GALLEY_CHECK(::fsync(fd) == 0, "save_safetensors: flushing ", writing,
                 " failed: ", std::strerror(errno));
  } catch (...) {
    ::close(fd);
    std::remove(tmp.c_str());
    throw;
  }
  // Renamed while still locked: closing drops the lock, and a temporary with bytes that nobody
  // holds is one that a Checkpointer clears.
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    ::close(fd);
    GALLEY_CHECK(false, "save_safetensors: cannot rename '", tmp, "' to '", path,
                 "': ", std::strerror(err));
  }
  ::close(fd);
  // Make the rename itself durable.
  int dir = ::open(directory_of(path).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {
    ::fsync(dir);
    ::close(dir);
  }
}

namespace {
// The largest header a file may declare, as the safetensors library's own reader allows: a
// header length is read before anything else, so a corrupt one must not cost its size in memory.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
// The deepest nesting of arrays and objects a header may have (a safetensors header needs 3).
constexpr int kMaxHeaderDepth = 64;

// A JSON value for a message: scalars as they are (a long string cut), containers by their kind
// (a file's value may be nested deeper than printing it recursively survives).
std::string describe(const nlohmann::json& v) {
  if (v.is_array()) return "an array";
  if (v.is_object()) return "an object";
  std::string text = v.dump();
  if (text.size() > 40) text = text.substr(0, 40) + "...";
  return text;
}

// The non-negative integers of a JSON array (shape or data_offsets). Anything else (a negative
// or fractional number, one too large for 63 bits, a string, a nested array) is an error naming
// the field.
std::vector<uint64_t> whole_numbers(const nlohmann::json& v, const char* field,
                                    const std::string& path, const std::string& name) {
  GALLEY_CHECK(v.is_array(), "safetensors file '", path, "': tensor '", name, "': ", field,
               " is not an array (it is ", describe(v), ")");
  std::vector<uint64_t> out;
  for (const auto& e : v) {
    GALLEY_CHECK(e.is_number_unsigned() && e.get<uint64_t>() <= uint64_t(INT64_MAX),
                 "safetensors file '", path, "': tensor '", name, "': ", field, " holds ",
                 describe(e), ", not a size (a whole number from 0 to 2^63 - 1)");
    out.push_back(e.get<uint64_t>());
  }
  return out;
}

// The first name given twice in any object of the header (a JSON object keeps the last
// silently), found by a pass of nlohmann's public SAX interface once the header parses.
// nlohmann's parser callback, which could see the keys, rescans each closed object's parent:
// quadratic in the header's entries (50,000 tensors took 20 s).
class RepeatedNames : public nlohmann::json_sax<nlohmann::json> {
 public:
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override {
    keys_.emplace_back();
    return true;
  }
  bool key(string_t& k) override {
    if (keys_.size() == 1) entry_ = k;
    if (!keys_.back().insert(k).second && found.empty())
      found = keys_.size() == 1 ? detail::str_cat("names '", k, "' twice")
                                : detail::str_cat("entry '", entry_, "' gives '", k, "' twice");
    return true;
  }
  bool end_object() override {
    keys_.pop_back();
    return true;
  }
  bool start_array(std::size_t) override { return true; }
  bool end_array() override { return true; }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override {
    return false;  // (the header parsed before this pass)
  }
  std::string found;  // what was given twice, for the message; empty where nothing was

 private:
  std::vector<std::unordered_set<std::string>> keys_;  // of each object open
  std::string entry_;                                  // the top-level entry being read
};

// Where a tensor's bytes lie in the data: [begin, end).
struct Span {
  uint64_t begin, end;
  std::string name;
  DType dtype;
  Shape shape;
};
}  // namespace

namespace {
// The offset of the first '[' or '{' of JSON text that opens a level past `most`, outside
// strings; npos when none does.
size_t nesting_past(const std::string& text, int most) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\')
        ++i;  // the escaped character
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > most) return i;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return std::string::npos;
}
}  // namespace

SafetensorsFile read_safetensors(const std::string& path) {
  // (A directory opens as a stream whose size reads as the largest offset.)
  struct stat st {};
  GALLEY_CHECK(::stat(path.c_str(), &st) == 0, "load_safetensors: cannot open '", path,
               "': ", std::strerror(errno));
  GALLEY_CHECK(S_ISREG(st.st_mode), "load_safetensors: '", path, "' is not a regular file");
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  GALLEY_CHECK(in.good(), "load_safetensors: cannot open '", path, "'");
  const uint64_t file_size = static_cast<uint64_t>(in.tellg());
  in.seekg(0);
  GALLEY_CHECK(file_size >= 8, "safetensors file '", path, "' is truncated: ", file_size,
               " bytes, the header length alone needs 8");
  unsigned char le[8];
  in.read(reinterpret_cast<char*>(le), 8);
  GALLEY_CHECK(in.gcount() == 8, "safetensors file '", path, "': reading the header length failed");
  uint64_t len = 0;
  for (int i = 0; i < 8; ++i) len |= uint64_t(le[i]) << (8 * i);
  GALLEY_CHECK(len <= file_size - 8, "safetensors file '", path, "': header length ", len,
               " at byte 0 runs past the end of the file (", file_size, " bytes)");
  GALLEY_CHECK(len <= kMaxHeaderBytes, "safetensors file '", path, "': header length ", len,
               " at byte 0 is more than the ", kMaxHeaderBytes, " bytes a header may take");
  std::string text(len, '\0');
  in.read(text.data(), static_cast<std::streamsize>(len));
  GALLEY_CHECK(in.gcount() == static_cast<std::streamsize>(len), "safetensors file '", path,
               "': reading the header (bytes 8..", 8 + len, ") failed");
  // (JSON text holds no NUL byte; a parser may take one for the end of its input.)
  const size_t nul = text.find('\0');
  GALLEY_CHECK(nul == std::string::npos, "safetensors file '", path,
               "': the JSON header holds a NUL byte at byte ", 8 + nul);
  // A header nests three deep ({name: {"shape": [...]}}); the parse's tree costs tens of times
  // a deeply nested text's size (16 million levels in 96 MB took 6.4 GB), so depth is refused
  // first, by a scan that allocates nothing (Python's reader stops at 128 levels).
  const size_t deep = nesting_past(text, kMaxHeaderDepth);
  GALLEY_CHECK(deep == std::string::npos, "safetensors file '", path,
               "': the JSON header nests deeper than ", kMaxHeaderDepth, " levels at byte ",
               8 + deep);
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text);
  } catch (...) {  // (out of memory stays OutOfMemoryError)
    detail::raise_nested(detail::str_cat("safetensors file '", path,
                                         "': the JSON header (bytes 8..", 8 + len,
                                         ") does not parse: ", detail::current_what()));
  }
  RepeatedNames repeated;
  nlohmann::json::sax_parse(text, &repeated);
  GALLEY_CHECK(repeated.found.empty(), "safetensors file '", path, "': the header ",
               repeated.found);
  GALLEY_CHECK(header.is_object(), "safetensors file '", path, "': the header is not an object");
  const uint64_t data_start = 8 + len, data_size = file_size - data_start;
  SafetensorsFile out;
  // Every entry checked before any tensor is allocated: a file of many entries over the same
  // bytes must fail on its overlap, not after reading each of them.
  std::vector<Span> spans;
  for (auto& [name, entry] : header.items()) {
    try {
      if (name == "__metadata__") {
        if (entry.is_null()) continue;  // none, as the safetensors library reads it
        GALLEY_CHECK(entry.is_object(), "safetensors file '", path,
                     "': __metadata__ is not an object of strings");
        for (auto& [k, v] : entry.items()) out.metadata[k] = v.get<std::string>();
        continue;
      }
      DType dt = from_st_dtype(entry.at("dtype").get<std::string>(), path, name);
      const auto dims = whole_numbers(entry.at("shape"), "shape", path, name);
      Shape shape(dims.begin(), dims.end());
      const auto offs = whole_numbers(entry.at("data_offsets"), "data_offsets", path, name);
      GALLEY_CHECK(offs.size() == 2, "safetensors file '", path, "': tensor '", name,
                   "': data_offsets holds ", offs.size(), " values, not [begin, end]");
      GALLEY_CHECK(offs[0] <= offs[1], "safetensors file '", path, "': tensor '", name,
                   "': data_offsets [", offs[0], ", ", offs[1], "] run backwards");
      GALLEY_CHECK(offs[1] <= data_size, "safetensors file '", path, "': tensor '", name,
                   "': data_offsets [", offs[0], ", ", offs[1], "] run past the ", data_size,
                   " bytes of data (to byte ", data_start + offs[1], " of a file of ", file_size,
                   ")");
      // The size in bytes, refusing products that overflow (no file holds such a tensor); a
      // shape with a zero has none, whatever its other sizes.
      uint64_t bytes = dtype_size(dt);
      if (std::find(dims.begin(), dims.end(), uint64_t(0)) != dims.end()) bytes = 0;
      for (uint64_t d : dims)
        GALLEY_CHECK(bytes == 0 || !__builtin_mul_overflow(bytes, d, &bytes), "safetensors file '",
                     path, "': tensor '", name, "' of shape ", shape_str(shape),
                     " is larger than any file");
      GALLEY_CHECK(offs[1] - offs[0] == bytes, "safetensors file '", path, "': tensor '", name,
                   "' of shape ", shape_str(shape), " needs ", bytes, " bytes but spans ",
                   offs[1] - offs[0], " (data_offsets [", offs[0], ", ", offs[1], "], at byte ",
                   data_start + offs[0], ")");
      spans.push_back({offs[0], offs[1], name, dt, std::move(shape)});
    } catch (const nlohmann::json::exception& e) {
      GALLEY_CHECK(false, "safetensors file '", path, "': entry '", name,
                   "' is malformed: ", e.what());
    }
  }
  // Tensors may not share bytes: a file whose tensors overlap was not written by a safetensors
  // writer and would alias weights. And they cover the data, as the format asks: no gap between
  // them, and nothing past the last (bytes no tensor holds are a sign of a corrupt header).
  // Empty tensors hold no bytes and take no part.
  std::vector<const Span*> order;
  for (const Span& sp : spans)
    if (sp.begin != sp.end) order.push_back(&sp);
  std::sort(order.begin(), order.end(),
            [](const Span* a, const Span* b) { return a->begin < b->begin; });
  uint64_t covered = 0;  // the data up to here is held by the tensors so far
  for (size_t i = 0; i < order.size(); ++i) {
    const Span& sp = *order[i];
    GALLEY_CHECK(sp.begin >= covered, "safetensors file '", path, "': tensors '",
                 order[i - 1]->name, "' and '", sp.name, "' overlap (bytes ", data_start + sp.begin,
                 "..", data_start + std::min(sp.end, covered), ")");
    GALLEY_CHECK(sp.begin == covered, "safetensors file '", path, "': bytes ", data_start + covered,
                 "..", data_start + sp.begin, " of the data belong to no tensor (before '", sp.name,
                 "')");
    covered = sp.end;
  }
  GALLEY_CHECK(covered == data_size, "safetensors file '", path, "': bytes ", data_start + covered,
               "..", file_size, " of the data belong to no tensor");
  for (const Span& sp : spans) {
    Tensor t = Tensor::empty(sp.shape, sp.dtype);
    const uint64_t bytes = sp.end - sp.begin;
    in.seekg(static_cast<std::streamoff>(data_start + sp.begin));
    in.read(static_cast<char*>(t.raw_data()), static_cast<std::streamsize>(bytes));
    GALLEY_CHECK(in.good(), "safetensors file '", path, "': reading tensor '", sp.name,
                 "' at byte ", data_start + sp.begin, " failed");
    out.tensors[sp.name] = t;
  }
  return out;
}

std::map<std::string, Tensor> load_safetensors(const std::string& path) {
  return read_safetensors(path).tensors;
}

}  // namespace galley::io
