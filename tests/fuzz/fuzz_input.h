// The fuzz targets' one shared piece: the readers take a path, so each input is written to a
// file of this process's own before the reader opens it.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>

namespace galley::fuzz {

/// Writes `data` to a file named after this process and `suffix`; returns its path, or an empty
/// string when the file cannot be written (the input is then skipped).
inline std::string write_input(const uint8_t* data, size_t size, const char* suffix) {
  const std::string path = "/tmp/galley_fuzz_" + std::to_string(::getpid()) + suffix;
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return {};
  const bool ok = std::fwrite(data, 1, size, f) == size;
  if (std::fclose(f) != 0 || !ok) return {};
  return path;
}

}  // namespace galley::fuzz
