// libFuzzer target for the safetensors reader: any bytes must either load or raise
// galley::Error; a crash, a sanitizer report or another exception type is a bug.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include "galley/io/checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // The reader takes a path: give it the bytes as a file of this process's own.
  static const std::string path = "/tmp/galley_fuzz_" + std::to_string(::getpid()) + ".safetensors";
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return 0;
  std::fwrite(data, 1, size, f);
  std::fclose(f);
  try {
    auto file = galley::io::read_safetensors(path);
    for (auto& [name, t] : file.tensors) (void)t.numel();
  } catch (const galley::Error&) {
    // Rejected with a message: the expected outcome for malformed input.
  }
  return 0;
}
